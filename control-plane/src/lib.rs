//! The Sandhold control plane: the public gRPC API, stores, leases,
//! providers, harness adapters and the run driver.

pub mod lease;
pub mod store;
