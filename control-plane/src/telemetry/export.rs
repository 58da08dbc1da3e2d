//! The OTLP exporter, wrapped so that a collector that cannot be reached is
//! a warning in the log (at most one a minute, and a note when it answers
//! again) instead of a silence: the SDK's own diagnostics are not compiled in.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SpanData, SpanExporter};

const WARN_EVERY: Duration = Duration::from_secs(60);

#[derive(Debug)]
pub(super) struct Warned<E> {
    inner: E,
    /// When the last warning was written, while exports fail.
    failing: Mutex<Option<Instant>>,
}

impl<E> Warned<E> {
    pub(super) fn new(inner: E) -> Self {
        Self { inner, failing: Mutex::new(None) }
    }

    fn note(&self, result: &OTelSdkResult, spans: usize) {
        let mut failing = self.failing.lock().unwrap_or_else(|p| p.into_inner());
        match (result, *failing) {
            (Ok(()), Some(_)) => {
                *failing = None;
                tracing::info!("traces: the collector takes spans again");
            }
            (Ok(()), None) => {}
            (Err(e), last) => {
                if last.is_none_or(|at| at.elapsed() >= WARN_EVERY) {
                    *failing = Some(Instant::now());
                    tracing::warn!(error = %e, dropped_spans = spans,
                        "traces: the collector did not take a batch of spans (the server goes on without them)");
                }
            }
        }
    }
}

impl<E: SpanExporter> SpanExporter for Warned<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let spans = batch.len();
        let result = self.inner.export(batch).await;
        self.note(&result, spans);
        result
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}
