//! The one error type of the lease machinery.

/// Errors of the lease machinery. A lease that is merely held by someone
/// else is not an error (`try_acquire` returns `None`).
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    /// The store could not be reached or answered with an error.
    #[error("lease store unavailable: {0}")]
    Unavailable(String),
    /// Options or a lease name that cannot work.
    #[error("invalid lease configuration: {0}")]
    Invalid(String),
}

impl From<LeaseError> for shared::error::Error {
    fn from(err: LeaseError) -> Self {
        use shared::error::{Error, ErrorCode};
        match err {
            LeaseError::Unavailable(_) => Error::new(ErrorCode::Unavailable, err.to_string()),
            LeaseError::Invalid(_) => Error::new(ErrorCode::Internal, err.to_string()),
        }
    }
}
