//! What the egress listener serves: the model routes and the extra roots
//! (where the proxy may go, the control plane alone decides); validated, and kept in the journal dir
//! (names of secrets only, never a value) with the listener's port.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use shared::error::Error;
use shared::proto::agent::v1::{ConfigureEgressRequest, EgressRoute};

use super::credential::{self, Credential};
use super::ledger::Budget;

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
    /// The run whose usage the route's answers are recorded under (empty:
    /// not metered).
    #[serde(default)]
    pub run_id: String,
    #[serde(default)]
    pub budget: Budget,
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
    pub extra_roots_pem: String,
    /// The brokered credentials, each with its placeholder.
    #[serde(default)]
    pub credentials: Vec<Credential>,
    /// Host patterns whose https connections are intercepted so each
    /// request is judged by its method and path.
    #[serde(default)]
    pub intercept_hosts: Vec<String>,
}

impl EgressConfig {
    /// Whether connections to `host:port` are intercepted: a credential
    /// is bound there, or rules judge its requests.
    pub fn intercepts(&self, host: &str, port: u16) -> bool {
        self.credentials.iter().any(|c| c.bound_to(host, port))
            || self
                .intercept_hosts
                .iter()
                .filter_map(|h| shared::hosts::HostPattern::parse(h).ok())
                .any(|p| p.matches(host, port))
    }

    /// Whether the interception CA is needed.
    pub fn intercepting(&self) -> bool {
        !self.credentials.is_empty() || !self.intercept_hosts.is_empty()
    }
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
    // It names a file in the journal dir.
    if !r.run_id.is_empty()
        && let Err(e) = shared::ids::RunId::parse(&r.run_id)
    {
        return Err(Error::invalid_field(field("run_id"), e.to_string()));
    }
    let budget = r.budget.as_ref().map_or_else(Budget::default, |b| Budget {
        max_tokens: b.max_tokens,
        max_input_tokens: b.max_input_tokens,
        max_output_tokens: b.max_output_tokens,
    });
    if !budget.is_none() && r.run_id.is_empty() {
        return Err(Error::invalid_field(field("budget"), "a budget counts a run's usage: set run_id"));
    }
    Ok(Route {
        placeholder: r.placeholder.clone(),
        tls,
        host: host.to_string(),
        port,
        secret_name: r.secret_name.clone(),
        label: r.label.clone(),
        run_id: r.run_id.clone(),
        budget,
    })
}

/// The configuration `current` becomes with `req`: routes added or
/// replaced by placeholder (a replaced one counts as new), at most
/// [`MAX_ROUTES`]; the extra roots and the credentials replaced (a
/// secret keeps the placeholder it had).
pub fn apply(current: &EgressConfig, req: &ConfigureEgressRequest) -> Result<EgressConfig, Error> {
    let routes = req.routes.iter().enumerate().map(|(i, r)| route(i, r)).collect::<Result<Vec<_>, _>>()?;
    super::tls::extra_roots(&req.extra_roots_pem)
        .map_err(|why| Error::invalid_field("extra_roots_pem", why))?;
    let mut next = current.routes.clone();
    for r in routes {
        next.retain(|old| old.placeholder != r.placeholder);
        next.push(r);
    }
    let excess = next.len().saturating_sub(MAX_ROUTES);
    next.drain(..excess);
    let credentials = req
        .credentials
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let kept = current.credentials.iter().find(|old| old.secret_name == c.secret_name);
            let placeholder = kept.map_or_else(credential::placeholder, |old| old.placeholder.clone());
            credential::credential(i, c, placeholder)
        })
        .collect::<Result<Vec<_>, _>>()?;
    for (i, h) in req.intercept_hosts.iter().enumerate() {
        shared::hosts::HostPattern::parse(h)
            .map_err(|why| Error::invalid_field(format!("intercept_hosts[{i}]"), why))?;
    }
    Ok(EgressConfig {
        routes: next,
        extra_roots_pem: req.extra_roots_pem.clone(),
        credentials,
        intercept_hosts: req.intercept_hosts.clone(),
    })
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

    fn wire(placeholder: &str) -> EgressRoute {
        EgressRoute {
            placeholder: placeholder.to_string(),
            scheme: "https".to_string(),
            host: "api.example.com".to_string(),
            port: 443,
            secret_name: "API_KEY".to_string(),
            label: "claude-code".to_string(),
            ..Default::default()
        }
    }

    #[test]
    fn invalid_routes_name_their_field() {
        type Spoil = fn(&mut EgressRoute);
        let cases: [(Spoil, &str); 8] = [
            (|r| r.placeholder = "short".into(), "routes[0].placeholder"),
            (|r| r.scheme = "ftp".into(), "routes[0].scheme"),
            (|r| r.host = String::new(), "routes[0].host"),
            (|r| r.port = 0, "routes[0].port"),
            (|r| r.port = 65_536, "routes[0].port"),
            (|r| r.secret_name = "not a name".into(), "routes[0].secret_name"),
            (|r| r.run_id = "../escape".into(), "routes[0].run_id"),
            (
                |r| {
                    r.budget =
                        Some(shared::proto::agent::v1::RouteBudget { max_tokens: 1, ..Default::default() })
                },
                "routes[0].budget",
            ),
        ];
        for (spoil, field) in cases {
            let mut r = wire("sandhold-placeholder-0001");
            spoil(&mut r);
            let err = route(0, &r).unwrap_err();
            assert_eq!(err.code, shared::error::ErrorCode::InvalidArgument);
            assert!(err.field_violations.iter().any(|v| v.0 == field), "{field}: {err:?}");
        }
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
