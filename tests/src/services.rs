//! Where the test services are, from the environment `scripts/services`
//! prints.

use std::time::Duration;

/// True when `scripts/test` asked for every service to be present.
pub fn required() -> bool {
    std::env::var("SANDHOLD_REQUIRE_SERVICES").is_ok_and(|v| v == "1")
}

/// A service missing: `false` (skip), or a failure when services are
/// required.
pub fn missing_service(service: &str, why: &str) -> bool {
    missing(service, why).is_some()
}

fn missing(service: &str, why: &str) -> Option<String> {
    if required() {
        panic!("{service} is required (SANDHOLD_REQUIRE_SERVICES=1) but {why}; run scripts/services");
    }
    eprintln!("skipping: {service} not available ({why}); scripts/test provides it");
    None
}

fn reachable(host_port: &str) -> bool {
    use std::net::ToSocketAddrs;
    host_port
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .is_some_and(|addr| std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).is_ok())
}

fn host_port(url: &str) -> Option<String> {
    let rest = url.split("://").nth(1)?;
    let rest = rest.rsplit('@').next()?;
    let hp = rest.split(['/', '?']).next()?;
    Some(hp.to_string())
}

fn url_service(service: &str, var: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(url) if !url.is_empty() => match host_port(&url) {
            Some(hp) if reachable(&hp) => Some(url),
            _ => missing(service, &format!("{var}={url} is not reachable")),
        },
        _ => missing(service, &format!("{var} is not set")),
    }
}

/// URL of a PostgreSQL database whose role may create databases.
pub fn postgres_url() -> Option<String> {
    url_service("PostgreSQL", "SANDHOLD_TEST_DATABASE_URL")
}

/// URL of a Redis server the tests may use freely.
pub fn redis_url() -> Option<String> {
    url_service("Redis", "SANDHOLD_TEST_REDIS_URL")
}

/// True when a Docker engine answers `docker info`.
pub fn docker() -> bool {
    let ok = std::process::Command::new("docker")
        .arg("info")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if ok { true } else { missing("Docker", "`docker info` failed").is_some() }
}

/// A path to an executable on PATH, or a skip/failure as above.
pub fn program(name: &str) -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH")?;
    for dir in std::env::split_paths(&path) {
        let candidate = dir.join(name);
        if candidate.is_file() {
            return Some(candidate);
        }
    }
    missing(name, "it is not on PATH").map(std::path::PathBuf::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_port_of_urls() {
        assert_eq!(host_port("postgres://u:p@127.0.0.1:5432/db").as_deref(), Some("127.0.0.1:5432"));
        assert_eq!(host_port("redis://127.0.0.1:6379").as_deref(), Some("127.0.0.1:6379"));
        assert_eq!(host_port("redis://127.0.0.1:6379/0?x=1").as_deref(), Some("127.0.0.1:6379"));
    }
}
