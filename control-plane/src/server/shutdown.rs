//! The supervisor: readiness, then the wait for shutdown, then the
//! shutdown sequence (NOT_SERVING, release leases, stop accepting, drain
//! within the grace period, drain the drives, wait for the loops, close the
//! stores), every step time-boxed.

use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;
use tracing::{info, warn};

use super::health::set_health;
use super::ready;
use crate::config::ServeConfig;

/// How long shutdown waits for the background loops to stop.
const LOOPS_GRACE: Duration = Duration::from_secs(5);

/// The gRPC server task and the token that stops it accepting.
pub(super) struct Serving {
    pub(super) stop_accepting: CancellationToken,
    pub(super) task: JoinHandle<Result<(), tonic::transport::Error>>,
}

/// Readiness, then the wait for shutdown, then the shutdown sequence.
pub(super) async fn supervise(
    config: ServeConfig,
    readiness: ready::Readiness,
    health: HealthReporter,
    shutdown: CancellationToken,
    serving: Serving,
    loops: TaskTracker,
) -> anyhow::Result<()> {
    let Serving { stop_accepting, task: mut serving } = serving;
    let grace = config.shutdown_grace;
    let built = readiness.built.clone();
    let mut readiness = tokio::spawn(readiness.run());

    let mut outcome: anyhow::Result<()> = Ok(());
    let mut readiness_done = false;
    tokio::select! {
        _ = shutdown.cancelled() => {}
        r = &mut serving => {
            // The server stopped by itself: nothing left to drain.
            return match r {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(anyhow::Error::new(e).context("gRPC server failed")),
                Err(e) => Err(anyhow::Error::new(e).context("gRPC server task")),
            };
        }
        r = &mut readiness => {
            readiness_done = true;
            if let Ok(Err(e)) | Err(e) = r.map_err(anyhow::Error::new) {
                tracing::error!(error = format!("{e:#}"), "cannot become ready; shutting down");
                outcome = Err(e);
            }
        }
    }

    info!("shutdown: health NOT_SERVING, releasing leases, draining calls");
    // Stop the readiness/health loop first so it cannot flip health back.
    if !readiness_done {
        readiness.abort();
        let _ = readiness.await;
    }
    set_health(&health, ServingStatus::NotServing).await;
    if let Some(b) = built.get() {
        b.cx.leases.release_all().await;
    }
    stop_accepting.cancel();
    match tokio::time::timeout(grace, &mut serving).await {
        Ok(Ok(Err(e))) => warn!(error = %e, "gRPC server ended with an error while draining"),
        Ok(_) => info!("drained"),
        Err(_) => {
            warn!(grace_ms = grace.as_millis() as u64, "drain time box expired; cutting remaining calls");
            serving.abort();
        }
    }
    // Drives detach on the shutdown token; they need the stores to say so.
    if let Some(b) = built.get() {
        b.runs.drain(Duration::from_secs(5)).await;
    }
    loops.close();
    if tokio::time::timeout(LOOPS_GRACE, loops.wait()).await.is_err() {
        warn!(still_running = loops.len(), "background loops did not stop in time at shutdown");
    }
    if let Some(b) = built.get() {
        let _ = tokio::time::timeout(Duration::from_secs(5), b.cx.stores.close()).await;
    }
    outcome
}
