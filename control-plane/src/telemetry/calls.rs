//! The spans of gRPC calls, both ways: a span's response body that keeps
//! it open until a stream ends and notes the call's `grpc-status`
//! ([`Spanned`]), used by the API's call spans (`server/spans.rs`), and
//! [`Traced`], the control plane's side of each call to a sandbox agent (a
//! client span under whatever span made the call: a run's drive, an
//! ensure's step, an API call). The agent records no spans of its own and
//! has no network: its side is this one, timed from here.

use std::pin::Pin;
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use http_body::Frame;
use tonic::body::Body;
use tracing::Instrument as _;

/// Note a `grpc-status` (a header of a trailers-only answer, or a trailer)
/// on `span`; a code other than OK marks it an error.
pub fn record_status(span: &tracing::Span, headers: &http::HeaderMap) {
    let Some(code) = headers.get("grpc-status").and_then(|v| v.to_str().ok()?.parse::<i64>().ok()) else {
        return;
    };
    span.record("rpc.grpc.status_code", code);
    if code != 0 {
        span.record("otel.status_code", "ERROR");
    }
}

/// A response body that keeps its call's span open until it ends, and
/// notes the status its trailers carry.
pub struct Spanned {
    pub body: Body,
    pub span: tracing::Span,
}

impl http_body::Body for Spanned {
    type Data = bytes::Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled
            && let Some(trailers) = frame.trailers_ref()
        {
            record_status(&self.span, trailers);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// The `(service, method)` of a gRPC path (`/package.Service/Method`).
pub fn rpc_of(path: &str) -> Option<(&str, &str)> {
    path.strip_prefix('/')?.split_once('/')
}

/// A channel to a sandbox agent whose every call is a client span,
/// `sandhold.agent.v1.Service/Method`, open until its response ends (a
/// `Follow` stream: as long as it is read).
#[derive(Clone)]
pub struct Traced<S> {
    inner: S,
}

impl<S> Traced<S> {
    pub fn new(inner: S) -> Self {
        Self { inner }
    }
}

/// The span of one gRPC call of `service`'s `method`, as OpenTelemetry
/// names RPCs; `kind`: `server` (a call of the API) or `client` (the
/// control plane calling an agent).
pub fn rpc_span(kind: &'static str, service: &str, method: &str) -> tracing::Span {
    tracing::info_span!(
        "rpc",
        otel.name = %format!("{service}/{method}"),
        otel.kind = kind,
        otel.status_code = tracing::field::Empty,
        rpc.system = "grpc",
        rpc.service = service,
        rpc.method = method,
        rpc.grpc.status_code = tracing::field::Empty,
    )
}

fn agent_call_span(path: &str) -> tracing::Span {
    let (service, method) = rpc_of(path).unwrap_or(("unknown", path));
    rpc_span("client", service, method)
}

impl<S> tower::Service<http::Request<Body>> for Traced<S>
where
    S: tower::Service<http::Request<Body>, Response = http::Response<Body>> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let span = agent_call_span(request.uri().path());
        in_span(span, self.inner.call(request))
    }
}

/// A call's response (`call`, the inner service's future) under `span`,
/// its body keeping the span open until it ends.
pub fn in_span<E>(
    span: tracing::Span,
    call: impl Future<Output = Result<http::Response<Body>, E>> + Send + 'static,
) -> BoxFuture<'static, Result<http::Response<Body>, E>> {
    Box::pin(
        async move {
            let response = call.await?;
            let span = tracing::Span::current();
            record_status(&span, response.headers());
            Ok(response.map(|body| Body::new(Spanned { body, span })))
        }
        .instrument(span),
    )
}
