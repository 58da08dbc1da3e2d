//! The one error type of every store, and its mapping onto the shared codes.

use shared::error::{Error as ApiError, ErrorCode};

use super::{Epoch, RunStatus};

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No such object, or it belongs to another tenant (never told apart).
    #[error("{0} not found")]
    NotFound(String),

    #[error("{0} already exists")]
    AlreadyExists(String),

    /// The writer's epoch is not the run's current epoch: another driver has
    /// claimed the run. Epochs only grow, so this never heals; the writer must
    /// stop (or claim again and re-align).
    #[error("run {run} was claimed by a newer driver: writer epoch {held}, current epoch {current}")]
    Fenced { run: String, held: Epoch, current: Epoch },

    /// The run already has a terminal status.
    #[error("run {run} is already {status}")]
    RunTerminal { run: String, status: RunStatus },

    /// The run has not ended: what only an ended run allows (removing it)
    /// is refused.
    #[error("run {run} has not ended (it is {status})")]
    RunNotEnded { run: String, status: RunStatus },

    /// A newer writer claimed the snapshot thread: this save is superseded.
    #[error(
        "a newer writer claimed the snapshots of thread {thread}: writer epoch {held}, current epoch {current}"
    )]
    WriterLost { thread: String, held: u64, current: u64 },

    /// The thread's head moved since the writer claimed it.
    #[error("the head of thread {thread} moved from {expected:?} to {current:?}")]
    StaleHead { thread: String, expected: Option<String>, current: Option<String> },

    /// The destination of a fork already has checkpoints or runs.
    #[error("{0}")]
    NotEmpty(String),

    /// The run's event log was closed; nothing more may be appended.
    #[error("event log of run {0} is closed")]
    LogClosed(String),

    #[error("invalid {field}: {reason}")]
    Invalid { field: &'static str, reason: String },

    /// The database cannot be reached (connect, I/O, pool exhausted or closed).
    #[error("store unavailable: {0}")]
    Unavailable(String),

    /// The disk under the database is full (SQLite `SQLITE_FULL`,
    /// PostgreSQL `53100 disk_full`, `ENOSPC`): the write failed and
    /// nothing of it landed. Not retried: space does not come back by
    /// waiting, and a run that cannot append must end.
    #[error("the disk under the server's data is full: {0}")]
    StorageFull(String),

    /// A row the store wrote cannot be read back (a bug or manual tampering).
    #[error("corrupt row: {0}")]
    Corrupt(String),

    #[error("database error: {0}")]
    Database(#[source] sqlx::Error),

    #[error("migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
}

impl Error {
    /// A failure of the database that a later attempt may not meet (it was
    /// unavailable, or refused or dropped the connection): what readers and
    /// writers retry.
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Unavailable(_) | Self::Database(_))
    }

    pub(crate) fn invalid(field: &'static str, reason: impl Into<String>) -> Self {
        Self::Invalid { field, reason: reason.into() }
    }

    /// The shared code this error travels as.
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::NotFound(_) => ErrorCode::NotFound,
            Self::AlreadyExists(_) => ErrorCode::AlreadyExists,
            Self::Fenced { .. } => ErrorCode::ClaimLost,
            Self::RunTerminal { .. } => ErrorCode::RunTerminal,
            Self::RunNotEnded { .. } => ErrorCode::FailedPrecondition,
            Self::LogClosed(_) => ErrorCode::FailedPrecondition,
            Self::WriterLost { .. } => ErrorCode::SnapshotWriterLost,
            Self::StaleHead { .. } => ErrorCode::SnapshotStaleHead,
            Self::NotEmpty(_) => ErrorCode::FailedPrecondition,
            Self::Invalid { .. } => ErrorCode::InvalidArgument,
            Self::Unavailable(_) => ErrorCode::Unavailable,
            Self::StorageFull(_) => ErrorCode::StorageFull,
            Self::Corrupt(_) | Self::Database(_) | Self::Migrate(_) => ErrorCode::Internal,
        }
    }
}

/// Whether `err` says the disk under the database is full.
fn disk_full(err: &sqlx::Error) -> bool {
    match err {
        sqlx::Error::Database(db) => {
            // SQLite's primary result code 13 (SQLITE_FULL) and PostgreSQL's
            // SQLSTATE class 53100; the message covers extended codes.
            matches!(db.code().as_deref(), Some("13" | "53100"))
                || db.message().contains("database or disk is full")
        }
        sqlx::Error::Io(io) => io.kind() == std::io::ErrorKind::StorageFull,
        _ => false,
    }
}

impl From<sqlx::Error> for Error {
    fn from(err: sqlx::Error) -> Self {
        if disk_full(&err) {
            return Self::StorageFull(err.to_string());
        }
        match err {
            sqlx::Error::RowNotFound => Self::NotFound("row".into()),
            sqlx::Error::Io(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::WorkerCrashed => Self::Unavailable(err.to_string()),
            other => Self::Database(other),
        }
    }
}

impl From<Error> for ApiError {
    fn from(err: Error) -> Self {
        let code = err.code();
        // Database internals stay in the server log; clients get the code.
        let message = match &err {
            Error::Database(_) | Error::Migrate(_) | Error::Corrupt(_) => "internal store error".to_owned(),
            other => other.to_string(),
        };
        let mut api = ApiError::new(code, message);
        match err {
            Error::Fenced { held, current, .. } => {
                api = api
                    .with_meta("held_epoch", held.to_string())
                    .with_meta("current_epoch", current.to_string());
            }
            Error::RunTerminal { status, .. } | Error::RunNotEnded { status, .. } => {
                api = api.with_meta("status", status.as_str())
            }
            Error::WriterLost { held, current, .. } => {
                api = api
                    .with_meta("held_epoch", held.to_string())
                    .with_meta("current_epoch", current.to_string());
            }
            Error::StaleHead { expected, current, .. } => {
                api = api
                    .with_meta("expected_head", expected.unwrap_or_default())
                    .with_meta("current_head", current.unwrap_or_default());
            }
            Error::Invalid { field, reason } => api = api.with_violation(field, reason),
            _ => {}
        }
        api
    }
}

impl From<Error> for tonic::Status {
    fn from(err: Error) -> Self {
        ApiError::from(err).into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_disk_is_its_own_error_and_code() {
        let io = sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::StorageFull));
        let e = Error::from(io);
        assert!(matches!(e, Error::StorageFull(_)), "{e:?}");
        let api = ApiError::from(e);
        assert_eq!(api.code, ErrorCode::StorageFull);
        assert!(api.message.starts_with("the disk under the server's data is full"), "{}", api.message);
        let other = Error::from(sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::ConnectionReset)));
        assert!(matches!(other, Error::Unavailable(_)), "{other:?}");
    }
}
