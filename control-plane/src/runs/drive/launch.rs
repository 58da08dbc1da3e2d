//! A drive's launch: for a fresh run, ensure the sandbox and start the
//! journaled command in it (the launch plan: session carried in, files
//! projected, egress pointed, journal cap, environment and `PATH`); for a
//! takeover, read what the predecessor left and reach the sandbox again.

use std::sync::Arc;
use std::time::{Duration, Instant};

use backon::ExponentialBuilder;
use shared::chunk::{self, ChunkFactory};
use tracing::{debug, info, warn};

use super::ctx::DriveCtx;
use super::ending::Ending;
use super::retry::{GaveUp, retry};
use super::store_calls::{gave_up, persistently, retry_store};
use crate::agent::AgentClient;
use crate::harness::CommandSpec;
use crate::harness::session::Carry;
use crate::provision::{Progress, Secrets};
use crate::runs::egress::RunEgress;
use crate::runs::error::Error;
use crate::runs::log::{decode_chunk, encode_chunk};
use crate::runs::replica::StopReason;
use crate::runs::{Runs, session};
use crate::sandbox::EnsureInput;
use crate::store::RunUpdate;

/// What a fresh run needs before its journal exists.
pub(crate) struct FreshStart {
    pub input: EnsureInput,
    pub command: CommandSpec,
    pub progress: Progress,
    /// `harness.warning`s decided before the run started.
    pub notes: Vec<String>,
    /// For when the ensure does not resume the thread's sandbox: `command`
    /// continues a session whose files lived there.
    pub unless_resumed: Option<Unresumed>,
}

/// What a run that continues a session does in a sandbox that is not the
/// one the session was left in.
pub(crate) struct Unresumed {
    /// Starts a new session instead.
    pub fresh: CommandSpec,
    /// Says so, as a `harness.warning`.
    pub note: String,
    /// The session, which a checkpoint restored into the new sandbox may
    /// carry.
    pub session: String,
}

impl Runs {
    /// A takeover's launch: what the predecessor left (a complete log, a
    /// recorded cancel, the run's sandbox), and the sandbox's agent again.
    #[tracing::instrument(name = "run.takeover", skip_all)]
    pub(super) async fn take_up(
        &self,
        ctx: &DriveCtx,
    ) -> Result<(String, AgentClient, Arc<Secrets>), Ending> {
        let cx = &self.inner.ctx;
        let (runs, events) = (&cx.stores.runs, &cx.stores.events);
        let record = persistently(ctx, "reading the run", || runs.get(&ctx.key)).await?;
        let quiet = &self.inner.options.quiet;
        match persistently(ctx, "waiting for quiet", || quiet.wait(events.as_ref(), &ctx.key)).await? {
            0 => {}
            grew => info!(run_id = %ctx.key.run, grew, "the stored log grew after the claim"),
        }
        let last = persistently(ctx, "reading the log's last chunk", || events.last(&ctx.key)).await?;
        // Its driver died between the terminal chunk and the status:
        // the run is over, whatever its journal or sandbox became,
        // and only the record is left to finish.
        match last.as_ref().map(decode_chunk).transpose() {
            Ok(Some(terminal)) if chunk::is_terminal(&terminal) => {
                info!(run_id = %ctx.key.run, "the stored log is complete; finishing the record");
                return Err(Ending::Exited { terminal });
            }
            Ok(_) => {}
            Err(e) => return Err(Ending::Failed(e)),
        }
        if record.cancel_requested {
            return Err(Ending::Stopped(StopReason::Cancel));
        }
        let sandbox = &self.inner.sandbox;
        let definition = retry_store(
            &ctx.key.run,
            ctx.interrupts.clone(),
            "reading the definition",
            crate::store::Error::is_transient,
            || sandbox.definition(&ctx.key.tenant, &ctx.spec.definition_id),
        );
        match definition.await {
            Ok(definition) => {
                let _ = ctx.definition.set(definition);
            }
            // Deleted since: the run goes on without egress.
            Err(GaveUp::Failed(e)) if e.is_not_found() => {}
            Err(GaveUp::Failed(e @ crate::sandbox::Error::CorruptDefinition(_))) => {
                return Err(Ending::Failed(Error::Egress(e.to_string())));
            }
            Err(other) => return Err(gave_up(other)),
        }
        let Some(key) = record.sandbox_key else {
            return Err(Ending::Failed(Error::SandboxNeverReady));
        };
        let (agent, secrets) = self.reconnect(ctx, &key).await?;
        Ok((key, agent, secrets))
    }

    /// Ensure the sandbox and start the journaled command.
    #[tracing::instrument(name = "run.start", skip_all)]
    pub(super) async fn start_fresh(
        &self,
        ctx: &DriveCtx,
        start: FreshStart,
    ) -> Result<(String, AgentClient, Arc<Secrets>), Ending> {
        let cx = &self.inner.ctx;
        let sandbox = &self.inner.sandbox;
        // A cancel recorded before this drive was registered found no
        // driver to stop: the record is read once, now that one listens.
        match cx.stores.runs.get(&ctx.key).await {
            Ok(record) if record.cancel_requested => return Err(Ending::Stopped(StopReason::Cancel)),
            Ok(_) => {}
            Err(e) => debug!(run_id = %ctx.key.run, error = %e, "could not read the record for a cancel"),
        }
        let FreshStart { input, mut command, progress, mut notes, unless_resumed } = start;
        let workspace = input.definition.workspace.clone().unwrap_or_default();
        let journal_cap = sandbox.journal_cap(&input.definition);
        let definition = input.definition.clone();
        let _ = ctx.definition.set(definition.clone());
        let ensured = sandbox.ensure(input, &progress).await.map_err(|e| Ending::Failed(e.into()))?;
        drop(progress); // ends the progress part of StartRun's stream
        let restored = !ensured.restored_checkpoint_id.is_empty();
        let unresumed =
            unless_resumed.filter(|_| ensured.outcome() != shared::proto::v1::EnsureOutcome::Resumed);
        let key = ensured.sandbox_id;
        let update = RunUpdate { sandbox_key: Some(Some(key.clone())), ..Default::default() };
        persistently(ctx, "recording the run's sandbox", || cx.stores.runs.update(&ctx.key, update.clone()))
            .await?;
        let live = sandbox.agent(&ctx.key.tenant, &key).await.map_err(|e| Ending::Failed(e.into()))?;
        if let Some(stopped) = ctx.interrupts.stopped() {
            // Stopped while the sandbox was being made: nothing to start,
            // and no journal for a pump to follow.
            return Err(stopped);
        }
        let (path, missing) = sandbox.run_path(&live, ctx.harness, command.cli_program(), &command.env).await;
        if let Some(u) = unresumed {
            // A checkpoint restored into the new sandbox may carry the
            // session: put it back where the CLI looks for it.
            let env = session::carry_env(&live.env, &ctx.spec.session_env, path.as_deref());
            let carried = restored
                && match session::carry(
                    &live.agent,
                    ctx.harness,
                    Carry::Import,
                    &u.session,
                    &ctx.spec.cwd,
                    &ctx.spec.program,
                    env,
                )
                .await
                {
                    Ok(found) => found,
                    Err(e) => {
                        warn!(run_id = %ctx.key.run, error = %e, "could not restore the thread's session");
                        false
                    }
                };
            if carried {
                info!(run_id = %ctx.key.run, session = %u.session, "session restored from the checkpoint");
            } else {
                command = u.fresh;
                notes.push(u.note);
            }
        }
        // Files that carry secrets are written for each run, for its harness
        // only; what the harness cannot use is a warning, not an error.
        let mut warnings = notes;
        if !live.provider.kind().isolated() && ctx.harness != crate::harness::Harness::Command {
            warnings.push(format!(
                "{} runs on the server's host with no isolation: it can read, change and run anything the \
                 server's user can. Give the run a container (--image IMAGE) for work you would not do on this host yourself",
                ctx.harness.name()
            ));
        }
        warnings.extend(live.agent.confinement_warnings());
        warnings.append(&mut command.warnings);
        warnings.extend(missing);
        warnings.extend(
            crate::workspace::project_for_run(&live.agent, &workspace, &live.secrets, ctx.harness)
                .await
                .map_err(|e| Ending::Failed(Error::Projecting(e)))?,
        );
        if !warnings.is_empty() {
            let factory = ChunkFactory::new(&ctx.key.run, &ctx.thread_id, chunk::now_ms);
            let chunks: Vec<_> = warnings.iter().map(|w| encode_chunk(&factory.warning(w, None))).collect();
            self.append(ctx, &chunks).await?;
        }
        // The model broker's URL and placeholder key, and the proxy.
        let tenant = ctx.key.tenant.as_str();
        if let Some(egress) =
            RunEgress::of(&definition, ctx.harness, sandbox, (tenant, &key)).map_err(Ending::Failed)?
        {
            let run = (ctx.harness, ctx.key.run.as_str(), ctx.spec.budget);
            crate::runs::egress::point(&egress, &definition, run, &live.agent, &mut command)
                .await
                .map_err(Ending::Failed)?;
        }
        let mut request = command.start_run_request(&ctx.key.run, &ctx.spec.cwd, ctx.sentinel_key.clone());
        // Enforced by the sandbox agent, so it holds while no replica drives.
        request.max_journal_bytes = journal_cap;
        // Model keys stay with the agent.
        for (name, value) in live.process_secrets() {
            request.env.entry(name.clone()).or_insert_with(|| value.expose().to_string());
        }
        // The sandbox's SetEnv variables, below the harness's and the secrets.
        for (name, value) in &live.env {
            request.env.entry(name.clone()).or_insert_with(|| value.clone());
        }
        // The toolchain's CLIs, unless the run sets its own PATH.
        if let Some(path) = path {
            request.env.entry("PATH".into()).or_insert(path);
        }
        if let Some(stopped) = ctx.interrupts.stopped() {
            return Err(stopped);
        }
        live.agent
            .journal()
            .start_run(request)
            .await
            .map_err(|status| Ending::Failed(Error::StartRefused(status)))?;
        Ok((key, live.agent, live.secrets))
    }

    /// A connected agent for the sandbox, retried within the budget.
    pub(super) async fn reconnect(
        &self,
        ctx: &DriveCtx,
        key: &str,
    ) -> Result<(AgentClient, Arc<Secrets>), Ending> {
        let sandbox = &self.inner.sandbox;
        // A sandbox on a node is waited for while the node may come back
        // (a partition shorter than the grace period).
        let budget = sandbox.reconnect_budget(key, self.inner.options.reconnect_budget).await;
        let deadline = Instant::now() + budget;
        let backoff = ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(100))
            .with_max_delay(Duration::from_secs(2))
            .without_max_times();
        let live = retry(
            ctx.interrupts.clone(),
            backoff,
            || sandbox.agent(&ctx.key.tenant, key),
            |e: &crate::sandbox::Error| !e.is_not_found() && !e.is_lost() && Instant::now() < deadline,
            |e, _| debug!(run_id = %ctx.key.run, error = %e, "sandbox agent unreachable; retrying"),
        )
        .await;
        match live {
            Ok(live) => Ok((live.agent, live.secrets)),
            Err(GaveUp::Failed(e)) => Err(Ending::Failed(Error::Unreachable(e))),
            Err(GaveUp::Interrupted(ending)) => Err(ending),
        }
    }
}
