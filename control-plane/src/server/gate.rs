//! Readiness, gated once at the router: each public service is mounted
//! behind a [`Gate`] that answers UNAVAILABLE until the service exists (the
//! server builds the services only once the stores are open). Handlers
//! never check readiness themselves.

use std::convert::Infallible;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use shared::error::{Error, ErrorCode};
use tonic::body::Body;
use tonic::server::NamedService;
use tower::{Service, ServiceExt};

/// Where the server puts a service once it is built.
pub struct Slot<S>(Arc<OnceLock<S>>);

impl<S> Slot<S> {
    /// Open the gate. A second fill is ignored (the first service stays).
    pub fn fill(&self, service: S) {
        let _ = self.0.set(service);
    }
}

/// A service that is UNAVAILABLE until its [`Slot`] is filled.
pub struct Gate<S> {
    slot: Arc<OnceLock<S>>,
}

impl<S> Clone for Gate<S> {
    fn clone(&self) -> Self {
        Self { slot: self.slot.clone() }
    }
}

/// A closed gate and the slot that opens it.
pub fn gate<S>() -> (Gate<S>, Slot<S>) {
    let slot = Arc::new(OnceLock::new());
    (Gate { slot: slot.clone() }, Slot(slot))
}

impl<S: NamedService> NamedService for Gate<S> {
    const NAME: &'static str = S::NAME;
}

impl<S> Service<http::Request<Body>> for Gate<S>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        match self.slot.get() {
            Some(service) => Box::pin(service.clone().oneshot(request)),
            None => Box::pin(async {
                let starting =
                    Error::new(ErrorCode::Unavailable, "the server is starting: stores are not ready yet");
                Ok(tonic::Status::from(starting).into_http())
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use tonic::body::Body;
    use tower::ServiceExt;

    use super::*;

    /// A service that answers every call with 200 and "inner".
    #[derive(Clone)]
    struct Inner;

    impl NamedService for Inner {
        const NAME: &'static str = "test.Inner";
    }

    impl Service<http::Request<Body>> for Inner {
        type Response = http::Response<Body>;
        type Error = Infallible;
        type Future = std::future::Ready<Result<Self::Response, Infallible>>;

        fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _request: http::Request<Body>) -> Self::Future {
            let mut response = http::Response::new(Body::default());
            response.headers_mut().insert("x-answered-by", http::HeaderValue::from_static("inner"));
            std::future::ready(Ok(response))
        }
    }

    fn request() -> http::Request<Body> {
        http::Request::builder().uri("/test.Inner/Call").body(Body::default()).unwrap()
    }

    #[tokio::test]
    async fn a_closed_gate_is_unavailable_and_an_open_one_delegates() {
        let (gate, slot) = gate::<Inner>();
        assert_eq!(<Gate<Inner> as NamedService>::NAME, "test.Inner");

        let closed = gate.clone().oneshot(request()).await.unwrap();
        let status = tonic::Status::from_header_map(closed.headers()).expect("a gRPC status");
        assert_eq!(status.code(), tonic::Code::Unavailable);
        assert!(status.message().contains("starting"), "{status:?}");
        assert!(closed.headers().get("x-answered-by").is_none());

        slot.fill(Inner);
        let open = gate.oneshot(request()).await.unwrap();
        assert_eq!(open.headers().get("x-answered-by").unwrap(), "inner");
        assert!(tonic::Status::from_header_map(open.headers()).is_none());
    }
}
