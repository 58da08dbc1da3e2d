//! Bearer-token authentication of every RPC the agent serves.

use std::sync::Arc;

use shared::error::{Error, ErrorCode};
use shared::secret::{Secret, constant_time_eq};
use shared::transport::bearer_of;

/// Checks `authorization: Bearer <token>` in constant time. Installed as a
/// server-wide layer so no service (health and reflection included) can be
/// reached without it.
#[derive(Clone)]
pub struct TokenCheck {
    token: Arc<Secret>,
}

impl TokenCheck {
    pub fn new(token: Secret) -> Self {
        Self { token: Arc::new(token) }
    }
}

impl tonic::service::Interceptor for TokenCheck {
    fn call(&mut self, req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        match bearer_of(req.metadata()) {
            Some(given) if constant_time_eq(given.as_bytes(), self.token.expose().as_bytes()) => Ok(req),
            Some(_) => Err(Error::new(ErrorCode::Unauthenticated, "wrong bearer token").into()),
            None => {
                Err(Error::new(ErrorCode::Unauthenticated, "missing authorization: Bearer <token>").into())
            }
        }
    }
}
