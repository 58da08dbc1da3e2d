//! What the benches report: a row of samples and its quantiles.

use std::time::Duration;

pub struct Row {
    pub name: &'static str,
    pub samples: Vec<Duration>,
}

impl Row {
    pub fn quantile(&self, q: f64) -> Duration {
        let mut s = self.samples.clone();
        s.sort();
        s[((s.len() - 1) as f64 * q).round() as usize]
    }
}

pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// One row of the table `scripts/bench` prints at the end (the rows of issue
/// 23's table): Sandhold's figure beside the baseline measured in the same
/// run, their ratio, and the goal. `order` places the row in that table.
/// Appended to the file `SANDHOLD_BENCH_SUMMARY` names (tab-separated), or
/// printed when it is unset (a bench run on its own).
pub fn summary(order: u32, measure: &str, now: &str, baseline: &str, ratio: Option<f64>, goal: &str) {
    let ratio = ratio.map_or_else(|| "—".to_owned(), |r| format!("{r:.2}×"));
    let fields = [measure, now, baseline, &ratio, goal].map(|f| f.replace(['\t', '\n'], " "));
    match std::env::var_os("SANDHOLD_BENCH_SUMMARY") {
        Some(path) => {
            use std::io::Write;
            let mut file =
                std::fs::OpenOptions::new().create(true).append(true).open(path).expect("summary file");
            writeln!(file, "{order}\t{}", fields.join("\t")).expect("summary row");
        }
        None => println!("summary: {}", fields.join(" | ")),
    }
}
