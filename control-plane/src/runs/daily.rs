//! A tenant's daily token budget (the operator's `tenant_daily_tokens`):
//! what the runs it started today (UTC) used, summed from their stored
//! records. Each drive keeps its run's metered usage on the record as the
//! broker's records arrive, marked `metered`, so the sum is the same on
//! every replica and counts only what a broker read (never what a CLI
//! claims in its output).

use serde_json::Value;

use super::Error;
use crate::store::{RunFilter, RunStore, Tenant, Timestamp};

const DAY_MS: i64 = 86_400_000;
/// Records read per page.
const PAGE: u32 = 200;

/// The key that marks a record's usage as the broker's.
pub const METERED: &str = "metered";

/// Tokens (input, cache reads and writes, output) the runs `tenant`
/// started since today's 00:00 UTC used, as metered.
pub async fn tokens_today(runs: &dyn RunStore, tenant: &Tenant) -> Result<u64, Error> {
    let now = Timestamp::now().as_millis();
    let since = now - now.rem_euclid(DAY_MS);
    let mut filter = RunFilter::default();
    let mut total = 0u64;
    loop {
        let page = runs.list_page(tenant, &filter, PAGE).await?;
        for r in &page {
            if r.started_at.as_millis() < since {
                return Ok(total);
            }
            total = total.saturating_add(metered_tokens(r.usage.as_ref()));
        }
        match page.last() {
            Some(last) if page.len() == PAGE as usize => {
                filter.after = Some((last.started_at, last.run_id.clone()))
            }
            _ => return Ok(total),
        }
    }
}

/// The tokens of a record's usage, when the broker metered them.
pub fn metered_tokens(usage: Option<&Value>) -> u64 {
    let Some(u) = usage.filter(|u| u[METERED] == true) else { return 0 };
    ["input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens"]
        .iter()
        .map(|k| u[*k].as_u64().unwrap_or(0))
        .fold(0, u64::saturating_add)
}

/// `usage` marked as the broker's.
pub fn marked(mut usage: Value) -> Value {
    if let Value::Object(map) = &mut usage {
        map.insert(METERED.into(), true.into());
    }
    usage
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_metered_usage_counts() {
        let usage = serde_json::json!({"input_tokens": 12, "output_tokens": 7, "cache_read_tokens": 5,
            "cache_write_tokens": 3, "reasoning_tokens": 100});
        assert_eq!(metered_tokens(Some(&usage)), 0, "a CLI's own claim");
        assert_eq!(metered_tokens(Some(&marked(usage))), 27);
        assert_eq!(metered_tokens(None), 0);
    }
}
