//! Authenticating test clients the way a real client does: a bearer token
//! in the `authorization` metadata of every call.

use tonic::metadata::{Ascii, MetadataValue};

/// A tonic interceptor adding `authorization: Bearer <token>`.
#[derive(Clone)]
pub struct Bearer(pub MetadataValue<Ascii>);

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        req.metadata_mut().insert("authorization", self.0.clone());
        Ok(req)
    }
}

/// The interceptor for `token`.
pub fn bearer(token: &str) -> Bearer {
    Bearer(format!("Bearer {token}").parse().expect("a token is ASCII"))
}
