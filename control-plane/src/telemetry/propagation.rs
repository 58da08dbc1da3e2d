//! W3C trace context over gRPC metadata: taken from a caller's request (so
//! a Python or TypeScript caller's trace continues into the server), and put
//! on the requests this process makes (the CLI's calls).

use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// Make `span` a child of the trace context in `headers`, if they carry
/// one (`traceparent`, `tracestate`); otherwise it stays a root.
pub fn continue_from(span: &tracing::Span, headers: &http::HeaderMap) {
    let parent = TraceContextPropagator::new().extract(&Headers(headers));
    if opentelemetry::trace::TraceContextExt::has_active_span(&parent) {
        // Fails only when traces are off (no layer to hold the parent).
        let _ = span.set_parent(parent);
    }
}

/// Put the current span's trace context on an outgoing request.
pub fn inject_current(metadata: &mut tonic::metadata::MetadataMap) {
    let context = tracing::Span::current().context();
    TraceContextPropagator::new().inject_context(&context, &mut Metadata(metadata));
}

struct Headers<'a>(&'a http::HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

struct Metadata<'a>(&'a mut tonic::metadata::MetadataMap);

impl Injector for Metadata<'_> {
    fn set(&mut self, key: &str, value: String) {
        let key = tonic::metadata::MetadataKey::from_bytes(key.as_bytes());
        if let (Ok(key), Ok(value)) = (key, value.parse()) {
            self.0.insert(key, value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_context_is_injected_without_a_span_in_a_trace() {
        let mut metadata = tonic::metadata::MetadataMap::new();
        inject_current(&mut metadata);
        assert!(metadata.get("traceparent").is_none());
    }

    #[test]
    fn a_traceparent_header_is_read() {
        let mut headers = http::HeaderMap::new();
        headers.insert(
            "traceparent",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".parse().unwrap(),
        );
        let parent = TraceContextPropagator::new().extract(&Headers(&headers));
        use opentelemetry::trace::TraceContextExt;
        let span = parent.span();
        let context = span.span_context();
        assert_eq!(context.trace_id().to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(context.span_id().to_string(), "00f067aa0ba902b7");
        assert!(context.is_remote() && context.is_sampled());
    }
}
