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
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::ca::InterceptCa;
use super::carrier::{DialError, Pool};
use super::config::{EgressConfig, Route};
use super::credential::{self, BindError, Credential, Misplaced, Scanned};
use super::ledger::Ledger;
use super::metered::Metered;
use super::tls::{Hello, client_hello, fits};
use super::usage::Api;
use crate::vault::Vault;

/// The longest host name the proxy dials (DNS's own maximum).
const MAX_HOST: usize = 253;

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Body = BoxBody<Bytes, BoxError>;

/// What the listener serves from, swapped whole by `Configure`.
pub struct Table {
    pub config: EgressConfig,
    pub tls: Arc<rustls::ClientConfig>,
    /// The interception CA, when there are credentials.
    pub ca: Option<Arc<InterceptCa>>,
}

/// The listener's state. Shared by every connection.
pub struct Broker {
    pub table: RwLock<Arc<Table>>,
    pub pool: Pool,
    pub vault: Vault,
    pub ledger: Arc<Ledger>,
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

    async fn handle(self: Arc<Self>, req: Request<Incoming>) -> Response<Body> {
        if req.method() == Method::CONNECT {
            self.tunnel(req).await
        } else if req.uri().scheme().is_some() {
            self.forward(req).await
        } else {
            self.broker(req).await
        }
    }

    /// The model broker: the route whose placeholder the request's auth
    /// header carries, the key put in that header only.
    async fn broker(&self, req: Request<Incoming>) -> Response<Body> {
        let table = self.table();
        let route = match authenticating_route(req.headers(), &table.config.routes) {
            Ok(Some(route)) => route,
            Ok(None) => {
                return error(
                    StatusCode::UNAUTHORIZED,
                    "authentication_error",
                    "the request carries no Sandhold placeholder key: the sandbox's model broker adds the real key \
                     only in place of the placeholder the harness was given",
                );
            }
            Err(misplaced) => {
                // A placeholder anywhere but the auth header would have the
                // key written where an upstream may repeat it back (an
                // unknown `anthropic-beta` value is quoted in the 400).
                tracing::warn!(header = %misplaced, "egress broker: refused a placeholder outside the auth header");
                return error(
                    StatusCode::BAD_REQUEST,
                    "invalid_request_error",
                    &format!(
                        "the Sandhold placeholder key stands in the header {misplaced}: the broker adds the real \
                         key only as the whole value of x-api-key or x-goog-api-key, or as `Bearer <placeholder>` \
                         in authorization"
                    ),
                );
            }
        };
        // A credential's placeholder goes to a model upstream only where it
        // is bound to it.
        for c in &table.config.credentials {
            if !c.bound_to(&route.host, route.port)
                && (credential::find_in(req.uri().to_string().as_bytes(), std::slice::from_ref(c)).is_some()
                    || req
                        .headers()
                        .values()
                        .any(|v| credential::find_in(v.as_bytes(), std::slice::from_ref(c)).is_some()))
            {
                let place = format!("a request to the model route {:?}", route.label);
                return self.refuse(
                    &route.host,
                    route.port,
                    &Misplaced { secret_name: c.secret_name.clone(), place },
                );
            }
        }
        let api = Api::of(&route.label, req.headers());
        // The run's count is its routes', whatever process sends with its
        // placeholder: past its budget, nothing more goes upstream.
        if !route.run_id.is_empty()
            && let Some((limit, max, used)) = route.budget.reached(&self.ledger.totals(&route.run_id))
        {
            tracing::warn!(run_id = %route.run_id, limit, max, used, "egress broker: refused a model request past the run's budget");
            return budget_refusal(api, limit, max, used);
        }
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
        if let Err(why) = authenticate(&mut parts.headers, &route.placeholder, secret.expose()) {
            return error(StatusCode::BAD_REQUEST, "invalid_request_error", &why);
        }
        strip_hop_by_hop(&mut parts.headers);
        if let Ok(host) = HeaderValue::from_str(&route.authority()) {
            parts.headers.insert(header::HOST, host);
        }
        if !route.run_id.is_empty() {
            // An encoded answer could not be read for its usage.
            parts.headers.insert(header::ACCEPT_ENCODING, HeaderValue::from_static("identity"));
        }
        parts.uri = origin_form(&parts.uri);
        parts.version = http::Version::HTTP_11;
        let req = Request::from_parts(parts, body);
        let dial = CarryDial {
            host: route.host.clone(),
            port: u32::from(route.port),
            purpose: CarryPurpose::Model.into(),
            route: route.label.clone(),
            ..Default::default()
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
            Ok(resp) if route.run_id.is_empty() => response(resp),
            Ok(resp) => {
                let (mut parts, body) = resp.into_parts();
                strip_hop_by_hop(&mut parts.headers);
                let body = Metered::new(body, &parts.headers, self.ledger.clone(), &route.run_id);
                Response::from_parts(parts, body.map_err(BoxError::from).boxed())
            }
            Err(e) => error(StatusCode::BAD_GATEWAY, "api_error", &format!("{}: {e}", describe(route))),
        }
    }

    /// The proxy's `CONNECT host:port`: a tunnel to an allowed host, or,
    /// to a credential's host, TLS terminated here and each request sent
    /// on with the credential put in.
    async fn tunnel(self: Arc<Self>, mut req: Request<Incoming>) -> Response<Body> {
        let Some((host, port)) =
            req.uri().authority().and_then(|a| Some((a.host().to_string(), a.port_u16()?)))
        else {
            return error(StatusCode::BAD_REQUEST, "invalid_request_error", "CONNECT needs host:port");
        };
        let host = host.trim_start_matches('[').trim_end_matches(']').to_string();
        let table = self.table();
        if table.config.intercepts(&host, port) {
            return self.intercept(req, &table, host, port);
        }
        let stream = match self.proxy_dial(&host, port, None).await {
            Ok(stream) => stream,
            Err(resp) => return resp,
        };
        let upgrade = hyper::upgrade::on(&mut req);
        tokio::spawn(async move {
            match upgrade.await {
                Ok(upgraded) => {
                    if let Err(e) = carry_tunnel(TokioIo::new(upgraded), stream, &host).await {
                        tracing::debug!(host, port, error = %e, "egress tunnel ended with an error");
                    }
                }
                Err(e) => tracing::debug!(host, port, error = %e, "egress tunnel: the client never upgraded"),
            }
        });
        Response::new(empty())
    }

    /// Terminate the tunnel's TLS with a certificate for `host` from the
    /// sandbox's CA and serve its requests ([`Broker::intercepted`]).
    fn intercept(
        self: Arc<Self>,
        mut req: Request<Incoming>,
        table: &Table,
        host: String,
        port: u16,
    ) -> Response<Body> {
        let config = match table.ca.as_ref().map(|ca| ca.server_config(&host)) {
            Some(Ok(config)) => config,
            Some(Err(e)) => {
                return error(
                    StatusCode::BAD_GATEWAY,
                    "api_error",
                    &format!("intercepting {host}:{port}: {e}"),
                );
            }
            None => {
                return error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "api_error",
                    &format!("intercepting {host}:{port}: the sandbox's interception CA is not loaded"),
                );
            }
        };
        let upgrade = hyper::upgrade::on(&mut req);
        tokio::spawn(async move {
            let upgraded = match upgrade.await {
                Ok(upgraded) => upgraded,
                Err(e) => {
                    return tracing::debug!(host, port, error = %e, "egress tunnel: the client never upgraded");
                }
            };
            let tls = match tokio_rustls::TlsAcceptor::from(config).accept(TokioIo::new(upgraded)).await {
                Ok(tls) => tls,
                Err(e) => {
                    // A client that does not trust the sandbox's CA (or pins).
                    return tracing::info!(host, port, error = %e, "egress: an intercepted TLS handshake failed");
                }
            };
            let service = hyper::service::service_fn(move |req| {
                let (broker, host) = (self.clone(), host.clone());
                async move { Ok::<_, Infallible>(broker.intercepted(req, &host, port).await) }
            });
            if let Err(e) =
                hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(tls), service).await
            {
                tracing::debug!(error = %e, "egress: an intercepted connection ended with an error");
            }
        });
        Response::new(empty())
    }

    /// One request of an intercepted tunnel to `host:port`: its target
    /// checked, the credentials bound to it put in (a placeholder anywhere
    /// else refuses it), sent over a new connection with the agent's own
    /// TLS, which verifies the upstream.
    async fn intercepted(&self, req: Request<Incoming>, host: &str, port: u16) -> Response<Body> {
        if let Some(named) = req.headers().get(header::HOST)
            && !same_authority(named.as_bytes(), host, port, 443)
        {
            let named = String::from_utf8_lossy(named.as_bytes());
            tracing::warn!(host, port, named = %named, "egress: refused a Host header that is not the tunnel's target");
            return error(
                StatusCode::FORBIDDEN,
                "forbidden",
                &format!("the Host header {named:?} is not the tunnel's target {host}:{port}"),
            );
        }
        let table = self.table();
        let target = match request_target(&req) {
            Ok(target) => target,
            Err(resp) => return resp,
        };
        let req = match self.bound(req, &table.config.credentials, host, port) {
            Ok(req) => req,
            Err(resp) => return resp,
        };
        let stream = match self.proxy_dial(host, port, Some(target)).await {
            Ok(stream) => stream,
            Err(resp) => return resp,
        };
        let tls = match super::tls::connect(table.tls.clone(), host, stream).await {
            Ok(tls) => tls,
            Err(e) => {
                return error(
                    StatusCode::BAD_GATEWAY,
                    "api_error",
                    &format!("{host}:{port}: TLS failed: {e}"),
                );
            }
        };
        match exchange(tls, req).await {
            Ok(resp) => response(resp),
            Err(e) => error(StatusCode::BAD_GATEWAY, "api_error", &format!("{host}:{port}: {e}")),
        }
    }

    /// `req` for `host:port` with the credentials bound there put in, its
    /// body scanned for placeholders, in the form sent upstream; or the
    /// refusal (recorded).
    fn bound(
        &self,
        req: Request<Incoming>,
        credentials: &[Credential],
        host: &str,
        port: u16,
    ) -> Result<Request<Body>, Response<Body>> {
        let (mut parts, body) = req.into_parts();
        parts.headers.remove("proxy-authorization");
        strip_hop_by_hop(&mut parts.headers);
        let value = |name: &str| self.vault.latest(name);
        match credential::bind(&mut parts.headers, &parts.uri, (host, port), credentials, value) {
            Ok(()) => {}
            Err(BindError::Misplaced(m)) => return Err(self.refuse(host, port, &m)),
            Err(BindError::Missing(name)) => {
                return Err(error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "secret_missing",
                    &format!(
                        "this sandbox's agent holds no value of the secret {name} (it restarted since it was handed \
                         over); the control plane hands it over again when it next ensures the sandbox"
                    ),
                ));
            }
            Err(BindError::Unusable(name)) => {
                return Err(error(
                    StatusCode::BAD_REQUEST,
                    "invalid_request_error",
                    &format!("the value of the secret {name} cannot stand in a header"),
                ));
            }
        }
        if !parts.headers.contains_key(header::HOST)
            && let Ok(authority) = HeaderValue::from_str(&authority(host, port, 443))
        {
            parts.headers.insert(header::HOST, authority);
        }
        parts.uri = origin_form(&parts.uri);
        parts.version = http::Version::HTTP_11;
        let body = if credentials.is_empty() {
            body.map_err(BoxError::from).boxed()
        } else {
            let (pool, host) = (self.pool.clone(), host.to_string());
            Scanned::new(body, credentials, move |m| report(&pool, &host, port, &m)).boxed()
        };
        Ok(Request::from_parts(parts, body))
    }

    /// The answer to a request that carried a placeholder where it may not
    /// go; the refusal is recorded by the control plane.
    fn refuse(&self, host: &str, port: u16, misplaced: &Misplaced) -> Response<Body> {
        tracing::warn!(host, port, secret = %misplaced.secret_name, place = %misplaced.place, "egress: refused a misplaced credential placeholder");
        report(&self.pool, host, port, misplaced);
        error(
            StatusCode::FORBIDDEN,
            "forbidden",
            &format!(
                "refused: {misplaced}; the sandbox's agent puts the credential only into its own header of \
                 requests to its hosts"
            ),
        )
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
        // The allowlist judges the URI's host; a different `Host` would have
        // a shared front serve another name than the one allowed.
        if let Some(named) = req.headers().get(header::HOST)
            && !same_authority(named.as_bytes(), &host, port, 80)
        {
            let named = String::from_utf8_lossy(named.as_bytes());
            tracing::warn!(host, port, named = %named, "egress proxy: refused a Host header that is not the target");
            return error(
                StatusCode::FORBIDDEN,
                "forbidden",
                &format!("the Host header {named:?} is not the request's target {host}:{port}"),
            );
        }
        let host = host.trim_start_matches('[').trim_end_matches(']').to_string();
        let table = self.table();
        let target = match request_target(&req) {
            Ok(target) => target,
            Err(resp) => return resp,
        };
        let req = match self.bound(req, &table.config.credentials, &host, port) {
            Ok(req) => req,
            Err(resp) => return resp,
        };
        let stream = match self.proxy_dial(&host, port, Some(target)).await {
            Ok(stream) => stream,
            Err(resp) => return resp,
        };
        match exchange(stream, req).await {
            Ok(resp) => response(resp),
            Err(e) => error(StatusCode::BAD_GATEWAY, "api_error", &format!("{host}:{port}: {e}")),
        }
    }

    /// A carrier to `host:port` for the proxy, or the response that says
    /// why not. Every attempt is dialed: the control plane alone decides
    /// (nothing in the sandbox is trusted) and records each one, refused
    /// ones included.
    /// `request`: the method and target of the one request the connection
    /// carries, for the rules by method and path.
    async fn proxy_dial(
        &self,
        host: &str,
        port: u16,
        request: Option<(String, String)>,
    ) -> Result<tokio::io::DuplexStream, Response<Body>> {
        // A made-up name of kilobytes would travel to the control plane and
        // into the run's log with each attempt.
        if host.len() > MAX_HOST {
            return Err(error(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                &format!("a host name is {MAX_HOST} bytes at most"),
            ));
        }
        let dial = CarryDial {
            host: host.to_string(),
            port: u32::from(port),
            purpose: CarryPurpose::Proxy.into(),
            route: String::new(),
            blocked: String::new(),
            method: request.as_ref().map(|r| r.0.clone()).unwrap_or_default(),
            path: request.map(|r| r.1).unwrap_or_default(),
            ..Default::default()
        };
        self.pool.dial(dial).await.map_err(|e| dial_error(&e, &format!("{host}:{port}")))
    }
}

/// Carry a tunnel: the destination's bytes to the client at once (some
/// protocols speak first), the client's only once its first bytes show
/// they go where the tunnel was allowed to: a TLS ClientHello must name the
/// CONNECT target (no server name for an IP address), or the tunnel ends
/// before anything reaches the destination. Other protocols pass as they are.
async fn carry_tunnel<C>(client: C, stream: tokio::io::DuplexStream, host: &str) -> std::io::Result<()>
where
    C: AsyncRead + AsyncWrite + Unpin,
{
    let (mut client_read, mut client_write) = tokio::io::split(client);
    let (mut up_read, mut up_write) = tokio::io::split(stream);
    let down = async {
        let copied = tokio::io::copy(&mut up_read, &mut client_write).await;
        let _ = client_write.shutdown().await;
        copied.map(drop)
    };
    let up = async {
        let mut first = Vec::new();
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = client_read.read(&mut buf).await?;
            if n == 0 {
                // The client is done before its first message was whole.
                up_write.write_all(&first).await?;
                return up_write.shutdown().await;
            }
            first.extend_from_slice(&buf[..n]);
            match client_hello(&first) {
                Hello::Partial => continue,
                Hello::NotTls => break,
                Hello::ServerName(name) if fits(name.as_deref(), host) => break,
                Hello::ServerName(name) => {
                    let name = name.unwrap_or_default();
                    tracing::warn!(host, server_name = %name, "egress tunnel: refused a TLS server name that is not the CONNECT target");
                    return Err(std::io::Error::other(format!(
                        "the TLS server name {name:?} is not the tunnel's target {host}"
                    )));
                }
                Hello::Malformed(why) => {
                    tracing::warn!(host, error = %why, "egress tunnel: refused an unreadable TLS ClientHello");
                    return Err(std::io::Error::other(format!("unreadable TLS ClientHello: {why}")));
                }
            }
        }
        up_write.write_all(&first).await?;
        tokio::io::copy(&mut client_read, &mut up_write).await?;
        up_write.shutdown().await
    };
    tokio::pin!(up, down);
    let (mut up_done, mut down_done) = (false, false);
    while !(up_done && down_done) {
        // A refused first message ends the tunnel both ways at once.
        tokio::select! {
            sent = &mut up, if !up_done => {
                sent?;
                up_done = true;
            }
            received = &mut down, if !down_done => {
                received?;
                down_done = true;
            }
        }
    }
    Ok(())
}

/// The method and target (path and query) of `req`, for the rules; a
/// target too long to be judged whole is refused.
fn request_target<B>(req: &Request<B>) -> Result<(String, String), Response<Body>> {
    const MAX_TARGET: usize = 8 * 1024;
    let target = req.uri().path_and_query().map(|pq| pq.as_str()).unwrap_or("/");
    if target.len() > MAX_TARGET {
        return Err(error(
            StatusCode::URI_TOO_LONG,
            "invalid_request_error",
            &format!("a request target through the sandbox's proxy is {MAX_TARGET} bytes at most"),
        ));
    }
    Ok((req.method().as_str().to_string(), target.to_string()))
}

/// Ask the control plane, on a carrier, to record a misplaced placeholder
/// (it connects nothing); in the background, as the client is answered.
fn report(pool: &Pool, host: &str, port: u16, misplaced: &Misplaced) {
    let dial = CarryDial {
        host: host.chars().take(MAX_HOST).collect(),
        port: u32::from(port),
        purpose: CarryPurpose::Proxy.into(),
        route: String::new(),
        blocked: misplaced.to_string(),
        ..Default::default()
    };
    let pool = pool.clone();
    tokio::spawn(async move {
        if let Err(e) = pool.dial(dial).await
            && !matches!(e, DialError::Refused(_))
        {
            tracing::warn!(error = %e, "egress: the refusal could not be recorded by the control plane");
        }
    });
}

/// `host` or `host:port` (the port when it is not `default`).
fn authority(host: &str, port: u16, default: u16) -> String {
    let host = if host.contains(':') { format!("[{host}]") } else { host.to_string() };
    if port == default { host } else { format!("{host}:{port}") }
}

/// Whether a `Host` header value names `host:port` (the port may be left
/// out when it is `default`; case and a trailing dot aside).
fn same_authority(named: &[u8], host: &str, port: u16, default: u16) -> bool {
    let Ok(named) = std::str::from_utf8(named) else { return false };
    let Ok(named) = named.trim().parse::<http::uri::Authority>() else { return false };
    let bare =
        |h: &str| h.trim_start_matches('[').trim_end_matches(']').trim_end_matches('.').to_ascii_lowercase();
    bare(named.host()) == bare(host) && named.port_u16().unwrap_or(default) == port
}

/// "the model route L (https://host:port)", for errors.
fn describe(route: &Route) -> String {
    let scheme = if route.tls { "https" } else { "http" };
    format!("the model route {:?} ({scheme}://{}:{})", route.label, route.host, route.port)
}

/// The headers a harness authenticates with, and the shape of their value
/// (`{}` for the key): Anthropic's, OpenAI's, and Gemini's. A model route is
/// a credential sent in one of these, as [`credential::fill`] fills them.
const AUTH_HEADERS: [(HeaderName, &str); 3] = [
    (HeaderName::from_static("x-api-key"), "{}"),
    (header::AUTHORIZATION, "Bearer {}"),
    (HeaderName::from_static("x-goog-api-key"), "{}"),
];

/// Whether `name: value` is a harness's auth header whose whole value is
/// `placeholder` (in its shape).
fn is_auth(name: &HeaderName, value: &[u8], placeholder: &str) -> bool {
    AUTH_HEADERS
        .iter()
        .any(|(auth, format)| auth == name && credential::is_filled(format, value, placeholder))
}

/// The route whose placeholder the request authenticates with (`None`: no
/// placeholder at all). `Err` names a header where a placeholder of any
/// route stands other than as a whole auth value: such a request is never
/// sent, so no upstream can echo the key back.
fn authenticating_route<'a>(headers: &HeaderMap, routes: &'a [Route]) -> Result<Option<&'a Route>, String> {
    let mut found: Option<&Route> = None;
    for (name, value) in headers {
        for route in routes {
            if memchr::memmem::find(value.as_bytes(), route.placeholder.as_bytes()).is_none() {
                continue;
            }
            if !is_auth(name, value.as_bytes(), &route.placeholder) {
                return Err(name.to_string());
            }
            match found {
                Some(other) if other.placeholder != route.placeholder => {
                    return Err(format!("{name} (a second route's placeholder)"));
                }
                _ => found = Some(route),
            }
        }
    }
    Ok(found)
}

/// The key in place of `placeholder` in the auth headers that carry it
/// as their whole value; the new values are marked sensitive.
fn authenticate(headers: &mut HeaderMap, placeholder: &str, key: &str) -> Result<(), String> {
    for (auth, format) in &AUTH_HEADERS {
        if let header::Entry::Occupied(mut entry) = headers.entry(auth) {
            for v in entry.iter_mut() {
                if !is_auth(auth, v.as_bytes(), placeholder) {
                    continue;
                }
                // Never the value in the error: it names the header only.
                let mut keyed = HeaderValue::from_str(&credential::fill(format, key))
                    .map_err(|_| format!("the secret's value cannot stand in the header {auth}"))?;
                keyed.set_sensitive(true);
                *v = keyed;
            }
        }
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
async fn exchange<IO, B>(io: IO, req: Request<B>) -> Result<Response<Incoming>, hyper::Error>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
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
        DialError::Refused(_) | DialError::Ask(_) => (StatusCode::FORBIDDEN, "forbidden"),
        DialError::Failed(_) => (StatusCode::BAD_GATEWAY, "api_error"),
    };
    error(status, kind, &format!("{what}: {e}"))
}

/// The broker's answer past a run's budget, in the shape of the run's API
/// (Anthropic's, which the other harnesses' clients read too, when it is
/// not known): a refusal its clients show and do not retry, like the
/// provider's own for a spent credit or quota.
fn budget_refusal(api: Option<Api>, limit: &str, max: u64, used: u64) -> Response<Body> {
    let message = format!(
        "Sandhold: this run's token budget is used up ({limit} = {max}, {used} used); its model broker sends \
         no further requests"
    );
    let (status, body) = match api {
        Some(Api::OpenAi) => (
            StatusCode::TOO_MANY_REQUESTS,
            serde_json::json!({"error": {"message": message, "type": "insufficient_quota", "param": null,
                "code": "insufficient_quota"}}),
        ),
        Some(Api::Gemini) => (
            StatusCode::TOO_MANY_REQUESTS,
            serde_json::json!({"error": {"code": 429, "message": message, "status": "RESOURCE_EXHAUSTED"}}),
        ),
        Some(Api::Anthropic) | None => (
            StatusCode::BAD_REQUEST,
            serde_json::json!({"type": "error", "error": {"type": "invalid_request_error", "message": message}}),
        ),
    };
    let mut resp =
        Response::new(Full::new(Bytes::from(body.to_string())).map_err(|never| match never {}).boxed());
    *resp.status_mut() = status;
    let headers = resp.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    // The Anthropic and OpenAI clients honour it.
    headers.insert("x-should-retry", HeaderValue::from_static("false"));
    headers.insert("x-sandhold-budget", HeaderValue::from_static("exceeded"));
    resp
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

    fn routes(placeholders: &[&str]) -> Vec<Route> {
        placeholders
            .iter()
            .map(|p| Route {
                placeholder: p.to_string(),
                tls: true,
                host: "api.example".into(),
                port: 443,
                secret_name: "KEY".into(),
                label: "claude-code".into(),
                run_id: String::new(),
                budget: Default::default(),
            })
            .collect()
    }

    #[test]
    fn the_key_goes_only_into_the_auth_headers_and_hop_by_hop_headers_go() {
        const P: &str = "PLACEHOLDER-0123456789";
        let mut h = HeaderMap::new();
        h.insert("x-api-key", HeaderValue::from_static(P));
        h.insert("authorization", HeaderValue::from_static("Bearer PLACEHOLDER-0123456789"));
        h.insert("x-other", HeaderValue::from_static("untouched"));
        h.insert(header::CONNECTION, HeaderValue::from_static("keep-alive, x-hop"));
        h.insert("x-hop", HeaderValue::from_static("1"));
        h.insert("proxy-connection", HeaderValue::from_static("keep-alive"));
        let routes = routes(&["PLACEHOLDER-9999999999", P]);
        assert_eq!(authenticating_route(&h, &routes).unwrap().unwrap().placeholder, P);
        assert!(authenticating_route(&h, &routes[..1]).unwrap().is_none());
        authenticate(&mut h, P, "sk-real").unwrap();
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

    #[tokio::test]
    async fn past_its_budget_a_request_is_refused_in_its_apis_shape() {
        let read = |api| async move {
            let resp = budget_refusal(api, "max_tokens", 10, 27);
            let status = resp.status().as_u16();
            let body = resp.into_body().collect().await.unwrap().to_bytes();
            (status, serde_json::from_slice::<serde_json::Value>(&body).unwrap())
        };
        let (status, anthropic) = read(Some(Api::Anthropic)).await;
        assert_eq!((status, anthropic["type"].as_str()), (400, Some("error")), "{anthropic}");
        assert_eq!(anthropic["error"]["type"], "invalid_request_error");
        assert!(anthropic["error"]["message"].as_str().unwrap().contains("max_tokens = 10, 27 used"));
        let (status, openai) = read(Some(Api::OpenAi)).await;
        assert_eq!((status, openai["error"]["code"].as_str()), (429, Some("insufficient_quota")), "{openai}");
        let (status, gemini) = read(Some(Api::Gemini)).await;
        assert_eq!(
            (status, gemini["error"]["status"].as_str()),
            (429, Some("RESOURCE_EXHAUSTED")),
            "{gemini}"
        );
        assert_eq!(gemini["error"]["code"], 429);
    }

    #[test]
    fn a_placeholder_anywhere_but_a_whole_auth_value_is_refused() {
        const P: &str = "PLACEHOLDER-0123456789";
        let routes = routes(&[P, "PLACEHOLDER-9999999999"]);
        let misplaced: [&[(&str, &str)]; 6] = [
            &[("x-api-key", P), ("anthropic-beta", P)],
            &[("x-api-key", "PLACEHOLDER-0123456789,PLACEHOLDER-0123456789")],
            &[("authorization", "Basic PLACEHOLDER-0123456789")],
            &[("authorization", P)],
            &[("x-api-key", "Bearer PLACEHOLDER-0123456789")],
            &[("x-api-key", P), ("authorization", "Bearer PLACEHOLDER-9999999999")],
        ];
        for headers in misplaced {
            let mut h = HeaderMap::new();
            for (n, v) in headers {
                h.append(HeaderName::from_static(n), HeaderValue::from_static(v));
            }
            assert!(authenticating_route(&h, &routes).is_err(), "{headers:?}");
        }
    }
}
