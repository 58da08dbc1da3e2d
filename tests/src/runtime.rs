//! The container runtimes Docker sandboxes run under, for tests that must
//! hold under each: [`under_each_runtime!`] turns one test body into a
//! test per runtime (`<test>::runc`, `<test>::gvisor`), so the hostile
//! suite is written once and run under both.

use std::process::Command;

use shared::proto::v1 as api;

/// A runtime as definitions name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Runtime {
    Runc,
    Gvisor,
}

impl Runtime {
    /// The definition's `provider.docker.runtime`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Runc => "runc",
            Self::Gvisor => "gvisor",
        }
    }

    /// Whether tests under this runtime can run here: the engine answers
    /// and (gVisor) has `runsc` registered. Missing: a skip, or a failure
    /// under `SANDHOLD_REQUIRE_SERVICES=1` (`scripts/services` registers
    /// runsc, so CI can never pass by skipping gVisor).
    pub fn available(self) -> bool {
        if !crate::services::docker() {
            return false;
        }
        match self {
            Self::Runc => true,
            Self::Gvisor => {
                engine_has_runsc()
                    || crate::services::missing_service("gVisor", "the engine has no runsc runtime")
            }
        }
    }

    /// `d` (a Docker definition) under this runtime.
    pub fn apply(self, d: &mut api::SandboxDefinition) {
        match d.provider.as_mut().and_then(|p| p.provider.as_mut()) {
            Some(api::provider_spec::Provider::Docker(docker)) => docker.runtime = self.name().into(),
            other => panic!("a runtime applies to Docker definitions only, not {other:?}"),
        }
    }

    /// The control plane's own value (a provider spec's `docker.runtime`).
    pub fn config(self) -> control_plane::config::Runtime {
        match self {
            Self::Runc => control_plane::config::Runtime::Runc,
            Self::Gvisor => control_plane::config::Runtime::Gvisor,
        }
    }

    /// What `docker inspect` says a container of this runtime runs under.
    pub fn engine_name(self) -> &'static str {
        match self {
            Self::Runc => "runc",
            Self::Gvisor => "runsc",
        }
    }
}

impl From<control_plane::config::Runtime> for Runtime {
    fn from(runtime: control_plane::config::Runtime) -> Self {
        match runtime {
            control_plane::config::Runtime::Runc => Self::Runc,
            control_plane::config::Runtime::Gvisor => Self::Gvisor,
        }
    }
}

fn engine_has_runsc() -> bool {
    let out = Command::new("docker").args(["info", "--format", "{{json .Runtimes}}"]).output();
    out.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("\"runsc\""))
}

/// One async test body, a `#[tokio::test]` per runtime: `name::runc` and
/// `name::gvisor`, each skipped (or failed, when services are required)
/// where its runtime is missing.
///
/// A `#[tokio_test(...)]` before the function passes its arguments on to
/// both `#[tokio::test]`s (a flavor, worker threads); its doc comment goes
/// on the module of the two.
///
/// ```ignore
/// under_each_runtime! {
///     async fn the_run_user_cannot_trace_the_agent(runtime) { ... }
///
///     #[tokio_test(flavor = "multi_thread", worker_threads = 4)]
///     async fn ports_reach_a_server_in_the_sandbox(runtime) { ... }
/// }
/// ```
#[macro_export]
macro_rules! under_each_runtime {
    ($($(#[doc = $doc:literal])* $(#[tokio_test($($args:tt)*)])? async fn $name:ident($runtime:ident) $body:block)*) => {$(
        $(#[doc = $doc])*
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            async fn body($runtime: $crate::runtime::Runtime) $body

            #[tokio::test($($($args)*)?)]
            async fn runc() {
                if $crate::runtime::Runtime::Runc.available() {
                    body($crate::runtime::Runtime::Runc).await
                }
            }

            #[tokio::test($($($args)*)?)]
            async fn gvisor() {
                if $crate::runtime::Runtime::Gvisor.available() {
                    body($crate::runtime::Runtime::Gvisor).await
                }
            }
        }
    )*};
}
