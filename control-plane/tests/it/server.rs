//! The gRPC server over a real loopback socket: health, auth, tenants, the
//! exposure check, and SIGTERM handling of the real binary.

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use control_plane::config::{ConfigLayer, ServeConfig};
use control_plane::lease::{Leases, RedisLockStore};
use control_plane::server::{self, RunningServer};
use sandhold_tests::wait::PATIENCE;
use shared::proto::v1::GetServerInfoRequest;
use shared::proto::v1::admin_service_client::AdminServiceClient;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};

fn config(data_dir: &std::path::Path, tokens: &[&str]) -> ServeConfig {
    let layer = ConfigLayer {
        listen: Some("127.0.0.1:0".parse().unwrap()),
        data_dir: Some(data_dir.to_path_buf()),
        shutdown_grace_ms: Some(5_000),
        tokens: (!tokens.is_empty()).then(|| tokens.iter().map(|t| t.parse().unwrap()).collect()),
        ..Default::default()
    };
    ServeConfig::resolve(layer).unwrap()
}

async fn channel(addr: SocketAddr) -> Channel {
    Channel::from_shared(format!("http://{addr}")).unwrap().connect().await.unwrap()
}

async fn health_status(addr: SocketAddr) -> ServingStatus {
    let mut client = HealthClient::new(channel(addr).await);
    let response: HealthCheckResponse = client
        .check(HealthCheckRequest { service: String::new() })
        .await
        .expect("health answers")
        .into_inner();
    ServingStatus::try_from(response.status).unwrap()
}

async fn wait_serving(addr: SocketAddr) {
    let deadline = Instant::now() + PATIENCE;
    while health_status(addr).await != ServingStatus::Serving {
        assert!(Instant::now() < deadline, "server did not become SERVING");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn server_info(addr: SocketAddr, token: Option<&str>) -> Result<String, tonic::Status> {
    let mut client = AdminServiceClient::new(channel(addr).await);
    let mut request = tonic::Request::new(GetServerInfoRequest {});
    if let Some(token) = token {
        request.metadata_mut().insert("authorization", format!("Bearer {token}").parse().unwrap());
    }
    client.get_server_info(request).await.map(|r| r.into_inner().tenant)
}

/// An admin client of a server without API tokens, with its local token.
async fn local_admin(
    server: &RunningServer,
) -> AdminServiceClient<tonic::service::interceptor::InterceptedService<Channel, sandhold_tests::auth::Bearer>>
{
    let token = server.local_token().expect("a tokenless server has a local token").expose().to_string();
    AdminServiceClient::with_interceptor(
        channel(server.local_addr()).await,
        sandhold_tests::auth::bearer(&token),
    )
}

async fn start(config: ServeConfig) -> RunningServer {
    server::start(config, CancellationToken::new()).await.expect("server starts")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_is_not_serving_until_the_stores_open() {
    let dir = tempfile::tempdir().unwrap();
    // The data dir is a plain file, so the SQLite store cannot be created
    // until the test removes it: the server must report NOT_SERVING (and
    // keep retrying) rather than fail or pretend.
    let blocker = dir.path().join("data");
    std::fs::write(&blocker, b"not a directory").unwrap();
    let server = start(config(&blocker, &[])).await;
    let addr = server.local_addr();

    assert_eq!(health_status(addr).await, ServingStatus::NotServing);
    let err = server_info(addr, None).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable, "calls before readiness: {err:?}");

    std::fs::remove_file(&blocker).unwrap();
    wait_serving(addr).await;
    let token = server.local_token().expect("single-user mode has a local token").expose().to_string();
    assert_eq!(server_info(addr, Some(&token)).await.unwrap(), "default", "single-user tenant");
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bearer_tokens_map_to_tenants() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(config(dir.path(), &["acme=acme-token-1", "globex=globex-token-1"])).await;
    let addr = server.local_addr();
    wait_serving(addr).await;

    let missing = server_info(addr, None).await.unwrap_err();
    assert_eq!(missing.code(), tonic::Code::Unauthenticated);
    let wrong = server_info(addr, Some("acme-token-2")).await.unwrap_err();
    assert_eq!(wrong.code(), tonic::Code::Unauthenticated);
    let reason = shared::error::Error::from_status(&wrong).code;
    assert_eq!(reason, shared::error::ErrorCode::Unauthenticated, "ErrorInfo reason travels with the status");

    assert_eq!(server_info(addr, Some("acme-token-1")).await.unwrap(), "acme");
    assert_eq!(server_info(addr, Some("globex-token-1")).await.unwrap(), "globex");
    // Cached the second time; still the right tenant.
    assert_eq!(server_info(addr, Some("acme-token-1")).await.unwrap(), "acme");
    // Health stays open for probes without credentials.
    assert_eq!(health_status(addr).await, ServingStatus::Serving);
    server.stop().await.unwrap();
}

/// A token taken out of the configuration stops working at the next start
/// (it does not live on in the database the last start wrote it to), also
/// when the server then runs with no tokens at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_removed_from_the_configuration_no_longer_authenticates() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(config(dir.path(), &["acme=acme-token-1", "globex=globex-token-1"])).await;
    wait_serving(server.local_addr()).await;
    assert_eq!(server_info(server.local_addr(), Some("globex-token-1")).await.unwrap(), "globex");
    server.stop().await.unwrap();

    let server = start(config(dir.path(), &["acme=acme-token-1"])).await;
    let addr = server.local_addr();
    wait_serving(addr).await;
    let revoked = server_info(addr, Some("globex-token-1")).await.unwrap_err();
    assert_eq!(revoked.code(), tonic::Code::Unauthenticated, "{revoked:?}");
    assert_eq!(server_info(addr, Some("acme-token-1")).await.unwrap(), "acme");
    server.stop().await.unwrap();

    let server = start(config(dir.path(), &[])).await;
    let addr = server.local_addr();
    wait_serving(addr).await;
    let revoked = server_info(addr, Some("acme-token-1")).await.unwrap_err();
    assert_eq!(revoked.code(), tonic::Code::Unauthenticated, "{revoked:?}");
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_info_names_the_backends() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path(), &[]);
    cfg.replica_id = "replica-under-test".into();
    let server = start(cfg).await;
    let addr = server.local_addr();
    wait_serving(addr).await;
    let info =
        local_admin(&server).await.get_server_info(GetServerInfoRequest {}).await.unwrap().into_inner();
    assert_eq!(info.tenant, "default");
    assert_eq!(info.replica_id, "replica-under-test");
    assert_eq!(info.store_backend, "sqlite");
    assert_eq!(info.lease_backend, "in-process");
    assert_eq!(info.server_version, env!("CARGO_PKG_VERSION"));
    server.stop().await.unwrap();
}

#[tokio::test]
async fn non_loopback_without_tokens_is_refused_before_binding() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path(), &[]);
    cfg.listen = "0.0.0.0:0".parse().unwrap();
    let err = server::start(cfg, CancellationToken::new()).await.err().expect("refused");
    let message = format!("{err:#}");
    assert!(message.contains("without API tokens"), "{message}");
}

#[test]
fn binary_refuses_non_loopback_without_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_sandhold"))
        .args(["serve", "--listen", "0.0.0.0:0", "--data-dir"])
        .arg(dir.path())
        .env_remove("SANDHOLD_TOKENS")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("refusing to listen on 0.0.0.0:0 without API tokens"), "{stderr}");
}

/// The real binary: SERVING, then SIGTERM -> NOT_SERVING on an open watch,
/// and exit status 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_reports_not_serving_and_exits_zero() {
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let log = std::fs::File::create(dir.path().join("server.log")).unwrap();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_sandhold"))
        .args(["serve", "--listen", &addr.to_string(), "--shutdown-grace-ms", "5000", "--data-dir"])
        .arg(dir.path().join("data"))
        .stdout(Stdio::null())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let log_text = || std::fs::read_to_string(dir.path().join("server.log")).unwrap_or_default();

    let deadline = Instant::now() + PATIENCE;
    let mut health = loop {
        if let Ok(ch) = Channel::from_shared(format!("http://{addr}")).unwrap().connect().await {
            break HealthClient::new(ch);
        }
        assert!(child.try_wait().unwrap().is_none(), "server exited early:\n{}", log_text());
        assert!(Instant::now() < deadline, "server did not listen:\n{}", log_text());
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let mut watch = health.watch(HealthCheckRequest { service: String::new() }).await.unwrap().into_inner();
    loop {
        let status =
            tokio::time::timeout(PATIENCE, watch.message()).await.expect("watch update").unwrap().unwrap();
        if status.status == ServingStatus::Serving as i32 {
            break;
        }
    }

    let pid = child.id().unwrap().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let status = tokio::time::timeout(PATIENCE, watch.message())
        .await
        .expect("health update after SIGTERM")
        .expect("stream still open when NOT_SERVING is announced")
        .expect("an update");
    assert_eq!(status.status, ServingStatus::NotServing as i32);
    drop(watch);
    drop(health);

    let exit = tokio::time::timeout(PATIENCE, child.wait()).await.expect("exits after SIGTERM").unwrap();
    assert_eq!(exit.code(), Some(0), "exit status after SIGTERM:\n{}", log_text());
    assert!(log_text().contains("shutting down gracefully"), "{}", log_text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_releases_held_leases() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(config(dir.path(), &[])).await;
    wait_serving(server.local_addr()).await;
    let leases = server.context().unwrap().leases.clone();
    let lease = leases.try_acquire("run:shutdown-test").await.unwrap().expect("free lease");
    let lost = lease.lost();
    server.stop().await.unwrap();
    assert!(lost.is_cancelled(), "graceful shutdown fires the holder's token");
    assert_eq!(leases.held_count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_url_selects_redis_leases() {
    let Some(redis_url) = sandhold_tests::services::redis_url() else { return };
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path(), &[]);
    cfg.redis_url = Some(redis_url.clone());
    let server = start(cfg).await;
    let addr = server.local_addr();
    wait_serving(addr).await;
    let info =
        local_admin(&server).await.get_server_info(GetServerInfoRequest {}).await.unwrap().into_inner();
    assert_eq!(info.lease_backend, "redis");
    // A lease taken through the server is held in Redis, for everyone.
    let leases = server.context().unwrap().leases.clone();
    let name = format!("run:{}", uuid::Uuid::new_v4().simple());
    let lease = leases.try_acquire(&name).await.unwrap().unwrap();
    let options = leases.options().clone();
    let store = RedisLockStore::connect(&redis_url, options.ttl).await.unwrap();
    let other = Leases::new(Arc::new(store), options).unwrap();
    assert!(other.try_acquire(&name).await.unwrap().is_none(), "held across connections");
    server.stop().await.unwrap();
    assert!(lease.is_lost());
    assert!(other.try_acquire(&name).await.unwrap().is_some(), "released in Redis at shutdown");
}

/// A log pipe whose reader went away (a restarted log collector) must not
/// stop the server from shutting down cleanly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_a_dead_log_pipe_still_exits_zero() {
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_sandhold"))
        .args(["serve", "--listen", &addr.to_string(), "--data-dir"])
        .arg(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    drop(child.stderr.take());
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Ok(ch) = Channel::from_shared(format!("http://{addr}")).unwrap().connect().await {
            let status = HealthClient::new(ch).check(HealthCheckRequest { service: String::new() }).await;
            if status.is_ok_and(|s| s.into_inner().status == ServingStatus::Serving as i32) {
                break;
            }
        }
        assert!(child.try_wait().unwrap().is_none(), "server died with its log pipe closed");
        assert!(Instant::now() < deadline, "server did not become SERVING");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let pid = child.id().unwrap().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let exit = tokio::time::timeout(PATIENCE, child.wait()).await.expect("exits after SIGTERM").unwrap();
    assert_eq!(exit.code(), Some(0));
}
