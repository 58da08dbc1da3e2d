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
