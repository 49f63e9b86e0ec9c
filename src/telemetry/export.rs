//! The span exporter: a bounded queue the request path only ever `try_send`s into,
//! drained by one thread of its own that posts OTLP/HTTP protobuf through the same
//! hyper + rustls client the upstreams use (docs/design.md §24 "Operations"). A full
//! queue or a failed post drops spans and counts them
//! (`taskgate_trace_spans_dropped_total`); nothing here can block or fail a request.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry::{Context, KeyValue};
use opentelemetry_http::{HttpClient, HttpError};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{
    Sampler, SdkTracer, SdkTracerProvider, Span, SpanData, SpanExporter, SpanProcessor,
};
use parking_lot::Mutex;
use tokio::sync::mpsc;

use crate::config::TraceExport;

/// Spans per OTLP request at most.
const MAX_BATCH: usize = 512;
/// A partial batch waits this long at most.
const EXPORT_INTERVAL: Duration = Duration::from_millis(500);
/// One post, connect to last byte.
const POST_TIMEOUT: Duration = Duration::from_secs(10);
/// The collector's answer is read this far (it only carries partial-success counts).
const MAX_ANSWER_BYTES: usize = 64 * 1024;
/// Export failures are logged at most this often.
const WARN_EVERY: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("telemetry TLS: {0}")]
    Tls(#[from] crate::tls::TlsError),
    #[error("telemetry exporter: {0}")]
    Exporter(String),
    #[error("telemetry export thread: {0}")]
    Thread(std::io::Error),
}

/// Traces, started: the tracer the `tracing` bridge records into, and the provider
/// to flush at exit.
pub struct Telemetry {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
}

impl Telemetry {
    /// The `tracing` layer that turns the gateway's spans (target
    /// [`super::TARGET`]) and the events inside them into OpenTelemetry spans.
    pub fn layer<S>(&self) -> tracing_opentelemetry::OpenTelemetryLayer<S, SdkTracer>
    where
        S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    {
        tracing_opentelemetry::layer()
            .with_tracer(self.tracer.clone())
            .with_location(false)
            .with_target(false)
            .with_threads(false)
            .with_tracked_inactivity(false)
    }

    /// Export what is queued and stop the export thread (bounded by its timeout).
    pub fn shutdown(&self) {
        super::set_enabled(false);
        if let Err(e) = self.provider.shutdown() {
            tracing::debug!(error = %e, "telemetry shutdown");
        }
    }
}

/// Start exporting to `cfg.url`; `replica_id` and `role` (`replica`, `edge`) become
/// resource attributes.
pub fn start(
    cfg: &TraceExport,
    replica_id: &str,
    role: &'static str,
) -> Result<Telemetry, TelemetryError> {
    let mut attrs = vec![
        KeyValue::new("service.instance.id", replica_id.to_string()),
        KeyValue::new("taskgate.replica_id", replica_id.to_string()),
        KeyValue::new("taskgate.role", role),
        KeyValue::new("service.version", env!("CARGO_PKG_VERSION")),
    ];
    attrs.extend(
        cfg.resource
            .iter()
            .map(|(k, v)| KeyValue::new(k.clone(), v.clone())),
    );
    let resource = Resource::builder_empty()
        .with_service_name(cfg.service_name.clone())
        .with_attributes(attrs)
        .build();

    let tls = crate::tls::client::client_config(cfg.ca_file.as_deref(), None)?;
    let client = Client::builder(TokioExecutor::new())
        .build(crate::tls::client::https_connector(&tls, POST_TIMEOUT));
    let headers: HashMap<String, String> = cfg.headers.iter().cloned().collect();
    let mut exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(cfg.url.clone())
        .with_headers(headers)
        .with_timeout(POST_TIMEOUT)
        .with_http_client(Hyper(client))
        .build()
        .map_err(|e| TelemetryError::Exporter(e.to_string()))?;
    exporter.set_resource(&resource);

    let (spans_tx, spans_rx) = mpsc::channel(cfg.queue_spans);
    let (control_tx, control_rx) = mpsc::unbounded_channel();
    let url = cfg.url.clone();
    let thread = std::thread::Builder::new()
        .name("taskgate-otlp".into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    tracing::error!(error = %e, "telemetry: no runtime for the exporter; spans are dropped");
                    return;
                }
            };
            rt.block_on(run(exporter, spans_rx, control_rx, url));
        })
        .map_err(TelemetryError::Thread)?;
    let queue = Queue {
        spans: spans_tx,
        control: control_tx,
        thread: Mutex::new(Some(thread)),
    };
    let sampler = Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(cfg.sample_ratio)));
    let provider = SdkTracerProvider::builder()
        .with_span_processor(queue)
        .with_sampler(sampler)
        .with_resource(resource)
        .build();
    let tracer = provider.tracer("taskgate");
    super::set_record_principal(cfg.record_principal);
    super::set_enabled(true);
    Ok(Telemetry { provider, tracer })
}

/// The exporter's HTTP client: the gateway's hyper client, bounded in time and in
/// what it reads back.
#[derive(Debug, Clone)]
struct Hyper(Client<crate::tls::client::HttpsConnector, Full<Bytes>>);

#[async_trait::async_trait]
impl HttpClient for Hyper {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let (parts, body) = request.into_parts();
        let request = Request::from_parts(parts, Full::new(body));
        let post = async {
            let resp = self.0.request(request).await?;
            let (parts, body) = resp.into_parts();
            let body = Limited::new(body, MAX_ANSWER_BYTES)
                .collect()
                .await?
                .to_bytes();
            Ok::<_, HttpError>(Response::from_parts(parts, body))
        };
        tokio::time::timeout(POST_TIMEOUT, post).await?
    }
}

enum Control {
    Flush(std::sync::mpsc::Sender<()>),
    Shutdown(std::sync::mpsc::Sender<()>),
}

/// The span processor: sampled spans go into the bounded queue, or are dropped.
#[derive(Debug)]
struct Queue {
    spans: mpsc::Sender<SpanData>,
    control: mpsc::UnboundedSender<Control>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl std::fmt::Debug for Control {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Control::Flush(_) => "Flush",
            Control::Shutdown(_) => "Shutdown",
        })
    }
}

impl Queue {
    fn round_trip(
        &self,
        make: fn(std::sync::mpsc::Sender<()>) -> Control,
        timeout: Duration,
    ) -> OTelSdkResult {
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        self.control
            .send(make(done_tx))
            .map_err(|_| OTelSdkError::AlreadyShutdown)?;
        done_rx
            .recv_timeout(timeout)
            .map_err(|_| OTelSdkError::Timeout(timeout))
    }
}

impl SpanProcessor for Queue {
    fn on_start(&self, _span: &mut Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        if !span.span_context.is_sampled() {
            return;
        }
        if self.spans.try_send(span).is_err() {
            crate::metrics::trace_spans_dropped("queue_full", 1);
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.round_trip(Control::Flush, POST_TIMEOUT)
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        let r = self.round_trip(Control::Shutdown, timeout);
        if r.is_ok()
            && let Some(t) = self.thread.lock().take()
        {
            let _ = t.join();
        }
        r
    }
}

async fn run(
    exporter: opentelemetry_otlp::SpanExporter,
    mut spans: mpsc::Receiver<SpanData>,
    mut control: mpsc::UnboundedReceiver<Control>,
    url: String,
) {
    let exporter = Arc::new(exporter);
    let mut out = Outbox {
        batch: Vec::with_capacity(MAX_BATCH),
        last_warned: None,
        url,
    };
    let mut tick = tokio::time::interval(EXPORT_INTERVAL);
    loop {
        tokio::select! {
            s = spans.recv() => match s {
                Some(s) => {
                    out.batch.push(s);
                    if out.batch.len() >= MAX_BATCH {
                        out.send(&exporter).await;
                    }
                }
                None => break,
            },
            _ = tick.tick() => out.send(&exporter).await,
            c = control.recv() => {
                while let Ok(s) = spans.try_recv() {
                    out.batch.push(s);
                    if out.batch.len() >= MAX_BATCH {
                        out.send(&exporter).await;
                    }
                }
                out.send(&exporter).await;
                match c {
                    Some(Control::Flush(done)) => {
                        let _ = done.send(());
                    }
                    Some(Control::Shutdown(done)) => {
                        let _ = exporter.shutdown();
                        let _ = done.send(());
                        break;
                    }
                    None => break,
                }
            }
        }
    }
}

struct Outbox {
    batch: Vec<SpanData>,
    last_warned: Option<Instant>,
    url: String,
}

impl Outbox {
    async fn send(&mut self, exporter: &opentelemetry_otlp::SpanExporter) {
        if self.batch.is_empty() {
            return;
        }
        let n = self.batch.len() as u64;
        let batch = std::mem::replace(&mut self.batch, Vec::with_capacity(MAX_BATCH));
        match exporter.export(batch).await {
            Ok(()) => crate::metrics::trace_spans_exported(n),
            Err(e) => {
                crate::metrics::trace_spans_dropped("export_failed", n);
                if self.last_warned.is_none_or(|t| t.elapsed() >= WARN_EVERY) {
                    self.last_warned = Some(Instant::now());
                    tracing::warn!(collector = %self.url, error = %e, spans = n,
                        "telemetry: spans dropped, the collector did not take them (logged once a minute)");
                }
            }
        }
    }
}
