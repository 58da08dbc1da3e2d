//! The HTTP/1.1 listener on the sandbox's 127.0.0.1: the model broker
//! (origin-form requests carrying a route's placeholder) and the proxy
//! (`CONNECT host:port`, absolute-form `http://`), every upstream
//! connection on a carrier.

use std::convert::Infallible;
use std::sync::{Arc, RwLock};

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use shared::proto::agent::v1::{CarryDial, CarryPurpose};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::carrier::{DialError, Pool};
use super::config::{EgressConfig, Route};
use crate::vault::Vault;

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Body = BoxBody<Bytes, BoxError>;

/// What the listener serves from, swapped whole by `Configure`.
pub struct Table {
    pub config: EgressConfig,
    pub tls: Arc<rustls::ClientConfig>,
}

/// The listener's state. Shared by every connection.
pub struct Broker {
    pub table: RwLock<Arc<Table>>,
    pub pool: Pool,
    pub vault: Vault,
}

/// Accept connections until `stop`.
pub async fn serve(listener: TcpListener, broker: Arc<Broker>, stop: CancellationToken) {
    loop {
        let tcp = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => tcp,
                Err(e) => {
                    tracing::warn!(error = %e, "egress listener: accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = stop.cancelled() => return,
        };
        let broker = broker.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let broker = broker.clone();
                async move { Ok::<_, Infallible>(broker.handle(req).await) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tcp), service)
                .with_upgrades();
            tokio::select! {
                served = conn => if let Err(e) = served {
                    tracing::debug!(error = %e, "egress listener: connection ended with an error");
                },
                () = stop.cancelled() => {}
            }
        });
    }
}

impl Broker {
    fn table(&self) -> Arc<Table> {
        self.table.read().expect("egress table poisoned").clone()
    }

    async fn handle(&self, req: Request<Incoming>) -> Response<Body> {
        if req.method() == Method::CONNECT {
            self.tunnel(req).await
        } else if req.uri().scheme().is_some() {
            self.forward(req).await
        } else {
            self.broker(req).await
        }
    }

    /// The model broker: the route whose placeholder the request carries,
    /// the placeholder replaced by the secret's value.
    async fn broker(&self, req: Request<Incoming>) -> Response<Body> {
        let table = self.table();
        // Newest first: a route replaced later wins.
        let Some(route) = table.config.routes.iter().rev().find(|r| carries(req.headers(), &r.placeholder))
        else {
            return error(
                StatusCode::UNAUTHORIZED,
                "authentication_error",
                "the request carries no Sandhold placeholder key: the sandbox's model broker adds the real key \
                 only in place of the placeholder the harness was given",
            );
        };
        let Some(secret) = self.vault.latest(&route.secret_name) else {
            return error(
                StatusCode::SERVICE_UNAVAILABLE,
                "secret_missing",
                &format!(
                    "this sandbox holds no value of the secret {} for the model route {:?} (the agent restarted \
                     since it was handed over); the control plane hands it over again when it next ensures the sandbox",
                    route.secret_name, route.label
                ),
            );
        };
        let (mut parts, body) = req.into_parts();
        if let Err(why) = replace(&mut parts.headers, &route.placeholder, secret.expose()) {
            return error(StatusCode::BAD_REQUEST, "invalid_request_error", &why);
        }
        strip_hop_by_hop(&mut parts.headers);
        if let Ok(host) = HeaderValue::from_str(&route.authority()) {
            parts.headers.insert(header::HOST, host);
        }
        parts.uri = origin_form(&parts.uri);
        parts.version = http::Version::HTTP_11;
        let req = Request::from_parts(parts, body);
        let dial = CarryDial {
            host: route.host.clone(),
            port: u32::from(route.port),
            purpose: CarryPurpose::Model.into(),
            route: route.label.clone(),
        };
        let stream = match self.pool.dial(dial).await {
            Ok(stream) => stream,
            Err(e) => return dial_error(&e, &describe(route)),
        };
        let sent = if route.tls {
            match super::tls::connect(table.tls.clone(), &route.host, stream).await {
                Ok(tls) => exchange(tls, req).await,
                Err(e) => {
                    return error(
                        StatusCode::BAD_GATEWAY,
                        "api_error",
                        &format!("{}: TLS failed: {e}", describe(route)),
                    );
                }
            }
        } else {
            exchange(stream, req).await
        };
        match sent {
            Ok(resp) => response(resp),
            Err(e) => error(StatusCode::BAD_GATEWAY, "api_error", &format!("{}: {e}", describe(route))),
        }
    }

    /// The proxy's `CONNECT host:port`: a tunnel to an allowed host.
    async fn tunnel(&self, mut req: Request<Incoming>) -> Response<Body> {
        let Some((host, port)) =
            req.uri().authority().and_then(|a| Some((a.host().to_string(), a.port_u16()?)))
        else {
            return error(StatusCode::BAD_REQUEST, "invalid_request_error", "CONNECT needs host:port");
        };
        let stream = match self.proxy_dial(&host, port).await {
            Ok(stream) => stream,
            Err(resp) => return resp,
        };
        let upgrade = hyper::upgrade::on(&mut req);
        tokio::spawn(async move {
            let mut stream = stream;
            match upgrade.await {
                Ok(upgraded) => {
                    let mut client = TokioIo::new(upgraded);
                    if let Err(e) = tokio::io::copy_bidirectional(&mut client, &mut stream).await {
                        tracing::debug!(host, port, error = %e, "egress tunnel ended with an error");
                    }
                }
                Err(e) => tracing::debug!(host, port, error = %e, "egress tunnel: the client never upgraded"),
            }
        });
        Response::new(empty())
    }

    /// The proxy's absolute-form `http://host[:port]/path`.
    async fn forward(&self, req: Request<Incoming>) -> Response<Body> {
        if req.uri().scheme() != Some(&http::uri::Scheme::HTTP) {
            return error(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                "the proxy forwards http:// only; use CONNECT for https",
            );
        }
        let Some(authority) = req.uri().authority().cloned() else {
            return error(StatusCode::BAD_REQUEST, "invalid_request_error", "no host in the request's URI");
        };
        let (host, port) = (authority.host().to_string(), authority.port_u16().unwrap_or(80));
        let stream = match self.proxy_dial(&host, port).await {
            Ok(stream) => stream,
            Err(resp) => return resp,
        };
        let (mut parts, body) = req.into_parts();
        parts.headers.remove("proxy-authorization");
        strip_hop_by_hop(&mut parts.headers);
        if !parts.headers.contains_key(header::HOST)
            && let Ok(host) = HeaderValue::from_str(authority.as_str())
        {
            parts.headers.insert(header::HOST, host);
        }
        parts.uri = origin_form(&parts.uri);
        parts.version = http::Version::HTTP_11;
        match exchange(stream, Request::from_parts(parts, body)).await {
            Ok(resp) => response(resp),
            Err(e) => error(StatusCode::BAD_GATEWAY, "api_error", &format!("{host}:{port}: {e}")),
        }
    }

    /// A carrier to `host:port` for the proxy, or the response that says
    /// why not. Every attempt is dialed: the control plane alone decides
    /// (nothing in the sandbox is trusted) and records each one, refused
    /// ones included.
    async fn proxy_dial(&self, host: &str, port: u16) -> Result<tokio::io::DuplexStream, Response<Body>> {
        let dial = CarryDial {
            host: host.to_string(),
            port: u32::from(port),
            purpose: CarryPurpose::Proxy.into(),
            route: String::new(),
        };
        self.pool.dial(dial).await.map_err(|e| dial_error(&e, &format!("{host}:{port}")))
    }
}

/// "the model route L (https://host:port)", for errors.
fn describe(route: &Route) -> String {
    let scheme = if route.tls { "https" } else { "http" };
    format!("the model route {:?} ({scheme}://{}:{})", route.label, route.host, route.port)
}

/// Whether any header value carries `placeholder`.
fn carries(headers: &HeaderMap, placeholder: &str) -> bool {
    headers.values().any(|v| memchr::memmem::find(v.as_bytes(), placeholder.as_bytes()).is_some())
}

/// `placeholder` replaced by `value` in every header value that carries
/// it; the new values are marked sensitive.
fn replace(headers: &mut HeaderMap, placeholder: &str, value: &str) -> Result<(), String> {
    for (name, v) in headers.iter_mut() {
        let bytes = v.as_bytes();
        if memchr::memmem::find(bytes, placeholder.as_bytes()).is_none() {
            continue;
        }
        let finder = memchr::memmem::Finder::new(placeholder.as_bytes());
        let mut out = Vec::with_capacity(bytes.len() + value.len());
        let mut at = 0;
        for found in finder.find_iter(bytes) {
            out.extend_from_slice(&bytes[at..found]);
            out.extend_from_slice(value.as_bytes());
            at = found + placeholder.len();
        }
        out.extend_from_slice(&bytes[at..]);
        // Never the value in the error: it names the header only.
        let mut replaced = HeaderValue::from_bytes(&out)
            .map_err(|_| format!("the secret's value cannot stand in the header {name}"))?;
        replaced.set_sensitive(true);
        *v = replaced;
    }
    Ok(())
}

/// Headers that belong to one connection, not to the message.
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in [
        header::CONNECTION,
        header::PROXY_AUTHENTICATE,
        header::PROXY_AUTHORIZATION,
        header::TE,
        header::TRAILER,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
    ] {
        headers.remove(name);
    }
    headers.remove("keep-alive");
    headers.remove("proxy-connection");
}

/// `/path?query` of `uri` (`/` when it has none).
fn origin_form(uri: &Uri) -> Uri {
    uri.path_and_query().map(|pq| Uri::from(pq.clone())).unwrap_or_else(|| Uri::from_static("/"))
}

/// Send `req` on a new HTTP/1.1 connection over `io`; the response's body
/// streams as it arrives (the connection lives until it is read).
async fn exchange<IO>(io: IO, req: Request<Incoming>) -> Result<Response<Incoming>, hyper::Error>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io)).await?;
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(error = %e, "egress upstream connection ended with an error");
        }
    });
    sender.send_request(req).await
}

/// The upstream's response for the client, hop-by-hop headers removed.
fn response(resp: Response<Incoming>) -> Response<Body> {
    let (mut parts, body) = resp.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    Response::from_parts(parts, body.map_err(BoxError::from).boxed())
}

fn dial_error(e: &DialError, what: &str) -> Response<Body> {
    let (status, kind) = match e {
        DialError::NoCarrier(_) => (StatusCode::SERVICE_UNAVAILABLE, "overloaded_error"),
        DialError::Refused(_) => (StatusCode::FORBIDDEN, "forbidden"),
        DialError::Failed(_) => (StatusCode::BAD_GATEWAY, "api_error"),
    };
    error(status, kind, &format!("{what}: {e}"))
}

fn empty() -> Body {
    Full::new(Bytes::new()).map_err(|never| match never {}).boxed()
}

/// A JSON error, `{"error": {"type": ..., "message": ...}}`: the shape the
/// model APIs' clients read a message from.
fn error(status: StatusCode, kind: &str, message: &str) -> Response<Body> {
    tracing::info!(status = status.as_u16(), message, "egress request failed");
    let body = serde_json::json!({ "error": { "type": kind, "message": message } }).to_string();
    let mut resp = Response::new(Full::new(Bytes::from(body)).map_err(|never| match never {}).boxed());
    *resp.status_mut() = status;
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_placeholder_is_replaced_wherever_it_occurs_and_hop_by_hop_headers_go() {
        let mut h = HeaderMap::new();
        h.insert("x-api-key", HeaderValue::from_static("PLACEHOLDER-0123456789"));
        h.insert("authorization", HeaderValue::from_static("Bearer PLACEHOLDER-0123456789"));
        h.insert("x-other", HeaderValue::from_static("untouched"));
        h.insert(header::CONNECTION, HeaderValue::from_static("keep-alive, x-hop"));
        h.insert("x-hop", HeaderValue::from_static("1"));
        h.insert("proxy-connection", HeaderValue::from_static("keep-alive"));
        assert!(carries(&h, "PLACEHOLDER-0123456789"));
        assert!(!carries(&h, "PLACEHOLDER-9999999999"));
        replace(&mut h, "PLACEHOLDER-0123456789", "sk-real").unwrap();
        strip_hop_by_hop(&mut h);
        assert_eq!(h["x-api-key"], "sk-real");
        assert!(h["x-api-key"].is_sensitive());
        assert_eq!(h["authorization"], "Bearer sk-real");
        assert_eq!(h["x-other"], "untouched");
        for gone in ["connection", "x-hop", "proxy-connection"] {
            assert!(!h.contains_key(gone), "{gone}");
        }
        assert_eq!(origin_form(&"http://h:1/a/b?c=d".parse().unwrap()), "/a/b?c=d");
    }
}
