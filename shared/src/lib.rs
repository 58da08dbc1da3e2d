//! Types both sides of Sandhold share: the generated gRPC code of the public
//! (`sandhold.v1`) and agent (`sandhold.agent.v1`) packages with their file
//! descriptor sets, the closed set of error codes, run-scoped identifiers, the
//! secret type and the redactor that keeps secret values out of output.

pub mod chunk;
pub mod codec;
pub mod error;
pub mod hosts;
pub mod ids;
pub mod journal;
pub mod limits;
pub mod mask;
pub mod policy;
pub mod redact;
pub mod requests;
pub mod secret;
pub mod snapshot;
pub mod transport;
pub mod user;

/// Generated protobuf and gRPC code.
pub mod proto {
    /// The public API, package `sandhold.v1`.
    pub mod v1 {
        tonic::include_proto!("sandhold.v1");
    }
    /// Control plane <-> sandbox agent, package `sandhold.agent.v1`.
    pub mod agent {
        pub mod v1 {
            tonic::include_proto!("sandhold.agent.v1");
        }
    }
    /// Control plane <-> sandbox host (`sandhold node`), package
    /// `sandhold.node.v1`: the provider boundary.
    pub mod node {
        pub mod v1 {
            tonic::include_proto!("sandhold.node.v1");
        }
    }
}

/// Encoded `FileDescriptorSet` of `sandhold.v1`, for server reflection.
pub const PUBLIC_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/sandhold_v1_descriptor.bin"));

/// Encoded `FileDescriptorSet` of `sandhold.agent.v1`, for server reflection.
pub const AGENT_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/sandhold_agent_v1_descriptor.bin"));

/// Encoded `FileDescriptorSet` of `sandhold.node.v1`, for server reflection.
pub const NODE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/sandhold_node_v1_descriptor.bin"));

/// Version of the `sandhold.agent.v1` wire protocol. The control plane refuses
/// an agent that reports another one.
pub const AGENT_PROTOCOL_VERSION: u32 = 1;
