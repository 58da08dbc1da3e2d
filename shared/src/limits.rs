//! The gRPC limits every Sandhold server and client sets on purpose, rather
//! than inherit a library's defaults (tonic decodes 4 MiB and encodes
//! anything; HTTP/2 allows unbounded concurrent streams).

use std::time::Duration;

/// The most output `Exec` keeps per stream (stdout, stderr): its default
/// and the ceiling of a request's `output_limit_bytes`.
pub const MAX_EXEC_OUTPUT: u64 = 16 << 20;

/// The largest gRPC message any Sandhold service or client sends or
/// accepts: an `Exec` answer with both streams full, and room for the rest.
/// Every other message is far smaller (journal batches and file chunks are
/// at most a few MiB).
pub const MAX_MESSAGE_BYTES: usize = 2 * MAX_EXEC_OUTPUT as usize + (1 << 20);

/// Calls one HTTP/2 connection may hold open at once on a server.
pub const MAX_STREAMS_PER_CONNECTION: u32 = 1024;

/// How often a server pings an idle connection, and how long it waits for
/// the answer before dropping it (a vanished client frees its streams).
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// A generated tonic server or client with [`MAX_MESSAGE_BYTES`] both ways.
#[macro_export]
macro_rules! sized {
    ($service:expr) => {
        $service
            .max_decoding_message_size($crate::limits::MAX_MESSAGE_BYTES)
            .max_encoding_message_size($crate::limits::MAX_MESSAGE_BYTES)
    };
}
