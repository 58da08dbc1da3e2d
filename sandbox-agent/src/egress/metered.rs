//! A model answer's body on its way to the client, read for its usage as
//! it passes: the usage is recorded in the run's ledger as soon as the
//! answer's final usage is known (its last stream event, or its last byte
//! by its length), so before the client has all of the answer; at the
//! latest when the body ends or is dropped (a client that leaves early is
//! still charged what the answer said so far).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::HeaderMap;
use http::header;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;

use super::ledger::Ledger;
use super::usage::Meter;

pub struct Metered {
    inner: Incoming,
    /// `None` once recorded (or when the answer cannot be read).
    meter: Option<Meter>,
    ledger: Arc<Ledger>,
    run_id: String,
}

impl Metered {
    pub fn new(inner: Incoming, headers: &HeaderMap, ledger: Arc<Ledger>, run_id: &str) -> Self {
        let encoded = headers
            .get(header::CONTENT_ENCODING)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| !v.trim().is_empty() && !v.trim().eq_ignore_ascii_case("identity"));
        if encoded {
            tracing::warn!(run_id, "egress broker: an encoded model answer; its usage is not read");
        }
        let content_type =
            headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or_default();
        let meter = (!encoded).then(|| Meter::new(content_type));
        Self { inner, meter, ledger, run_id: run_id.to_string() }
    }

    /// Record what the answer said, once.
    fn settle(&mut self) {
        let Some((api, usage)) = self.meter.take().and_then(Meter::finish) else { return };
        match self.ledger.record(&self.run_id, api.as_str(), usage) {
            Ok(seq) => tracing::debug!(run_id = %self.run_id, seq, "model usage recorded"),
            Err(e) => {
                tracing::error!(run_id = %self.run_id, error = %e, "egress broker: recording model usage failed")
            }
        }
    }
}

impl Body for Metered {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let (Some(meter), Some(data)) = (this.meter.as_mut(), frame.data_ref()) {
                    meter.feed(data);
                }
                if this.meter.as_ref().is_some_and(Meter::done) || this.inner.is_end_stream() {
                    this.settle();
                }
            }
            Poll::Ready(_) => this.settle(),
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Metered {
    fn drop(&mut self) {
        self.settle();
    }
}
