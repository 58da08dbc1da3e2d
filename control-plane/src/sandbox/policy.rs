//! The operator policy applied to a tenant's definition: refused at
//! `PutDefinition` and again at every ensure (a stored definition may
//! predate a stricter policy), each breach a field violation that names
//! the rule; and the default limits a definition that names none gets.
//!
//! At an ensure, bind sources are also resolved on this host (symlinks
//! followed, as the engine will) and must still be under a prefix: a link
//! a sandbox left in a writable prefix cannot point a later bind at `/`.

use std::path::{Path, PathBuf};

use shared::proto::v1::{DockerProvider, SandboxDefinition, provider_spec};

use crate::config::{Policy, ProviderName, forbidden_network, plain_absolute};
use crate::provider::DockerOptions;
use crate::provision::{Violations, refuse};

/// Image repositories the control plane makes for native snapshots and
/// forks: never a tenant's to name (they hold other sandboxes' files).
const RESERVED_IMAGE_REPOS: [&str; 2] = ["sandhold-snapshot", "sandhold-fork"];
/// Container paths the agent owns: its binary and its host directory.
const RESERVED_TARGETS: [&str; 2] = ["/.sandhold", "/run/sandhold"];

/// The policy of one server: the operator's settings and whether API
/// tokens are configured (which turns the local provider off unless the
/// operator opted in).
#[derive(Debug, Clone)]
pub struct OperatorPolicy {
    policy: Policy,
    with_tokens: bool,
    /// Host paths of the server no bind may hold or sit in, whatever the
    /// prefixes say (its data dir, its toolchains).
    protected: Vec<PathBuf>,
}

impl Default for OperatorPolicy {
    /// The built-in policy of a single-user server.
    fn default() -> Self {
        Self::new(Policy::default(), false)
    }
}

impl OperatorPolicy {
    pub fn new(policy: Policy, with_tokens: bool) -> Self {
        Self { policy, with_tokens, protected: Vec::new() }
    }

    /// The same policy, refusing any bind that holds or sits in one of
    /// `paths` (the server's data dir and toolchain dir: sandboxes' host
    /// dirs, tokens, the database).
    pub fn protecting(mut self, paths: impl IntoIterator<Item = PathBuf>) -> Self {
        self.protected.extend(paths);
        self
    }

    pub fn allows_provider(&self, provider: ProviderName) -> bool {
        self.policy.allows_provider(provider, self.with_tokens)
    }

    /// Why `provider` is off, or `None` when tenants may use it.
    pub fn provider_refusal(&self, provider: ProviderName) -> Option<String> {
        if self.allows_provider(provider) {
            return None;
        }
        let name = provider.as_str();
        Some(if self.policy.providers.contains(&provider) {
            "the local provider is off on a server with API tokens: it runs tenant code on the host as the \
             server's user (operator policy: allow_local_with_tokens)"
                .to_string()
        } else {
            format!("the {name} provider is not allowed on this server (operator policy: providers)")
        })
    }

    /// `d` against the policy, as at `PutDefinition`: every breach a field
    /// violation in one INVALID_ARGUMENT.
    pub fn check(&self, d: &SandboxDefinition) -> Result<(), Violations> {
        refuse("sandbox definition", self.violations(d, false))
    }

    /// As [`check`](Self::check), bind sources also resolved on this host:
    /// what an ensure runs right before the provider creates.
    pub fn check_on_host(&self, d: &SandboxDefinition) -> Result<(), Violations> {
        refuse("sandbox definition", self.violations(d, true))
    }

    fn violations(&self, d: &SandboxDefinition, on_host: bool) -> Vec<(String, String)> {
        let mut out = Vec::new();
        let provider = match d.provider.as_ref().and_then(|p| p.provider.as_ref()) {
            Some(provider_spec::Provider::Local(_)) => ProviderName::Local,
            Some(provider_spec::Provider::Docker(_)) => ProviderName::Docker,
            None => return out,
        };
        if let Some(why) = self.provider_refusal(provider) {
            out.push(("definition.provider".to_string(), why));
        }
        let max = self.policy.max_journal_bytes;
        if let Some(asked) = d.max_journal_bytes.filter(|n| *n > max) {
            out.push((
                "definition.max_journal_bytes".to_string(),
                format!("{asked} is over the maximum of {max} (operator policy: max_journal_bytes)"),
            ));
        }
        if let Some(provider_spec::Provider::Docker(docker)) =
            d.provider.as_ref().and_then(|p| p.provider.as_ref())
        {
            self.docker_violations(docker, on_host, &mut out);
        }
        out.extend(crate::egress::violations(d, &self.policy.egress_hosts));
        out
    }

    /// Whether sandbox egress may reach private addresses.
    pub fn egress_private_addresses(&self) -> bool {
        self.policy.egress_private_addresses
    }

    fn docker_violations(&self, d: &DockerProvider, on_host: bool, out: &mut Vec<(String, String)>) {
        let p = &self.policy;
        let mut bad =
            |field: &str, why: String| out.push((format!("definition.provider.docker.{field}"), why));
        if !d.image.is_empty() {
            let repo = d.image.split(['@', ':']).next().unwrap_or_default();
            if RESERVED_IMAGE_REPOS.contains(&repo) {
                bad("image", format!("{:?} is an image Sandhold made for another sandbox", d.image));
            } else if !p.docker_images.iter().any(|allowed| image_allowed(allowed, &d.image)) {
                bad(
                    "image",
                    format!("{:?} is not an allowed image (operator policy: docker_images)", d.image),
                );
            }
        }
        if !d.network.is_empty() && d.network != "none" {
            if forbidden_network(&d.network) {
                bad(
                    "network",
                    format!(
                        "{:?} shares the host's or another container's namespaces and is never allowed \
                         (operator policy: docker_networks)",
                        d.network
                    ),
                );
            } else if !p.docker_networks.iter().any(|n| n == "*" || *n == d.network) {
                bad(
                    "network",
                    format!("{:?} is not an allowed network (operator policy: docker_networks)", d.network),
                );
            }
        }
        for (i, m) in d.mounts.iter().enumerate() {
            let field = format!("mounts[{i}]");
            let target = Path::new(&m.target);
            if RESERVED_TARGETS.iter().any(|r| target.starts_with(r) || Path::new(r).starts_with(target)) {
                bad(&field, format!("target {:?} is reserved for the sandbox agent", m.target));
            }
            if m.source.starts_with('/') {
                let source = Path::new(&m.source);
                if let Some(why) = bind_refusal(p, source, m.read_only, on_host)
                    .or_else(|| protected_refusal(&self.protected, source))
                {
                    bad(&field, why);
                }
            } else if !p.docker_volumes.contains(&m.source) {
                bad(
                    &field,
                    format!(
                        "volume {:?} is not an allowed volume (operator policy: docker_volumes)",
                        m.source
                    ),
                );
            }
        }
        let over = |value: f64, max: f64| max > 0.0 && value > max;
        if over(d.memory_bytes as f64, p.docker_max_memory_bytes as f64) {
            bad(
                "memory_bytes",
                format!(
                    "{} is over the maximum of {} (operator policy: docker_max_memory_bytes)",
                    d.memory_bytes, p.docker_max_memory_bytes
                ),
            );
        }
        if over(d.cpus, p.docker_max_cpus) {
            bad(
                "cpus",
                format!(
                    "{} is over the maximum of {} (operator policy: docker_max_cpus)",
                    d.cpus, p.docker_max_cpus
                ),
            );
        }
        if over(d.pids_limit as f64, p.docker_max_pids_limit as f64) {
            bad(
                "pids_limit",
                format!(
                    "{} is over the maximum of {} (operator policy: docker_max_pids_limit)",
                    d.pids_limit, p.docker_max_pids_limit
                ),
            );
        }
    }

    /// The journal byte cap of a run of `d`: its own, else the operator's
    /// default; never over the operator's maximum (a stored definition may
    /// predate a lower one).
    pub fn journal_cap(&self, d: &SandboxDefinition) -> u64 {
        let p = &self.policy;
        d.max_journal_bytes.filter(|n| *n > 0).unwrap_or(p.default_journal_bytes).min(p.max_journal_bytes)
    }

    /// The default limits where `docker` names none.
    pub fn apply_limits(&self, docker: &mut DockerOptions) {
        let p = &self.policy;
        if docker.memory_bytes.is_none() && p.docker_default_memory_bytes > 0 {
            docker.memory_bytes = Some(i64::try_from(p.docker_default_memory_bytes).unwrap_or(i64::MAX));
        }
        if docker.cpus.is_none() && p.docker_default_cpus > 0.0 {
            docker.cpus = Some(p.docker_default_cpus);
        }
        if docker.pids_limit.is_none() && p.docker_default_pids_limit > 0 {
            docker.pids_limit = Some(p.docker_default_pids_limit);
        }
    }
}

/// `allowed` (an image, any tag or digest of it, or a prefix ending in
/// `*`) admits `image`.
fn image_allowed(allowed: &str, image: &str) -> bool {
    match allowed.strip_suffix('*') {
        Some(prefix) => image.starts_with(prefix),
        None => {
            image == allowed
                || image
                    .strip_prefix(allowed)
                    .is_some_and(|rest| rest.starts_with(':') || rest.starts_with('@'))
        }
    }
}

/// Why a bind of `source` is refused whatever the prefixes: it holds or
/// sits in a `protected` path, or is (or directly holds) a socket, which a
/// read-only bind still lets the sandbox connect to (`docker.sock`). Both
/// as written and as this host resolves it.
fn protected_refusal(protected: &[PathBuf], source: &Path) -> Option<String> {
    let resolved = std::fs::canonicalize(source).ok();
    let sources: Vec<&Path> = std::iter::once(source).chain(resolved.as_deref()).collect();
    for path in protected {
        let real = std::fs::canonicalize(path).ok();
        for p in std::iter::once(path.as_path()).chain(real.as_deref()) {
            if sources.iter().any(|s| s.starts_with(p) || p.starts_with(s)) {
                return Some(format!(
                    "host path {} holds or is inside the server's own {} (never bound)",
                    source.display(),
                    path.display()
                ));
            }
        }
    }
    use std::os::unix::fs::FileTypeExt;
    let meta = std::fs::metadata(source).ok()?;
    if meta.file_type().is_socket() {
        return Some(format!("host path {} is a socket (never bound, even read-only)", source.display()));
    }
    if meta.is_dir() {
        let socket =
            std::fs::read_dir(source).ok()?.flatten().find(|e| e.file_type().is_ok_and(|t| t.is_socket()))?;
        return Some(format!(
            "host path {} holds a socket, {} (never bound, even read-only)",
            source.display(),
            socket.file_name().to_string_lossy()
        ));
    }
    None
}

/// Why a bind of host path `source` is refused, or `None`.
fn bind_refusal(p: &Policy, source: &Path, read_only: bool, on_host: bool) -> Option<String> {
    if !plain_absolute(source) {
        return Some(format!(
            "bind source {} must be an absolute path without `.` or `..`",
            source.display()
        ));
    }
    // The engine follows links in the source on this host, so the check
    // must too; a missing source the engine refuses anyway.
    let (source, resolve): (PathBuf, fn(&Path) -> PathBuf) = if on_host {
        (std::fs::canonicalize(source).unwrap_or_else(|_| source.to_path_buf()), |prefix| {
            std::fs::canonicalize(prefix).unwrap_or_else(|_| prefix.to_path_buf())
        })
    } else {
        (source.to_path_buf(), Path::to_path_buf)
    };
    let under = |prefixes: &[PathBuf]| prefixes.iter().any(|prefix| source.starts_with(resolve(prefix)));
    if under(&p.docker_writable_bind_prefixes) {
        return None;
    }
    if under(&p.docker_bind_prefixes) {
        return (!read_only).then(|| {
            format!(
                "a read-write bind of {} needs a prefix listed as writable \
                 (operator policy: docker_writable_bind_prefixes)",
                source.display()
            )
        });
    }
    Some(format!(
        "host path {} is not under an allowed bind prefix (operator policy: docker_bind_prefixes)",
        source.display()
    ))
}

#[cfg(test)]
mod tests {
    use shared::error::ErrorCode;
    use shared::proto::v1::{LocalProvider, Mount, ProviderSpec};

    use super::*;

    fn docker(d: DockerProvider) -> SandboxDefinition {
        SandboxDefinition {
            id: "d".into(),
            provider: Some(ProviderSpec { provider: Some(provider_spec::Provider::Docker(d)) }),
            ..Default::default()
        }
    }

    fn image(name: &str) -> DockerProvider {
        DockerProvider { image: name.into(), ..Default::default() }
    }

    fn mount(source: &str, read_only: bool) -> Mount {
        Mount { source: source.into(), target: "/m".into(), read_only }
    }

    /// The refused fields and their reasons.
    fn refused(policy: &OperatorPolicy, d: &SandboxDefinition) -> Vec<(String, String)> {
        match policy.check(d) {
            Ok(()) => Vec::new(),
            Err(e) => {
                let e = shared::error::Error::from(e);
                assert_eq!(e.code, ErrorCode::InvalidArgument);
                e.field_violations
            }
        }
    }

    fn rule_of(violations: &[(String, String)], field: &str) -> String {
        violations.iter().find(|(f, _)| f == field).map(|(_, w)| w.clone()).unwrap_or_default()
    }

    #[test]
    fn local_is_off_with_tokens_unless_opted_in() {
        let local = SandboxDefinition {
            id: "l".into(),
            provider: Some(ProviderSpec { provider: Some(provider_spec::Provider::Local(LocalProvider {})) }),
            ..Default::default()
        };
        assert!(refused(&OperatorPolicy::default(), &local).is_empty());
        let v = refused(&OperatorPolicy::new(Policy::default(), true), &local);
        assert!(rule_of(&v, "definition.provider").contains("allow_local_with_tokens"), "{v:?}");
        let opted = Policy { allow_local_with_tokens: true, ..Default::default() };
        assert!(refused(&OperatorPolicy::new(opted, true), &local).is_empty());
        let docker_only = Policy { providers: vec![ProviderName::Docker], ..Default::default() };
        let v = refused(&OperatorPolicy::new(docker_only.clone(), false), &local);
        assert!(rule_of(&v, "definition.provider").contains("operator policy: providers"), "{v:?}");
        assert!(refused(&OperatorPolicy::new(docker_only, false), &docker(image("x"))).is_empty());
    }

    #[test]
    fn a_journal_cap_over_the_operator_maximum_is_refused_and_unset_gets_the_default() {
        let caps =
            Policy { default_journal_bytes: 1 << 20, max_journal_bytes: 4 << 20, ..Default::default() };
        let policy = OperatorPolicy::new(caps, false);
        let with = |max_journal_bytes| SandboxDefinition { max_journal_bytes, ..docker(image("x")) };
        let v = refused(&policy, &with(Some((4 << 20) + 1)));
        assert_eq!(
            rule_of(&v, "definition.max_journal_bytes"),
            "4194305 is over the maximum of 4194304 (operator policy: max_journal_bytes)"
        );
        assert!(refused(&policy, &with(Some(4 << 20))).is_empty());
        assert_eq!(policy.journal_cap(&with(None)), 1 << 20);
        assert_eq!(policy.journal_cap(&with(Some(2 << 20))), 2 << 20);
        assert_eq!(
            policy.journal_cap(&with(Some(9 << 20))),
            4 << 20,
            "a stored definition over a lowered max"
        );
    }

    #[test]
    fn networks_other_than_none_must_be_listed_and_never_host() {
        let listed = Policy { docker_networks: vec!["sandnet".into()], ..Default::default() };
        let policy = OperatorPolicy::new(listed, true);
        for ok in ["", "none", "sandnet"] {
            assert!(
                refused(&policy, &docker(DockerProvider { network: ok.into(), ..image("x") })).is_empty()
            );
        }
        for (net, rule) in [
            ("host", "never allowed"),
            ("container:abc", "never allowed"),
            ("bridge", "not an allowed network"),
        ] {
            let v = refused(&policy, &docker(DockerProvider { network: net.into(), ..image("x") }));
            assert!(rule_of(&v, "definition.provider.docker.network").contains(rule), "{net}: {v:?}");
        }
    }

    #[test]
    fn binds_only_under_prefixes_and_read_write_only_under_writable_ones() {
        let policy = OperatorPolicy::new(
            Policy {
                docker_bind_prefixes: vec!["/srv/ro".into()],
                docker_writable_bind_prefixes: vec!["/srv/rw".into()],
                docker_volumes: vec!["cache".into()],
                ..Default::default()
            },
            true,
        );
        let with = |m: Mount| docker(DockerProvider { mounts: vec![m], ..image("x") });
        for ok in [
            mount("/srv/ro/a", true),
            mount("/srv/rw/b", false),
            mount("/srv/rw", true),
            mount("cache", false),
        ] {
            assert!(refused(&policy, &with(ok.clone())).is_empty(), "{ok:?}");
        }
        let cases = [
            (mount("/", true), "docker_bind_prefixes"),
            (mount("/srv/rox", true), "docker_bind_prefixes"),
            (mount("/srv/ro/../../etc", true), "without `.` or `..`"),
            (mount("/srv/ro/a", false), "docker_writable_bind_prefixes"),
            (mount("other-volume", false), "docker_volumes"),
            (Mount { source: "cache".into(), target: "/run/sandhold/x".into(), read_only: true }, "reserved"),
            (Mount { source: "cache".into(), target: "/run".into(), read_only: true }, "reserved"),
        ];
        for (m, rule) in cases {
            let v = refused(&policy, &with(m.clone()));
            assert!(rule_of(&v, "definition.provider.docker.mounts[0]").contains(rule), "{m:?}: {v:?}");
        }
    }

    #[test]
    fn a_link_in_a_prefix_is_followed_on_the_host() {
        let dir = tempfile::tempdir().unwrap();
        let prefix = dir.path().join("shared");
        std::fs::create_dir(&prefix).unwrap();
        std::os::unix::fs::symlink("/", prefix.join("root")).unwrap();
        let policy = OperatorPolicy::new(
            Policy { docker_bind_prefixes: vec![prefix.clone()], ..Default::default() },
            true,
        );
        let d = docker(DockerProvider {
            mounts: vec![mount(&prefix.join("root").display().to_string(), true)],
            ..image("x")
        });
        assert!(policy.check(&d).is_ok(), "lexically under the prefix");
        let err = shared::error::Error::from(policy.check_on_host(&d).unwrap_err());
        assert!(err.message.contains("not under an allowed bind prefix"), "{err:?}");
    }

    #[test]
    fn images_exact_with_any_tag_or_by_prefix_and_never_sandholds_own() {
        let policy = OperatorPolicy::new(
            Policy {
                docker_images: vec!["debian".into(), "registry.local/team/*".into()],
                ..Default::default()
            },
            true,
        );
        for ok in ["debian", "debian:bookworm", "debian@sha256:abc", "registry.local/team/app:1"] {
            assert!(refused(&policy, &docker(image(ok))).is_empty(), "{ok}");
        }
        for bad in ["debianx", "ubuntu", "registry.local/other/app"] {
            let v = refused(&policy, &docker(image(bad)));
            assert!(
                rule_of(&v, "definition.provider.docker.image").contains("docker_images"),
                "{bad}: {v:?}"
            );
        }
        let any = OperatorPolicy::default();
        assert!(refused(&any, &docker(image("anything:1"))).is_empty());
        let v = refused(&any, &docker(image("sandhold-snapshot:abc")));
        assert!(rule_of(&v, "definition.provider.docker.image").contains("another sandbox"), "{v:?}");
    }

    #[test]
    fn limits_over_the_maximum_are_refused_and_missing_ones_defaulted() {
        let policy = OperatorPolicy::new(
            Policy { docker_default_cpus: 1.0, docker_max_cpus: 2.0, ..Default::default() },
            true,
        );
        let over = DockerProvider { memory_bytes: 17 << 30, cpus: 2.5, pids_limit: 10_000, ..image("x") };
        let v = refused(&policy, &docker(over));
        for (field, rule) in [
            ("memory_bytes", "docker_max_memory_bytes"),
            ("cpus", "docker_max_cpus"),
            ("pids_limit", "docker_max_pids_limit"),
        ] {
            assert!(rule_of(&v, &format!("definition.provider.docker.{field}")).contains(rule), "{v:?}");
        }
        let at_max = DockerProvider { memory_bytes: 16 << 30, cpus: 2.0, pids_limit: 8192, ..image("x") };
        assert!(refused(&policy, &docker(at_max)).is_empty());

        let mut opts = DockerOptions::default();
        policy.apply_limits(&mut opts);
        assert_eq!((opts.memory_bytes, opts.cpus, opts.pids_limit), (Some(2 << 30), Some(1.0), Some(1024)));
        let mut named = DockerOptions { memory_bytes: Some(1 << 20), ..Default::default() };
        policy.apply_limits(&mut named);
        assert_eq!(named.memory_bytes, Some(1 << 20), "a named limit is kept");
    }
}
