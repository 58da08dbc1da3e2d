//! A run's model usage and budget: the records its sandbox's model broker
//! keeps (one per answer, numbered), appended to the run's log as
//! `model.usage` chunks exactly once (a successor reads the records after
//! the last stored `seq`), summed into the run's total from the stored
//! chunks (never from a driver's memory), and checked against the run's
//! budget: once it is reached, a `budget.exceeded` chunk and the
//! BUDGET_EXCEEDED ending.

use serde::{Deserialize, Serialize};
use shared::chunk::{BUDGET_EXCEEDED, ChunkFactory, MODEL_USAGE, usage_seq};
use shared::proto::agent::v1 as agent;
use shared::proto::v1::{self as api, Chunk, ChunkType};

/// A run's token budget (0: no limit of that kind), as its spec keeps it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunBudget {
    #[serde(default, skip_serializing_if = "is_zero")]
    pub max_tokens: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub max_input_tokens: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub max_output_tokens: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl RunBudget {
    /// The run's budget: each limit the run sets, else the definition's;
    /// `None` when neither sets any.
    pub fn of(run: Option<&api::Budget>, definition: Option<&api::Budget>) -> Option<Self> {
        let pick = |f: fn(&api::Budget) -> u64| {
            run.map(f).filter(|n| *n > 0).or_else(|| definition.map(f)).unwrap_or(0)
        };
        let budget = Self {
            max_tokens: pick(|b| b.max_tokens),
            max_input_tokens: pick(|b| b.max_input_tokens),
            max_output_tokens: pick(|b| b.max_output_tokens),
        };
        (budget != Self::default()).then_some(budget)
    }

    /// The limit `tally` reached (its name, value and what is used of it).
    pub fn reached(&self, tally: &Tally) -> Option<(&'static str, u64, u64)> {
        let (input, output) = (tally.input_side(), tally.output);
        [
            ("max_tokens", self.max_tokens, input.saturating_add(output)),
            ("max_input_tokens", self.max_input_tokens, input),
            ("max_output_tokens", self.max_output_tokens, output),
        ]
        .into_iter()
        .find(|(_, max, used)| *max > 0 && used >= max)
    }

    /// The budget the run's route carries to the broker.
    pub fn route(&self) -> agent::RouteBudget {
        agent::RouteBudget {
            max_tokens: self.max_tokens,
            max_input_tokens: self.max_input_tokens,
            max_output_tokens: self.max_output_tokens,
        }
    }
}

/// What a run's usage records add up to, and how far they are delivered.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    /// The last record delivered (0: none).
    pub seq: u64,
    /// Uncached input tokens.
    pub input: u64,
    pub output: u64,
    pub cache_read: u64,
    pub cache_write: u64,
    /// A `budget.exceeded` chunk is in the log already.
    pub exceeded: bool,
}

impl Tally {
    /// Input tokens, cache reads and writes included.
    pub fn input_side(&self) -> u64 {
        self.input.saturating_add(self.cache_read).saturating_add(self.cache_write)
    }

    /// Take a stored chunk into account (any chunk; only `model.usage` and
    /// `budget.exceeded` count).
    pub fn observe(&mut self, chunk: &Chunk) {
        if chunk.r#type() != ChunkType::Custom {
            return;
        }
        if chunk.name == BUDGET_EXCEEDED {
            self.exceeded = true;
        }
        let Some(seq) = usage_seq(chunk) else { return };
        let Ok(value) = serde_json::from_str::<serde_json::Value>(&chunk.value_json) else { return };
        let n = |k: &str| value[k].as_u64().unwrap_or(0);
        self.count(
            seq,
            n("input_tokens"),
            n("output_tokens"),
            n("cache_read_tokens"),
            n("cache_write_tokens"),
        );
    }

    /// Take a record into account; `false` when it was delivered before.
    pub fn add(&mut self, r: &agent::ModelUsage) -> bool {
        if r.seq <= self.seq {
            return false;
        }
        self.count(r.seq, r.input_tokens, r.output_tokens, r.cache_read_tokens, r.cache_write_tokens);
        true
    }

    fn count(&mut self, seq: u64, input: u64, output: u64, read: u64, write: u64) {
        self.seq = self.seq.max(seq);
        self.input = self.input.saturating_add(input);
        self.output = self.output.saturating_add(output);
        self.cache_read = self.cache_read.saturating_add(read);
        self.cache_write = self.cache_write.saturating_add(write);
    }

    /// Whether any model answer was metered.
    pub fn metered(&self) -> bool {
        self.seq > 0
    }

    /// The totals as the API's `Usage` (`reasoning_tokens` and the cost,
    /// which the broker does not read, from `reported`).
    pub fn usage(&self, reported: Option<&api::Usage>) -> api::Usage {
        api::Usage {
            input_tokens: self.input,
            output_tokens: self.output,
            cache_read_tokens: self.cache_read,
            cache_write_tokens: self.cache_write,
            reasoning_tokens: reported.map_or(0, |u| u.reasoning_tokens),
            cost_usd: reported.and_then(|u| u.cost_usd),
        }
    }
}

/// The `model.usage` chunk of one record.
pub fn usage_chunk(f: &ChunkFactory, r: &agent::ModelUsage) -> Chunk {
    f.custom(
        MODEL_USAGE,
        &serde_json::json!({
            "seq": r.seq,
            "api": r.api,
            "model": r.model,
            "input_tokens": r.input_tokens,
            "output_tokens": r.output_tokens,
            "cache_read_tokens": r.cache_read_tokens,
            "cache_write_tokens": r.cache_write_tokens,
        }),
    )
}

/// The `budget.exceeded` chunk.
pub fn exceeded_chunk(f: &ChunkFactory, limit: &str, max: u64, used: u64) -> Chunk {
    f.custom(BUDGET_EXCEEDED, &serde_json::json!({"limit": limit, "max": max, "used": used}))
}

#[cfg(test)]
mod tests {
    use shared::ids::RunId;

    use super::*;

    fn record(seq: u64, input: u64, output: u64) -> agent::ModelUsage {
        agent::ModelUsage {
            seq,
            api: "anthropic".into(),
            model: "m".into(),
            input_tokens: input,
            output_tokens: output,
            cache_read_tokens: 5,
            cache_write_tokens: 3,
            at_ms: 0,
        }
    }

    #[test]
    fn the_tally_of_stored_chunks_is_the_tally_of_the_records() {
        let f = ChunkFactory::new(&RunId::parse("r").unwrap(), "t", || 0);
        let mut live = Tally::default();
        let mut chunks = Vec::new();
        for r in [record(1, 12, 7), record(2, 10, 2)] {
            assert!(live.add(&r));
            chunks.push(usage_chunk(&f, &r));
        }
        // Delivered before: not counted twice.
        assert!(!live.add(&record(2, 10, 2)));
        chunks.push(f.text_content("m", "text"));
        chunks.push(exceeded_chunk(&f, "max_tokens", 10, 45));
        let mut stored = Tally::default();
        chunks.iter().for_each(|c| stored.observe(c));
        assert_eq!((stored.seq, stored.input, stored.output, stored.cache_read), (2, 22, 9, 10));
        assert!(stored.exceeded && !live.exceeded);
        assert_eq!(Tally { exceeded: true, ..live }, stored);
        assert_eq!(stored.input_side(), 38);
        let usage = stored.usage(Some(&api::Usage {
            reasoning_tokens: 4,
            cost_usd: Some(0.5),
            ..Default::default()
        }));
        assert_eq!((usage.input_tokens, usage.output_tokens, usage.cache_write_tokens), (22, 9, 6));
        assert_eq!((usage.reasoning_tokens, usage.cost_usd), (4, Some(0.5)));
    }

    #[test]
    fn the_runs_limits_take_the_definitions_place() {
        let run = api::Budget { max_tokens: 10, ..Default::default() };
        let definition = api::Budget { max_tokens: 100, max_output_tokens: 5, ..Default::default() };
        let budget = RunBudget::of(Some(&run), Some(&definition)).unwrap();
        assert_eq!((budget.max_tokens, budget.max_output_tokens), (10, 5));
        assert_eq!(RunBudget::of(None, Some(&api::Budget::default())), None);
        let used = Tally { seq: 1, input: 2, output: 4, cache_read: 3, ..Default::default() };
        assert_eq!(budget.reached(&used), None);
        let used = Tally { output: 5, ..used };
        assert_eq!(budget.reached(&used), Some(("max_tokens", 10, 10)));
        let only_input = RunBudget { max_input_tokens: 5, ..Default::default() };
        assert_eq!(only_input.reached(&used), Some(("max_input_tokens", 5, 5)));
    }
}
