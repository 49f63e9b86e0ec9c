//! The bare hyper ceiling: this binary re-executed with `--hello-server`.

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioExecutor;

pub(super) fn hello_server() {
    use hyper::service::service_fn;
    use hyper_util::rt::TokioIo;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        eprintln!(
            "hello listening on http://{}",
            listener.local_addr().unwrap()
        );
        loop {
            let Ok((sock, _)) = listener.accept().await else {
                continue;
            };
            let _ = sock.set_nodelay(true);
            tokio::spawn(async move {
                let svc = service_fn(|req: Request<hyper::body::Incoming>| async move {
                    let _ = req.into_body().collect().await;
                    Ok::<_, std::convert::Infallible>(
                        hyper::Response::builder()
                            .header("content-type", "application/json")
                            .body(Full::new(Bytes::from_static(
                                b"{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}",
                            )))
                            .unwrap(),
                    )
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .http1_only()
                    .serve_connection(TokioIo::new(sock), svc)
                    .await;
            });
        }
    });
}
