//! The public gRPC services (`sandhold.v1`): thin tonic adapters over the
//! domain components. Each reads the caller's tenant and the request's
//! fields, calls one domain operation, and maps its result and its error to
//! a response and a status (`From<runs::Error> for Status` sits beside the
//! run adapter). No domain logic lives here, and nothing below imports it.

pub mod admin;
pub mod nodes;
pub mod runs;
pub mod sandbox;
pub mod snapshot;

pub use admin::AdminApi;
pub use nodes::NodeRegistryApi;
pub use runs::RunApi;
pub use sandbox::SandboxApi;
pub use snapshot::SnapshotApi;
