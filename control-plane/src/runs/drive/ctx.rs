//! One drive's context: the run, its spec and harness, and what this
//! replica holds while it drives it (lease, fenced writer, interrupts).

use shared::proto::v1::SandboxDefinition;

use super::retry::Interrupts;
use crate::harness::Harness;
use crate::lease::Lease;
use crate::runs::RunSpec;
use crate::runs::usage::Tally;
use crate::store::{LogWriter, RunKey};

/// One drive: who drives, under which epoch, for which run.
pub(crate) struct DriveCtx {
    /// The run (run ids are per tenant: the tenant is part of its name).
    pub key: RunKey,
    pub thread_id: String,
    pub spec: RunSpec,
    pub harness: Harness,
    pub sentinel_key: Vec<u8>,
    pub writer: LogWriter,
    pub lease: Lease,
    /// What ends this drive's pauses: the server's shutdown, `lease.lost()`
    /// and the drive's stop.
    pub(in crate::runs) interrupts: Interrupts,
    /// The harness session the translation last reported (replays
    /// included, so a successor knows it too); recorded with the run's end.
    pub(in crate::runs) session: std::sync::Mutex<Option<String>>,
    /// The run's definition, decoded once per drive (by its launch) and
    /// read by its egress and its checkpoint. Unset when it was deleted
    /// since the run started.
    pub(in crate::runs) definition: std::sync::OnceLock<SandboxDefinition>,
    /// The run's model usage as its log holds it, once this drive read it
    /// (the pump keeps it current); recorded with the run's end.
    pub(in crate::runs) usage: std::sync::Mutex<Option<Tally>>,
}
