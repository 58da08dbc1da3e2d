//! Saving: capture the manifest, upload what the blob store lacks, commit
//! the checkpoint as the thread's new head; and the run pump's hook.

use bytes::BytesMut;
use prost::Message;
use shared::proto::agent::v1 as agent;
use shared::proto::v1 as api;
use tracing::{info, warn};

use super::Error;
use super::policy::{capture_policy, enabled, portable};
use crate::agent::AgentClient;
use crate::provision::{InvalidField, Secrets};
use crate::store::{Checkpoint, NewCheckpoint, Stores, Tenant};

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
    InvalidField::required("thread_id", req.thread_id)?;
    let claim = stores.checkpoints.claim_writer(req.tenant, req.thread_id).await?;
    let redact_values: Vec<String> = req.secrets.values().map(|s| s.expose().to_string()).collect();
    let mut stream = agent
        .snapshot()
        .capture(agent::CaptureRequest {
            policy: Some(req.policy.clone()),
            redact_values: redact_values.clone(),
        })
        .await
        .map_err(Error::agent("capturing the workspace"))?
        .into_inner();
    let mut entries = Vec::new();
    while let Some(batch) = stream.message().await.map_err(Error::agent("capturing the workspace"))? {
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
        .map_err(Error::agent("reading captured files"))?
        .into_inner();
    let mut uploaded = 0u64;
    let mut current: Option<(String, BytesMut)> = None;
    while let Some(msg) = stream.message().await.map_err(Error::agent("reading captured files"))? {
        if !wanted.contains(msg.sha256.as_str()) {
            return Err(Error::Corrupt(format!("the agent sent blob {} that was not asked for", msg.sha256)));
        }
        let (hash, buf) = current.get_or_insert_with(|| (msg.sha256.clone(), BytesMut::new()));
        if *hash != msg.sha256 {
            return Err(Error::Corrupt("the agent interleaved two blobs".into()));
        }
        buf.extend_from_slice(&msg.data);
        if msg.last {
            let (hash, buf) = current.take().expect("set above");
            uploaded += buf.len() as u64;
            // `put` re-hashes: bytes that changed since the manifest are refused.
            stores.blobs.put(&hash, buf.freeze()).await.map_err(|e| match e {
                crate::store::Error::Invalid { reason, .. } => Error::ChangedWhileCaptured(reason),
                other => other.into(),
            })?;
        }
    }
    if current.is_some() {
        return Err(Error::Corrupt("the agent ended a blob stream mid-blob".into()));
    }
    Ok(uploaded)
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
