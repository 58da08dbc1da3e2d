//! Group commit of event-log appends, the same on both backends.
//!
//! Every [`EventLog::append`](super::EventLog::append) goes to one committer
//! task per store. It takes the first append waiting, adds whatever else is
//! already waiting (never waits for more: a lone append goes at once), up to
//! [`GroupCommit::Grouped`]'s bounds, and writes the group in one
//! transaction, so many runs share one COMMIT and one sync of the disk.
//!
//! Per member nothing changes:
//! - its fence: the runs' epochs and closed flags are read inside the
//!   group's transaction, after the write lock (SQLite's `BEGIN IMMEDIATE`)
//!   or the runs' rows (`FOR SHARE` on PostgreSQL) are held, so a member of
//!   a superseded writer, of a closed log or of an unknown run is refused
//!   with its own error and writes nothing, and the others land (SQLite's
//!   committer reuses the fences of its last group instead of reading them
//!   again while `PRAGMA data_version`, read under the write lock, says no
//!   other connection committed since; see `sqlite.rs`);
//! - its promise: a member is answered `Ok` (and its rows handed to this
//!   process's tail of its run, [`Tails::feed`]) only after the group's
//!   COMMIT succeeded. A COMMIT that fails (a full disk) fails
//!   every member. A statement that fails before the COMMIT (which may be
//!   one member's doing, such as a racing same-epoch append) rolls the
//!   group back, and each member is then written again in a transaction of
//!   its own, in order, so its failure is its own;
//! - its order: members are written in the order they were enqueued, and
//!   appends through one [`LogWriter`](super::LogWriter) are serialized.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use tokio::sync::{mpsc, oneshot};

use super::tail::Tails;
use super::{Epoch, Error, NewChunk, Offset, Result, RunKey, StoredChunk, Timestamp};

/// How appends reach the database ([`Stores::open_with`](super::Stores::open_with)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupCommit {
    /// Appends already waiting when a transaction starts share it: at most
    /// `max_rows` chunks and `max_bytes` of payload per group (an append
    /// larger than that goes alone).
    Grouped { max_rows: usize, max_bytes: usize },
    /// Every append is a transaction of its own, in its caller's task: the
    /// path before group commit, kept as the benchmarks' baseline.
    Off,
}

impl Default for GroupCommit {
    /// The bounds of the driver's own batches (`runs/coalesce.rs`).
    fn default() -> Self {
        Self::Grouped { max_rows: 4096, max_bytes: 4 << 20 }
    }
}

/// Appends waiting for the committer, at most; more wait to be enqueued.
const QUEUE: usize = 4096;

/// One append of a group.
pub(super) struct Member<'a> {
    pub(super) run: &'a RunKey,
    pub(super) epoch: Epoch,
    /// `epoch` as stored.
    pub(super) held: i64,
    pub(super) chunks: &'a [NewChunk],
}

/// The fence of one run as the group's transaction reads it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Fence {
    pub(super) epoch: i64,
    pub(super) closed: bool,
    /// The run's last sequence number (0 for an empty log).
    pub(super) last: i64,
}

/// What one member's write comes to.
pub(super) enum Written {
    /// Stored at these sequence numbers, in order, appended at `at`
    /// (milliseconds, as stored).
    Stored { seqs: Vec<i64>, at: i64 },
    /// Refused before anything was written ([`Error::Fenced`],
    /// [`Error::LogClosed`], [`Error::NotFound`]): this member's answer;
    /// the group goes on.
    Refused(Error),
}

/// Why `member` may not append, given its run's fence (`None`: no such
/// run).
pub(super) fn refusal(member: &Member<'_>, fence: Option<Fence>) -> Option<Error> {
    match fence {
        None => Some(super::sql::run_not_found(member.run)),
        Some(fence) if fence.epoch != member.held => Some(Error::Fenced {
            run: member.run.run.to_string(),
            held: member.epoch,
            current: fence.epoch as Epoch,
        }),
        Some(Fence { closed: true, .. }) => Some(Error::LogClosed(member.run.run.to_string())),
        Some(_) => None,
    }
}

/// Which members land and where: each admitted member's chunks follow its
/// run's last sequence number, and the members of one run follow each
/// other in group order; all appended `at`.
pub(super) fn plan(members: &[Member<'_>], fences: &HashMap<RunKey, Fence>, at: i64) -> Vec<Written> {
    let mut last: HashMap<&RunKey, i64> = HashMap::new();
    members
        .iter()
        .map(|member| {
            let fence = fences.get(member.run).copied();
            if let Some(refused) = refusal(member, fence) {
                return Written::Refused(refused);
            }
            let last = last.entry(member.run).or_insert_with(|| fence.map_or(0, |f| f.last));
            let first = *last + 1;
            *last += member.chunks.len() as i64;
            Written::Stored { seqs: (first..=*last).collect(), at }
        })
        .collect()
}

/// The distinct runs of a group, in first-seen order.
pub(super) fn runs_of<'a>(members: &'a [Member<'a>]) -> Vec<&'a RunKey> {
    let mut runs: Vec<&RunKey> = Vec::with_capacity(members.len());
    for member in members {
        if !runs.contains(&member.run) {
            runs.push(member.run);
        }
    }
    runs
}

/// A backend's side of group commit: one transaction, written once for
/// the whole group.
#[async_trait]
pub(super) trait GroupLog: Send + Sync + 'static {
    type Tx: Send;

    /// Open the group's write transaction.
    async fn begin(&self) -> Result<Self::Tx>;

    /// Read the members' fences inside `tx` (locking them against claims
    /// until the transaction ends), write the members [`plan`] admits and
    /// their request index rows, and say what each came to. An error is a
    /// failed statement: the caller abandons the transaction.
    async fn write(&self, tx: &mut Self::Tx, members: &[Member<'_>]) -> Result<Vec<Written>>;

    /// COMMIT. On an error nothing of the transaction may be acknowledged,
    /// and the connection is left clean (or closed).
    async fn commit(&self, tx: Self::Tx) -> Result<()>;

    /// Roll back after a failed write.
    async fn abandon(&self, tx: Self::Tx);

    /// One append in a transaction of its own.
    async fn alone(&self, member: &Member<'_>) -> Result<Written> {
        let mut tx = self.begin().await?;
        match self.write(&mut tx, std::slice::from_ref(member)).await {
            Ok(mut written) => {
                self.commit(tx).await?;
                written.pop().ok_or_else(|| Error::Corrupt("a write answered no member".into()))
            }
            Err(e) => {
                self.abandon(tx).await;
                Err(e)
            }
        }
    }
}

/// An append waiting for the committer.
struct Queued {
    run: RunKey,
    epoch: Epoch,
    held: i64,
    chunks: Vec<NewChunk>,
    reply: oneshot::Sender<Result<Vec<Offset>>>,
}

impl Queued {
    fn member(&self) -> Member<'_> {
        Member { run: &self.run, epoch: self.epoch, held: self.held, chunks: &self.chunks }
    }

    fn rows(&self) -> usize {
        self.chunks.len().max(1)
    }

    /// Reply with what `written` came to.
    fn answer(self, tails: &Tails, written: Result<Written>) {
        let Self { run, epoch, chunks, reply, .. } = self;
        let _ = reply.send(answer(tails, &run, epoch, written, || chunks));
    }

    fn bytes(&self) -> usize {
        self.chunks.iter().map(|c| c.payload.len() + c.kind.len()).sum()
    }
}

/// The appends of one store: a handle on its committer task (or, with
/// [`GroupCommit::Off`], on the backend directly).
pub(super) struct Committer<L> {
    log: Arc<L>,
    tails: Tails,
    queue: Option<mpsc::Sender<Queued>>,
}

impl<L> Clone for Committer<L> {
    fn clone(&self) -> Self {
        Self { log: self.log.clone(), tails: self.tails.clone(), queue: self.queue.clone() }
    }
}

impl<L: GroupLog> Committer<L> {
    /// Start the committer task (on the current Tokio runtime); it ends
    /// once every handle is dropped. What it commits goes to `tails`.
    pub(super) fn start(log: L, tails: Tails, mode: GroupCommit) -> Self {
        let log = Arc::new(log);
        let queue = match mode {
            GroupCommit::Off => None,
            GroupCommit::Grouped { max_rows, max_bytes } => {
                let (queue, waiting) = mpsc::channel(QUEUE);
                tokio::spawn(commit_groups(log.clone(), tails.clone(), waiting, max_rows, max_bytes));
                Some(queue)
            }
        };
        Self { log, tails, queue }
    }

    /// [`EventLog::append`](super::EventLog::append): answered once the
    /// transaction holding it committed.
    pub(super) async fn append(
        &self,
        run: &RunKey,
        epoch: Epoch,
        chunks: &[NewChunk],
    ) -> Result<Vec<Offset>> {
        let held = super::sql::epoch_to_db(epoch)?;
        let Some(queue) = &self.queue else {
            let written = self.log.alone(&Member { run, epoch, held, chunks }).await;
            return answer(&self.tails, run, epoch, written, || chunks.to_vec());
        };
        let (reply, answered) = oneshot::channel();
        let queued = Queued { run: run.clone(), epoch, held, chunks: chunks.to_vec(), reply };
        queue.send(queued).await.map_err(|_| stopped())?;
        answered.await.map_err(|_| stopped())?
    }
}

fn stopped() -> Error {
    Error::Unavailable("the event log's committer stopped".into())
}

/// A member's answer: its offsets once stored (its `chunks` handed to its
/// run's tail as stored), or why not.
fn answer(
    tails: &Tails,
    run: &RunKey,
    epoch: Epoch,
    written: Result<Written>,
    chunks: impl FnOnce() -> Vec<NewChunk>,
) -> Result<Vec<Offset>> {
    match written? {
        Written::Stored { seqs, at } => {
            let offsets = seqs.into_iter().map(Offset::from_seq).collect::<Result<Vec<_>>>()?;
            if !offsets.is_empty() {
                tails.feed(run, || stored(chunks(), &offsets, epoch, at));
            }
            Ok(offsets)
        }
        Written::Refused(refused) => Err(refused),
    }
}

/// `chunks` as a read of the table gives them back.
fn stored(chunks: Vec<NewChunk>, offsets: &[Offset], epoch: Epoch, at: i64) -> Vec<StoredChunk> {
    chunks
        .into_iter()
        .zip(offsets)
        .map(|(chunk, offset)| StoredChunk {
            offset: offset.clone(),
            epoch,
            kind: chunk.kind,
            payload: chunk.payload,
            appended_at: Timestamp::from_millis(at),
        })
        .collect()
}

/// The committer task: one group after another until every handle is gone.
async fn commit_groups<L: GroupLog>(
    log: Arc<L>,
    tails: Tails,
    mut waiting: mpsc::Receiver<Queued>,
    max_rows: usize,
    max_bytes: usize,
) {
    let mut held_over: Option<Queued> = None;
    loop {
        let first = match held_over.take() {
            Some(first) => first,
            None => match waiting.recv().await {
                Some(first) => first,
                None => return,
            },
        };
        let (mut rows, mut bytes) = (first.rows(), first.bytes());
        let mut group = vec![first];
        while let Ok(next) = waiting.try_recv() {
            if rows + next.rows() > max_rows || bytes + next.bytes() > max_bytes {
                held_over = Some(next);
                break;
            }
            rows += next.rows();
            bytes += next.bytes();
            group.push(next);
        }
        // A caller that gave up (its future dropped) is not written for.
        group.retain(|queued| !queued.reply.is_closed());
        commit_group(log.as_ref(), &tails, group).await;
    }
}

async fn commit_group<L: GroupLog>(log: &L, tails: &Tails, group: Vec<Queued>) {
    if group.len() <= 1 {
        for queued in group {
            let written = log.alone(&queued.member()).await;
            queued.answer(tails, written);
        }
        return;
    }
    let members: Vec<Member<'_>> = group.iter().map(Queued::member).collect();
    let mut tx = match log.begin().await {
        Ok(tx) => tx,
        Err(e) => return fail_all(group, &e),
    };
    let written = match log.write(&mut tx, &members).await {
        Ok(written) if written.len() == members.len() => written,
        failed => {
            log.abandon(tx).await;
            let error = failed
                .err()
                .map_or_else(|| "a write answered the wrong members".to_owned(), |e| e.to_string());
            tracing::debug!(members = members.len(), %error, "group write failed; writing its members one by one");
            drop(members);
            for queued in group {
                let written = log.alone(&queued.member()).await;
                queued.answer(tails, written);
            }
            return;
        }
    };
    drop(members);
    if let Err(e) = log.commit(tx).await {
        return fail_all(group, &e);
    }
    for (queued, written) in group.into_iter().zip(written) {
        queued.answer(tails, Ok(written));
    }
}

/// The group's transaction failed as a whole: every member with it.
fn fail_all(group: Vec<Queued>, error: &Error) {
    tracing::debug!(members = group.len(), %error, "group commit failed");
    for queued in group {
        let _ = queued.reply.send(Err(shared_failure(error)));
    }
}

/// `error` once per member (store errors do not clone: a database error
/// travels as its text, still a failure a later attempt may not meet).
fn shared_failure(error: &Error) -> Error {
    match error {
        Error::StorageFull(message) => Error::StorageFull(message.clone()),
        Error::Corrupt(message) => Error::Corrupt(message.clone()),
        other => Error::Unavailable(other.to_string()),
    }
}

/// One multi-row INSERT of `$rows` (a slice of `(&RunKey, seq, held epoch,
/// &NewChunk)`, at most [`ROWS_PER_INSERT`] of them) into `run_events` on
/// `$conn`. Room for every bound value is made before the first: grown
/// value by value, the arguments of each INSERT were reallocated a dozen
/// times.
macro_rules! insert_events {
    ($db:ty, $conn:expr, $rows:expr, $now:expr) => {{
        let rows: &[(&RunKey, i64, i64, &NewChunk)] = $rows;
        let mut arguments = <$db as sqlx::Database>::Arguments::<'_>::default();
        let payloads: usize = rows.iter().map(|row| row.3.payload.len()).sum();
        sqlx::Arguments::reserve(&mut arguments, rows.len() * $crate::store::group::VALUES_PER_ROW, payloads);
        let mut insert = sqlx::QueryBuilder::<$db>::with_arguments(
            "INSERT INTO run_events (tenant, run_id, seq, epoch, kind, payload, appended_at) ",
            arguments,
        );
        insert.push_values(rows.iter().copied(), |mut row, (run, seq, held, chunk)| {
            row.push_bind(run.tenant.as_str())
                .push_bind(run.run.as_str())
                .push_bind(seq)
                .push_bind(held)
                .push_bind(chunk.kind.as_ref())
                .push_bind(chunk.payload.as_ref())
                .push_bind($now);
        });
        insert.build().execute($conn).await?;
    }};
}
pub(super) use insert_events;

/// Rows per INSERT statement: SQLite caps bound parameters per statement
/// (32,766), PostgreSQL at 65,535; [`VALUES_PER_ROW`] a row.
pub(super) const ROWS_PER_INSERT: usize = 1000;

/// The values an INSERT binds for each row of `run_events`.
pub(super) const VALUES_PER_ROW: usize = 7;

/// Runs per fence query, two parameters each.
pub(super) const RUNS_PER_QUERY: usize = 500;

/// The rows `written` admits, in group order: `(run, seq, held, chunk)`.
pub(super) fn rows<'a>(
    members: &'a [Member<'a>],
    written: &'a [Written],
) -> impl Iterator<Item = (&'a RunKey, i64, i64, &'a NewChunk)> {
    members.iter().zip(written).flat_map(|(member, written)| {
        let seqs: &[i64] = match written {
            Written::Stored { seqs, .. } => seqs,
            Written::Refused(_) => &[],
        };
        member.chunks.iter().zip(seqs).map(move |(chunk, seq)| (member.run, *seq, member.held, chunk))
    })
}

/// The fences of `$runs` (`&[&RunKey]`, at most [`RUNS_PER_QUERY`]) read on
/// `$conn` into `$fences` (`HashMap<RunKey, Fence>`); `$lock` is what
/// makes a claim of those runs wait until the transaction ends (PostgreSQL's
/// `FOR SHARE OF r`; nothing on SQLite, whose `BEGIN IMMEDIATE` holds the one
/// write lock). The runs' rows are locked in key order, so two groups never
/// wait for each other in a circle.
macro_rules! read_fences {
    ($db:ty, $conn:expr, $runs:expr, $fences:expr, lock: $lock:literal) => {{
        let mut query = sqlx::QueryBuilder::<$db>::new(concat!(
            "SELECT ",
            $crate::store::group::fence_columns!(),
            " FROM ("
        ));
        query.push_values($runs.iter(), |mut row, run: &&RunKey| {
            row.push_bind(run.tenant.as_str()).push_bind(run.run.as_str());
        });
        query.push(
            ") AS m JOIN runs r ON r.tenant = m.column1 AND r.run_id = m.column2 \
             ORDER BY r.tenant, r.run_id",
        );
        query.push($lock);
        $crate::store::group::add_fences(&mut $fences, query.build_query_as().fetch_all($conn).await?)?;
    }};
}
pub(super) use read_fences;

/// What a fence query selects of a run `r`: tenant, run id, epoch, closed,
/// last sequence number.
macro_rules! fence_columns {
    () => {
        "r.tenant, r.run_id, r.driver_epoch, r.log_closed, \
         (SELECT COALESCE(MAX(e.seq), 0) FROM run_events e WHERE e.tenant = r.tenant AND e.run_id = r.run_id)"
    };
}
pub(super) use fence_columns;

/// The rows of a fence query into `fences`.
pub(super) fn add_fences(
    fences: &mut HashMap<RunKey, Fence>,
    found: Vec<(String, String, i64, bool, i64)>,
) -> Result<()> {
    for (tenant, run, epoch, closed, last) in found {
        let run = super::RunId::parse(&run).map_err(|e| Error::Corrupt(format!("run id {run:?}: {e}")))?;
        fences.insert(RunKey::new(super::Tenant::new(tenant), run), Fence { epoch, closed, last });
    }
    Ok(())
}

/// The body of [`GroupLog::write`] on `$conn` (`&mut` a transaction that
/// derefs twice to the connection): the members' fences (`$lock` as in
/// [`read_fences`]), then [`write_planned`]. Evaluates to what each member
/// came to.
macro_rules! write_group {
    ($db:ty, $conn:ident, $members:expr, lock: $lock:literal) => {{
        let members: &[$crate::store::group::Member<'_>] = $members;
        let mut fences = std::collections::HashMap::new();
        for runs in $crate::store::group::runs_of(members).chunks($crate::store::group::RUNS_PER_QUERY) {
            $crate::store::group::read_fences!($db, &mut **$conn, runs, fences, lock: $lock);
        }
        $crate::store::group::write_planned!($db, $conn, members, &fences)
    }};
}
pub(super) use write_group;

/// The rest of a group's write, given its runs' `$fences` as read inside
/// the transaction: the [`plan`], its rows, the request index of each
/// stored member. Evaluates to what each member came to.
macro_rules! write_planned {
    ($db:ty, $conn:ident, $members:expr, $fences:expr) => {{
        let members: &[$crate::store::group::Member<'_>] = $members;
        let now = $crate::store::Timestamp::now().as_millis();
        let written = $crate::store::group::plan(members, $fences, now);
        let rows: Vec<_> = $crate::store::group::rows(members, &written).collect();
        for rows in rows.chunks($crate::store::group::ROWS_PER_INSERT) {
            $crate::store::group::insert_events!($db, &mut **$conn, rows, now);
        }
        for (member, written) in members.iter().zip(&written) {
            if let $crate::store::group::Written::Stored { seqs, .. } = written {
                index_requests!((*$conn), member.run, member.chunks, seqs.iter().copied());
            }
        }
        written
    }};
}
pub(super) use write_planned;
