//! What the server is doing for its callers: calls in flight (a stream
//! counts until its response body ends) and when the last one ended. The
//! per-user background server stops after a quiet period
//! (`cli/daemon.rs`); a shell or an attach that streams for an hour keeps
//! it up as surely as a run does.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use http_body::Frame;
use tonic::body::Body;

/// Cheap to clone; every clone counts into the same numbers.
#[derive(Clone)]
pub struct Activity(Arc<Inner>);

struct Inner {
    since: Instant,
    in_flight: AtomicUsize,
    /// Milliseconds after `since` when the last call ended (or began).
    last_ms: AtomicU64,
}

impl Default for Activity {
    fn default() -> Self {
        Self(Arc::new(Inner {
            since: Instant::now(),
            in_flight: AtomicUsize::new(0),
            last_ms: AtomicU64::new(0),
        }))
    }
}

impl Activity {
    /// Calls whose response has not ended.
    pub fn in_flight(&self) -> usize {
        self.0.in_flight.load(Ordering::Acquire)
    }

    /// How long no call has been in flight (zero while one is).
    pub fn quiet_for(&self) -> Duration {
        if self.in_flight() > 0 {
            return Duration::ZERO;
        }
        let last = Duration::from_millis(self.0.last_ms.load(Ordering::Acquire));
        self.0.since.elapsed().saturating_sub(last)
    }

    fn touch(&self) {
        let now = u64::try_from(self.0.since.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.0.last_ms.fetch_max(now, Ordering::AcqRel);
    }

    fn begin(&self) -> CallGuard {
        self.0.in_flight.fetch_add(1, Ordering::AcqRel);
        self.touch();
        CallGuard(self.clone())
    }
}

/// One call in flight, until dropped.
struct CallGuard(Activity);

impl Drop for CallGuard {
    fn drop(&mut self) {
        self.0.touch();
        self.0.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Tower layer counting every call into an [`Activity`].
#[derive(Clone)]
pub struct ActivityLayer(pub Activity);

impl<S> tower::Layer<S> for ActivityLayer {
    type Service = ActivityService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ActivityService { inner, activity: self.0.clone() }
    }
}

#[derive(Clone)]
pub struct ActivityService<S> {
    inner: S,
    activity: Activity,
}

impl<S> tower::Service<http::Request<Body>> for ActivityService<S>
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
        let guard = self.activity.begin();
        let future = self.inner.call(request);
        Box::pin(async move {
            let response = future.await?;
            Ok(response.map(|body| Body::new(Counted { body, _guard: guard })))
        })
    }
}

/// A response body that holds its call's guard until it ends or is dropped.
struct Counted {
    body: Body,
    _guard: CallGuard,
}

impl http_body::Body for Counted {
    type Data = bytes::Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
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
    use std::convert::Infallible;

    use http_body_util::BodyExt;
    use tower::{Layer, ServiceExt};

    use super::*;

    #[derive(Clone)]
    struct Echo;

    impl tower::Service<http::Request<Body>> for Echo {
        type Response = http::Response<Body>;
        type Error = Infallible;
        type Future = BoxFuture<'static, Result<Self::Response, Infallible>>;

        fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, request: http::Request<Body>) -> Self::Future {
            Box::pin(async move { Ok(http::Response::new(request.into_body())) })
        }
    }

    /// A streaming answer keeps the call in flight until its body is done:
    /// the background server must not stop under a long attach or shell.
    #[tokio::test]
    async fn a_call_is_in_flight_until_its_response_body_ends() {
        let activity = Activity::default();
        let service = ActivityLayer(activity.clone()).layer(Echo);
        let response = service.oneshot(http::Request::new(Body::new(String::from("x")))).await.unwrap();
        assert_eq!(activity.in_flight(), 1, "answered, but its body is still open");
        assert_eq!(activity.quiet_for(), Duration::ZERO);
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"x");
        assert_eq!(activity.in_flight(), 0, "the body ended and was dropped");
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert!(activity.quiet_for() >= Duration::from_millis(30));
    }
}
