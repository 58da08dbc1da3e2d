//! Portable snapshots: a thread's workspace files kept in Sandhold's own
//! storage, so they move between providers and outlive the sandbox.
//!
//! - **Save** ([`save`]): claim the thread's writer fence, have the agent
//!   capture the manifest (secret values zeroed before hashing), pin every
//!   blob of it, upload only the blobs the blob store lacks (each verified
//!   against its hash on the way in), and commit checkpoint, blob
//!   references and the new head in one transaction
//!   (`store::CheckpointStore::commit`).
//! - **Restore** ([`restore`]): stream the manifest, the policy and every
//!   blob to the agent of a *new* sandbox, which verifies all of it before
//!   changing anything, then removes what the checkpoint lacks (outside
//!   the policy's exclusions) and writes the rest.
//!   The lifecycle calls [`restore_latest`] when it had to make a new
//!   sandbox for a thread with portable snapshots enabled.
//! - **After a run** ([`checkpoint_after_run`]): the run pump's hook.
//! - **Garbage collection** ([`collect_garbage`], [`run_gc_sweeper`]):
//!   blobs no checkpoint references and no save in progress pinned.
//!
//! Secrets: the values of the sandbox's secrets go to the agent with the
//! capture request only (over its authenticated socket), so that every
//! occurrence in a captured file is zeroed before hashing; no value reaches
//! a store, a log line or an error.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::{FutureExt, StreamExt};
use prost::Message;
use shared::error::{Error, ErrorCode};
use shared::proto::agent::v1 as agent;
use shared::proto::v1 as api;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::agent::AgentClient;
use crate::provision::Secrets;
use crate::store::{Checkpoint, NewCheckpoint, Stores, Tenant};

/// A save's pins protect its blobs this long; a save that takes longer may
/// see its uploads collected (and then fails its commit's purpose): sweeps
/// ignore pins of saves that died.
pub const PIN_TTL: Duration = Duration::from_secs(6 * 3600);

/// How often the server collects unreferenced blobs.
pub const GC_EVERY: Duration = Duration::from_secs(15 * 60);

/// Manifest entries per restore message.
const ENTRIES_PER_MESSAGE: usize = 1000;

/// What a capture keeps, from the definition's `portable_snapshots`.
pub fn capture_policy(portable: Option<&api::PortableSnapshots>) -> agent::CapturePolicy {
    let p = portable.cloned().unwrap_or_default();
    agent::CapturePolicy { include: p.include, exclude: p.exclude, redact: p.redact }
}

/// Whether the definition asks for a checkpoint after each run and a
/// restore into each new sandbox of a thread.
pub fn enabled(definition: &api::SandboxDefinition) -> bool {
    definition.lifecycle.as_ref().and_then(|l| l.portable_snapshots.as_ref()).is_some_and(|p| p.enabled)
}

fn portable(definition: &api::SandboxDefinition) -> Option<&api::PortableSnapshots> {
    definition.lifecycle.as_ref().and_then(|l| l.portable_snapshots.as_ref())
}

fn agent_error(what: &str, status: tonic::Status) -> Error {
    let mut err = Error::from_status(&status);
    err.message = format!("{what}: {}", err.message);
    err
}

/// What [`save`] is asked to capture.
pub struct SaveRequest<'a> {
    pub tenant: &'a Tenant,
    pub thread_id: &'a str,
    pub run_id: &'a str,
    pub label: &'a str,
    pub policy: agent::CapturePolicy,
    /// Every value is zeroed wherever it occurs in a captured file.
    pub secrets: &'a Secrets,
}

/// Capture the sandbox behind `agent` into a new checkpoint, the thread's
/// new head. See the module docs for the steps and their guarantees.
pub async fn save(stores: &Stores, agent: &AgentClient, req: SaveRequest<'_>) -> Result<Checkpoint, Error> {
    if req.thread_id.is_empty() {
        return Err(Error::invalid_field("thread_id", "required"));
    }
    let claim = stores.checkpoints.claim_writer(req.tenant, req.thread_id).await?;
    let redact_values: Vec<String> = req.secrets.values().map(|s| s.expose().to_string()).collect();
    let mut stream = agent
        .snapshot()
        .capture(agent::CaptureRequest {
            policy: Some(req.policy.clone()),
            redact_values: redact_values.clone(),
        })
        .await
        .map_err(|s| agent_error("capturing the workspace", s))?
        .into_inner();
    let mut entries = Vec::new();
    while let Some(batch) = stream.message().await.map_err(|s| agent_error("capturing the workspace", s))? {
        entries.extend(batch.entries);
    }
    // The agent is inside the sandbox: what it says is checked like input.
    let summary = shared::snapshot::check_manifest(&entries)?;
    let hashes: Vec<String> = summary.blobs.keys().cloned().collect();
    let pin_id = format!("save-{}", uuid::Uuid::new_v4().simple());
    stores.checkpoints.pin_blobs(&pin_id, &hashes).await?;
    let saved = async {
        let missing = stores.blobs.missing(&hashes).await?;
        let uploaded = upload(stores, agent, &entries, &missing, &req.policy, redact_values).await?;
        let new = NewCheckpoint {
            run_id: req.run_id.to_string(),
            label: req.label.to_string(),
            manifest: agent::CaptureResponse { entries }.encode_to_vec(),
            blobs: hashes.clone(),
            file_count: summary.files,
            dir_count: summary.dirs,
            total_bytes: summary.total_bytes,
            uploaded_bytes: uploaded,
        };
        Ok::<_, Error>(stores.checkpoints.commit(&claim, new, &pin_id).await?)
    }
    .await;
    match saved {
        Ok(checkpoint) => {
            info!(
                tenant = %req.tenant,
                thread_id = req.thread_id,
                checkpoint_id = %checkpoint.checkpoint_id,
                files = checkpoint.file_count,
                uploaded_bytes = checkpoint.uploaded_bytes,
                "checkpoint saved"
            );
            Ok(checkpoint)
        }
        Err(e) => {
            if let Err(u) = stores.checkpoints.unpin(&pin_id).await {
                warn!(error = %u, "releasing the pins of a failed save");
            }
            Err(e)
        }
    }
}

/// Read the `missing` blobs from the agent and store them; returns the
/// bytes stored.
async fn upload(
    stores: &Stores,
    agent: &AgentClient,
    entries: &[agent::ManifestEntry],
    missing: &[String],
    policy: &agent::CapturePolicy,
    redact_values: Vec<String>,
) -> Result<u64, Error> {
    if missing.is_empty() {
        return Ok(0);
    }
    let wanted: std::collections::HashSet<&str> = missing.iter().map(String::as_str).collect();
    let mut seen = std::collections::HashSet::new();
    let blobs: Vec<agent::BlobRef> = entries
        .iter()
        .filter(|e| wanted.contains(e.sha256.as_str()) && seen.insert(e.sha256.as_str()))
        .map(|e| agent::BlobRef { path: e.path.clone(), sha256: e.sha256.clone() })
        .collect();
    let mut stream = agent
        .snapshot()
        .read_blobs(agent::ReadBlobsRequest { blobs, redact_values, policy: Some(policy.clone()) })
        .await
        .map_err(|s| agent_error("reading captured files", s))?
        .into_inner();
    let mut uploaded = 0u64;
    let mut current: Option<(String, BytesMut)> = None;
    while let Some(msg) = stream.message().await.map_err(|s| agent_error("reading captured files", s))? {
        if !wanted.contains(msg.sha256.as_str()) {
            return Err(Error::internal(format!(
                "the agent sent blob {} that was not asked for",
                msg.sha256
            )));
        }
        let (hash, buf) = current.get_or_insert_with(|| (msg.sha256.clone(), BytesMut::new()));
        if *hash != msg.sha256 {
            return Err(Error::internal("the agent interleaved two blobs"));
        }
        buf.extend_from_slice(&msg.data);
        if msg.last {
            let (hash, buf) = current.take().expect("set above");
            uploaded += buf.len() as u64;
            // `put` re-hashes: bytes that changed since the manifest are refused.
            stores.blobs.put(&hash, buf.freeze()).await.map_err(|e| match e {
                crate::store::Error::Invalid { reason, .. } => Error::new(
                    ErrorCode::FailedPrecondition,
                    format!("a file changed while it was captured ({reason}); save again"),
                ),
                other => other.into(),
            })?;
        }
    }
    if current.is_some() {
        return Err(Error::internal("the agent ended a blob stream mid-blob"));
    }
    Ok(uploaded)
}

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
        .map_err(|e| Error::internal(format!("checkpoint {checkpoint_id}: unreadable manifest: {e}")))?
        .entries;
    let summary = shared::snapshot::check_manifest(&entries)?;
    let header = agent::RestoreHeader {
        entry_count: entries.len() as u64,
        blob_count: summary.blobs.len() as u64,
        policy: Some(policy),
    };
    let batches: Vec<Vec<agent::ManifestEntry>> =
        entries.chunks(ENTRIES_PER_MESSAGE).map(<[_]>::to_vec).collect();
    let hashes: Vec<String> = summary.blobs.into_keys().collect();
    let requests = restore_requests(stores.blobs.clone(), header, batches, hashes);
    let response = agent
        .snapshot()
        .restore(requests)
        .await
        .map_err(|s| agent_error(&format!("restoring checkpoint {checkpoint_id}"), s))?
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

/// The messages of a restore: header, manifest batches, then every blob.
/// A blob that cannot be read is left out: the agent then refuses the
/// restore as incomplete, having written nothing.
fn restore_requests(
    blobs: std::sync::Arc<dyn crate::store::BlobStore>,
    header: agent::RestoreHeader,
    batches: Vec<Vec<agent::ManifestEntry>>,
    hashes: Vec<String>,
) -> impl futures::Stream<Item = agent::RestoreRequest> + Send + 'static {
    use agent::restore_request::Request;
    let head = std::iter::once(Request::Header(header))
        .chain(batches.into_iter().map(|entries| Request::Entries(agent::RestoreEntries { entries })));
    let head =
        futures::stream::iter(head.map(|r| agent::RestoreRequest { request: Some(r) }).collect::<Vec<_>>());
    let blob_messages = futures::stream::iter(hashes).then(move |hash| {
        let blobs = blobs.clone();
        async move {
            let chunks: Vec<Vec<u8>> = match blobs.read(&hash).await {
                Ok(stream) => match stream
                    .map(|c| c.map(|b| b.to_vec()))
                    .collect::<Vec<_>>()
                    .await
                    .into_iter()
                    .collect()
                {
                    Ok(chunks) => chunks,
                    Err(error) => {
                        warn!(sha256 = %hash, %error, "reading a checkpoint blob failed");
                        return Vec::new();
                    }
                },
                Err(error) => {
                    warn!(sha256 = %hash, %error, "a checkpoint blob cannot be read");
                    return Vec::new();
                }
            };
            let chunks = if chunks.is_empty() { vec![Vec::new()] } else { chunks };
            chunks
                .into_iter()
                .map(|data| agent::RestoreRequest {
                    request: Some(Request::Blob(agent::RestoreBlob { sha256: hash.clone(), data })),
                })
                .collect::<Vec<_>>()
        }
    });
    head.chain(blob_messages.flat_map(futures::stream::iter))
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

/// The run pump's hook: after a run of `thread_id` completed successfully,
/// save a checkpoint of its live sandbox when the definition enables
/// portable snapshots (`Ok(None)` when it does not). `secrets` are the
/// run's secret values, zeroed in every captured file.
pub async fn checkpoint_after_run(
    stores: &Stores,
    agent: &AgentClient,
    tenant: &Tenant,
    thread_id: &str,
    run_id: &str,
    definition: &api::SandboxDefinition,
    secrets: &Secrets,
) -> Result<Option<Checkpoint>, Error> {
    if !enabled(definition) {
        return Ok(None);
    }
    let req = SaveRequest {
        tenant,
        thread_id,
        run_id,
        label: "after run",
        policy: capture_policy(portable(definition)),
        secrets,
    };
    save(stores, agent, req).await.map(Some)
}

/// Delete blobs that no checkpoint references and no save in progress
/// pinned; returns their hashes.
pub async fn collect_garbage(stores: &Stores) -> Result<Vec<String>, Error> {
    let stored = stores.blobs.list().await?;
    let blobs = stores.blobs.clone();
    let delete = move |hashes: Vec<String>| {
        let blobs = blobs.clone();
        async move { blobs.delete(&hashes).await }.boxed()
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
            Err(e) => warn!(error = %e.message, "snapshot garbage collection failed"),
        }
    }
}

/// The bytes of a blob, for artifact reads.
pub(crate) async fn blob_bytes(
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
