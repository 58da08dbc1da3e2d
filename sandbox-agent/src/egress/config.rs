//! What the egress listener serves: the model routes, the proxy's
//! allowlist and the extra roots; validated, and kept in the journal dir
//! (names of secrets only, never a value) with the listener's port.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use shared::error::Error;
use shared::proto::agent::v1::{ConfigureEgressRequest, EgressRoute};

/// Routes kept at most; the oldest go first.
pub const MAX_ROUTES: usize = 64;
/// The shortest placeholder: long enough never to occur by chance.
pub const MIN_PLACEHOLDER: usize = 16;
/// The file in the journal dir.
pub const CONFIG_FILE: &str = "egress.json";

/// One model route (see `EgressRoute` in `egress.proto`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Route {
    pub placeholder: String,
    pub tls: bool,
    pub host: String,
    pub port: u16,
    pub secret_name: String,
    pub label: String,
}

impl Route {
    /// `host` or `host:port` (the port when it is not the scheme's), as the
    /// `Host` header wants it.
    pub fn authority(&self) -> String {
        let default = if self.tls { 443 } else { 80 };
        let host = if self.host.contains(':') { format!("[{}]", self.host) } else { self.host.clone() };
        if self.port == default { host } else { format!("{host}:{}", self.port) }
    }
}

/// Everything configured, as kept on disk.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EgressConfig {
    /// Oldest first.
    pub routes: Vec<Route>,
    pub allow_hosts: Vec<Allowed>,
    pub extra_roots_pem: String,
}

/// One allowlist pattern: `host`, `host:port`, `*.domain`, `*.domain:port`,
/// `*` (any host), `*:port` (host names compared case-insensitively; IPv6
/// addresses in brackets when a port follows). A pattern without a port
/// allows the web's ports only, 80 and 443: anything else is named with its
/// port. The same syntax as the control plane's, which checks again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Allowed {
    /// Lowercase; for `*.domain`, the `domain`; empty for `*`.
    pub host: String,
    pub any_subdomain: bool,
    pub port: Option<u16>,
}

impl Allowed {
    /// Parse one pattern; `Err` says what is wrong with it.
    pub fn parse(pattern: &str) -> Result<Self, String> {
        let (host, port) = split_host_port(pattern.trim())?;
        if host == "*" {
            return Ok(Self { host: String::new(), any_subdomain: true, port });
        }
        let (host, any_subdomain) = match host.strip_prefix("*.") {
            Some(rest) => (rest, true),
            None => (host, false),
        };
        if host.is_empty() {
            return Err("no host".to_string());
        }
        let ipv6 = host.contains(':');
        let valid = if ipv6 {
            !any_subdomain && host.parse::<std::net::Ipv6Addr>().is_ok()
        } else {
            host.split('.').all(|label| {
                !label.is_empty()
                    && label.len() <= 63
                    && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            })
        };
        if !valid {
            return Err("not a host name, `*.domain` or IP address".to_string());
        }
        Ok(Self { host: host.to_ascii_lowercase(), any_subdomain, port })
    }

    pub fn allows(&self, host: &str, port: u16) -> bool {
        let port_ok = match self.port {
            Some(p) => p == port,
            None => port == 80 || port == 443,
        };
        let host = host.trim_start_matches('[').trim_end_matches(']').trim_end_matches('.');
        let host_ok = if self.host.is_empty() {
            true
        } else if self.any_subdomain {
            host.len() > self.host.len() + 1
                && host[host.len() - self.host.len()..].eq_ignore_ascii_case(&self.host)
                && host.as_bytes()[host.len() - self.host.len() - 1] == b'.'
        } else {
            host.eq_ignore_ascii_case(&self.host)
        };
        port_ok && host_ok
    }
}

impl std::fmt::Display for Allowed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let star = match (self.any_subdomain, self.host.is_empty()) {
            (true, true) => "*",
            (true, false) => "*.",
            (false, _) => "",
        };
        let host = if self.host.contains(':') { format!("[{}]", self.host) } else { self.host.clone() };
        match self.port {
            Some(p) => write!(f, "{star}{host}:{p}"),
            None => write!(f, "{star}{host}"),
        }
    }
}

/// `host`, `host:port`, `[v6]`, `[v6]:port`.
fn split_host_port(s: &str) -> Result<(&str, Option<u16>), String> {
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let (host, after) = rest.split_once(']').ok_or("an unclosed `[`")?;
        match after {
            "" => (host, None),
            _ => (host, Some(after.strip_prefix(':').ok_or("junk after `]`")?)),
        }
    } else {
        match s.rsplit_once(':') {
            Some((host, port)) if !host.contains(':') => (host, Some(port)),
            // A bare IPv6 address (no port).
            Some(_) if s.parse::<std::net::Ipv6Addr>().is_ok() => (s, None),
            Some(_) => return Err("an IPv6 address with a port goes in brackets".to_string()),
            None => (s, None),
        }
    };
    let port = match port {
        None => None,
        Some(p) => Some(
            p.parse::<u16>()
                .ok()
                .filter(|p| *p != 0)
                .ok_or_else(|| format!("{p:?} is not a port (1-65535)"))?,
        ),
    };
    Ok((host, port))
}

/// Whether `allow` lets the proxy reach `host:port`.
pub fn allowed(allow: &[Allowed], host: &str, port: u16) -> bool {
    allow.iter().any(|a| a.allows(host, port))
}

/// Validate one route from the wire; the field path names what is wrong.
pub fn route(index: usize, r: &EgressRoute) -> Result<Route, Error> {
    let field = |name: &str| format!("routes[{index}].{name}");
    if r.placeholder.chars().count() < MIN_PLACEHOLDER {
        return Err(Error::invalid_field(
            field("placeholder"),
            format!("at least {MIN_PLACEHOLDER} characters"),
        ));
    }
    if !r.placeholder.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(Error::invalid_field(
            field("placeholder"),
            "printable ASCII only (it is a header value)",
        ));
    }
    let tls = match r.scheme.as_str() {
        "https" => true,
        "http" => false,
        other => return Err(Error::invalid_field(field("scheme"), format!("{other:?}: http or https"))),
    };
    let host = r.host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() || host.bytes().any(|b| b.is_ascii_whitespace() || b"/?#@".contains(&b)) {
        return Err(Error::invalid_field(field("host"), format!("{:?} is not a host", r.host)));
    }
    let port = u16::try_from(r.port)
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| Error::invalid_field(field("port"), format!("{} is not a port (1-65535)", r.port)))?;
    if !shared::secret::valid_env_name(&r.secret_name) {
        return Err(Error::invalid_field(field("secret_name"), "not a valid variable name"));
    }
    Ok(Route {
        placeholder: r.placeholder.clone(),
        tls,
        host: host.to_string(),
        port,
        secret_name: r.secret_name.clone(),
        label: r.label.clone(),
    })
}

/// The configuration `current` becomes with `req`: routes added or
/// replaced by placeholder (a replaced one counts as new), at most
/// [`MAX_ROUTES`]; allowlist and roots replaced.
pub fn apply(current: &EgressConfig, req: &ConfigureEgressRequest) -> Result<EgressConfig, Error> {
    let routes = req.routes.iter().enumerate().map(|(i, r)| route(i, r)).collect::<Result<Vec<_>, _>>()?;
    let allow_hosts = req
        .allow_hosts
        .iter()
        .enumerate()
        .map(|(i, p)| Allowed::parse(p).map_err(|why| Error::invalid_field(format!("allow_hosts[{i}]"), why)))
        .collect::<Result<Vec<_>, _>>()?;
    super::tls::extra_roots(&req.extra_roots_pem)
        .map_err(|why| Error::invalid_field("extra_roots_pem", why))?;
    let mut next = current.routes.clone();
    for r in routes {
        next.retain(|old| old.placeholder != r.placeholder);
        next.push(r);
    }
    let excess = next.len().saturating_sub(MAX_ROUTES);
    next.drain(..excess);
    Ok(EgressConfig { routes: next, allow_hosts, extra_roots_pem: req.extra_roots_pem.clone() })
}

/// What the journal dir keeps.
#[derive(Debug, Serialize, Deserialize)]
pub struct Saved {
    pub port: u16,
    pub config: EgressConfig,
}

pub fn path(journal_dir: &Path) -> PathBuf {
    journal_dir.join(CONFIG_FILE)
}

/// Replace the file atomically (mode 600: only the agent reads it).
pub fn save(journal_dir: &Path, saved: &Saved) -> Result<(), Error> {
    let target = path(journal_dir);
    let tmp = target.with_extension(format!("tmp-{:016x}", rand::random::<u64>()));
    let body = serde_json::to_vec_pretty(saved).map_err(|e| Error::internal(format!("encoding: {e}")))?;
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .and_then(|mut f| {
            f.write_all(&body)?;
            f.sync_all()
        })
        .and_then(|()| std::fs::rename(&tmp, &target));
    written.map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        Error::internal(format!("writing {}: {e}", target.display()))
    })
}

/// The saved configuration, if any (a file that does not parse is logged
/// and ignored: the control plane configures again at its next ensure).
pub fn load(journal_dir: &Path) -> Option<Saved> {
    let target = path(journal_dir);
    let body = std::fs::read(&target).ok()?;
    match serde_json::from_slice(&body) {
        Ok(saved) => Some(saved),
        Err(e) => {
            tracing::warn!(path = %target.display(), error = %e, "ignoring an unreadable egress config");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allow(patterns: &[&str]) -> Vec<Allowed> {
        patterns.iter().map(|p| Allowed::parse(p).unwrap()).collect()
    }

    #[test]
    fn patterns_match_hosts_ports_and_subdomains() {
        let a = allow(&[
            "registry.npmjs.org",
            "*.pypi.org",
            "db.internal:5432",
            "[::1]:8080",
            "10.0.0.1",
            "fd00::7",
        ]);
        assert!(allowed(&a, "registry.npmjs.org", 443));
        assert!(allowed(&a, "REGISTRY.npmjs.org", 80));
        assert!(!allowed(&a, "registry.npmjs.org", 8443), "no port: 80 and 443 only");
        assert!(allowed(&a, "files.pypi.org", 443));
        assert!(allowed(&a, "a.b.pypi.org", 443));
        assert!(!allowed(&a, "pypi.org", 443), "`*.` is subdomains only");
        assert!(!allowed(&a, "evilpypi.org", 443));
        assert!(allowed(&a, "db.internal", 5432));
        assert!(!allowed(&a, "db.internal", 443));
        assert!(allowed(&a, "::1", 8080));
        assert!(allowed(&a, "10.0.0.1", 80));
        assert!(!allowed(&a, "registry.npmjs.org.evil.com", 443));
        assert!(allowed(&a, "fd00::7", 443));
        assert!(!allowed(&[], "registry.npmjs.org", 443));
        let any = allow(&["*", "*:8080"]);
        assert!(allowed(&any, "anything.test", 443) && allowed(&any, "x.test", 8080));
        assert!(!allowed(&any, "x.test", 22));
        assert_eq!(any[0].to_string(), "*");
        for bad in ["", "*.", "a b", "host:0", "host:99999", "a..b", "::1:x", "[::1", "*.[::1]", "x/y"] {
            assert!(Allowed::parse(bad).is_err(), "{bad:?}");
        }
        assert_eq!(Allowed::parse("*.Example.com:8443").unwrap().to_string(), "*.example.com:8443");
    }

    fn wire(placeholder: &str) -> EgressRoute {
        EgressRoute {
            placeholder: placeholder.to_string(),
            scheme: "https".to_string(),
            host: "api.example.com".to_string(),
            port: 443,
            secret_name: "API_KEY".to_string(),
            label: "claude-code".to_string(),
        }
    }

    #[test]
    fn invalid_routes_name_their_field() {
        type Spoil = fn(&mut EgressRoute);
        let cases: [(Spoil, &str); 6] = [
            (|r| r.placeholder = "short".into(), "routes[0].placeholder"),
            (|r| r.scheme = "ftp".into(), "routes[0].scheme"),
            (|r| r.host = String::new(), "routes[0].host"),
            (|r| r.port = 0, "routes[0].port"),
            (|r| r.port = 65_536, "routes[0].port"),
            (|r| r.secret_name = "not a name".into(), "routes[0].secret_name"),
        ];
        for (spoil, field) in cases {
            let mut r = wire("sandhold-placeholder-0001");
            spoil(&mut r);
            let err = route(0, &r).unwrap_err();
            assert_eq!(err.code, shared::error::ErrorCode::InvalidArgument);
            assert!(err.field_violations.iter().any(|v| v.0 == field), "{field}: {err:?}");
        }
        let req = ConfigureEgressRequest {
            allow_hosts: vec!["ok.com".into(), "bad host".into()],
            ..Default::default()
        };
        let err = apply(&EgressConfig::default(), &req).unwrap_err();
        assert!(err.field_violations.iter().any(|v| v.0 == "allow_hosts[1]"), "{err:?}");
        let req = ConfigureEgressRequest { extra_roots_pem: "not a pem".into(), ..Default::default() };
        let err = apply(&EgressConfig::default(), &req).unwrap_err();
        assert!(err.field_violations.iter().any(|v| v.0 == "extra_roots_pem"), "{err:?}");
    }

    #[test]
    fn routes_are_upserted_by_placeholder_and_the_oldest_go() {
        let mut config = EgressConfig::default();
        for i in 0..70 {
            let req = ConfigureEgressRequest {
                routes: vec![wire(&format!("placeholder-{i:08}"))],
                ..Default::default()
            };
            config = apply(&config, &req).unwrap();
        }
        assert_eq!(config.routes.len(), MAX_ROUTES);
        assert_eq!(config.routes[0].placeholder, "placeholder-00000006");
        let mut replaced = wire("placeholder-00000006");
        replaced.host = "other.example.com".into();
        let req = ConfigureEgressRequest { routes: vec![replaced], ..Default::default() };
        config = apply(&config, &req).unwrap();
        assert_eq!(config.routes.len(), MAX_ROUTES);
        let last = config.routes.last().unwrap();
        assert_eq!(
            (last.placeholder.as_str(), last.host.as_str()),
            ("placeholder-00000006", "other.example.com")
        );
        assert_eq!(last.authority(), "other.example.com");
    }
}
