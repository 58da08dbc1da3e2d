//! Reading stored blobs: always the tenant's own (a blob is (tenant,
//! hash); see `store::blob`).

use bytes::{Bytes, BytesMut};
use futures::StreamExt;

use super::Error;
use crate::store::{Stores, Tenant};

/// The bytes of the tenant's blob, for artifact reads.
pub(super) async fn blob_bytes(
    stores: &Stores,
    tenant: &Tenant,
    sha256: &str,
) -> Result<crate::store::blob::BlobStream, Error> {
    Ok(stores.blobs.read(tenant, sha256).await?)
}

/// Join the chunks of the tenant's blob (tests and small artifacts).
pub async fn read_blob(stores: &Stores, tenant: &Tenant, sha256: &str) -> Result<Bytes, Error> {
    let mut stream = blob_bytes(stores, tenant, sha256).await?;
    let mut out = BytesMut::new();
    while let Some(chunk) = stream.next().await {
        out.extend_from_slice(&chunk?);
    }
    Ok(out.freeze())
}
