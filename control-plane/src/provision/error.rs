//! What provisioning a workspace can fail with (the `workspace` module's
//! steps, behind the [`Provisioner`](super::Provisioner) seam), and the one
//! mapping of it to the wire error. Every message that may carry command
//! output or an agent's words is redacted before it is put in here.

use shared::error::{Error as WireError, ErrorCode};

use super::{InvalidField, Masks, Violations};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A workspace field that cannot be acted on.
    #[error(transparent)]
    InvalidField(#[from] InvalidField),
    /// A workspace the provisioner cannot build.
    #[error(transparent)]
    Invalid(#[from] Violations),
    /// A call to the sandbox's agent failed: its error, the message saying
    /// what was being done (redacted).
    #[error(transparent)]
    Agent(WireError),
    /// A step needs a secret the request did not pass (`needs` says who
    /// and how: "git skill \"x\" authenticates with").
    #[error("{needs} the secret {name}, which was not passed with the request")]
    SecretNotPassed { needs: String, name: String },
    /// `git clone` (or checkout) exited non-zero or timed out.
    #[error("cloning {url} failed ({why}): {git_error}")]
    CloneFailed { url: String, why: String, git_error: String, exit_code: i32 },
    /// A setup step exited non-zero, timed out, or ended the shell.
    #[error(
        "setup step {step}/{steps}{} `{command}` {why}; output tail:\n{tail}",
        parallel.map(|i| format!(" (parallel command {i})")).unwrap_or_default()
    )]
    SetupStepFailed {
        step: u32,
        steps: u32,
        /// Which command of a parallel group, counted from 1.
        parallel: Option<usize>,
        command: String,
        why: String,
        tail: String,
        exit_code: i32,
        timed_out: bool,
    },
    /// The agent ended a setup step without saying how it exited.
    #[error("{0}")]
    StepLost(String),
    /// Neither a link nor a copy could be made.
    #[error("{0}")]
    LinkFailed(String),
    /// A path the provisioner had just seen is gone.
    #[error("{0}")]
    Vanished(String),
    /// The secret matcher for redaction could not be built.
    #[error("{0}")]
    SecretMatcher(String),
}

impl Error {
    /// An agent call's status, said to have happened while `doing`, with
    /// secret values redacted from the message.
    pub fn agent(doing: &str, status: &tonic::Status, redactor: &Masks) -> Self {
        let mut err = WireError::from_status(status);
        err.message = redactor.mask(&format!("{doing}: {}", err.message));
        Self::Agent(err)
    }
}

impl From<Error> for WireError {
    fn from(e: Error) -> Self {
        let message = e.to_string();
        let precondition = || WireError::new(ErrorCode::FailedPrecondition, message.clone());
        match e {
            Error::InvalidField(e) => e.into(),
            Error::Invalid(e) => e.into(),
            Error::Agent(e) => e,
            Error::SecretNotPassed { name, .. } => precondition().with_meta("secret", name),
            Error::CloneFailed { url, exit_code, .. } => precondition()
                .with_meta("reason_detail", "GIT_CLONE_FAILED")
                .with_meta("url", url)
                .with_meta("exit_code", exit_code.to_string()),
            Error::SetupStepFailed { step, steps, parallel, exit_code, timed_out, .. } => {
                let err = precondition()
                    .with_meta("reason_detail", "SETUP_STEP_FAILED")
                    .with_meta("step", step.to_string())
                    .with_meta("steps", steps.to_string())
                    .with_meta("exit_code", exit_code.to_string())
                    .with_meta("timed_out", timed_out.to_string());
                match parallel {
                    Some(i) => err.with_meta("parallel_index", i.to_string()),
                    None => err,
                }
            }
            Error::StepLost(_) => WireError::new(ErrorCode::Unavailable, message),
            Error::LinkFailed(_) => precondition(),
            Error::Vanished(_) | Error::SecretMatcher(_) => WireError::internal(message),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta<'a>(e: &'a WireError, key: &str) -> Option<&'a str> {
        e.metadata.get(key).map(String::as_str)
    }

    #[test]
    fn a_failed_setup_step_keeps_its_message_and_metadata() {
        let failed = |parallel| Error::SetupStepFailed {
            step: 2,
            steps: 3,
            parallel,
            command: "make".into(),
            why: "failed with exit code 7".into(),
            tail: "boom".into(),
            exit_code: 7,
            timed_out: false,
        };
        let wire = WireError::from(failed(Some(1)));
        assert_eq!(wire.code, ErrorCode::FailedPrecondition);
        assert_eq!(
            wire.message,
            "setup step 2/3 (parallel command 1) `make` failed with exit code 7; output tail:\nboom"
        );
        for (key, value) in [
            ("reason_detail", "SETUP_STEP_FAILED"),
            ("step", "2"),
            ("steps", "3"),
            ("exit_code", "7"),
            ("timed_out", "false"),
            ("parallel_index", "1"),
        ] {
            assert_eq!(meta(&wire, key), Some(value), "{key}");
        }
        let serial = WireError::from(failed(None));
        assert_eq!(serial.message, "setup step 2/3 `make` failed with exit code 7; output tail:\nboom");
        assert_eq!(meta(&serial, "parallel_index"), None);
    }

    #[test]
    fn refusals_keep_their_codes_and_name_what_is_missing() {
        let clone = WireError::from(Error::CloneFailed {
            url: "https://h/r".into(),
            why: "git exited with 128".into(),
            git_error: "not found".into(),
            exit_code: 128,
        });
        assert_eq!(clone.code, ErrorCode::FailedPrecondition);
        assert_eq!(clone.message, "cloning https://h/r failed (git exited with 128): not found");
        assert_eq!(meta(&clone, "reason_detail"), Some("GIT_CLONE_FAILED"));
        assert_eq!(meta(&clone, "url"), Some("https://h/r"));
        assert_eq!(meta(&clone, "exit_code"), Some("128"));
        let secret = WireError::from(Error::SecretNotPassed {
            needs: "the workspace source authenticates with".into(),
            name: "GIT_TOKEN".into(),
        });
        assert_eq!(secret.code, ErrorCode::FailedPrecondition);
        assert_eq!(
            secret.message,
            "the workspace source authenticates with the secret GIT_TOKEN, which was not passed with the request"
        );
        assert_eq!(meta(&secret, "secret"), Some("GIT_TOKEN"));
        assert_eq!(WireError::from(Error::StepLost("gone".into())).code, ErrorCode::Unavailable);
        assert_eq!(WireError::from(Error::Vanished("x".into())).code, ErrorCode::Internal);
    }

    #[test]
    fn an_agent_status_keeps_its_code_and_loses_its_secrets() {
        let redactor = Masks::new([("PW", "hunter2-pw")]).unwrap();
        let status = tonic::Status::from(WireError::new(ErrorCode::PermissionDenied, "no hunter2-pw here"));
        let wire = WireError::from(Error::agent("writing a.txt", &status, &redactor));
        assert_eq!(wire.code, ErrorCode::PermissionDenied);
        assert_eq!(wire.message, "writing a.txt: no [secret:PW] here");
    }
}
