//! The model usage of each run, as its broker read it from the answers:
//! one record per answer, appended to `<run_id>.usage` in the journal dir
//! (deleted with the run's journal)
//! (the agent's alone) before the answer's last bytes reach the client, so
//! it outlives the agent and every driver, and is read by the control plane
//! from a sequence number (`ReadUsage`). The run's totals, summed from its
//! file, are what its budget is checked against: per run, whatever process
//! in the sandbox sent the request with the run's placeholder.

use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use super::usage::Usage;

/// One answer's usage, as the file keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// 1, 2, ...: the record's line in the file.
    pub seq: u64,
    pub api: String,
    #[serde(flatten)]
    pub usage: Usage,
    pub at_ms: i64,
}

/// A run's totals so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    pub records: u64,
    /// Input tokens, cache reads and writes included.
    pub input: u64,
    pub output: u64,
}

impl Totals {
    fn add(&mut self, usage: &Usage) {
        self.records += 1;
        self.input = self.input.saturating_add(usage.input_side());
        self.output = self.output.saturating_add(usage.output_tokens);
    }
}

/// A run's token budget; 0: no limit of that kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Budget {
    #[serde(default)]
    pub max_tokens: u64,
    #[serde(default)]
    pub max_input_tokens: u64,
    #[serde(default)]
    pub max_output_tokens: u64,
}

impl Budget {
    pub fn is_none(&self) -> bool {
        *self == Self::default()
    }

    /// The limit `totals` reached, if any (`max_tokens`, ...), with its
    /// value and what was used of it. Reaching a limit is being past it: a
    /// further answer would go over.
    pub fn reached(&self, totals: &Totals) -> Option<(&'static str, u64, u64)> {
        let all = totals.input.saturating_add(totals.output);
        [
            ("max_tokens", self.max_tokens, all),
            ("max_input_tokens", self.max_input_tokens, totals.input),
            ("max_output_tokens", self.max_output_tokens, totals.output),
        ]
        .into_iter()
        .find(|(_, max, used)| *max > 0 && used >= max)
    }
}

/// Every run's usage file, and the totals of those read so far.
#[derive(Debug)]
pub struct Ledger {
    dir: PathBuf,
    totals: Mutex<HashMap<String, Totals>>,
}

impl Ledger {
    pub fn new(journal_dir: &Path) -> Self {
        Self { dir: journal_dir.to_path_buf(), totals: Mutex::default() }
    }

    fn path(&self, run_id: &str) -> PathBuf {
        self.dir.join(format!("{run_id}.{}", shared::journal::USAGE_EXT))
    }

    /// `run_id`'s totals (read from its file the first time).
    pub fn totals(&self, run_id: &str) -> Totals {
        let mut totals = self.totals.lock().expect("ledger poisoned");
        *totals.entry(run_id.to_string()).or_insert_with(|| self.load(run_id))
    }

    fn load(&self, run_id: &str) -> Totals {
        let mut totals = Totals::default();
        for record in self.read(run_id, 0, usize::MAX) {
            totals.add(&record.usage);
        }
        totals
    }

    /// Append one answer's usage to `run_id`'s file (synced); returns its
    /// sequence number.
    pub fn record(&self, run_id: &str, api: &str, usage: Usage) -> std::io::Result<u64> {
        let mut totals = self.totals.lock().expect("ledger poisoned");
        let current = totals.entry(run_id.to_string()).or_insert_with(|| self.load(run_id));
        let record =
            Record { seq: current.records + 1, api: api.to_string(), usage, at_ms: shared::chunk::now_ms() };
        let mut line = serde_json::to_vec(&record).map_err(std::io::Error::other)?;
        line.push(b'\n');
        let mut file =
            std::fs::OpenOptions::new().append(true).create(true).mode(0o600).open(self.path(run_id))?;
        file.write_all(&line)?;
        file.sync_data()?;
        current.add(&record.usage);
        Ok(record.seq)
    }

    /// `run_id`'s records after `after_seq`, at most `max` of them.
    pub fn read(&self, run_id: &str, after_seq: u64, max: usize) -> Vec<Record> {
        let Ok(file) = std::fs::File::open(self.path(run_id)) else { return Vec::new() };
        std::io::BufReader::new(file)
            .lines()
            .map_while(Result::ok)
            // A line cut by a crash mid-write is the last, and not a record.
            .map_while(|line| serde_json::from_str::<Record>(&line).ok())
            .filter(|r| r.seq > after_seq)
            .take(max)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(input: u64, output: u64) -> Usage {
        Usage {
            model: "m".into(),
            input_tokens: input,
            output_tokens: output,
            cache_read_tokens: 5,
            cache_write_tokens: 3,
        }
    }

    #[test]
    fn records_are_numbered_durable_and_summed() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = Ledger::new(dir.path());
        assert_eq!(ledger.totals("r1"), Totals::default());
        assert_eq!(ledger.record("r1", "anthropic", usage(12, 7)).unwrap(), 1);
        assert_eq!(ledger.record("r1", "anthropic", usage(2, 1)).unwrap(), 2);
        assert_eq!(ledger.record("r2", "openai", usage(1, 1)).unwrap(), 1);
        assert_eq!(ledger.totals("r1"), Totals { records: 2, input: 30, output: 8 });
        // A restarted agent reads the same totals, and numbers on.
        let again = Ledger::new(dir.path());
        assert_eq!(again.totals("r1"), Totals { records: 2, input: 30, output: 8 });
        assert_eq!(again.record("r1", "anthropic", usage(0, 0)).unwrap(), 3);
        let after_one: Vec<u64> = again.read("r1", 1, 10).iter().map(|r| r.seq).collect();
        assert_eq!(after_one, [2, 3]);
        assert_eq!(again.read("r1", 0, 1).len(), 1);
        assert!(again.read("nobody", 0, 10).is_empty());
    }

    #[test]
    fn a_budget_is_reached_at_its_limit() {
        let used = Totals { records: 1, input: 20, output: 7 };
        assert_eq!(Budget::default().reached(&used), None);
        assert_eq!(Budget { max_tokens: 28, ..Default::default() }.reached(&used), None);
        assert_eq!(
            Budget { max_tokens: 27, ..Default::default() }.reached(&used),
            Some(("max_tokens", 27, 27))
        );
        let sides = Budget { max_input_tokens: 100, max_output_tokens: 5, ..Default::default() };
        assert_eq!(sides.reached(&used), Some(("max_output_tokens", 5, 7)));
    }
}
