//! Restoring: stream a checkpoint's manifest and blobs to the agent of a
//! new sandbox.

use futures::StreamExt;
use prost::Message;
use shared::proto::agent::v1 as agent;
use shared::proto::v1 as api;
use tracing::{info, warn};

use super::Error;
use super::policy::{capture_policy, portable};
use crate::agent::AgentClient;
use crate::store::{Stores, Tenant};

/// Manifest entries per restore message.
const ENTRIES_PER_MESSAGE: usize = 1000;

/// Restore checkpoint `checkpoint_id` of the tenant's thread into the
/// (new, private) sandbox behind `agent`, leaving its workspace equal to
/// the checkpoint outside what `policy` excludes (which stays untouched):
/// what provisioning put there and the checkpoint lacks is removed.
pub async fn restore(
    stores: &Stores,
    agent: &AgentClient,
    tenant: &Tenant,
    thread_id: &str,
    checkpoint_id: &str,
    policy: agent::CapturePolicy,
) -> Result<agent::RestoreResponse, Error> {
    let (_, manifest) = stores.checkpoints.get(tenant, thread_id, checkpoint_id).await?;
    let entries = agent::CaptureResponse::decode(manifest.as_slice())
        .map_err(|e| Error::Corrupt(format!("checkpoint {checkpoint_id}: unreadable manifest: {e}")))?
        .entries;
    let summary = shared::snapshot::check_manifest(&entries).map_err(Error::Manifest)?;
    let header = agent::RestoreHeader {
        entry_count: entries.len() as u64,
        blob_count: summary.blobs.len() as u64,
        policy: Some(policy),
    };
    let batches: Vec<Vec<agent::ManifestEntry>> =
        entries.chunks(ENTRIES_PER_MESSAGE).map(<[_]>::to_vec).collect();
    let hashes: Vec<String> = summary.blobs.into_keys().collect();
    let requests = restore_requests(stores.blobs.clone(), tenant.clone(), header, batches, hashes);
    let response = agent
        .snapshot()
        .restore(requests)
        .await
        .map_err(Error::agent(format!("restoring checkpoint {checkpoint_id}")))?
        .into_inner();
    info!(
        tenant = %tenant,
        thread_id,
        checkpoint_id,
        files = response.files_written,
        removed = response.paths_removed,
        "checkpoint restored"
    );
    Ok(response)
}

/// The messages of a restore: header, manifest batches, then every blob,
/// read from the tenant's own blobs as the store reads many best and sent
/// in its pieces as they are read (never a whole large blob in memory;
/// the agent's stream is pulled, so a slow agent holds the reading back).
/// A blob that cannot be read is cut short: the agent then refuses the
/// restore as incomplete, having written nothing.
fn restore_requests(
    blobs: std::sync::Arc<dyn crate::store::BlobStore>,
    tenant: Tenant,
    header: agent::RestoreHeader,
    batches: Vec<Vec<agent::ManifestEntry>>,
    hashes: Vec<String>,
) -> impl futures::Stream<Item = agent::RestoreRequest> + Send + 'static {
    use agent::restore_request::Request;
    let message = |r| agent::RestoreRequest { request: Some(r) };
    async_stream::stream! {
        yield message(Request::Header(header));
        for entries in batches {
            yield message(Request::Entries(agent::RestoreEntries { entries }));
        }
        let mut pieces = blobs.read_many(&tenant, hashes);
        while let Some((sha256, piece)) = pieces.next().await {
            match piece {
                Ok(data) => yield message(Request::Blob(agent::RestoreBlob { sha256, data })),
                Err(error) => warn!(%sha256, %error, "a checkpoint blob cannot be read"),
            }
        }
    }
}

/// Restore the thread's head checkpoint, if it has one, into the new
/// sandbox behind `agent`, under the definition's snapshot policy (the one
/// its later captures use); returns the checkpoint restored.
pub async fn restore_latest(
    stores: &Stores,
    agent: &AgentClient,
    tenant: &Tenant,
    thread_id: &str,
    definition: &api::SandboxDefinition,
) -> Result<Option<String>, Error> {
    let Some(head) = stores.checkpoints.head(tenant, thread_id).await? else { return Ok(None) };
    let policy = capture_policy(portable(definition));
    restore(stores, agent, tenant, thread_id, &head.checkpoint_id, policy).await?;
    Ok(Some(head.checkpoint_id))
}
