//! The operator's maxima of portable snapshots: how large one captured
//! file and one whole snapshot may be. Server configuration; a
//! definition's snapshot policy may lower them (never raise them), and the
//! save (`snapshot::save`) checks them on the manifest before it reads a
//! byte and again on every byte the agent sends.
//!
//! `0` turns a maximum off: an operator's explicit choice, never the
//! default (a tenant's workspace must not fill the blob store's disk).

use serde::{Deserialize, Serialize};

/// One captured file, unless the operator says otherwise.
pub const DEFAULT_MAX_SNAPSHOT_FILE_BYTES: u64 = 512 << 20;
/// One snapshot (every file of it), unless the operator says otherwise.
pub const DEFAULT_MAX_SNAPSHOT_BYTES: u64 = 4 << 30;

/// The maxima as configured. Serde names are the TOML keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotLimits {
    /// Bytes of one captured file; `0`: no maximum.
    pub max_snapshot_file_bytes: u64,
    /// Bytes of one snapshot, every file counted; `0`: no maximum.
    pub max_snapshot_bytes: u64,
}

impl Default for SnapshotLimits {
    fn default() -> Self {
        Self {
            max_snapshot_file_bytes: DEFAULT_MAX_SNAPSHOT_FILE_BYTES,
            max_snapshot_bytes: DEFAULT_MAX_SNAPSHOT_BYTES,
        }
    }
}

/// A maximum in force and the setting that set it (what a refusal names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByteMax {
    pub bytes: u64,
    pub setting: &'static str,
}

impl ByteMax {
    /// The operator's `operator` (0: none), lowered by a definition's
    /// `lowered` (0: not lowered) when that is smaller.
    fn of(
        operator: u64,
        operator_setting: &'static str,
        lowered: u64,
        lowered_setting: &'static str,
    ) -> Option<Self> {
        let operator = (operator > 0).then_some(Self { bytes: operator, setting: operator_setting });
        let lowered = (lowered > 0).then_some(Self { bytes: lowered, setting: lowered_setting });
        match (operator, lowered) {
            (Some(o), Some(l)) if l.bytes < o.bytes => Some(l),
            (Some(o), _) => Some(o),
            (None, l) => l,
        }
    }

    /// Whether `bytes` is over this maximum.
    pub fn exceeded_by(&self, bytes: u64) -> bool {
        bytes > self.bytes
    }
}

impl SnapshotLimits {
    /// The per-file maximum in force, with a definition's `lowered` (0: the operator's).
    pub fn file(&self, lowered: u64) -> Option<ByteMax> {
        ByteMax::of(
            self.max_snapshot_file_bytes,
            "max-snapshot-file-bytes",
            lowered,
            "lifecycle.portable_snapshots.max_file_bytes",
        )
    }

    /// The per-snapshot maximum in force, with a definition's `lowered` (0: the operator's).
    pub fn total(&self, lowered: u64) -> Option<ByteMax> {
        ByteMax::of(
            self.max_snapshot_bytes,
            "max-snapshot-bytes",
            lowered,
            "lifecycle.portable_snapshots.max_total_bytes",
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_definition_lowers_a_maximum_and_never_raises_it() {
        let limits = SnapshotLimits::default();
        assert_eq!(limits.file(0), Some(ByteMax { bytes: 512 << 20, setting: "max-snapshot-file-bytes" }));
        assert_eq!(
            limits.file(1024).map(|m| (m.bytes, m.setting)),
            Some((1024, "lifecycle.portable_snapshots.max_file_bytes"))
        );
        assert_eq!(limits.total(8 << 30).map(|m| m.bytes), Some(4 << 30), "not raised");
        let off = SnapshotLimits { max_snapshot_file_bytes: 0, max_snapshot_bytes: 0 };
        assert_eq!(off.file(0), None, "0 turns it off");
        assert_eq!(off.total(10).map(|m| m.bytes), Some(10), "a definition may still set one");
        let max = limits.file(10).unwrap();
        assert!(!max.exceeded_by(10) && max.exceeded_by(11));
    }
}
