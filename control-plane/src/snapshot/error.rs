//! How the snapshot operations report the agent's refusals.

use shared::error::Error;

pub(super) fn agent_error(what: &str, status: tonic::Status) -> Error {
    let mut err = Error::from_status(&status);
    err.message = format!("{what}: {}", err.message);
    err
}
