//! Garbage collection: blobs no checkpoint references and no save in
//! progress pinned, per tenant, swept on a schedule.

use std::time::Duration;

use futures::FutureExt;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::Error;
use crate::store::{BlobKey, Stores};

/// A save's pins protect its blobs this long; a save that takes longer may
/// see its uploads collected (and then fails its commit's purpose): sweeps
/// ignore pins of saves that died.
pub const PIN_TTL: Duration = Duration::from_secs(6 * 3600);

/// How often the server collects unreferenced blobs.
pub const GC_EVERY: Duration = Duration::from_secs(15 * 60);

/// Delete blobs that no checkpoint of their tenant references and no save
/// in progress of their tenant pinned; returns them.
pub async fn collect_garbage(stores: &Stores) -> Result<Vec<BlobKey>, Error> {
    let stored = stores.blobs.list().await?;
    let blobs = stores.blobs.clone();
    let delete = move |keys: Vec<BlobKey>| {
        let blobs = blobs.clone();
        async move { blobs.delete(&keys).await }.boxed()
    };
    Ok(stores.checkpoints.sweep(stored, PIN_TTL, &delete).await?)
}

/// Collect garbage every [`GC_EVERY`] until `shutdown` (safe on every
/// replica at once: sweeps exclude each other and every save's pins).
pub async fn run_gc_sweeper(stores: Stores, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(GC_EVERY) => {}
        }
        match collect_garbage(&stores).await {
            Ok(gone) if !gone.is_empty() => {
                info!(blobs = gone.len(), "unreferenced snapshot blobs collected")
            }
            Ok(_) => {}
            Err(e) => warn!(error = %e, "snapshot garbage collection failed"),
        }
    }
}
