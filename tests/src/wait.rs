//! Waiting for a state instead of sleeping for a guess.

use std::future::Future;
use std::time::{Duration, Instant};

/// Bound for anything that should happen "soon" on a loaded machine (a
/// 2-core CI box running every test binary at once). Only a bound: a wait
/// ends as soon as what it waits for holds.
pub const PATIENCE: Duration = Duration::from_secs(180);

/// Block until `done` holds, checking every 100 ms; panics naming `what`
/// after [`PATIENCE`]. For tests without a runtime.
pub fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !done() {
        assert!(Instant::now() < deadline, "waited {PATIENCE:?} for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Poll `cond` every 20 ms until it holds (true) or `within` passed
/// (false). A synchronous condition is `|| std::future::ready(check())`.
pub async fn eventually<F, Fut>(within: Duration, mut cond: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    loop {
        if cond().await {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
