//! Generates the gRPC code for both packages with `protox` (pure Rust, no
//! system `protoc`) and writes one file descriptor set per package for server
//! reflection: the control plane serves only `sandhold.v1`, the agent only
//! `sandhold.agent.v1`.

use std::path::{Path, PathBuf};

use prost::Message;

fn protos_under(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            protos_under(&path, out);
        } else if path.extension().is_some_and(|ext| ext == "proto") {
            out.push(path);
        }
    }
}

fn descriptor_set(root: &Path, package_dir: &str) -> prost_types::FileDescriptorSet {
    let mut files = Vec::new();
    protos_under(&root.join(package_dir), &mut files);
    assert!(!files.is_empty(), "no .proto files under {package_dir}");
    for f in &files {
        println!("cargo:rerun-if-changed={}", f.display());
    }
    protox::compile(&files, [root]).unwrap_or_else(|e| panic!("compiling {package_dir}: {e:?}"))
}

fn main() {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap()).join("../proto");
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    println!("cargo:rerun-if-changed={}", root.display());

    let public = descriptor_set(&root, "sandhold/v1");
    let agent = descriptor_set(&root, "sandhold/agent/v1");
    let node = descriptor_set(&root, "sandhold/node/v1");
    std::fs::write(out.join("sandhold_v1_descriptor.bin"), public.encode_to_vec()).unwrap();
    std::fs::write(out.join("sandhold_agent_v1_descriptor.bin"), agent.encode_to_vec()).unwrap();
    std::fs::write(out.join("sandhold_node_v1_descriptor.bin"), node.encode_to_vec()).unwrap();

    for set in [public, agent, node] {
        tonic_prost_build::configure()
            .codec_path("crate::codec::LeanCodec")
            // A snapshot's blob bytes pass through without a copy: a slice
            // of what was read on the sending side, of the received frame on
            // the other.
            .bytes(".sandhold.agent.v1.RestoreBlob.data")
            .bytes(".sandhold.agent.v1.ReadBlobsResponse.data")
            // A chunk is some 550 bytes held inline (its many text fields):
            // boxed in the stream's message, each move of an event on its way
            // out of the server and through the client is a pointer's, not a
            // `memcpy` of the chunk (several a chunk, on both sides).
            .boxed(".sandhold.v1.RunChunk.chunk")
            .build_client(true)
            .build_server(true)
            .compile_fds(set)
            .expect("generating gRPC code");
    }
}
