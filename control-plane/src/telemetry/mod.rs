//! OpenTelemetry traces: off unless the standard variables ask for them.
//!
//! `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`)
//! turns export on, over OTLP/gRPC; `OTEL_SERVICE_NAME` names the service
//! (default `sandhold`); `OTEL_TRACES_SAMPLER` / `OTEL_TRACES_SAMPLER_ARG`
//! choose the sampler (read by the SDK); `OTEL_SDK_DISABLED=true` or
//! `OTEL_TRACES_EXPORTER=none` keep it off. The spans are the `tracing`
//! spans the code opens anyway, bridged by `tracing-opentelemetry`.
//!
//! Export never holds up or fails the server: spans go through the SDK's
//! batch processor (its own thread, a bounded queue that drops when full),
//! and an unreachable collector costs a warning. [`propagation`] carries W3C
//! `traceparent` across gRPC calls in both directions.

pub mod calls;
mod export;
pub mod propagation;

use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::registry::LookupSpan;

/// The variables that turn export on (the per-signal one first).
pub const ENDPOINT_VARS: [&str; 2] = ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"];

/// How long a flush at exit may take before the process goes anyway.
const FLUSH_BOUND: Duration = Duration::from_secs(5);

/// Whether the environment asks for traces.
pub fn configured() -> bool {
    configured_in(|k| std::env::var(k).ok())
}

fn configured_in(var: impl Fn(&str) -> Option<String>) -> bool {
    let set = |k: &str| var(k).is_some_and(|v| !v.trim().is_empty());
    let off = var("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
        || var("OTEL_TRACES_EXPORTER").is_some_and(|v| v.trim().eq_ignore_ascii_case("none"));
    !off && ENDPOINT_VARS.iter().any(|k| set(k))
}

/// The exporter of this process, while traces are on. Dropping it without
/// [`Tracing::flush`] loses the spans still queued.
pub struct Tracing {
    provider: SdkTracerProvider,
}

impl Tracing {
    /// The exporter the environment asks for, or `None` (traces off).
    /// `default_service` names the service when `OTEL_SERVICE_NAME` does
    /// not. Must run inside a Tokio runtime (the gRPC channel lives on it);
    /// connects lazily, so an absent collector is not an error here.
    pub fn from_env(default_service: &'static str) -> Option<Self> {
        if !configured() {
            return None;
        }
        let exporter = opentelemetry_otlp::SpanExporter::builder().with_tonic().build();
        let exporter = match exporter {
            Ok(e) => e,
            Err(e) => {
                // Nothing is subscribed yet: stderr is where this can go.
                eprintln!("warning: traces off: the OTLP exporter could not be built: {e}");
                return None;
            }
        };
        // A service name set in the environment is the SDK's own
        // detector's to read.
        let mut resource = Resource::builder();
        if std::env::var("OTEL_SERVICE_NAME").ok().is_none_or(|v| v.is_empty()) {
            resource = resource.with_service_name(default_service);
        }
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(export::Warned::new(exporter))
            .with_resource(resource.build())
            .build();
        Some(Self { provider })
    }

    /// The `tracing` layer that turns spans into exported OpenTelemetry
    /// spans: Sandhold's own spans at `info` and above, whatever the log
    /// filter says (the transport's spans, and the exporter's own gRPC
    /// calls, stay out).
    pub fn layer<S>(&self) -> impl tracing_subscriber::Layer<S> + use<S>
    where
        S: tracing::Subscriber + for<'span> LookupSpan<'span>,
    {
        use tracing_subscriber::Layer as _;
        tracing_opentelemetry::layer()
            .with_tracer(self.provider.tracer("sandhold"))
            .with_tracked_inactivity(false)
            .with_threads(false)
            .with_location(false)
            .with_filter(
                tracing_subscriber::filter::Targets::new().with_target("control_plane", tracing::Level::INFO),
            )
    }

    /// Send what is queued and stop the exporter, within a bound. Blocks:
    /// call it outside the runtime's tasks (the runtime must still run).
    pub fn flush(self) {
        if let Err(e) = self.provider.shutdown_with_timeout(FLUSH_BOUND) {
            tracing::warn!(error = %e, "traces: the last spans were not all exported");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::configured_in;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| (*v).to_owned())
    }

    #[test]
    fn off_unless_an_endpoint_is_named() {
        assert!(!configured_in(env(&[])));
        assert!(!configured_in(env(&[("OTEL_SERVICE_NAME", "x"), ("OTEL_TRACES_SAMPLER", "always_on")])));
        assert!(!configured_in(env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", " ")])));
        assert!(configured_in(env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317")])));
        assert!(configured_in(env(&[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://127.0.0.1:4317")])));
    }

    #[test]
    fn the_standard_switches_turn_it_off() {
        let on = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317");
        assert!(!configured_in(env(&[on, ("OTEL_SDK_DISABLED", "TRUE")])));
        assert!(!configured_in(env(&[on, ("OTEL_TRACES_EXPORTER", "none")])));
        assert!(configured_in(env(&[on, ("OTEL_TRACES_EXPORTER", "otlp")])));
    }
}
