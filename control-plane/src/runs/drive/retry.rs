//! Retries inside a drive: `backon` backs off between attempts, and a pause
//! ends early when the drive must end (shutdown, a lost lease, a stop). An
//! attempt in flight is never cut short: a store write either lands or
//! fails on its own, so the writer's view of the log stays exact.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use backon::{BackoffBuilder, Retryable};
use tokio_util::sync::CancellationToken;

use super::ending::Ending;
use crate::runs::replica::{Drive, StopReason};

/// What ends a drive's pauses. Owned, so a backoff's sleeper can hold it.
#[derive(Clone)]
pub(in crate::runs) struct Interrupts {
    pub shutdown: CancellationToken,
    pub lease_lost: CancellationToken,
    pub drive: Drive,
}

impl Interrupts {
    /// These without the drive's stop: the run's last writes record the
    /// stop, so it must not end their pauses; a shutdown or a lost lease
    /// still does.
    pub fn past_the_stop(&self) -> Self {
        Self {
            shutdown: self.shutdown.clone(),
            lease_lost: self.lease_lost.clone(),
            drive: Drive::past_stopping(),
        }
    }

    /// The drive's stop as its ending, once a stop (a cancel, a deadline,
    /// a disconnect) has landed.
    pub fn stopped(&self) -> Option<Ending> {
        let reason = || self.drive.reason().unwrap_or(StopReason::Cancel);
        self.drive.stop.is_cancelled().then(|| Ending::Stopped(reason()))
    }

    /// Wait `d` unless the drive must end first, and then say how.
    pub async fn during(&self, d: Duration) -> Option<Ending> {
        tokio::select! {
            biased;
            _ = self.shutdown.cancelled() => Some(Ending::Detach),
            _ = self.lease_lost.cancelled() => Some(Ending::Superseded("the run's lease was lost".into())),
            _ = self.drive.stop.cancelled() => self.stopped(),
            _ = tokio::time::sleep(d) => None,
        }
    }
}

/// Why [`retry`] gave up.
pub(super) enum GaveUp<E> {
    /// The last attempt's error: not one to retry, or the backoff ran out.
    Failed(E),
    /// The drive had to end during a pause.
    Interrupted(Ending),
}

/// Call `attempt` until it succeeds, pausing as `backoff` says after each
/// error `retryable` accepts (`notify` hears of each). A pause that an
/// interrupt ends is the last one.
pub(super) async fn retry<T, E, F, Fut>(
    interrupts: Interrupts,
    backoff: impl BackoffBuilder,
    mut attempt: F,
    retryable: impl Fn(&E) -> bool,
    mut notify: impl FnMut(&E, Duration),
) -> Result<T, GaveUp<E>>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let interrupted: Arc<Mutex<Option<Ending>>> = Arc::default();
    let slot = interrupted.clone();
    let sleep = move |d: Duration| {
        let (interrupts, slot) = (interrupts.clone(), slot.clone());
        async move {
            if let Some(ending) = interrupts.during(d).await {
                *slot.lock().expect("interrupt slot poisoned") = Some(ending);
            }
        }
    };
    let once = || {
        let ending = interrupted.lock().expect("interrupt slot poisoned").take();
        let next = ending.is_none().then(&mut attempt);
        async move {
            match (ending, next) {
                (Some(ending), _) => Err(GaveUp::Interrupted(ending)),
                (None, Some(next)) => next.await.map_err(GaveUp::Failed),
                (None, None) => unreachable!("an attempt is made whenever no interrupt is pending"),
            }
        }
    };
    once.retry(backoff)
        .sleep(sleep)
        .when(|e| matches!(e, GaveUp::Failed(e) if retryable(e)))
        .notify(|e, d| {
            if let GaveUp::Failed(e) = e {
                notify(e, d)
            }
        })
        .await
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use backon::ConstantBuilder;

    use super::*;

    fn interrupts() -> Interrupts {
        Interrupts {
            shutdown: CancellationToken::new(),
            lease_lost: CancellationToken::new(),
            drive: Drive::detached_for_test(),
        }
    }

    #[tokio::test]
    async fn retries_until_success_and_notifies_each_retry() {
        let calls = AtomicU32::new(0);
        let mut notified = 0;
        let backoff = ConstantBuilder::default().with_delay(Duration::from_millis(1)).with_max_times(5);
        let out: Result<u32, GaveUp<&str>> = retry(
            interrupts(),
            backoff,
            || async {
                let n = calls.fetch_add(1, Ordering::SeqCst);
                if n < 2 { Err("hiccup") } else { Ok(n) }
            },
            |_| true,
            |_, _| notified += 1,
        )
        .await;
        assert!(matches!(out, Ok(2)));
        assert_eq!(notified, 2);
    }

    #[tokio::test]
    async fn an_error_it_may_not_retry_ends_at_once() {
        let calls = AtomicU32::new(0);
        let backoff = ConstantBuilder::default().with_delay(Duration::from_millis(1)).with_max_times(5);
        let out: Result<(), GaveUp<&str>> = retry(
            interrupts(),
            backoff,
            || async {
                calls.fetch_add(1, Ordering::SeqCst);
                Err("fatal")
            },
            |e| *e != "fatal",
            |_, _| {},
        )
        .await;
        assert!(matches!(out, Err(GaveUp::Failed("fatal"))));
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_shutdown_during_a_pause_detaches_without_another_attempt() {
        let calls = AtomicU32::new(0);
        let i = interrupts();
        let shutdown = i.shutdown.clone();
        // A pause far longer than the test: only the interrupt can end it.
        let backoff = ConstantBuilder::default().with_delay(Duration::from_secs(3600)).with_max_times(5);
        let out = retry(
            i,
            backoff,
            || {
                calls.fetch_add(1, Ordering::SeqCst);
                shutdown.cancel();
                async { Err::<(), _>("hiccup") }
            },
            |_| true,
            |_, _| {},
        )
        .await;
        assert!(matches!(out, Err(GaveUp::Interrupted(Ending::Detach))));
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_stop_during_a_pause_carries_its_reason() {
        let i = interrupts();
        let drive = i.drive.clone();
        let backoff = ConstantBuilder::default().with_delay(Duration::from_secs(3600)).with_max_times(5);
        let out = retry(
            i,
            backoff,
            || {
                drive.stop(StopReason::Cancel);
                async { Err::<(), _>("hiccup") }
            },
            |_| true,
            |_, _| {},
        )
        .await;
        assert!(matches!(out, Err(GaveUp::Interrupted(Ending::Stopped(StopReason::Cancel)))));
    }
}
