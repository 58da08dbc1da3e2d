//! Saving: capture the manifest, upload what the blob store lacks, commit
//! the checkpoint as the thread's new head; and the run pump's hook.

use prost::Message;
use shared::proto::agent::v1 as agent;
use shared::proto::v1 as api;
use tracing::{info, warn};

use super::Error;
use super::policy::{capture_policy, enabled, portable};
use crate::agent::AgentClient;
use crate::config::{ByteMax, SnapshotLimits};
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
    /// The maxima in force (see [`Maxima::new`]).
    pub maxima: Maxima,
}

/// The per-file and per-snapshot maxima of one save: the operator's,
/// lowered by the definition's snapshot policy.
#[derive(Debug, Clone, Copy, Default)]
pub struct Maxima {
    pub file: Option<ByteMax>,
    pub total: Option<ByteMax>,
}

impl Maxima {
    pub fn new(operator: SnapshotLimits, portable: Option<&api::PortableSnapshots>) -> Self {
        let (file, total) = portable.map_or((0, 0), |p| (p.max_file_bytes, p.max_total_bytes));
        Self { file: operator.file(file), total: operator.total(total) }
    }

    /// Refuse a manifest that declares a file, or a total, over a maximum.
    fn check_manifest(&self, entries: &[agent::ManifestEntry], total: u64) -> Result<(), Error> {
        if let Some(max) = self.file
            && let Some(e) = entries.iter().find(|e| max.exceeded_by(e.size))
        {
            return Err(Error::TooLarge { path: e.path.clone(), size: e.size, max });
        }
        match self.total {
            Some(max) if max.exceeded_by(total) => {
                Err(Error::TooLarge { path: String::new(), size: total, max })
            }
            _ => Ok(()),
        }
    }
}

/// Capture the sandbox behind `agent` into a new checkpoint, the thread's
/// new head. See the module docs for the steps and their guarantees.
pub async fn save(stores: &Stores, agent: &AgentClient, req: SaveRequest<'_>) -> Result<Checkpoint, Error> {
    InvalidField::required("thread_id", req.thread_id)?;
    // The agent zeroes every value it holds; these may be newer.
    crate::provision::hand_over(agent, req.secrets)
        .await
        .map_err(Error::agent("handing over the secret values"))?;
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
    let summary = shared::snapshot::check_manifest(&entries).map_err(Error::Manifest)?;
    // Before a byte is read; the bytes are held to what is declared here.
    req.maxima.check_manifest(&entries, summary.total_bytes)?;
    let hashes: Vec<String> = summary.blobs.keys().cloned().collect();
    let pin_id = format!("save-{}", uuid::Uuid::new_v4().simple());
    stores.checkpoints.pin_blobs(req.tenant, &pin_id, &hashes).await?;
    let saved = async {
        // The tenant's own blobs only: a hash another tenant stored is
        // missing here, so its bytes are asked for and hashed on receipt.
        let missing = stores.blobs.missing(req.tenant, &hashes).await?;
        let uploaded = upload(
            stores,
            agent,
            Upload { tenant: req.tenant, entries: &entries, missing: &missing, maxima: req.maxima },
            &req.policy,
            redact_values,
        )
        .await?;
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

/// What [`upload`] stores: the `missing` blobs of the manifest `entries`.
struct Upload<'a> {
    tenant: &'a Tenant,
    entries: &'a [agent::ManifestEntry],
    missing: &'a [String],
    maxima: Maxima,
}

/// Read the `missing` blobs from the agent and store them as the tenant's;
/// returns the bytes stored. Every missing blob must arrive, once, with
/// bytes that hash to its name: the checkpoint then references only blobs
/// the tenant holds. Each blob streams through to the blob store piece by
/// piece, held to the size the manifest declared (and so to the maxima).
async fn upload(
    stores: &Stores,
    agent: &AgentClient,
    up: Upload<'_>,
    policy: &agent::CapturePolicy,
    redact_values: Vec<String>,
) -> Result<u64, Error> {
    if up.missing.is_empty() {
        return Ok(0);
    }
    let wanted: std::collections::HashSet<&str> = up.missing.iter().map(String::as_str).collect();
    let mut sizes = std::collections::HashMap::new();
    let blobs: Vec<agent::BlobRef> = up
        .entries
        .iter()
        .filter(|e| {
            wanted.contains(e.sha256.as_str())
                && sizes.insert(e.sha256.as_str(), (e.size, e.path.as_str())).is_none()
        })
        .map(|e| agent::BlobRef { path: e.path.clone(), sha256: e.sha256.clone() })
        .collect();
    let blob_sizes: Vec<u64> = blobs.iter().map(|b| sizes[b.sha256.as_str()].0).collect();
    // Small blobs of a first save are stored together (the directory store
    // packs them): stored for good once the batch is sealed, below.
    let batch = stores.blobs.begin_batch(up.tenant, &blob_sizes).await?;
    let mut stream = agent
        .snapshot()
        .read_blobs(agent::ReadBlobsRequest { blobs, redact_values, policy: Some(policy.clone()) })
        .await
        .map_err(Error::agent("reading captured files"))?
        .into_inner();
    // Every blob is hashed on receipt: bytes that changed since the
    // manifest (or never were the manifest's) are refused, naming the
    // file, and so are more than it declared.
    let mut uploaded = 0u64;
    let mut received = std::collections::HashSet::new();
    let mut current: Option<(String, crate::store::blob::BlobUpload)> = None;
    // Blobs are verified and stored (a pack's appended, a file's fsynced
    // and linked) concurrently, while the next ones stream in: one after
    // another, a first save of many small files waited on each fsync;
    // together, the file system commits their fsyncs in shared journal
    // commits. As many as the store allows (PostgreSQL's each hold a
    // pooled connection).
    let (mut finishing, mut finishing_bytes) = (tokio::task::JoinSet::new(), 0u64);
    let at_once = stores.blobs.finishing_at_once().max(1);
    while let Some(msg) = stream.message().await.map_err(Error::agent("reading captured files"))? {
        let Some(&(size, path)) = sizes.get(msg.sha256.as_str()) else {
            return Err(Error::Corrupt(format!("the agent sent blob {} that was not asked for", msg.sha256)));
        };
        if current.is_none() {
            if received.contains(&msg.sha256) {
                return Err(Error::Corrupt(format!("the agent sent blob {} twice", msg.sha256)));
            }
            let blob = batch.begin_put(&msg.sha256, size).await.map_err(changed_in(path))?;
            current = Some((msg.sha256.clone(), blob));
        }
        let (hash, blob) = current.as_mut().expect("set above");
        if *hash != msg.sha256 {
            return Err(Error::Corrupt("the agent interleaved two blobs".into()));
        }
        // The agent is untrusted: whatever it declared, no byte past a
        // maximum is taken.
        let (file_bytes, total) = (blob.written() + msg.data.len() as u64, uploaded + msg.data.len() as u64);
        if let Some(max) = up.maxima.file.filter(|m| m.exceeded_by(file_bytes)) {
            return Err(Error::TooLarge { path: path.to_string(), size: file_bytes, max });
        }
        if let Some(max) = up.maxima.total.filter(|m| m.exceeded_by(total)) {
            return Err(Error::TooLarge { path: String::new(), size: total, max });
        }
        blob.write(&msg.data).await.map_err(changed_in(path))?;
        uploaded = total;
        if msg.last {
            let (hash, blob) = current.take().expect("set above");
            received.insert(hash);
            while finishing.len() >= at_once || finishing_bytes >= FINISHING_BYTES {
                finishing_bytes -= joined(finishing.join_next().await)?;
            }
            finishing_bytes += size;
            let path = path.to_string();
            finishing.spawn(async move { blob.finish().await.map(|_| size).map_err(changed_in(&path)) });
        }
    }
    while let Some(done) = finishing.join_next().await {
        joined(Some(done))?;
    }
    if current.is_some() {
        return Err(Error::Corrupt("the agent ended a blob stream mid-blob".into()));
    }
    if let Some(unsent) = up.missing.iter().find(|h| !received.contains(h.as_str())) {
        return Err(Error::Corrupt(format!("the agent did not send blob {unsent}")));
    }
    batch.seal().await?;
    Ok(uploaded)
}

/// A store error of the blob read from `path`: a refusal of its bytes is
/// the file having changed while it was captured, named.
fn changed_in(path: &str) -> impl Fn(crate::store::Error) -> Error + '_ {
    move |e| match e {
        crate::store::Error::Invalid { reason, .. } => {
            Error::ChangedWhileCaptured(format!("{path:?}: {reason}"))
        }
        other => other.into(),
    }
}

/// The bytes of the blobs of one save being verified and stored at once
/// (a blob's are in memory until stored, up to the directory store's
/// 1 MiB); how many, the blob store says.
const FINISHING_BYTES: u64 = 32 << 20;

/// The bytes of a blob whose `finish` task ended, once it succeeded.
fn joined(done: Option<Result<Result<u64, Error>, tokio::task::JoinError>>) -> Result<u64, Error> {
    match done {
        Some(Ok(stored)) => stored,
        Some(Err(e)) => Err(crate::store::Error::Unavailable(format!("storing a blob: {e}")).into()),
        None => Ok(0),
    }
}

/// The run pump's hook: after a run of `thread_id` completed successfully,
/// save a checkpoint of its live sandbox when the definition enables
/// portable snapshots (`Ok(None)` when it does not). `secrets` are the
/// run's secret values, zeroed in every captured file; `limits` the
/// operator's maxima (the definition may lower them).
#[allow(clippy::too_many_arguments)]
pub async fn checkpoint_after_run(
    stores: &Stores,
    agent: &AgentClient,
    tenant: &Tenant,
    thread_id: &str,
    run_id: &str,
    definition: &api::SandboxDefinition,
    secrets: &Secrets,
    limits: SnapshotLimits,
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
        maxima: Maxima::new(limits, portable(definition)),
    };
    save(stores, agent, req).await.map(Some)
}
