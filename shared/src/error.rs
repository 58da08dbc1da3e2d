//! The one closed set of error codes, and the one place they map to gRPC.
//!
//! Every error leaving a Sandhold service is a `tonic::Status` whose details
//! hold a `google.rpc.ErrorInfo` with `domain = "sandhold.dev"` and a stable
//! `reason` (see `proto/sandhold/v1/errors.proto`), plus optional metadata
//! (e.g. the index and fingerprints of a replay divergence) and field
//! violations for bad requests.

use std::collections::HashMap;
use std::fmt;

use tonic::Code;
use tonic_types::{ErrorDetails, StatusExt};

/// `ErrorInfo.domain` of every Sandhold error.
pub const ERROR_DOMAIN: &str = "sandhold.dev";

/// The closed set of error codes. Each has a stable reason string (what
/// clients branch on) and exactly one gRPC code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    InvalidArgument,
    NotFound,
    AlreadyExists,
    Unauthenticated,
    PermissionDenied,
    JournalStalled,
    RunTerminal,
    ClaimLost,
    ReplayDiverged,
    Unsupported,
    Unavailable,
    DeadlineExceeded,
    Internal,
    FailedPrecondition,
    LeaseLost,
    Cancelled,
    SnapshotUnsupportedEntry,
    SnapshotWriterLost,
    SnapshotStaleHead,
    ProtocolMismatch,
    Unimplemented,
    /// A per-tenant limit of the operator's (running runs, sandboxes, one
    /// sweep at a time) is reached; the message names the limit.
    ResourceExhausted,
    /// A journal line longer than [`crate::journal::MAX_LINE`]; the run
    /// ends.
    LineTooLong,
    /// The sandbox agent lacks the values of secrets it must mask in what
    /// was asked for (it restarted since they were handed over).
    SecretsMissing,
    /// A portable snapshot over a per-file or per-snapshot maximum; the
    /// metadata names the path, its size, the maximum and its setting.
    SnapshotTooLarge,
    /// A run's journal reached its byte cap; the run ends.
    JournalFull,
    /// The disk under the server's data dir is full; the write failed.
    StorageFull,
    /// A run's model upstream stayed unreachable past its bound.
    ModelUnreachable,
    /// A run's model usage reached its token budget; the run ends.
    BudgetExceeded,
    /// The node holding the run's sandbox is gone (removed by the operator,
    /// or silent past the grace period); the run ends.
    SandboxLost,
}

impl ErrorCode {
    pub const ALL: [ErrorCode; 30] = [
        Self::InvalidArgument,
        Self::NotFound,
        Self::AlreadyExists,
        Self::Unauthenticated,
        Self::PermissionDenied,
        Self::JournalStalled,
        Self::RunTerminal,
        Self::ClaimLost,
        Self::ReplayDiverged,
        Self::Unsupported,
        Self::Unavailable,
        Self::DeadlineExceeded,
        Self::Internal,
        Self::FailedPrecondition,
        Self::LeaseLost,
        Self::Cancelled,
        Self::SnapshotUnsupportedEntry,
        Self::SnapshotWriterLost,
        Self::SnapshotStaleHead,
        Self::ProtocolMismatch,
        Self::Unimplemented,
        Self::ResourceExhausted,
        Self::LineTooLong,
        Self::SecretsMissing,
        Self::SnapshotTooLarge,
        Self::JournalFull,
        Self::StorageFull,
        Self::ModelUnreachable,
        Self::BudgetExceeded,
        Self::SandboxLost,
    ];

    /// The stable reason string carried in `ErrorInfo.reason`.
    pub fn reason(self) -> &'static str {
        match self {
            Self::InvalidArgument => "INVALID_ARGUMENT",
            Self::NotFound => "NOT_FOUND",
            Self::AlreadyExists => "ALREADY_EXISTS",
            Self::Unauthenticated => "UNAUTHENTICATED",
            Self::PermissionDenied => "PERMISSION_DENIED",
            Self::JournalStalled => "JOURNAL_STALLED",
            Self::RunTerminal => "RUN_TERMINAL",
            Self::ClaimLost => "CLAIM_LOST",
            Self::ReplayDiverged => "REPLAY_DIVERGED",
            Self::Unsupported => "UNSUPPORTED",
            Self::Unavailable => "UNAVAILABLE",
            Self::DeadlineExceeded => "DEADLINE_EXCEEDED",
            Self::Internal => "INTERNAL",
            Self::FailedPrecondition => "FAILED_PRECONDITION",
            Self::LeaseLost => "LEASE_LOST",
            Self::Cancelled => "CANCELLED",
            Self::SnapshotUnsupportedEntry => "SNAPSHOT_UNSUPPORTED_ENTRY",
            Self::SnapshotWriterLost => "SNAPSHOT_WRITER_LOST",
            Self::SnapshotStaleHead => "SNAPSHOT_STALE_HEAD",
            Self::ProtocolMismatch => "PROTOCOL_MISMATCH",
            Self::Unimplemented => "UNIMPLEMENTED",
            Self::ResourceExhausted => "RESOURCE_EXHAUSTED",
            Self::LineTooLong => "LINE_TOO_LONG",
            Self::SecretsMissing => "SECRETS_MISSING",
            Self::SnapshotTooLarge => "SNAPSHOT_TOO_LARGE",
            Self::JournalFull => "JOURNAL_FULL",
            Self::StorageFull => "STORAGE_FULL",
            Self::ModelUnreachable => "MODEL_UNREACHABLE",
            Self::BudgetExceeded => "BUDGET_EXCEEDED",
            Self::SandboxLost => "SANDBOX_LOST",
        }
    }

    /// The gRPC code this error travels as.
    pub fn grpc_code(self) -> Code {
        match self {
            Self::InvalidArgument => Code::InvalidArgument,
            Self::NotFound => Code::NotFound,
            Self::AlreadyExists => Code::AlreadyExists,
            Self::Unauthenticated => Code::Unauthenticated,
            Self::PermissionDenied => Code::PermissionDenied,
            Self::JournalStalled => Code::FailedPrecondition,
            Self::RunTerminal => Code::FailedPrecondition,
            Self::ClaimLost => Code::Aborted,
            Self::ReplayDiverged => Code::DataLoss,
            Self::Unsupported => Code::Unimplemented,
            Self::Unavailable => Code::Unavailable,
            Self::DeadlineExceeded => Code::DeadlineExceeded,
            Self::Internal => Code::Internal,
            Self::FailedPrecondition => Code::FailedPrecondition,
            Self::LeaseLost => Code::Aborted,
            Self::Cancelled => Code::Cancelled,
            Self::SnapshotUnsupportedEntry => Code::FailedPrecondition,
            Self::SnapshotWriterLost => Code::Aborted,
            Self::SnapshotStaleHead => Code::Aborted,
            Self::ProtocolMismatch => Code::FailedPrecondition,
            Self::Unimplemented => Code::Unimplemented,
            Self::ResourceExhausted => Code::ResourceExhausted,
            Self::LineTooLong => Code::OutOfRange,
            Self::SecretsMissing => Code::FailedPrecondition,
            Self::SnapshotTooLarge => Code::ResourceExhausted,
            Self::JournalFull => Code::ResourceExhausted,
            Self::StorageFull => Code::ResourceExhausted,
            Self::ModelUnreachable => Code::Unavailable,
            Self::BudgetExceeded => Code::ResourceExhausted,
            Self::SandboxLost => Code::Unavailable,
        }
    }

    pub fn from_reason(reason: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.reason() == reason)
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.reason())
    }
}

/// An error with a code, a human message, and optional structured details.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    pub code: ErrorCode,
    pub message: String,
    /// Goes into `ErrorInfo.metadata`.
    pub metadata: HashMap<String, String>,
    /// `(field, description)` pairs, sent as `BadRequest` field violations.
    pub field_violations: Vec<(String, String)>,
}

impl Error {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self { code, message: message.into(), metadata: HashMap::new(), field_violations: Vec::new() }
    }

    pub fn invalid_field(field: impl Into<String>, description: impl Into<String>) -> Self {
        let (field, description) = (field.into(), description.into());
        Self::new(ErrorCode::InvalidArgument, format!("{field}: {description}"))
            .with_violation(field, description)
    }

    pub fn not_found(what: impl Into<String>) -> Self {
        Self::new(ErrorCode::NotFound, what)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Internal, message)
    }

    pub fn unimplemented(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Unimplemented, message)
    }

    /// Prefix the message with what was being done when it happened.
    pub fn context(mut self, doing: impl std::fmt::Display) -> Self {
        self.message = format!("{doing}: {}", self.message);
        self
    }

    pub fn with_meta(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.metadata.insert(key.into(), value.into());
        self
    }

    pub fn with_violation(mut self, field: impl Into<String>, description: impl Into<String>) -> Self {
        self.field_violations.push((field.into(), description.into()));
        self
    }

    /// Recover the structured error from a `Status` produced by [`From<Error>`].
    /// A status without Sandhold details maps through its gRPC code.
    pub fn from_status(status: &tonic::Status) -> Self {
        let details = status.get_error_details();
        let code = details
            .error_info()
            .filter(|i| i.domain == ERROR_DOMAIN)
            .and_then(|i| ErrorCode::from_reason(&i.reason))
            .unwrap_or_else(|| code_for_grpc(status.code()));
        let mut err = Error::new(code, status.message());
        if let Some(info) = details.error_info() {
            err.metadata = info.metadata.clone();
        }
        if let Some(br) = details.bad_request() {
            err.field_violations =
                br.field_violations.iter().map(|v| (v.field.clone(), v.description.clone())).collect();
        }
        err
    }
}

fn code_for_grpc(code: Code) -> ErrorCode {
    match code {
        Code::InvalidArgument | Code::OutOfRange => ErrorCode::InvalidArgument,
        Code::NotFound => ErrorCode::NotFound,
        Code::AlreadyExists => ErrorCode::AlreadyExists,
        Code::Unauthenticated => ErrorCode::Unauthenticated,
        Code::PermissionDenied => ErrorCode::PermissionDenied,
        Code::FailedPrecondition => ErrorCode::FailedPrecondition,
        Code::Aborted => ErrorCode::ClaimLost,
        Code::Unimplemented => ErrorCode::Unimplemented,
        Code::Unavailable => ErrorCode::Unavailable,
        Code::DeadlineExceeded => ErrorCode::DeadlineExceeded,
        Code::Cancelled => ErrorCode::Cancelled,
        Code::ResourceExhausted => ErrorCode::ResourceExhausted,
        _ => ErrorCode::Internal,
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl std::error::Error for Error {}

impl From<Error> for tonic::Status {
    fn from(err: Error) -> Self {
        let mut details = ErrorDetails::with_error_info(err.code.reason(), ERROR_DOMAIN, err.metadata);
        for (field, description) in err.field_violations {
            details.add_bad_request_violation(field, description);
        }
        tonic::Status::with_error_details(err.code.grpc_code(), err.message, details)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_are_unique_and_round_trip() {
        let mut seen = std::collections::HashSet::new();
        for code in ErrorCode::ALL {
            assert!(seen.insert(code.reason()), "duplicate reason {code}");
            assert_eq!(ErrorCode::from_reason(code.reason()), Some(code));
        }
    }

    #[test]
    fn status_round_trip_keeps_reason_metadata_and_violations() {
        let err = Error::new(ErrorCode::ReplayDiverged, "chunk 7 differs")
            .with_meta("index", "7")
            .with_violation("run_id", "bad");
        let status = tonic::Status::from(err.clone());
        assert_eq!(status.code(), Code::DataLoss);
        assert_eq!(status.message(), "chunk 7 differs");
        assert_eq!(Error::from_status(&status), err);
    }

    #[test]
    fn plain_status_maps_by_grpc_code() {
        let e = Error::from_status(&tonic::Status::not_found("x"));
        assert_eq!(e.code, ErrorCode::NotFound);
    }

    #[test]
    fn reason_set_matches_the_proto_enum() {
        // errors.proto documents the closed set; keep them in step.
        use crate::proto::v1::ErrorReason;
        for code in ErrorCode::ALL {
            let name = format!("ERROR_REASON_{}", code.reason());
            assert!(ErrorReason::from_str_name(&name).is_some(), "{name} missing in errors.proto");
        }
    }
}
