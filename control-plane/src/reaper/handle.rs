//! The reaper of one replica: what it is built from.

use std::sync::Arc;
use std::time::Duration;

use crate::config::ReaperOptions;
use crate::context::Context;
use crate::runs::Runs;
use crate::sandbox::RunSandbox;

/// Bound on reaching a sandbox's agent and asking it one thing.
pub(super) const PROBE_TIMEOUT: Duration = Duration::from_secs(15);

/// The reaper of one replica. Cheap to clone.
#[derive(Clone)]
pub struct Reaper {
    pub(super) inner: Arc<Inner>,
}

pub(super) struct Inner {
    pub(super) cx: Context,
    pub(super) runs: Runs,
    /// What the reaper uses of the sandbox layer.
    pub(super) sandbox: RunSandbox,
    pub(super) options: ReaperOptions,
    /// Single-user mode: the one tenant is known without a token.
    pub(super) single_user: bool,
}

impl Reaper {
    pub fn new(cx: Context, runs: Runs, options: ReaperOptions, single_user: bool) -> Self {
        Self { inner: Arc::new(Inner { sandbox: cx.run_sandbox(), cx, runs, options, single_user }) }
    }

    pub fn options(&self) -> &ReaperOptions {
        &self.inner.options
    }
}
