//! The request path as one tower stack: every step of the order of checks
//! (docs/design.md §12 "HTTP front", "Order of checks") is a layer, composed once in
//! `front::build` (src/front/mod.rs), and the first step that answers ends the request.
//! This file holds the machinery the steps share and names none of them.
//!
//! A step is a [`Step`] (it decides without waiting, and may touch the response on the
//! way out) or an [`AsyncStep`] (it waits before it decides): it passes the request
//! on, with what it learned in the request's extensions, or returns the response that
//! refuses it. [`StepLayer`] makes either a tower layer (an `AsyncStep` marked
//! [`Async`]), so a step holds no tower plumbing and stays a plain function of the
//! request.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use hyper::body::Incoming;
use parking_lot::Mutex;
use tower::{Layer, Service};

use super::reply::Body;
use crate::upstream::Upstream;

/// A request as hyper hands it over.
pub(super) type Req = Request<Incoming>;
/// Every answer of the stack.
pub(super) type Resp = Response<Body>;
/// The future of each layer's service: boxed, so the composed type stays nameable.
pub(super) type RespFuture = Pin<Box<dyn Future<Output = Result<Resp, Infallible>> + Send>>;

/// A step that decides before the rest of the stack runs, without waiting: it passes
/// the request on (keeping what it needs for the response) or answers it, and it may
/// touch the response on the way out.
/// Steps before the body read take a [`Req`]; those after it a [`ReadRequest`].
pub(super) trait Step<R = Req>: Clone + Send + Sync + 'static {
    /// What the step keeps from the request for [`Step::after`].
    type Kept: Send + 'static;

    /// Pass the request on, or refuse it with the response to send.
    // The refusal is the response itself, moved once to the client; boxing it would
    // add an allocation to every refused request for nothing.
    #[allow(clippy::result_large_err)]
    fn before(&self, req: &mut R) -> Result<Self::Kept, Resp>;

    /// The response of the rest of the stack, on its way out.
    fn after(&self, _kept: Self::Kept, _resp: &mut Resp) {}
}

/// A step that waits before it decides (auth may fetch keys; the body read waits for
/// the body), and may hand the next step another type (the body read).
pub(super) trait AsyncStep<In>: Clone + Send + Sync + 'static {
    /// What the next step receives.
    type Out: Send + 'static;

    /// Pass the request on, or refuse it with the response to send.
    fn check(&self, req: In) -> impl Future<Output = Result<Self::Out, Resp>> + Send;
}

/// A [`Step`], or an [`AsyncStep`] marked [`Async`], as a tower layer.
#[derive(Clone)]
pub(super) struct StepLayer<T>(pub(super) T);

impl<T: Clone, S> Layer<S> for StepLayer<T> {
    type Service = StepService<T, S>;

    fn layer(&self, inner: S) -> Self::Service {
        StepService {
            step: self.0.clone(),
            inner,
        }
    }
}

/// The service of a [`StepLayer`]: runs the step, then the rest of the stack.
#[derive(Clone)]
pub(super) struct StepService<T, S> {
    step: T,
    inner: S,
}

impl<T, S> Service<Req> for StepService<T, S>
where
    T: Step,
    S: Service<Req, Response = Resp, Error = Infallible>,
    S::Future: Send + 'static,
{
    type Response = Resp;
    type Error = Infallible;
    type Future = RespFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        run_step(&self.step, &mut self.inner, req)
    }
}

/// Marks a [`Step`] over a [`ReadRequest`], one that runs after the body read, for
/// [`StepLayer`]. Such a step only decides: its [`Step::after`] is not run, so the
/// inner service's future is returned as it is, without a box of its own (every
/// request passes it).
#[derive(Clone)]
pub(super) struct Read<T>(pub(super) T);

impl<T, S> Service<ReadRequest> for StepService<Read<T>, S>
where
    T: Step<ReadRequest, Kept = ()>,
    S: Service<ReadRequest, Response = Resp, Error = Infallible, Future = RespFuture>,
{
    type Response = Resp;
    type Error = Infallible;
    type Future = RespFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: ReadRequest) -> Self::Future {
        match self.step.0.before(&mut req) {
            Ok(()) => self.inner.call(req),
            Err(answer) => Box::pin(std::future::ready(Ok(answer))),
        }
    }
}

/// Run `step`, then the rest of the stack unless the step answered.
fn run_step<T, S>(step: &T, inner: &mut S, mut req: Req) -> RespFuture
where
    T: Step,
    S: Service<Req, Response = Resp, Error = Infallible>,
    S::Future: Send + 'static,
{
    let kept = match step.before(&mut req) {
        Ok(kept) => kept,
        Err(answer) => return Box::pin(std::future::ready(Ok(answer))),
    };
    // The step decided without waiting, so the inner service `poll_ready` made
    // ready is called here and needs no clone.
    let next = inner.call(req);
    let step = step.clone();
    Box::pin(async move {
        let mut resp = next.await?;
        step.after(kept, &mut resp);
        Ok(resp)
    })
}

/// Marks an [`AsyncStep`] for [`StepLayer`] (a type could be both kinds of step; the
/// mark says which one the layer runs).
#[derive(Clone)]
pub(super) struct Async<T>(pub(super) T);

impl<In, T, S> Service<In> for StepService<Async<T>, S>
where
    In: Send + 'static,
    T: AsyncStep<In>,
    S: Service<T::Out, Response = Resp, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = Resp;
    type Error = Infallible;
    type Future = RespFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: In) -> Self::Future {
        let step = self.step.0.clone();
        let mut inner = take_ready(&mut self.inner);
        Box::pin(async move {
            match step.check(req).await {
                Ok(next) => inner.call(next).await,
                Err(answer) => Ok(answer),
            }
        })
    }
}

/// The inner service that `poll_ready` made ready, leaving a clone in its place: the
/// ready one is what the future may call (tower's `Service` contract).
pub(super) fn take_ready<S: Clone>(slot: &mut S) -> S {
    let clone = slot.clone();
    std::mem::replace(slot, clone)
}

/// The upstream whose path the request named (set by the path step).
#[derive(Clone)]
pub(super) struct Target(pub(super) Arc<Upstream>);

/// When the HTTP request arrived: the start of `sync_timeout_ms` (docs/design.md §2
/// "Clients without the tasks extension"). Set by the request-log layer.
#[derive(Clone, Copy)]
pub(super) struct Received(pub(super) tokio::time::Instant);

/// What the per-request log line says about a request, filled by the steps that learn
/// it (auth: tenant and subject; the JSON-RPC service: method and task).
#[derive(Clone, Default)]
pub(super) struct LogFields(Arc<Mutex<ReqLog>>);

#[derive(Default, Clone)]
pub(super) struct ReqLog {
    pub(super) method: Option<crate::protocol::Method>,
    pub(super) tenant: Option<String>,
    pub(super) subject: Option<String>,
    pub(super) task_id: Option<String>,
}

impl LogFields {
    pub(super) fn update(&self, f: impl FnOnce(&mut ReqLog)) {
        f(&mut self.0.lock());
    }

    pub(super) fn snapshot(&self) -> ReqLog {
        self.0.lock().clone()
    }
}

/// A request whose body has been read (within `max_body_bytes` and the body timeout).
pub(super) type ReadRequest = Request<Bytes>;
