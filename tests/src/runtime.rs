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
/// ```ignore
/// under_each_runtime! {
///     async fn the_run_user_cannot_trace_the_agent(runtime) { ... }
/// }
/// ```
#[macro_export]
macro_rules! under_each_runtime {
    ($(async fn $name:ident($runtime:ident) $body:block)*) => {$(
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            async fn body($runtime: $crate::runtime::Runtime) $body

            #[tokio::test]
            async fn runc() {
                if $crate::runtime::Runtime::Runc.available() {
                    body($crate::runtime::Runtime::Runc).await
                }
            }

            #[tokio::test]
            async fn gvisor() {
                if $crate::runtime::Runtime::Gvisor.available() {
                    body($crate::runtime::Runtime::Gvisor).await
                }
            }
        }
    )*};
}
