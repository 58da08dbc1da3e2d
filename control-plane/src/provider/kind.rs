//! What a provider module tells the rest of the server about itself, and
//! the registry of them.
//!
//! The set of providers is open: a provider is one module that implements
//! [`Kind`] (its name, how it reads its section of a definition, the
//! operator's checks of that section, how it is built from the server's
//! configuration) and one line in [`REGISTERED`]. Nothing outside this
//! module, `config/` and the server's assembly names a provider; the sandbox
//! layer asks the [`ProviderKind`] of a definition instead.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;

use shared::proto::v1::{SandboxDefinition, provider_spec};

use super::{Canon, Provider, SandboxSpec};
use crate::config::{Policy, ServeConfig};

/// A field violation: the field (under `definition.provider`) and why.
pub type Violation = (String, String);

/// What [`Kind::build`] hands back: the provider, or why it is off.
pub type Built = Pin<Box<dyn Future<Output = Result<Arc<dyn Provider>, String>> + Send + 'static>>;

/// One provider, as the server knows it before any sandbox exists.
pub trait Kind: Send + Sync + 'static {
    /// Its name: in definitions' errors, instance records, policies and logs.
    fn name(&self) -> &'static str;

    /// Whether `section` (the definition's `provider` oneof) names this provider.
    fn reads(&self, section: &provider_spec::Provider) -> bool;

    /// Whether its sandboxes are isolated from the host. One that is not
    /// is said so on the terminal of whoever creates or runs in it
    /// ([`NO_ISOLATION`]), not only in the server's log.
    fn isolated(&self) -> bool {
        true
    }

    /// Problems of the section on its own, as at `PutDefinition` (fields
    /// under `definition.provider.<name>`).
    fn validate(&self, section: &provider_spec::Provider, out: &mut Vec<Violation>) {
        let _ = (section, out);
    }

    /// Where the section asks for more than the operator's `policy` allows;
    /// `on_host`: host paths are also resolved on this host, as right before
    /// a create.
    fn violations(
        &self,
        section: &provider_spec::Provider,
        policy: &Policy,
        on_host: bool,
        out: &mut Vec<Violation>,
    ) {
        let _ = (section, policy, on_host, out);
    }

    /// The host paths the section binds into the sandbox, each with its
    /// field: the operator policy refuses those that hold or sit in the
    /// server's own dirs, or are sockets, whatever the provider.
    fn host_paths(&self, section: &provider_spec::Provider) -> Vec<(String, PathBuf)> {
        let _ = section;
        Vec::new()
    }

    /// Fill `spec` with what the section asks for, the operator's default
    /// limits where it names none.
    fn configure(&self, section: &provider_spec::Provider, policy: &Policy, spec: &mut SandboxSpec) {
        let _ = (section, policy, spec);
    }

    /// The section's part of the sandbox key (after `provider` = its name).
    fn key(&self, section: &provider_spec::Provider, c: &mut Canon) {
        let _ = (section, c);
    }

    /// The section as a person reads it (`docker busybox`).
    fn describe(&self, section: &provider_spec::Provider) -> String {
        let _ = section;
        self.name().to_string()
    }

    /// What a listing of definitions shows beside the name (`busybox`).
    fn detail(&self, section: &provider_spec::Provider) -> String {
        let _ = section;
        String::new()
    }

    /// Where the host's toolchain dir `host_root` is seen inside a sandbox.
    /// Default: at the same path (the sandbox shares the host's file system).
    fn toolchain_root(&self, host_root: &Path) -> String {
        host_root.display().to_string()
    }

    /// The provider of a server's configuration, or why it is off. Called
    /// only when the operator policy lets tenants use it.
    fn build(&self, config: &ServeConfig) -> Built;
}

/// Every provider this build knows, in the order errors list them.
const REGISTERED: &[ProviderKind] = &[ProviderKind(&super::local::KIND), ProviderKind(&super::docker::KIND)];

/// What a person creating a sandbox of a provider that isolates nothing is
/// told, with what to use instead.
pub const NO_ISOLATION: &str = "this sandbox has NO isolation: it is a directory on the server's host, and its \
    commands run as the server's user with the host's files, processes and network. Use a container for anything \
    you would not run on this host yourself: `sandhold run --image IMAGE`, or `[provider.docker]` in a definition";

/// Which provider: a cheap handle on its [`Kind`]. Equal when named alike.
#[derive(Clone, Copy)]
pub struct ProviderKind(&'static dyn Kind);

impl ProviderKind {
    pub const fn new(kind: &'static dyn Kind) -> Self {
        Self(kind)
    }

    pub fn as_str(self) -> &'static str {
        self.0.name()
    }

    pub fn kind(self) -> &'static dyn Kind {
        self.0
    }

    /// Every registered provider.
    pub fn all() -> impl Iterator<Item = ProviderKind> {
        REGISTERED.iter().copied()
    }

    /// The registered provider called `name`.
    pub fn named(name: &str) -> Option<Self> {
        Self::all().find(|k| k.as_str() == name)
    }

    /// The provider `section` names.
    pub fn reading(section: &provider_spec::Provider) -> Option<Self> {
        Self::all().find(|k| k.0.reads(section))
    }

    /// The provider definition `d` names, with its section; `None` when it
    /// names none (or one this build does not know).
    pub fn of(d: &SandboxDefinition) -> Option<(Self, &provider_spec::Provider)> {
        let section = d.provider.as_ref()?.provider.as_ref()?;
        Some((Self::reading(section)?, section))
    }

    /// `local or docker`: for an error that says what may be named.
    pub fn choices() -> String {
        Self::all().map(Self::as_str).collect::<Vec<_>>().join(" or ")
    }
}

impl PartialEq for ProviderKind {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for ProviderKind {}

impl std::hash::Hash for ProviderKind {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_str().hash(state)
    }
}

impl std::fmt::Debug for ProviderKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::fmt::Display for ProviderKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The provider of `d` as a person reads it; `none` when it names none.
pub fn describe(d: &SandboxDefinition) -> String {
    match ProviderKind::of(d) {
        Some((kind, section)) => kind.0.describe(section),
        None => "none".to_string(),
    }
}
