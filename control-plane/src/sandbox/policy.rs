//! The operator policy applied to a tenant's definition: refused at
//! `PutDefinition` and again at every ensure (a stored definition may
//! predate a stricter policy), each breach a field violation that names
//! the rule. What a provider's own section may ask for (images, mounts,
//! networks, limits) its provider checks ([`crate::provider::Kind`]).

use std::path::{Path, PathBuf};

use shared::proto::v1::SandboxDefinition;

use crate::config::{Policy, ProviderName};
use crate::provider::{ProviderKind, SandboxSpec};
use crate::provision::{Violations, refuse};

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

    /// The operator's settings.
    pub fn settings(&self) -> &Policy {
        &self.policy
    }

    pub fn allows_provider(&self, provider: ProviderKind) -> bool {
        ProviderName::named(provider.as_str())
            .is_some_and(|name| self.policy.allows_provider(name, self.with_tokens))
    }

    /// Why `provider` is off, or `None` when tenants may use it.
    pub fn provider_refusal(&self, provider: ProviderKind) -> Option<String> {
        if self.allows_provider(provider) {
            return None;
        }
        let name = provider.as_str();
        Some(if ProviderName::named(name).is_some_and(|n| self.policy.providers.contains(&n)) {
            "the local provider is off on a server with API tokens: it runs tenant code on the host as the \
             server's user (operator policy: allow_local_with_tokens)"
                .to_string()
        } else {
            format!("the {name} provider is not allowed on this server (operator policy: providers)")
        })
    }

    /// `d` against the policy, as at `PutDefinition`: every breach a field
    /// violation in one INVALID_ARGUMENT.
    pub fn check(&self, d: &SandboxDefinition, tenant: &str) -> Result<(), Violations> {
        refuse("sandbox definition", self.violations(d, tenant, false))
    }

    /// As [`check`](Self::check), bind sources also resolved on this host:
    /// what an ensure runs right before the provider creates.
    pub fn check_on_host(&self, d: &SandboxDefinition, tenant: &str) -> Result<(), Violations> {
        refuse("sandbox definition", self.violations(d, tenant, true))
    }

    fn violations(&self, d: &SandboxDefinition, tenant: &str, on_host: bool) -> Vec<(String, String)> {
        let mut out = Vec::new();
        let Some((provider, section)) = ProviderKind::of(d) else { return out };
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
        provider.kind().violations(section, &self.policy.for_tenant(tenant), on_host, &mut out);
        for (field, source) in provider.kind().host_paths(section) {
            if let Some(why) = protected_refusal(&self.protected, &source) {
                out.push((field, why));
            }
        }
        out.extend(crate::egress::violations(d, &self.policy.egress_hosts));
        out
    }

    /// Whether sandbox egress may reach private addresses.
    pub fn egress_private_addresses(&self) -> bool {
        self.policy.egress_private_addresses
    }

    /// The journal byte cap of a run of `d`: its own, else the operator's
    /// default; never over the operator's maximum (a stored definition may
    /// predate a lower one).
    pub fn journal_cap(&self, d: &SandboxDefinition) -> u64 {
        let p = &self.policy;
        d.max_journal_bytes.filter(|n| *n > 0).unwrap_or(p.default_journal_bytes).min(p.max_journal_bytes)
    }

    /// Fill `spec` with what `d`'s provider section asks for, the
    /// operator's default limits where it names none.
    pub fn configure(&self, d: &SandboxDefinition, spec: &mut SandboxSpec) {
        if let Some((provider, section)) = ProviderKind::of(d) {
            provider.kind().configure(section, &self.policy.for_tenant(&spec.tenant), spec);
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

#[cfg(test)]
mod tests {
    use shared::error::ErrorCode;
    use shared::proto::v1::{DockerProvider, LocalProvider, ProviderSpec, provider_spec};

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

    /// The refused fields and their reasons.
    fn refused(policy: &OperatorPolicy, d: &SandboxDefinition) -> Vec<(String, String)> {
        match policy.check(d, "t") {
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
}
