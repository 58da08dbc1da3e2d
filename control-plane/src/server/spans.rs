//! A span for each call of the API, named `service/Method` as OpenTelemetry
//! names RPCs, continuing the caller's trace when the request carries W3C
//! `traceparent` (the CLI, the Python and TypeScript clients send it). A
//! stream's span lasts until its response body ends, and records the gRPC
//! status from the trailers. Health checks and reflection get none: load
//! balancers poll them, and they say nothing about the work.

use std::task::{Context, Poll};

use futures::future::BoxFuture;
use tonic::body::Body;

use crate::telemetry::calls::{in_span, rpc_of, rpc_span};

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
    let (service, method) = rpc_of(path)?;
    if !service.starts_with("sandhold.") {
        return None;
    }
    Some(rpc_span("server", service, method))
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
        in_span(span, future)
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
