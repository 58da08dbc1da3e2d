//! Request deadlines for calls that are not streams: a unary call's handler
//! that takes longer than its method's deadline is dropped (its work
//! cancelled) and the client gets `DEADLINE_EXCEEDED`. Streams are bounded
//! otherwise (keepalive drops a vanished peer; a run's stream ends with the
//! run); `Exec` is bounded by its own `timeout_ms` (see
//! [`crate::sandbox`]'s default). A client's shorter `grpc-timeout` still
//! applies on top (tonic honours it).

use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use shared::error::{Error as WireError, ErrorCode};
use tonic::body::Body;

/// Deadlines by kind of call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadlines {
    /// Reads and small writes of records: definitions, sandboxes' and runs'
    /// records, file metadata, cancel.
    pub quick: Duration,
    /// Calls that move a sandbox or a snapshot: destroy, save, fork, delete,
    /// sweep.
    pub long: Duration,
}

impl Default for Deadlines {
    fn default() -> Self {
        Self { quick: Duration::from_secs(30), long: Duration::from_secs(600) }
    }
}

/// Unary methods of the public API that move sandboxes or snapshots.
const LONG: &[&str] = &[
    "/sandhold.v1.SandboxService/DestroySandbox",
    "/sandhold.v1.SandboxService/GitPush",
    "/sandhold.v1.SandboxService/GitPull",
    "/sandhold.v1.SnapshotService/SaveSnapshot",
    "/sandhold.v1.SnapshotService/ForkSnapshot",
    "/sandhold.v1.SnapshotService/DeleteSnapshot",
    "/sandhold.v1.AdminService/Sweep",
];

/// Unary methods bounded by their own request: `Exec` runs a command for up
/// to its `timeout_ms`.
const OWN_BOUND: &[&str] = &["/sandhold.v1.SandboxService/Exec"];

/// Streaming methods: no deadline of the server's.
const STREAMS: &[&str] = &[
    "/sandhold.v1.RunService/StartRun",
    "/sandhold.v1.RunService/AttachRun",
    "/sandhold.v1.SandboxService/EnsureSandbox",
    "/sandhold.v1.SandboxService/ExecStream",
    "/sandhold.v1.SandboxService/ReadFile",
    "/sandhold.v1.SandboxService/WriteFile",
    "/sandhold.v1.SandboxService/WatchFiles",
    "/sandhold.v1.SandboxService/ConnectPort",
    "/sandhold.v1.SandboxService/OpenTerminal",
    "/sandhold.v1.SnapshotService/ReadArtifact",
    "/grpc.health.v1.Health/Watch",
];

impl Deadlines {
    /// The deadline of the method at `path`; `None` for streams, for calls
    /// bounded by their own request, and for reflection (a stream).
    pub fn of(&self, path: &str) -> Option<Duration> {
        if STREAMS.contains(&path) || OWN_BOUND.contains(&path) || path.starts_with("/grpc.reflection.") {
            None
        } else if LONG.contains(&path) {
            Some(self.long)
        } else {
            Some(self.quick)
        }
    }
}

/// Tower layer that applies [`Deadlines`] to every call.
#[derive(Clone)]
pub struct DeadlineLayer {
    deadlines: Deadlines,
}

impl DeadlineLayer {
    pub fn new(deadlines: Deadlines) -> Self {
        Self { deadlines }
    }
}

impl<S> tower::Layer<S> for DeadlineLayer {
    type Service = DeadlineService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        DeadlineService { inner, deadlines: self.deadlines }
    }
}

#[derive(Clone)]
pub struct DeadlineService<S> {
    inner: S,
    deadlines: Deadlines,
}

impl<S> tower::Service<http::Request<Body>> for DeadlineService<S>
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
        let path = request.uri().path().to_owned();
        let future = self.inner.call(request);
        let Some(deadline) = self.deadlines.of(&path) else { return Box::pin(future) };
        Box::pin(async move {
            match tokio::time::timeout(deadline, future).await {
                Ok(answer) => answer,
                Err(_) => {
                    tracing::warn!(path, deadline_ms = deadline.as_millis(), "call exceeded its deadline");
                    let error = WireError::new(
                        ErrorCode::DeadlineExceeded,
                        format!("{path} took longer than its deadline of {} s", deadline.as_secs_f64()),
                    )
                    .with_meta("deadline_ms", deadline.as_millis().to_string());
                    Ok(tonic::Status::from(error).into_http())
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use prost_reflect::DescriptorPool;
    use tower::{Layer, ServiceExt};

    use super::*;

    /// A service that answers after `delay`.
    #[derive(Clone)]
    struct Slow(Duration);

    impl tower::Service<http::Request<Body>> for Slow {
        type Response = http::Response<Body>;
        type Error = Infallible;
        type Future = BoxFuture<'static, Result<Self::Response, Infallible>>;

        fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _request: http::Request<Body>) -> Self::Future {
            let delay = self.0;
            Box::pin(async move {
                tokio::time::sleep(delay).await;
                Ok(http::Response::new(Body::default()))
            })
        }
    }

    fn call(path: &str) -> http::Request<Body> {
        http::Request::builder().uri(path).body(Body::default()).unwrap()
    }

    #[tokio::test]
    async fn a_unary_call_past_its_deadline_is_deadline_exceeded_and_a_stream_is_not_cut() {
        // Margins one way only: a call that takes far longer than its
        // deadline, or none at all against a long one.
        let deadlines = Deadlines { quick: Duration::from_millis(100), long: Duration::from_secs(30) };
        let layer = DeadlineLayer::new(deadlines);
        let slow = |ms| layer.layer(Slow(Duration::from_millis(ms)));

        let late = slow(5_000).oneshot(call("/sandhold.v1.RunService/GetRun")).await.unwrap();
        let status = tonic::Status::from_header_map(late.headers()).expect("a gRPC status");
        assert_eq!(status.code(), tonic::Code::DeadlineExceeded, "{status:?}");
        assert!(status.message().contains("GetRun"), "{status:?}");
        let wire = WireError::from_status(&status);
        assert_eq!(wire.metadata.get("deadline_ms").map(String::as_str), Some("100"));

        let in_time = slow(0).oneshot(call("/sandhold.v1.RunService/GetRun")).await.unwrap();
        assert!(tonic::Status::from_header_map(in_time.headers()).is_none(), "{:?}", in_time.headers());
        let long = slow(500).oneshot(call("/sandhold.v1.SnapshotService/SaveSnapshot")).await.unwrap();
        assert!(tonic::Status::from_header_map(long.headers()).is_none(), "a long call is not quick");
        let stream = slow(500).oneshot(call("/sandhold.v1.RunService/AttachRun")).await.unwrap();
        assert!(tonic::Status::from_header_map(stream.headers()).is_none(), "a stream has no deadline");
        let exec = slow(500).oneshot(call("/sandhold.v1.SandboxService/Exec")).await.unwrap();
        assert!(
            tonic::Status::from_header_map(exec.headers()).is_none(),
            "Exec is bounded by its own timeout"
        );
    }

    /// Every method of the public API is classified as its descriptor says:
    /// a stream never gets a deadline, a unary call always does unless it is
    /// bounded by its own request. A new method fails here until placed.
    #[test]
    fn every_public_method_is_classified_by_its_kind() {
        let pool = DescriptorPool::decode(shared::PUBLIC_DESCRIPTOR_SET).unwrap();
        let deadlines = Deadlines::default();
        let mut unary = 0;
        for service in pool.services() {
            for method in service.methods() {
                let path = format!("/{}/{}", service.full_name(), method.name());
                let streaming = method.is_client_streaming() || method.is_server_streaming();
                if streaming {
                    assert!(STREAMS.contains(&path.as_str()), "{path} streams: list it in STREAMS");
                    assert_eq!(deadlines.of(&path), None, "{path}");
                } else {
                    unary += 1;
                    assert!(!STREAMS.contains(&path.as_str()), "{path} is unary, not a stream");
                    assert_eq!(deadlines.of(&path).is_none(), OWN_BOUND.contains(&path.as_str()), "{path}");
                }
            }
        }
        assert!(unary > 15, "only {unary} unary methods found");
        for listed in LONG.iter().chain(OWN_BOUND) {
            let (service, method) = listed[1..].split_once('/').unwrap();
            let found =
                pool.get_service_by_name(service).and_then(|s| s.methods().find(|m| m.name() == method));
            assert!(found.is_some(), "{listed} is not a method of the public API");
        }
    }
}
