//! What browsers get on the gRPC port: the console's pages and assets for
//! plain `GET`s, and gRPC-Web calls only from allowed origins.
//!
//! A request is a gRPC call (native or gRPC-Web) when its `content-type`
//! starts with `application/grpc`; any other `GET` or `HEAD` is the console
//! ([`super::console`]), so `/runs/<run_id>` loads the page that renders it.
//! A request with an `Origin` that is neither the server's own nor a
//! configured one is refused with HTTP 403 before it reaches a service:
//! browsers would refuse the answer anyway without CORS headers, but the
//! call would have run. Allowed cross-origin calls get their CORS headers
//! (and preflights their answer) from `tower-http`'s `CorsLayer`.
//!
//! Without API tokens, a request whose `Host` (or `:authority`) names
//! neither a loopback address nor a configured host is refused first
//! ([`Hosts`]): a DNS-rebinding page reaches 127.0.0.1 under its own name,
//! and its `Origin` matches that forged `Host`.

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use http::header::{CONTENT_TYPE, HOST, ORIGIN};
use http::{HeaderValue, Method, Request, Response, StatusCode};
use tonic::body::Body;
use tower_http::cors::{AllowHeaders, AllowOrigin, CorsLayer};

use super::console::{self, plain};
use crate::config::ANY_ORIGIN;

/// The origins allowed to call the API from a browser: the server's own,
/// plus the configured ones.
#[derive(Debug, Clone, Default)]
pub struct Origins {
    configured: Arc<Vec<String>>,
}

impl Origins {
    /// `configured` normalized as [`crate::config::normalize_origin`] does.
    pub fn new(configured: Vec<String>) -> Self {
        Self { configured: Arc::new(configured) }
    }

    /// Whether a request from `origin` to `authority` (the `Host` it was
    /// sent to) may be served. Same origin: the origin's host and port are
    /// the request's authority (the scheme is not compared, so a server
    /// behind a TLS-terminating proxy that keeps `Host` is its own origin).
    pub fn allows(&self, origin: &[u8], authority: Option<&str>) -> bool {
        let Ok(origin) = std::str::from_utf8(origin) else { return false };
        let same = authority.is_some_and(|authority| {
            origin
                .split_once("://")
                .is_some_and(|(_, host)| same_authority(host, authority, origin.starts_with("https:")))
        });
        same || self.configured.iter().any(|o| o == ANY_ORIGIN || o.eq_ignore_ascii_case(origin))
    }

    /// `tower-http`'s CORS answer for the allowed origins.
    pub fn cors_layer(&self) -> CorsLayer {
        let origins = self.clone();
        CorsLayer::new()
            .allow_origin(AllowOrigin::predicate(move |origin: &HeaderValue, parts| {
                origins.allows(origin.as_bytes(), authority_of(&parts.headers, &parts.uri))
            }))
            .allow_methods([Method::POST])
            .allow_headers(AllowHeaders::mirror_request())
            .expose_headers([
                http::HeaderName::from_static("grpc-status"),
                http::HeaderName::from_static("grpc-message"),
                http::HeaderName::from_static("grpc-status-details-bin"),
            ])
            .max_age(Duration::from_secs(600))
    }
}

/// The names a single-user server answers to: loopback (`127.0.0.1`,
/// `::1`, `localhost`, any port) and the configured ones.
#[derive(Debug, Clone, Default)]
pub struct Hosts {
    configured: Arc<Vec<String>>,
}

impl Hosts {
    /// `configured`: host names (no port), normalized as
    /// [`crate::config::normalize_host`] does.
    pub fn new(configured: Vec<String>) -> Self {
        Self { configured: Arc::new(configured) }
    }

    /// Whether every name the request was sent to is one of ours (and it
    /// names at least one): HTTP/2 carries `:authority`, HTTP/1.1 `Host`,
    /// and both are checked when both are there.
    pub fn allows(&self, headers: &http::HeaderMap, uri: &http::Uri) -> bool {
        let mut names = headers
            .get_all(HOST)
            .iter()
            .map(|h| h.to_str().ok())
            .chain(uri.authority().map(|a| Some(a.as_str())))
            .peekable();
        names.peek().is_some() && names.all(|name| name.is_some_and(|n| self.allows_authority(n)))
    }

    fn allows_authority(&self, authority: &str) -> bool {
        let host = host_of(authority).trim_end_matches('.').to_ascii_lowercase();
        let loopback = host == "localhost"
            || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
            || host
                .strip_prefix('[')
                .and_then(|h| h.strip_suffix(']'))
                .is_some_and(|h| h.parse::<std::net::Ipv6Addr>().is_ok_and(|ip| ip.is_loopback()));
        loopback || self.configured.contains(&host)
    }
}

/// The host of `host[:port]` (an IPv6 address keeps its brackets).
fn host_of(authority: &str) -> &str {
    let authority = authority.rsplit_once('@').map_or(authority, |(_, a)| a);
    match authority.rsplit_once(':') {
        Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) && !host.is_empty() => {
            if host.starts_with('[') || !host.contains(':') { host } else { authority }
        }
        _ => authority,
    }
}

/// `host[:port]` of an origin against an authority, the default port of
/// the origin's scheme implied on either side.
fn same_authority(origin_host: &str, authority: &str, https: bool) -> bool {
    let default_port = if https { ":443" } else { ":80" };
    let full = |s: &str| {
        let s = s.to_ascii_lowercase();
        let has_port = s.rsplit_once(':').is_some_and(|(_, p)| p.bytes().all(|b| b.is_ascii_digit()))
            && !s.ends_with(']');
        if has_port { s } else { format!("{s}{default_port}") }
    };
    full(origin_host) == full(authority)
}

fn authority_of<'a>(headers: &'a http::HeaderMap, uri: &'a http::Uri) -> Option<&'a str> {
    headers.get(HOST).and_then(|h| h.to_str().ok()).or_else(|| uri.authority().map(|a| a.as_str()))
}

/// A gRPC or gRPC-Web call, by its content type.
fn content_type<B>(request: &Request<B>) -> Option<&str> {
    request.headers().get(CONTENT_TYPE).and_then(|v| v.to_str().ok())
}

/// gRPC or gRPC-Web.
fn is_grpc<B>(request: &Request<B>) -> bool {
    content_type(request).is_some_and(|v| v.starts_with("application/grpc"))
}

/// gRPC over HTTP/2, whose client reads a refusal as a status.
fn is_native_grpc<B>(request: &Request<B>) -> bool {
    is_grpc(request) && !content_type(request).is_some_and(|v| v.starts_with("application/grpc-web"))
}

/// Tower layer in front of the services: the console, and the origin gate.
#[derive(Clone)]
pub struct WebLayer {
    origins: Origins,
    hosts: Option<Hosts>,
}

impl WebLayer {
    /// `hosts`: the names a single-user server answers to; `None` (with
    /// API tokens): any.
    pub fn new(origins: Origins, hosts: Option<Hosts>) -> Self {
        Self { origins, hosts }
    }
}

impl<S> tower::Layer<S> for WebLayer {
    type Service = WebService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        WebService { inner, origins: self.origins.clone(), hosts: self.hosts.clone() }
    }
}

#[derive(Clone)]
pub struct WebService<S> {
    inner: S,
    origins: Origins,
    hosts: Option<Hosts>,
}

impl<S> tower::Service<Request<Body>> for WebService<S>
where
    S: tower::Service<Request<Body>, Response = Response<Body>> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        if let Some(hosts) = &self.hosts
            && !hosts.allows(request.headers(), request.uri())
        {
            tracing::debug!(host = ?request.headers().get(HOST), uri = %request.uri(), "refused a foreign host name");
            const WHY: &str =
                "this server without API tokens answers only to loopback names and --allowed-host ones";
            // A native gRPC client reads the refusal as a status, not as
            // an HTTP error it cannot decode.
            let response = if is_native_grpc(&request) {
                tonic::Status::permission_denied(WHY).into_http()
            } else {
                plain(StatusCode::FORBIDDEN, WHY)
            };
            return Box::pin(async move { Ok(response) });
        }
        if !is_grpc(&request) && matches!(*request.method(), Method::GET | Method::HEAD) {
            let response = console::respond(&request);
            return Box::pin(async move { Ok(response) });
        }
        if let Some(origin) = request.headers().get(ORIGIN) {
            let authority = authority_of(request.headers(), request.uri());
            if !self.origins.allows(origin.as_bytes(), authority) {
                tracing::debug!(origin = ?origin, path = request.uri().path(), "refused a foreign origin");
                let response =
                    plain(StatusCode::FORBIDDEN, "this origin may not call this server (--cors-origin)");
                return Box::pin(async move { Ok(response) });
            }
        }
        // Use the instance that was polled ready; leave a fresh clone behind.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(async move { inner.call(request).await })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_own_origin_is_allowed_and_foreign_ones_only_when_configured() {
        let none = Origins::default();
        assert!(none.allows(b"http://127.0.0.1:7443", Some("127.0.0.1:7443")));
        assert!(none.allows(b"https://sandhold.example", Some("sandhold.example:443")));
        assert!(none.allows(b"http://Sandhold.Example", Some("sandhold.example")));
        assert!(!none.allows(b"http://127.0.0.1:7444", Some("127.0.0.1:7443")));
        assert!(!none.allows(b"http://evil.example", Some("127.0.0.1:7443")));
        assert!(!none.allows(b"http://evil.example", None));
        assert!(!none.allows(b"null", Some("127.0.0.1:7443")));
        let some = Origins::new(vec!["https://console.example".into()]);
        assert!(some.allows(b"https://console.example", Some("127.0.0.1:7443")));
        assert!(!some.allows(b"https://console.example:8443", Some("127.0.0.1:7443")));
        let any = Origins::new(vec![ANY_ORIGIN.into()]);
        assert!(any.allows(b"http://anything.example", Some("127.0.0.1:7443")));
    }

    #[test]
    fn a_single_user_server_answers_only_to_loopback_and_configured_names() {
        let hosts = Hosts::new(vec!["devbox.internal".into()]);
        let host = |value: &str| {
            let mut h = http::HeaderMap::new();
            h.insert(HOST, value.parse().unwrap());
            h
        };
        let path: http::Uri = "/sandhold.v1.RunService/StartRun".parse().unwrap();
        for ok in [
            "127.0.0.1:7443",
            "127.0.0.1",
            "localhost:80",
            "LOCALHOST",
            "[::1]:7443",
            "[::1]",
            "devbox.internal:7443",
            "DevBox.Internal",
        ] {
            assert!(hosts.allows(&host(ok), &path), "{ok}");
            let h2: http::Uri = format!("http://{ok}/x").parse().unwrap();
            assert!(hosts.allows(&http::HeaderMap::new(), &h2), "{ok} as :authority");
        }
        for refused in [
            "rebind.evil.example:7443",
            "evil.example",
            "127.0.0.1.evil.example",
            "localhost.evil.example:7443",
            "devbox.internal.evil.example",
            "[::2]:7443",
            "10.0.0.1:7443",
        ] {
            assert!(!hosts.allows(&host(refused), &path), "{refused}");
            let h2: http::Uri = format!("http://{refused}/x").parse().unwrap();
            assert!(!hosts.allows(&http::HeaderMap::new(), &h2), "{refused} as :authority");
        }
        assert!(!hosts.allows(&http::HeaderMap::new(), &path), "a request naming no host");
        let both: http::Uri = "http://127.0.0.1:7443/x".parse().unwrap();
        assert!(!hosts.allows(&host("evil.example"), &both), "a forged Host beside a loopback :authority");
    }
}
