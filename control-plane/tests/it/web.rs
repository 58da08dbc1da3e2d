//! Browsers on the gRPC port: gRPC-Web calls (with the same tokens, tenants
//! and errors as native gRPC), the console's pages, the origin gate, and
//! the host gate of a server without tokens (DNS rebinding).

use std::net::SocketAddr;

use bytes::Bytes;
use control_plane::config::{ConfigLayer, ServeConfig};
use control_plane::server::{self, RunningServer};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use sandhold_tests::wait::PATIENCE;
use shared::error::{Error as WireError, ErrorCode};
use shared::proto::v1::admin_service_client::AdminServiceClient;
use shared::proto::v1::run_service_client::RunServiceClient;
use shared::proto::v1::{AttachRunRequest, GetServerInfoRequest};
use tokio_util::sync::CancellationToken;
use tonic::body::Body;
use tonic_web::{GrpcWebCall, GrpcWebClientLayer, GrpcWebClientService};

type Http = Client<HttpConnector, Full<Bytes>>;

fn config(data_dir: &std::path::Path, tokens: &[&str], cors_origins: &[&str]) -> ServeConfig {
    let layer = ConfigLayer {
        listen: Some("127.0.0.1:0".parse().unwrap()),
        data_dir: Some(data_dir.to_path_buf()),
        shutdown_grace_ms: Some(5_000),
        tokens: (!tokens.is_empty()).then(|| tokens.iter().map(|t| t.parse().unwrap()).collect()),
        cors_origins: (!cors_origins.is_empty())
            .then(|| cors_origins.iter().map(|o| o.to_string()).collect()),
        ..Default::default()
    };
    ServeConfig::resolve(layer).unwrap()
}

async fn start(config: ServeConfig) -> RunningServer {
    let server = server::start(config, CancellationToken::new()).await.expect("server starts");
    server.ready(PATIENCE).await.expect("stores open");
    server
}

/// An HTTP/1.1 client, as a browser on a plain-text port.
fn http<B>() -> Client<HttpConnector, B>
where
    B: http_body::Body + Send,
    B::Data: Send,
{
    Client::builder(TokioExecutor::new()).build_http()
}

/// tonic's generated clients over gRPC-Web on HTTP/1.1.
fn grpc_web(addr: SocketAddr) -> (GrpcWebClientService<Client<HttpConnector, GrpcWebCall<Body>>>, http::Uri) {
    let service = tower::ServiceBuilder::new().layer(GrpcWebClientLayer::new()).service(http());
    (service, format!("http://{addr}").parse().unwrap())
}

fn with_token<T>(message: T, token: Option<&str>) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    if let Some(token) = token {
        request.metadata_mut().insert("authorization", format!("Bearer {token}").parse().unwrap());
    }
    request
}

async fn tenant_over_grpc_web(addr: SocketAddr, token: Option<&str>) -> Result<String, tonic::Status> {
    let (service, origin) = grpc_web(addr);
    let mut client = AdminServiceClient::with_origin(service, origin);
    client.get_server_info(with_token(GetServerInfoRequest {}, token)).await.map(|r| r.into_inner().tenant)
}

async fn send(request: http::Request<Full<Bytes>>) -> (http::StatusCode, http::HeaderMap, String) {
    let client: Http = http();
    let response = tokio::time::timeout(PATIENCE, client.request(request)).await.unwrap().unwrap();
    let (parts, body) = response.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    (parts.status, parts.headers, String::from_utf8_lossy(&body).into_owned())
}

fn get(addr: SocketAddr, path: &str) -> http::Request<Full<Bytes>> {
    http::Request::get(format!("http://{addr}{path}")).body(Full::default()).unwrap()
}

/// A gRPC-Web `GetServerInfo` by hand, as a browser on `origin` sends it
/// (with `token`, if any).
fn grpc_web_post(addr: SocketAddr, origin: &str, token: Option<&str>) -> http::Request<Full<Bytes>> {
    let mut request = http::Request::post(format!("http://{addr}/sandhold.v1.AdminService/GetServerInfo"))
        .header("content-type", "application/grpc-web+proto")
        .header("x-grpc-web", "1")
        .header("origin", origin);
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    request.body(Full::new(Bytes::from_static(&[0, 0, 0, 0, 0]))).unwrap()
}

fn local_token(server: &RunningServer) -> String {
    server.local_token().expect("a server without tokens has a local token").expose().to_string()
}

fn preflight(addr: SocketAddr, origin: &str) -> http::Request<Full<Bytes>> {
    http::Request::options(format!("http://{addr}/sandhold.v1.AdminService/GetServerInfo"))
        .header("origin", origin)
        .header("access-control-request-method", "POST")
        .header("access-control-request-headers", "authorization,content-type,x-grpc-web")
        .body(Full::default())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_web_calls_carry_the_same_tokens_tenants_and_errors() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(config(dir.path(), &["acme=acme-token-1", "globex=globex-token-1"], &[])).await;
    let addr = server.local_addr();

    assert_eq!(tenant_over_grpc_web(addr, Some("acme-token-1")).await.unwrap(), "acme");
    assert_eq!(tenant_over_grpc_web(addr, Some("globex-token-1")).await.unwrap(), "globex");
    for token in [None, Some("acme-token-2")] {
        let err = tenant_over_grpc_web(addr, token).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::Unauthenticated, "{token:?}: {err:?}");
        assert_eq!(WireError::from_status(&err).code, ErrorCode::Unauthenticated, "ErrorInfo reason travels");
    }

    // A server stream over gRPC-Web: another tenant's (here: no) run is
    // NOT_FOUND with its reason, as over native gRPC.
    let (service, origin) = grpc_web(addr);
    let mut runs = RunServiceClient::with_origin(service, origin);
    let request = AttachRunRequest { run_id: "no-such-run".into(), ..Default::default() };
    let err = match runs.attach_run(with_token(request, Some("acme-token-1"))).await {
        Err(err) => err,
        Ok(stream) => stream.into_inner().message().await.expect_err("an unknown run has no chunks"),
    };
    assert_eq!(err.code(), tonic::Code::NotFound, "{err:?}");
    assert_eq!(WireError::from_status(&err).code, ErrorCode::NotFound);
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_is_served_at_the_root_and_at_every_page_address() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(config(dir.path(), &["acme=acme-token-1"], &[])).await;
    let addr = server.local_addr();

    // No token needed for the page itself: the calls it makes need one.
    for path in ["/", "/runs/r-123", "/sandboxes", "/threads/t-1/snapshots"] {
        let (status, headers, body) = send(get(addr, path)).await;
        assert_eq!(status, http::StatusCode::OK, "{path}");
        assert_eq!(headers["content-type"], "text/html; charset=utf-8", "{path}");
        assert!(body.contains(r#"src="/assets/console.js""#), "{path}: {body}");
        assert!(headers["content-security-policy"].to_str().unwrap().contains("script-src 'self'"));
    }
    let (status, headers, body) = send(get(addr, "/assets/console.js")).await;
    assert_eq!(status, http::StatusCode::OK);
    assert_eq!(headers["content-type"], "text/javascript; charset=utf-8");
    assert!(body.contains("application/grpc-web"), "the bundle carries the gRPC-Web client");
    let (status, _, _) = send(get(addr, "/assets/missing.js")).await;
    assert_eq!(status, http::StatusCode::NOT_FOUND);

    // Native gRPC on the same port still works.
    let channel =
        tonic::transport::Channel::from_shared(format!("http://{addr}")).unwrap().connect().await.unwrap();
    let info = AdminServiceClient::new(channel)
        .get_server_info(with_token(GetServerInfoRequest {}, Some("acme-token-1")))
        .await
        .unwrap();
    assert_eq!(info.into_inner().tenant, "acme");
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cors_allows_the_own_origin_by_default_and_configured_origins_only() {
    let dir = tempfile::tempdir().unwrap();
    let default = start(config(&dir.path().join("a"), &[], &[])).await;
    let addr = default.local_addr();
    let own = format!("http://{addr}");
    let token = local_token(&default);

    // A foreign page: its preflight and its call are refused, no CORS grant.
    for request in
        [preflight(addr, "http://evil.example"), grpc_web_post(addr, "http://evil.example", Some(&token))]
    {
        let (status, headers, _) = send(request).await;
        assert_eq!(status, http::StatusCode::FORBIDDEN);
        assert!(!headers.contains_key("access-control-allow-origin"));
    }
    // The console's own origin calls through.
    let (status, _, body) = send(grpc_web_post(addr, &own, Some(&token))).await;
    assert_eq!(status, http::StatusCode::OK);
    assert!(body.contains("grpc-status:0"), "the trailer frame says OK: {body:?}");
    default.stop().await.unwrap();

    let configured = start(config(&dir.path().join("b"), &[], &["http://console.example:8080"])).await;
    let addr = configured.local_addr();
    let (status, headers, _) = send(preflight(addr, "http://console.example:8080")).await;
    assert!(status.is_success(), "{status}");
    assert_eq!(headers["access-control-allow-origin"], "http://console.example:8080");
    assert!(headers["access-control-allow-headers"].to_str().unwrap().contains("authorization"));
    let token = local_token(&configured);
    let (status, headers, body) =
        send(grpc_web_post(addr, "http://console.example:8080", Some(&token))).await;
    assert_eq!(status, http::StatusCode::OK);
    assert_eq!(headers["access-control-allow-origin"], "http://console.example:8080");
    assert!(body.contains("default"), "the answer names the tenant: {body:?}");
    assert!(headers["access-control-expose-headers"].to_str().unwrap().contains("grpc-status"));
    let (status, _, _) = send(preflight(addr, "http://console.example:9090")).await;
    assert_eq!(status, http::StatusCode::FORBIDDEN, "another port is another origin");
    configured.stop().await.unwrap();
}

/// A DNS-rebinding page: `rebind.evil.example` resolves to 127.0.0.1, so
/// the browser sends the page's own name as `Host` and as `Origin`, and
/// the origin gate sees a same-origin call. A server without tokens
/// answers only to loopback names (and configured ones): the page, its
/// gRPC-Web calls (even one that carries the token) and a native call
/// with a forged `:authority` are refused before auth.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebinding_page_with_a_forged_host_is_refused_without_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(&dir.path().join("data"), &[], &[]);
    cfg.allowed_hosts = vec!["devbox.internal".into()];
    let server = start(cfg).await;
    let addr = server.local_addr();
    let token = local_token(&server);
    let forged = format!("rebind.evil.example:{}", addr.port());
    let page = format!("http://{forged}");

    for with_token in [None, Some(token.as_str())] {
        let mut call = grpc_web_post(addr, &page, with_token);
        call.headers_mut().insert("host", forged.parse().unwrap());
        let (status, _, body) = send(call).await;
        assert_eq!(status, http::StatusCode::FORBIDDEN, "{with_token:?}: {body}");
        assert!(!body.contains("default"), "the call never ran: {body}");
    }
    let mut page_get = get(addr, "/");
    page_get.headers_mut().insert("host", forged.parse().unwrap());
    let (status, _, body) = send(page_get).await;
    assert_eq!(status, http::StatusCode::FORBIDDEN, "the console under a foreign name: {body}");

    // Native gRPC (HTTP/2) names the host in `:authority`.
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .origin(format!("http://{forged}").parse().unwrap())
        .connect()
        .await
        .unwrap();
    let err = AdminServiceClient::new(channel)
        .get_server_info(with_token(GetServerInfoRequest {}, Some(&token)))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err:?}");

    // The loopback names and the configured one are served (with the token).
    for host in [addr.to_string(), format!("localhost:{}", addr.port()), "devbox.internal".into()] {
        let mut call = grpc_web_post(addr, &format!("http://{host}"), Some(&token));
        call.headers_mut().insert("host", host.parse().unwrap());
        let (status, _, body) = send(call).await;
        assert_eq!(status, http::StatusCode::OK, "{host}: {body}");
        assert!(body.contains("grpc-status:0") && body.contains("default"), "{host}: {body:?}");
    }
    server.stop().await.unwrap();
}

/// Over TLS, a browser that speaks HTTP/1.1 only (ALPN `http/1.1`) gets
/// the console; `h2` stays the choice of clients that offer it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_tls_http1_browsers_get_the_console() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let dir = tempfile::tempdir().unwrap();
    let ca = sandhold_tests::tls::TestCa::new("web-test-ca");
    let files = ca.write(dir.path(), &ca.leaf(7));
    let mut cfg = config(&dir.path().join("data"), &[], &[]);
    cfg.tls_cert = Some(files.cert.clone());
    cfg.tls_key = Some(files.key.clone());
    let server = start(cfg).await;
    let addr = server.local_addr().to_string();

    let (_, h2) = sandhold_tests::tls::presented(&addr, &files.ca).await.unwrap();
    assert_eq!(h2.as_deref(), Some(&b"h2"[..]));

    let mut stream = sandhold_tests::tls::connect(&addr, &files.ca, &[b"http/1.1"])
        .await
        .expect("a TLS handshake offering only http/1.1 succeeds");
    assert_eq!(stream.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
    stream
        .write_all(b"GET /runs/r-1 HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut response = Vec::new();
    tokio::time::timeout(PATIENCE, stream.read_to_end(&mut response)).await.unwrap().unwrap_or_default();
    let response = String::from_utf8_lossy(&response);
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(response.contains(r#"src="/assets/console.js""#), "{response}");
    server.stop().await.unwrap();
}
