//! Reading stored blobs.

use bytes::{Bytes, BytesMut};
use futures::StreamExt;

use super::Error;
use crate::store::Stores;

/// The bytes of a blob, for artifact reads.
pub(super) async fn blob_bytes(
    stores: &Stores,
    sha256: &str,
) -> Result<crate::store::blob::BlobStream, Error> {
    Ok(stores.blobs.read(sha256).await?)
}

/// Join a blob stream's chunks (tests and small artifacts).
pub async fn read_blob(stores: &Stores, sha256: &str) -> Result<Bytes, Error> {
    let mut stream = blob_bytes(stores, sha256).await?;
    let mut out = BytesMut::new();
    while let Some(chunk) = stream.next().await {
        out.extend_from_slice(&chunk?);
    }
    Ok(out.freeze())
}
