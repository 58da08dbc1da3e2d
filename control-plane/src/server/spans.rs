//! A span for each call of the API, named `service/Method` as OpenTelemetry
//! names RPCs, continuing the caller's trace when the request carries W3C
//! `traceparent` (the CLI, the Python and TypeScript clients send it). A
//! stream's span lasts until its response body ends, and records the gRPC
//! status from the trailers. Health checks and reflection get none: load
//! balancers poll them, and they say nothing about the work.

use std::pin::Pin;
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use http_body::Frame;
use tonic::body::Body;
use tracing::Instrument as _;

/// Tower layer opening the call spans.
#[derive(Clone, Default)]
pub struct SpanLayer;

impl<S> tower::Layer<S> for SpanLayer {
    type Service = SpanService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        SpanService { inner }
    }
}

#[derive(Clone)]
pub struct SpanService<S> {
    inner: S,
}

/// The span of a call to `path` (`/package.Service/Method`), or `None` for
/// what is not a call of Sandhold's API.
fn call_span(path: &str) -> Option<tracing::Span> {
    let (service, method) = path.strip_prefix('/')?.split_once('/')?;
    if !service.starts_with("sandhold.") {
        return None;
    }
    Some(tracing::info_span!(
        "rpc",
        otel.name = %format!("{service}/{method}"),
        otel.kind = "server",
        otel.status_code = tracing::field::Empty,
        rpc.system = "grpc",
        rpc.service = service,
        rpc.method = method,
        rpc.grpc.status_code = tracing::field::Empty,
    ))
}

/// Note a `grpc-status` (a header of a trailers-only answer, or a trailer).
fn record_status(span: &tracing::Span, headers: &http::HeaderMap) {
    let Some(code) = headers.get("grpc-status").and_then(|v| v.to_str().ok()?.parse::<i64>().ok()) else {
        return;
    };
    span.record("rpc.grpc.status_code", code);
    if code != 0 {
        span.record("otel.status_code", "ERROR");
    }
}

impl<S> tower::Service<http::Request<Body>> for SpanService<S>
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
        let Some(span) = call_span(request.uri().path()) else {
            return Box::pin(self.inner.call(request));
        };
        crate::telemetry::propagation::continue_from(&span, request.headers());
        // Entered while the handler is called, so what it spawns (a run's
        // drive) can take the call as its parent.
        let future = span.in_scope(|| self.inner.call(request));
        Box::pin(
            async move {
                let response = future.await?;
                let span = tracing::Span::current();
                record_status(&span, response.headers());
                Ok(response.map(|body| Body::new(Spanned { body, span })))
            }
            .instrument(span),
        )
    }
}

/// A response body that keeps its call's span open until it ends.
struct Spanned {
    body: Body,
    span: tracing::Span,
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

#[cfg(test)]
mod tests {
    use super::call_span;

    #[test]
    fn only_calls_of_the_api_get_a_span() {
        // No subscriber here: the spans are disabled, but made or not.
        assert!(call_span("/sandhold.v1.RunService/StartRun").is_some());
        assert!(call_span("/grpc.health.v1.Health/Check").is_none());
        assert!(call_span("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo").is_none());
        assert!(call_span("/").is_none());
        assert!(call_span("/runs/abc").is_none(), "a console page");
    }
}
