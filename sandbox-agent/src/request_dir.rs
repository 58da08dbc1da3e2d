//! A run's request dir: where the processes of a run ask (a permission, a
//! call of a client tool) and wait, and where the agent records what was
//! asked and answered into the run's journal (see `shared::requests`).
//!
//! Layout, `<journal dir>/<run_id>.requests/`. With a run user the journal
//! dir is closed to it (0700), so the dir goes under a root the agent owns
//! with mode 0711 (traversable, not listable) that the run user can reach:
//! the sibling `<journal dir>.requests/` when the journal dir's parent lets
//! it through, else [`FALLBACK_ROOT`] (the Docker provider's `/run/sandhold`
//! is 0700). Readers look in all three places.
//!
//! | path | owner, mode | what |
//! |---|---|---|
//! | `policy.json` | agent, 0644 | the run's policy (absent: no permission tool) |
//! | `tools.json` | agent, 0644 | the client tools, `[{name, description, input_schema}]` |
//! | `ask/` | run user, 0700 | `<request_id>.json`, a `Request`, written by an asking process (tmp then rename) |
//! | `answer/` | agent, 0755 | `<request_id>.json`, an `Answer`, 0644, created once (link, never replaced) |
//! | `recorded/` | agent, 0700 | markers: `<id>.request` (the request as recorded), `<id>.answer`, `<id>.invalid` |
//! | `.lock` | agent, 0600 | `flock`ed by every recording pass |
//! | `.key` | agent, 0600 | `shared::requests::key_check` of the run's key |
//! | `.closed` | agent, 0600 | the supervisor wrote the sentinel: nothing is appended any more |
//!
//! A recording pass (under the lock) appends each ask not yet recorded, then
//! each answer not yet recorded, then denies (by deadline) each recorded
//! request past its deadline: the answer file is written before its line is
//! appended and the line before its marker, so a crash can append a line
//! twice (readers keep the first per request id) but never lose one. The
//! supervisor runs a last pass before the exit sentinel, denies what is still
//! pending (by cancel: the run ended) and writes `.closed`.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use shared::error::{Error, ErrorCode};
use shared::ids::RunId;
use shared::policy::{DEFAULT_REQUEST_TIMEOUT_MS, Policy};
use shared::proto::agent::v1::RequestSetup;
use shared::requests::{self, Answer, AnsweredBy, Record, Request};

use crate::run_user::RunUser;

pub const ASK_DIR: &str = "ask";
pub const ANSWER_DIR: &str = "answer";
pub const RECORDED_DIR: &str = "recorded";
pub const POLICY_FILE: &str = "policy.json";
pub const TOOLS_FILE: &str = "tools.json";
const LOCK_FILE: &str = ".lock";
const KEY_FILE: &str = ".key";
const CLOSED_FILE: &str = ".closed";
/// Where request dirs go when the run user cannot reach the journal dir's
/// parent.
pub const FALLBACK_ROOT: &str = "/tmp/.sandhold-requests";
/// Extension of a run's request dir.
pub const REQUESTS_EXT: &str = "requests";
/// Largest ask file recorded.
pub const MAX_ASK_BYTES: u64 = 1 << 20;
/// How long an asking process waits past the deadline for the agent's
/// denial before it gives up on its own.
pub const ANSWER_GRACE: Duration = Duration::from_secs(60);
/// How often an asking process looks for its answer.
pub const ASK_POLL: Duration = Duration::from_millis(100);
/// Replaced in a run's argv and env values by the agent's executable.
pub const AGENT_PLACEHOLDER: &str = "{{sandhold-agent}}";
/// Replaced in a run's argv and env values by its request dir.
pub const REQUESTS_PLACEHOLDER: &str = "{{sandhold-requests}}";
/// What a request denied at its deadline tells the harness.
pub const DEADLINE_MESSAGE: &str = "no answer before the deadline";
/// What a request still pending when the run ends is denied with.
pub const ENDED_MESSAGE: &str = "the run ended before an answer";
/// Most requests of one run waiting for an answer at once. An ask past it is
/// denied at once and never recorded: the run's log and the control plane's
/// index stay bounded by what a client can answer, not by what a run writes.
pub const MAX_PENDING: usize = 256;

/// A client tool as `tools.json` holds it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    pub name: String,
    #[serde(default)]
    pub description: String,
    pub input_schema: Value,
}

/// A checked [`RequestSetup`].
#[derive(Clone, Debug, PartialEq)]
pub struct Setup {
    pub policy: Option<Policy>,
    pub tools: Vec<ToolSpec>,
}

impl Setup {
    pub fn from_proto(setup: &RequestSetup) -> Result<Self, Error> {
        let policy = match setup.policy_json.trim() {
            "" => None,
            text => {
                Some(Policy::from_json(text).map_err(|e| Error::invalid_field("requests.policy_json", e.0))?)
            }
        };
        let mut tools = Vec::with_capacity(setup.tools.len());
        for t in &setup.tools {
            if !requests::valid_request_id(&t.name) {
                return Err(Error::invalid_field(
                    "requests.tools.name",
                    format!("{:?} is not [A-Za-z0-9_-]{{1,64}}", t.name),
                ));
            }
            if tools.iter().any(|s: &ToolSpec| s.name == t.name) {
                return Err(Error::invalid_field("requests.tools.name", format!("{:?} twice", t.name)));
            }
            let input_schema = match t.input_schema_json.trim() {
                "" => serde_json::json!({"type": "object"}),
                text => match serde_json::from_str::<Value>(text) {
                    Ok(v @ Value::Object(_)) => v,
                    _ => {
                        return Err(Error::invalid_field(
                            "requests.tools.input_schema_json",
                            format!("the schema of {:?} is not a JSON object", t.name),
                        ));
                    }
                },
            };
            tools.push(ToolSpec { name: t.name.clone(), description: t.description.clone(), input_schema });
        }
        Ok(Self { policy, tools })
    }
}

/// The sibling root of a journal dir: `<journal dir>.requests/`.
pub fn sibling_root(journal_dir: &Path) -> PathBuf {
    let name = journal_dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    journal_dir.with_file_name(format!("{name}.{REQUESTS_EXT}"))
}

/// A real dir of the agent's user that nobody else may write: the roots
/// outside the journal dir are used only then (`/tmp` is everybody's).
fn own_root(root: &Path) -> bool {
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    std::fs::symlink_metadata(root).is_ok_and(|m| m.is_dir() && m.uid() == me && m.mode() & 0o022 == 0)
}

/// Make `root` (or take it as it is: a real dir of the agent's user that
/// nobody else may write) and check the run user reaches it.
fn prepare_root(root: &Path, user: &RunUser) -> std::io::Result<()> {
    match std::fs::create_dir(root) {
        Ok(()) => std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o711))?,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    if !own_root(root) {
        return Err(std::io::Error::other(format!("{} is not the agent's own dir", root.display())));
    }
    // Reachable when the user may search every dir above it.
    let _as_user = crate::run_user::FsAs::new(Some(user)).map_err(std::io::Error::other)?;
    std::fs::metadata(root.join(".")).map(drop)
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

/// One run's request dir.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestDir {
    path: PathBuf,
}

impl RequestDir {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self { path: path.into() }
    }

    fn under(root: &Path, run_id: &RunId) -> Self {
        Self::new(root.join(format!("{}.{REQUESTS_EXT}", run_id.as_str())))
    }

    /// Where a new run's dir goes (see the module docs).
    pub fn choose(journal_dir: &Path, run_user: Option<&RunUser>, run_id: &RunId) -> Self {
        let Some(user) = run_user else { return Self::under(journal_dir, run_id) };
        let sibling = sibling_root(journal_dir);
        for root in [sibling.clone(), PathBuf::from(FALLBACK_ROOT)] {
            match prepare_root(&root, user) {
                Ok(()) => return Self::under(&root, run_id),
                Err(e) => tracing::debug!(root = %root.display(), error = %e, "not a request root"),
            }
        }
        Self::under(&sibling, run_id)
    }

    /// Every place a run's dir may be.
    pub fn candidates(journal_dir: &Path, run_id: &RunId) -> Vec<Self> {
        let mut dirs = vec![Self::under(journal_dir, run_id)];
        for root in [sibling_root(journal_dir), PathBuf::from(FALLBACK_ROOT)] {
            if own_root(&root) {
                dirs.push(Self::under(&root, run_id));
            }
        }
        dirs
    }

    /// The run's dir, when it has one.
    pub fn find(journal_dir: &Path, run_id: &RunId) -> Option<Self> {
        Self::candidates(journal_dir, run_id).into_iter().find(Self::exists)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// True once the agent made it (the key file is written last).
    pub fn exists(&self) -> bool {
        self.path.join(KEY_FILE).is_file()
    }

    pub fn ask_file(&self, id: &str) -> PathBuf {
        self.path.join(ASK_DIR).join(format!("{id}.json"))
    }

    pub fn answer_file(&self, id: &str) -> PathBuf {
        self.path.join(ANSWER_DIR).join(format!("{id}.json"))
    }

    fn marker(&self, id: &str, what: &str) -> PathBuf {
        self.path.join(RECORDED_DIR).join(format!("{id}.{what}"))
    }

    /// The run's policy; `None` when it has none (or it cannot be read).
    pub fn policy(&self) -> Option<Policy> {
        let text = std::fs::read_to_string(self.path.join(POLICY_FILE)).ok()?;
        // A policy that no longer parses denies everything rather than
        // allowing it.
        Some(
            Policy::from_json(&text)
                .unwrap_or_else(|_| Policy { default: shared::policy::Effect::Deny, ..Policy::default() }),
        )
    }

    pub fn timeout_ms(&self) -> u64 {
        self.policy().map_or(DEFAULT_REQUEST_TIMEOUT_MS, |p| p.request_timeout_ms())
    }

    pub fn tools(&self) -> Vec<ToolSpec> {
        std::fs::read(self.path.join(TOOLS_FILE))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default()
    }

    /// Make the dir of a new run (a stale one of a deleted run with the
    /// same id goes first).
    pub fn create(
        &self,
        setup: &Setup,
        run_user: Option<&RunUser>,
        key: &[u8],
        run_id: &RunId,
    ) -> std::io::Result<()> {
        let mode = |p: &Path, m: u32| std::fs::set_permissions(p, std::fs::Permissions::from_mode(m));
        let _ = std::fs::remove_dir_all(&self.path);
        std::fs::create_dir(&self.path)?;
        mode(&self.path, 0o755)?;
        if let Some(policy) = &setup.policy {
            write_file(
                &self.path.join(POLICY_FILE),
                &serde_json::to_vec(policy).expect("serializes"),
                0o644,
            )?;
        }
        write_file(
            &self.path.join(TOOLS_FILE),
            &serde_json::to_vec(&setup.tools).expect("serializes"),
            0o644,
        )?;
        let ask = self.path.join(ASK_DIR);
        std::fs::create_dir(&ask)?;
        mode(&ask, 0o700)?;
        if let Some(user) = run_user {
            std::os::unix::fs::chown(&ask, Some(user.uid), Some(user.gid))?;
        }
        std::fs::create_dir(self.path.join(ANSWER_DIR))?;
        mode(&self.path.join(ANSWER_DIR), 0o755)?;
        std::fs::create_dir(self.path.join(RECORDED_DIR))?;
        mode(&self.path.join(RECORDED_DIR), 0o700)?;
        write_file(&self.path.join(LOCK_FILE), b"", 0o600)?;
        write_file(&self.path.join(KEY_FILE), requests::key_check(key, run_id).as_bytes(), 0o600)
    }

    pub fn remove(&self) -> std::io::Result<()> {
        match std::fs::remove_dir_all(&self.path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// Take the dir's lock for recording into `journal` under `key`:
    /// `PERMISSION_DENIED` when the key is not the run's.
    pub fn lock<'a>(
        &'a self,
        key: &'a [u8],
        run_id: &'a RunId,
        journal: &'a Path,
    ) -> Result<Locked<'a>, Error> {
        let check = std::fs::read_to_string(self.path.join(KEY_FILE))
            .map_err(|e| io_error("reading the run's key check", e))?;
        if key.is_empty() || check.trim() != requests::key_check(key, run_id) {
            return Err(Error::new(
                ErrorCode::PermissionDenied,
                format!("the sentinel key is not the key of run {run_id}"),
            ));
        }
        let lock = OpenOptions::new()
            .read(true)
            .write(true)
            .open(self.path.join(LOCK_FILE))
            .map_err(|e| io_error("opening the requests lock", e))?;
        // SAFETY: flock on a valid open descriptor.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(io_error("locking the requests", std::io::Error::last_os_error()));
        }
        Ok(Locked { dir: self, key, run_id, journal, _lock: lock })
    }
}

fn io_error(what: &str, e: std::io::Error) -> Error {
    Error::internal(format!("{what}: {e}"))
}

/// Write a whole file with `mode` (replacing it), through a temp file.
fn write_file(path: &Path, data: &[u8], mode: u32) -> std::io::Result<()> {
    let tmp = tmp_beside(path);
    let mut f = OpenOptions::new().write(true).create_new(true).mode(mode).open(&tmp)?;
    f.write_all(data)?;
    f.set_permissions(std::fs::Permissions::from_mode(mode))?;
    drop(f);
    std::fs::rename(&tmp, path)
}

fn tmp_beside(path: &Path) -> PathBuf {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    path.with_file_name(format!(".{name}.{}.tmp", uuid::Uuid::new_v4().simple()))
}

/// A regular file of at most `max` bytes with one link, never through a
/// symlink: what a run user leaves in `ask/` is read by the agent's user.
fn read_small(path: &Path, max: u64) -> Option<Vec<u8>> {
    let f =
        OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK).open(path).ok()?;
    let m = f.metadata().ok()?;
    if !m.is_file() || m.nlink() != 1 || m.len() > max {
        return None;
    }
    let mut buf = Vec::new();
    f.take(max + 1).read_to_end(&mut buf).ok()?;
    (buf.len() as u64 <= max).then_some(buf)
}

/// Append `line` (ending in a newline) to the journal in one write, on a
/// line of its own.
fn append(journal: &Path, line: &[u8]) -> std::io::Result<()> {
    let file = OpenOptions::new().append(true).read(true).open(journal)?;
    let len = file.metadata()?.len();
    let mut buf = Vec::with_capacity(line.len() + 1);
    if len > 0 {
        let mut last = [0u8; 1];
        file.read_exact_at(&mut last, len - 1)?;
        if last[0] != b'\n' {
            buf.push(b'\n');
        }
    }
    buf.extend_from_slice(line);
    (&file).write_all(&buf)?;
    file.sync_data()
}

/// The ids of the files named `<id>.<ext>` in `dir`.
fn ids_in(dir: &Path, ext: &str) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut ids: Vec<String> = entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let id = name.strip_suffix(ext)?.strip_suffix('.')?;
            requests::valid_request_id(id).then(|| id.to_string())
        })
        .collect();
    ids.sort();
    ids
}

/// A request dir under its lock, for one run's journal and key.
pub struct Locked<'a> {
    dir: &'a RequestDir,
    key: &'a [u8],
    run_id: &'a RunId,
    journal: &'a Path,
    _lock: File,
}

impl Locked<'_> {
    pub fn closed(&self) -> bool {
        self.dir.path.join(CLOSED_FILE).exists()
    }

    fn record(&self, record: &Record) -> Result<(), Error> {
        append(self.journal, &requests::seal(self.key, self.run_id, record))
            .map_err(|e| io_error("appending to the journal", e))
    }

    fn mark(&self, id: &str, what: &str, data: &[u8]) -> Result<(), Error> {
        write_file(&self.dir.marker(id, what), data, 0o600).map_err(|e| io_error("marking a record", e))
    }

    /// The request as recorded, if it is.
    pub fn recorded(&self, id: &str) -> Option<Request> {
        std::fs::read(self.dir.marker(id, "request")).ok().and_then(|b| serde_json::from_slice(&b).ok())
    }

    /// The answer given, if any.
    pub fn answer_of(&self, id: &str) -> Option<Answer> {
        std::fs::read(self.dir.answer_file(id)).ok().and_then(|b| serde_json::from_slice(&b).ok())
    }

    /// Record what is new: asks, answers, and denials of requests past
    /// their deadline.
    pub fn sync(&self, now_ms: i64) -> Result<(), Error> {
        if self.closed() {
            return Ok(());
        }
        let timeout = self.dir.timeout_ms() as i64;
        let mut pending = self.pending_ids().len();
        let mut refused = 0usize;
        for id in ids_in(&self.dir.path.join(ASK_DIR), "json") {
            let ask = self.dir.ask_file(&id);
            if self.dir.marker(&id, "request").exists()
                || self.dir.marker(&id, "invalid").exists()
                || self.dir.answer_file(&id).exists()
            {
                // Handled by an earlier pass that could not remove it.
                let _ = std::fs::remove_file(&ask);
                continue;
            }
            let parsed = read_small(&ask, MAX_ASK_BYTES)
                .and_then(|b| serde_json::from_slice::<Request>(&b).ok())
                .filter(|r| r.request_id == id);
            let Some(mut request) = parsed else {
                tracing::warn!(run_id = %self.run_id, request_id = id, "ignoring an invalid request file");
                self.mark(&id, "invalid", b"")?;
                let _ = std::fs::remove_file(&ask);
                continue;
            };
            if pending >= MAX_PENDING {
                // The asker reads this answer; nothing reaches the journal.
                self.write_answer(&denial(&id, AnsweredBy::Cancel, &over_limit_message(self.run_id)))?;
                let _ = std::fs::remove_file(&ask);
                refused += 1;
                continue;
            }
            // The asker's deadline, but never later than the policy allows.
            if request.deadline_ms <= 0 || request.deadline_ms > now_ms + timeout {
                request.deadline_ms = now_ms + timeout;
            }
            self.record(&Record::Request(request.clone()))?;
            self.mark(&id, "request", &serde_json::to_vec(&request).expect("serializes"))?;
            // Handled asks leave the dir, so a pass reads only what is new.
            let _ = std::fs::remove_file(&ask);
            pending += 1;
        }
        if refused > 0 {
            tracing::warn!(run_id = %self.run_id, refused, limit = MAX_PENDING, "requests past the per-run limit refused");
        }
        for id in ids_in(&self.dir.path.join(RECORDED_DIR), "request") {
            if self.dir.marker(&id, "answer").exists() {
                continue;
            }
            match self.answer_of(&id) {
                Some(answer) => self.record_answer(&answer)?,
                None => {
                    let Some(request) = self.recorded(&id) else { continue };
                    if request.deadline_ms <= now_ms {
                        let answer = denial(&id, AnsweredBy::Deadline, DEADLINE_MESSAGE);
                        self.write_answer(&answer)?;
                        self.record_answer(&answer)?;
                    }
                }
            }
        }
        Ok(())
    }

    fn record_answer(&self, answer: &Answer) -> Result<(), Error> {
        self.record(&Record::Answer(answer.clone()))?;
        self.mark(&answer.request_id, "answer", b"")
    }

    /// Create the answer file; false when there is one already.
    fn write_answer(&self, answer: &Answer) -> Result<bool, Error> {
        let path = self.dir.answer_file(&answer.request_id);
        let tmp = tmp_beside(&path);
        write_file(&tmp, &serde_json::to_vec(answer).expect("serializes"), 0o644)
            .map_err(|e| io_error("writing an answer", e))?;
        // A link never replaces: of two answers, the first stays.
        let won = match std::fs::hard_link(&tmp, &path) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(io_error("writing an answer", e)),
        };
        let _ = std::fs::remove_file(&tmp);
        won
    }

    /// Answer a recorded request (after a [`sync`](Self::sync)): the answer
    /// as recorded.
    pub fn answer(&self, answer: Answer) -> Result<Answer, Error> {
        let id = answer.request_id.clone();
        if self.recorded(&id).is_none() {
            return Err(Error::not_found(format!("run {} has no request {id}", self.run_id)));
        }
        if let Some(given) = self.answer_of(&id) {
            return Err(answered_already(&id, given.by));
        }
        if self.closed() {
            return Err(Error::new(ErrorCode::FailedPrecondition, format!("run {} has ended", self.run_id)));
        }
        if !self.write_answer(&answer)? {
            let by = self.answer_of(&id).map_or(AnsweredBy::Client, |a| a.by);
            return Err(answered_already(&id, by));
        }
        self.record_answer(&answer)?;
        Ok(answer)
    }

    /// Recorded requests without an answer.
    pub fn pending(&self) -> Vec<Request> {
        self.pending_ids().into_iter().filter_map(|id| self.recorded(&id)).collect()
    }

    fn pending_ids(&self) -> Vec<String> {
        ids_in(&self.dir.path.join(RECORDED_DIR), "request")
            .into_iter()
            .filter(|id| !self.dir.answer_file(id).exists())
            .collect()
    }

    /// Deny every pending request (after a [`sync`](Self::sync)): their ids.
    pub fn deny_pending(&self, by: AnsweredBy, message: &str) -> Result<Vec<String>, Error> {
        let mut denied = Vec::new();
        if self.closed() {
            return Ok(denied);
        }
        for request in self.pending() {
            let answer = denial(&request.request_id, by, message);
            if self.write_answer(&answer)? {
                self.record_answer(&answer)?;
                denied.push(request.request_id);
            }
        }
        Ok(denied)
    }

    /// The last pass, by the supervisor before its sentinel: record what is
    /// there, deny what waits, and append nothing after.
    pub fn close(&self, now_ms: i64) -> Result<(), Error> {
        self.sync(now_ms)?;
        self.deny_pending(AnsweredBy::Cancel, ENDED_MESSAGE)?;
        write_file(&self.dir.path.join(CLOSED_FILE), b"", 0o600).map_err(|e| io_error("closing", e))
    }
}

pub fn denial(id: &str, by: AnsweredBy, message: &str) -> Answer {
    Answer {
        request_id: id.to_string(),
        allowed: false,
        message: message.to_string(),
        is_error: false,
        always: false,
        scope: String::new(),
        by,
    }
}

/// What an ask past [`MAX_PENDING`] is denied with: the limit, named.
pub fn over_limit_message(run_id: &RunId) -> String {
    format!(
        "refused: run {run_id} already has {MAX_PENDING} requests waiting for an answer, \
         the most a run may have (at most {MAX_PENDING} pending requests per run)"
    )
}

fn answered_already(id: &str, by: AnsweredBy) -> Error {
    Error::new(
        ErrorCode::FailedPrecondition,
        format!("request {id} was answered already (by {})", by.as_str()),
    )
}

/// The asking side (a process of the run): write the request, wait for its
/// answer. Past the deadline and its grace without one: a denial by
/// deadline, decided here.
pub fn ask(dir: &RequestDir, mut request: Request) -> std::io::Result<Answer> {
    request.request_id = format!("req_{}", uuid::Uuid::new_v4().simple());
    let timeout = dir.timeout_ms();
    request.deadline_ms = now_ms() + timeout as i64;
    let path = dir.ask_file(&request.request_id);
    write_file(&path, &serde_json::to_vec(&request).expect("serializes"), 0o600)?;
    let give_up = std::time::Instant::now() + Duration::from_millis(timeout) + ANSWER_GRACE;
    let answer_path = dir.answer_file(&request.request_id);
    loop {
        if let Ok(bytes) = std::fs::read(&answer_path)
            && let Ok(answer) = serde_json::from_slice::<Answer>(&bytes)
        {
            return Ok(answer);
        }
        if std::time::Instant::now() >= give_up {
            return Ok(denial(&request.request_id, AnsweredBy::Deadline, DEADLINE_MESSAGE));
        }
        std::thread::sleep(ASK_POLL);
    }
}

/// Replace the placeholders in one argv element or env value.
pub fn substitute(text: &str, agent: &str, dir: &str) -> String {
    text.replace(AGENT_PLACEHOLDER, agent).replace(REQUESTS_PLACEHOLDER, dir)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use shared::requests::RequestKind;

    fn run() -> RunId {
        RunId::parse("run-1").unwrap()
    }

    fn setup(timeout: Option<u64>) -> Setup {
        let policy = Policy { request_timeout_ms: timeout, ..Policy::default() };
        Setup { policy: Some(policy), tools: vec![] }
    }

    fn request(id: &str, deadline_ms: i64) -> Request {
        Request {
            request_id: id.into(),
            kind: RequestKind::Permission,
            tool: "Bash".into(),
            input: json!({"command": "ls"}),
            tool_call_id: String::new(),
            rule: "default".into(),
            deadline_ms,
        }
    }

    fn records(journal: &Path) -> Vec<Record> {
        std::fs::read(journal)
            .unwrap()
            .split(|b| *b == b'\n')
            .filter_map(|l| requests::open(b"k", &run(), l).and_then(requests::parse))
            .collect()
    }

    #[test]
    fn asks_answers_and_deadlines_are_recorded_once() {
        let tmp = tempfile::tempdir().unwrap();
        let journal = tmp.path().join("run-1.ndjson");
        std::fs::write(&journal, b"partial").unwrap();
        let run_id = run();
        let dir = RequestDir::choose(tmp.path(), None, &run_id);
        dir.create(&setup(Some(1000)), None, b"k", &run_id).unwrap();
        assert!(dir.lock(b"wrong", &run(), &journal).is_err());
        let now = now_ms();
        for id in ["a", "b"] {
            write_file(&dir.ask_file(id), &serde_json::to_vec(&request(id, now + 500)).unwrap(), 0o600)
                .unwrap();
        }
        // A file whose id is not its name is never recorded.
        write_file(&dir.ask_file("c"), &serde_json::to_vec(&request("x", now)).unwrap(), 0o600).unwrap();
        let locked = dir.lock(b"k", &run_id, &journal).unwrap();
        locked.sync(now).unwrap();
        locked.sync(now).unwrap();
        assert_eq!(records(&journal).len(), 2);
        assert!(std::fs::read(&journal).unwrap().starts_with(b"partial\n"));
        let yes = Answer { allowed: true, ..denial("a", AnsweredBy::Client, "") };
        assert_eq!(locked.answer(yes.clone()).unwrap(), yes);
        let again = locked.answer(yes.clone()).unwrap_err();
        assert_eq!(again.code, ErrorCode::FailedPrecondition);
        assert!(again.message.contains("answered already (by client)"), "{again}");
        assert_eq!(
            locked.answer(denial("zz", AnsweredBy::Client, "")).unwrap_err().code,
            ErrorCode::NotFound
        );
        locked.sync(now + 1000).unwrap();
        let all = records(&journal);
        assert_eq!(all.len(), 4, "{all:?}");
        assert_eq!(all[3], Record::Answer(denial("b", AnsweredBy::Deadline, DEADLINE_MESSAGE)));
        locked.close(now + 2000).unwrap();
        locked.sync(now + 3000).unwrap();
        assert_eq!(records(&journal).len(), 4);
    }

    #[test]
    fn asks_past_the_limit_are_denied_at_once_and_never_recorded() {
        let tmp = tempfile::tempdir().unwrap();
        let journal = tmp.path().join("run-1.ndjson");
        std::fs::write(&journal, b"").unwrap();
        let run_id = run();
        let dir = RequestDir::choose(tmp.path(), None, &run_id);
        dir.create(&setup(None), None, b"k", &run_id).unwrap();
        let now = now_ms();
        let ask_all = |from: usize, to: usize| {
            for i in from..to {
                let id = format!("q{i}");
                write_file(&dir.ask_file(&id), &serde_json::to_vec(&request(&id, 0)).unwrap(), 0o600)
                    .unwrap();
            }
        };
        ask_all(0, MAX_PENDING + 10);
        let locked = dir.lock(b"k", &run_id, &journal).unwrap();
        locked.sync(now).unwrap();
        assert_eq!(records(&journal).len(), MAX_PENDING);
        assert_eq!(locked.pending().len(), MAX_PENDING);
        let refused: Vec<Answer> =
            (0..MAX_PENDING + 10).filter_map(|i| locked.answer_of(&format!("q{i}"))).collect();
        assert_eq!(refused.len(), 10);
        assert!(
            refused.iter().all(|a| !a.allowed && a.message.contains("at most 256 pending requests per run"))
        );
        // Handled asks leave the dir; a refused id stays refused.
        assert!(std::fs::read_dir(dir.path().join(ASK_DIR)).unwrap().next().is_none());
        // Answers free room for more.
        locked.answer(Answer { allowed: true, ..denial("q0", AnsweredBy::Client, "") }).unwrap();
        ask_all(MAX_PENDING + 10, MAX_PENDING + 12);
        locked.sync(now).unwrap();
        let requests = records(&journal).iter().filter(|r| matches!(r, Record::Request(_))).count();
        assert_eq!(requests, MAX_PENDING + 1);
        assert_eq!(locked.pending().len(), MAX_PENDING);
    }

    #[test]
    fn an_asker_gets_the_answer_file() {
        let tmp = tempfile::tempdir().unwrap();
        let journal = tmp.path().join("run-1.ndjson");
        std::fs::write(&journal, b"").unwrap();
        let run_id = run();
        let dir = RequestDir::choose(tmp.path(), None, &run_id);
        dir.create(&setup(None), None, b"k", &run_id).unwrap();
        let asker = {
            let dir = dir.clone();
            std::thread::spawn(move || ask(&dir, request("", 0)).unwrap())
        };
        let id = loop {
            let locked = dir.lock(b"k", &run_id, &journal).unwrap();
            locked.sync(now_ms()).unwrap();
            if let Some(r) = locked.pending().pop() {
                break r.request_id;
            }
            drop(locked);
            std::thread::sleep(Duration::from_millis(20));
        };
        let locked = dir.lock(b"k", &run_id, &journal).unwrap();
        let denied = locked.deny_pending(AnsweredBy::Cancel, "cancelled").unwrap();
        assert_eq!(denied, vec![id.clone()]);
        drop(locked);
        assert_eq!(asker.join().unwrap(), denial(&id, AnsweredBy::Cancel, "cancelled"));
    }

    #[test]
    fn placeholders_and_roots() {
        assert_eq!(
            substitute("{{sandhold-agent}} mcp --requests {{sandhold-requests}}", "/a", "/d"),
            "/a mcp --requests /d"
        );
        assert_eq!(sibling_root(Path::new("/x/journal")), Path::new("/x/journal.requests"));
    }

    #[test]
    fn with_a_run_user_the_dir_is_a_reachable_sibling_it_can_only_ask_in() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return; // chown needs root
        }
        let tmp = tempfile::tempdir().unwrap();
        std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let journal_dir = tmp.path().join("journal");
        std::fs::create_dir(&journal_dir).unwrap();
        let user = RunUser { uid: 10001, gid: 10001, name: "sandhold".into(), home: "/home/sandhold".into() };
        let run_id = run();
        let dir = RequestDir::choose(&journal_dir, Some(&user), &run_id);
        assert_eq!(dir.path(), tmp.path().join("journal.requests/run-1.requests"));
        // A journal dir whose parent the user cannot pass: the fallback.
        let closed = tmp.path().join("closed");
        std::fs::create_dir(&closed).unwrap();
        std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o700)).unwrap();
        let other = RunId::parse("run-fallback").unwrap();
        let fallback = RequestDir::choose(&closed.join("journal"), Some(&user), &other);
        assert_eq!(fallback.path(), Path::new(FALLBACK_ROOT).join("run-fallback.requests"));
        dir.create(&setup(None), Some(&user), b"k", &run_id).unwrap();
        let meta = |p: &Path| std::fs::metadata(p).unwrap();
        let mode = |p: &Path| meta(p).mode() & 0o7777;
        assert_eq!(mode(&tmp.path().join("journal.requests")), 0o711);
        assert_eq!(mode(dir.path()), 0o755);
        assert_eq!(mode(&dir.path().join(POLICY_FILE)), 0o644);
        assert_eq!(mode(&dir.path().join(TOOLS_FILE)), 0o644);
        assert_eq!((mode(&dir.path().join(ASK_DIR)), meta(&dir.path().join(ASK_DIR)).uid()), (0o700, 10001));
        assert_eq!(
            (mode(&dir.path().join(ANSWER_DIR)), meta(&dir.path().join(ANSWER_DIR)).uid()),
            (0o755, 0)
        );
        assert_eq!(mode(&dir.path().join(RECORDED_DIR)), 0o700);
        assert_eq!(mode(&dir.path().join(KEY_FILE)), 0o600);
        assert_eq!(mode(&dir.path().join(LOCK_FILE)), 0o600);
        // A link to a file the user cannot read is never recorded.
        let secret = tmp.path().join("secret");
        std::fs::write(&secret, serde_json::to_vec(&request("a", 0)).unwrap()).unwrap();
        std::fs::hard_link(&secret, dir.ask_file("a")).unwrap();
        let journal = journal_dir.join("run-1.ndjson");
        std::fs::write(&journal, b"").unwrap();
        dir.lock(b"k", &run_id, &journal).unwrap().sync(now_ms()).unwrap();
        assert!(records(&journal).is_empty());
    }
}
