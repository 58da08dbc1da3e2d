//! The HTTP endpoint Prometheus scrapes: `GET /metrics` on its own listen
//! address, apart from the gRPC port (so it needs no API token and can be
//! firewalled separately). It carries no tenant data.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use futures::future::BoxFuture;
use tokio_util::task::TaskTracker;

const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Refreshes the gauges sampled at scrape time (the server's: runs by
/// status from the database).
pub type Sampler = std::sync::Arc<dyn Fn() -> BoxFuture<'static, ()> + Send + Sync>;

/// A bound, serving metrics endpoint.
pub struct MetricsEndpoint {
    local_addr: SocketAddr,
}

impl MetricsEndpoint {
    /// The bound address (useful with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }
}

/// Bind `addr` and serve `GET /metrics` until `shutdown` fires.
pub async fn serve(
    addr: SocketAddr,
    sampler: Sampler,
    shutdown: CancellationToken,
    tasks: &TaskTracker,
) -> anyhow::Result<MetricsEndpoint> {
    let listener = TcpListener::bind(addr).await.with_context(|| format!("metrics: listening on {addr}"))?;
    let local_addr = listener.local_addr()?;
    let connections = tasks.clone();
    tasks.spawn(async move {
        loop {
            let (stream, peer) = tokio::select! {
                _ = shutdown.cancelled() => return,
                accepted = listener.accept() => match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        warn!(error = %e, "metrics: accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
            };
            let sampler = sampler.clone();
            let shutdown = shutdown.clone();
            connections.spawn(async move {
                let service = service_fn(move |req| respond(req, sampler.clone()));
                let conn = http1::Builder::new().serve_connection(TokioIo::new(stream), service);
                tokio::select! {
                    _ = shutdown.cancelled() => {}
                    r = conn => if let Err(e) = r {
                        debug!(%peer, error = %e, "metrics: connection ended with an error");
                    },
                }
            });
        }
    });
    Ok(MetricsEndpoint { local_addr })
}

async fn respond(req: Request<Incoming>, sampler: Sampler) -> Result<Response<Full<Bytes>>, Infallible> {
    let (status, content_type, body) = match (req.method(), req.uri().path()) {
        (&Method::GET, "/metrics") => {
            sampler().await;
            (StatusCode::OK, CONTENT_TYPE, super::registry().encode())
        }
        (_, "/metrics") => {
            (StatusCode::METHOD_NOT_ALLOWED, "text/plain; charset=utf-8", "use GET\n".to_string())
        }
        _ => (StatusCode::NOT_FOUND, "text/plain; charset=utf-8", "metrics are at /metrics\n".to_string()),
    };
    let response = Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, content_type)
        .body(Full::new(Bytes::from(body)))
        .expect("static response parts are valid");
    Ok(response)
}
