//! What the pump does with what it reads: journal lines translated,
//! aligned and appended; stderr lines appended as `run.stderr` where they
//! arrived; out-of-band chunks (file and network events)
//! within their budget; and, at the sentinel, the rest of the translation,
//! the workspace's changes and the terminal chunk.

use shared::chunk::{self, ChunkFactory, SANDBOX_FILE};
use shared::proto::agent::v1 as agent;
use shared::proto::v1::{Chunk, ChunkType};
use tracing::debug;

use super::ctx::DriveCtx;
use super::ending::Ending;
use super::files::changed_files;
use super::outbox::Outbox;
use crate::agent::AgentClient;
use crate::harness::{Harness, Translator};
use crate::provision::Masks;
use crate::runs::Runs;
use crate::runs::align::Aligner;
use crate::runs::daily;
use crate::runs::error::Error;
use crate::runs::usage::{Tally, exceeded_chunk, usage_chunk};
use crate::store::RunUpdate;

/// Usage records read from the broker per call.
const USAGE_PAGE: u32 = 500;

/// `sandbox.file` chunks allowed in a row between two translated chunks:
/// kept under the aligner's limit of out-of-band chunks in a row, so a
/// successor can always skip them. Further file events in the same gap are
/// dropped (counted in the log).
const FILE_EVENT_BUDGET: usize = 48;

/// The state of the pump between journal reads.
pub(super) struct Pump<'a> {
    pub(super) translator: Translator,
    pub(super) aligner: Aligner,
    pub(super) factory: ChunkFactory,
    /// Translated terminal chunk, held back until the exit is known so that
    /// `file.changed` chunks come before it.
    pub(super) held_terminal: Option<Chunk>,
    pub(super) from_byte: u64,
    /// Where the stderr sidecar is delivered up to (a successor starts at
    /// the stored checkpoint).
    pub(super) stderr_from: u64,
    /// The run's model usage as delivered to its log so far.
    pub(super) usage: Tally,
    /// The run has a model route, whose usage its broker records.
    pub(super) metered: bool,
    /// Out-of-band chunks appended since the last translated one.
    pub(super) out_of_band_run: usize,
    /// Out-of-band chunks that arrived before the aligner caught up (a
    /// sandbox's connections before the run's first line): appended once
    /// it has.
    pub(super) held_out_of_band: Vec<Chunk>,
    pub(super) dropped_file_events: u64,
    pub(super) redactor: Masks,
    /// What was made and is not appended yet, and the append in flight.
    pub(super) outbox: Outbox<'a>,
}

impl Runs {
    pub(super) fn translator(&self, ctx: &DriveCtx) -> Translator {
        ctx.harness.translator_for(ctx.spec.output, &ctx.key.run, &ctx.thread_id, chunk::now_ms)
    }

    /// Translate and align one batch of journal lines into the outbox;
    /// stderr lines go in between as they came, past the aligner (a
    /// successor follows stderr from the stored checkpoint, so every one
    /// read is new).
    pub(super) async fn lines(
        &self,
        ctx: &DriveCtx,
        pump: &mut Pump<'_>,
        lines: Vec<agent::JournalLine>,
    ) -> Result<(), Ending> {
        // Whether a translated chunk is in the batch: stderr lines do not
        // end a run of out-of-band chunks (the aligner looks through them).
        let mut translated = false;
        crate::metrics::journal().read(lines.iter().map(|l| l.data.len() as u64 + 1).sum());
        for line in &lines {
            if line.stderr {
                // Masked by the agent, which holds the values, like stdout.
                let text = String::from_utf8_lossy(&line.data);
                pump.outbox.push_one(&pump.factory.stderr_line(&text, line.end_offset));
                pump.stderr_from = line.end_offset;
                continue;
            }
            let chunks = if line.sealed {
                pump.translator.feed_record(&line.data)
            } else {
                pump.translator.feed(&line.data)
            };
            for c in chunks {
                if let Some(session) = session_of(ctx.harness, &c) {
                    *ctx.session.lock().unwrap_or_else(|e| e.into_inner()) = Some(session);
                }
                if chunk::is_terminal(&c) {
                    pump.held_terminal = Some(c);
                } else if pump.aligner.offer(&c).await.map_err(|e| ctx.interrupts.failed(e))? {
                    translated = true;
                    pump.outbox.push_one(&c);
                }
            }
        }
        if let Some(last) = lines.iter().rev().find(|l| !l.stderr) {
            pump.from_byte = last.end_offset;
        }
        if translated {
            pump.out_of_band_run = 0;
        }
        if pump.aligner.caught_up() {
            pump.outbox.push(std::mem::take(&mut pump.held_out_of_band));
        }
        Ok(())
    }

    /// Everything made so far, appended: the append in flight landed, then
    /// what waits.
    pub(super) async fn flush(&self, ctx: &DriveCtx, pump: &mut Pump<'_>) -> Result<(), Ending> {
        self.flush_as(ctx, pump, Last::No).await
    }

    /// [`Self::flush`], what waits appended as `last` says.
    pub(super) async fn flush_as(
        &self,
        ctx: &DriveCtx,
        pump: &mut Pump<'_>,
        last: Last,
    ) -> Result<(), Ending> {
        pump.outbox.settle().await?;
        let rest = pump.outbox.take();
        match (rest.is_empty(), last) {
            (true, _) => Ok(()),
            (false, Last::No) => self.append(ctx, &rest).await,
            (false, Last::Yes) => self.append_last(ctx, &rest).await,
        }
    }

    /// Deliver the usage records the broker kept since the last one
    /// delivered, as `model.usage` chunks (appended wherever they arrive,
    /// past the aligner, like stderr: a successor reads on from the stored
    /// `seq`), and end the run once its budget is reached: a
    /// `budget.exceeded` chunk (once), then BUDGET_EXCEEDED. A broker that
    /// cannot be read now is read at the next call.
    pub(super) async fn meter(
        &self,
        ctx: &DriveCtx,
        pump: &mut Pump<'_>,
        agent: &AgentClient,
    ) -> Result<(), Ending> {
        if !pump.metered {
            return Ok(());
        }
        let mut fresh_records = false;
        loop {
            let request = agent::ReadUsageRequest {
                run_id: ctx.key.run.to_string(),
                after_seq: pump.usage.seq,
                max_records: USAGE_PAGE,
            };
            let records = match agent.egress().read_usage(request).await {
                Ok(r) => r.into_inner().records,
                Err(status) => {
                    debug!(run_id = %ctx.key.run, error = %status.message(), "reading the model usage failed");
                    break;
                }
            };
            let page = records.len();
            let fresh: Vec<_> = records.into_iter().filter(|r| pump.usage.add(r)).collect();
            if !fresh.is_empty() {
                pump.outbox.push(fresh.iter().map(|r| usage_chunk(&pump.factory, r)));
                for r in &fresh {
                    crate::metrics::model().metered(
                        ctx.key.tenant.as_str(),
                        r.input_tokens,
                        r.output_tokens,
                        r.cache_read_tokens,
                        r.cache_write_tokens,
                    );
                }
                *ctx.usage.lock().unwrap_or_else(|e| e.into_inner()) = Some(pump.usage);
                fresh_records = true;
            }
            if page < USAGE_PAGE as usize {
                break;
            }
        }
        let mut reached = ctx.spec.budget.and_then(|b| b.reached(&pump.usage));
        if fresh_records {
            // The record keeps the run's usage as it grows, never ahead of
            // its log: the tenant's daily budget is summed from the records.
            self.flush(ctx, pump).await?;
            let usage = daily::marked(shared::chunk::usage_to_json(&pump.usage.usage(None)));
            let update = RunUpdate { usage: Some(usage), ..Default::default() };
            if let Err(e) = self.inner.ctx.stores.runs.update(&ctx.key, update).await {
                debug!(run_id = %ctx.key.run, error = %e, "recording the run's usage on its record failed");
            }
        }
        // Summed again after new records, and by a successor that finds the
        // budget reached in the log but the run not ended.
        if fresh_records || (pump.usage.exceeded && reached.is_none()) {
            let max = self.inner.options.tenant_daily_tokens;
            if reached.is_none() && max > 0 {
                match daily::tokens_today(self.inner.ctx.stores.runs.as_ref(), &ctx.key.tenant).await {
                    Ok(used) if used >= max => reached = Some(("tenant_daily_tokens", max, used)),
                    Ok(_) => {}
                    Err(e) => debug!(run_id = %ctx.key.run, error = %e, "summing the tenant's tokens failed"),
                }
            }
        }
        let Some((limit, max, used)) = reached else {
            return Ok(());
        };
        if !pump.usage.exceeded {
            pump.outbox.push([exceeded_chunk(&pump.factory, limit, max, used)]);
            self.flush(ctx, pump).await?;
            pump.usage.exceeded = true;
            *ctx.usage.lock().unwrap_or_else(|e| e.into_inner()) = Some(pump.usage);
        }
        Err(Ending::Failed(Error::BudgetExceeded { limit: limit.to_string(), max, used }))
    }

    /// The sentinel was read: the usage the broker recorded up to now (the
    /// budget may end the run here), the rest of the translation, the
    /// workspace's changes, then the terminal chunk, which carries the
    /// metered usage when there is any.
    pub(super) async fn exited(
        &self,
        ctx: &DriveCtx,
        pump: &mut Pump<'_>,
        agent: &AgentClient,
        exit_code: i32,
        stderr_tail: &str,
    ) -> Ending {
        if let Err(ending) = self.meter(ctx, pump, agent).await {
            return ending;
        }
        let mut batch = Vec::new();
        for c in pump.translator.finish(exit_code, stderr_tail) {
            if chunk::is_terminal(&c) {
                pump.held_terminal.get_or_insert(c);
            } else {
                match pump.aligner.offer(&c).await {
                    Ok(true) => batch.push(c),
                    Ok(false) => {}
                    Err(e) => return ctx.interrupts.failed(e),
                }
            }
        }
        for c in changed_files(agent, &ctx.spec.cwd, &pump.factory, &pump.redactor).await {
            match pump.aligner.offer(&c).await {
                Ok(true) => batch.push(c),
                Ok(false) => {}
                Err(e) => return ctx.interrupts.failed(e),
            }
        }
        let mut terminal = pump.held_terminal.take().unwrap_or_else(|| {
            // Translator::finish always yields one; keep the run closable anyway.
            pump.factory.run_error("the run ended without a terminal event", "INTERNAL")
        });
        // What the broker read, not what the CLI says: every answer counts,
        // whatever process asked. A successor has the same records stored,
        // so its replay gives the same chunk.
        if terminal.r#type() == ChunkType::RunFinished && pump.usage.metered() {
            terminal.usage = Some(pump.usage.usage(terminal.usage.as_ref()));
        }
        match pump.aligner.offer(&terminal).await {
            Ok(true) => batch.push(terminal.clone()),
            Ok(false) => {}
            Err(e) => return ctx.interrupts.failed(e),
        }
        if let Err(e) = pump.aligner.finish().await {
            return ctx.interrupts.failed(e);
        }
        // Out-of-band chunks still held (the run printed nothing) go before
        // the end: they happened before it.
        pump.outbox.push(std::mem::take(&mut pump.held_out_of_band));
        pump.outbox.push(batch);
        if let Err(ending) = self.flush(ctx, pump).await {
            return ending;
        }
        Ending::Exited { terminal }
    }
}

/// Whether a flush is the drive's last append before its end is written
/// (retried as [`Runs::append_last`] is: past a stop, through a full disk).
#[derive(Clone, Copy)]
pub(super) enum Last {
    No,
    Yes,
}

impl Pump<'_> {
    /// File events as `sandbox.file` chunks, within the per-gap budget.
    pub(super) fn file_events(&mut self, events: Vec<agent::FileEvent>) {
        let mut batch = Vec::new();
        for e in events {
            let kind = match agent::FileEventType::try_from(e.r#type) {
                Ok(agent::FileEventType::Create) => "create",
                Ok(agent::FileEventType::Change) => "change",
                Ok(agent::FileEventType::Delete) => "delete",
                Ok(agent::FileEventType::Rename) => "rename",
                _ => continue,
            };
            if self.out_of_band_run + batch.len() >= FILE_EVENT_BUDGET {
                self.dropped_file_events += 1;
                continue;
            }
            let value = serde_json::json!({"type": kind, "path": e.path, "timestamp": e.timestamp_ms});
            batch.push(self.factory.custom(SANDBOX_FILE, &value));
        }
        self.out_of_band(batch)
    }

    /// Chunks the server adds outside translation (file and network
    /// events), into the outbox within the per-gap budget.
    pub(super) fn out_of_band(&mut self, batch: Vec<Chunk>) {
        if batch.is_empty() {
            return;
        }
        if self.out_of_band_run + batch.len() > FILE_EVENT_BUDGET {
            self.dropped_file_events += batch.len() as u64;
            return;
        }
        self.out_of_band_run += batch.len();
        // Out of band: never offered to the aligner (a replay does not
        // produce them; the aligner skips the stored ones).
        if self.aligner.caught_up() {
            self.outbox.push(batch);
        } else {
            self.held_out_of_band.extend(batch);
        }
    }
}

/// The session a `<harness>.session-id` chunk reports.
fn session_of(harness: Harness, c: &Chunk) -> Option<String> {
    if c.r#type() != ChunkType::Custom || c.name != chunk::session_id_name(harness.name()) {
        return None;
    }
    let value: serde_json::Value = serde_json::from_str(&c.value_json).ok()?;
    value.get("session_id")?.as_str().filter(|s| !s.is_empty()).map(str::to_string)
}
