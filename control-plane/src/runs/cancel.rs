//! Cancels between replicas. `CancelRun` lands on any replica; the run's
//! driver may be another one. The record's `cancel_requested` is the
//! authority (a driver re-reads it every second); this bus only makes the
//! driver hear of it at once: Redis pub/sub when replicas share a Redis, a
//! no-op on a single node, where the driver is in this process.

use futures::StreamExt;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::{Runs, StopReason};
use crate::store::RunId;

/// Where cancels are announced.
#[derive(Clone, Debug)]
pub enum CancelBus {
    /// One node: the driver is in this process.
    Local,
    Redis {
        client: redis::Client,
        channel: String,
    },
}

impl CancelBus {
    /// The bus for the server's lease backend: Redis when a URL is set.
    pub fn new(redis_url: Option<&str>, namespace: &str) -> Result<Self, redis::RedisError> {
        match redis_url {
            None => Ok(CancelBus::Local),
            Some(url) => Ok(CancelBus::Redis {
                client: redis::Client::open(url)?,
                channel: format!("{namespace}:cancel"),
            }),
        }
    }

    /// Announce a recorded cancel. Best effort: a driver that misses it
    /// reads the record within its poll interval.
    pub(crate) async fn publish(&self, run: &RunId) {
        let CancelBus::Redis { client, channel } = self else { return };
        let result: Result<i64, redis::RedisError> = async {
            let mut conn = client.get_multiplexed_async_connection().await?;
            redis::cmd("PUBLISH").arg(channel).arg(run.as_str()).query_async(&mut conn).await
        }
        .await;
        match result {
            Ok(receivers) => debug!(run_id = %run, receivers, "cancel published"),
            Err(e) => {
                warn!(run_id = %run, error = %e, "could not publish the cancel; drivers poll the record")
            }
        }
    }
}

impl Runs {
    /// Stop the runs this replica drives when another replica announces
    /// their cancel, until shutdown. Reconnects when Redis goes away.
    pub fn listen_for_cancels(&self, shutdown: CancellationToken) {
        let CancelBus::Redis { client, channel } = self.inner.cancels.clone() else { return };
        let runs = self.clone();
        tokio::spawn(async move {
            let mut backoff = std::time::Duration::from_millis(100);
            loop {
                let subscribed = async {
                    let mut pubsub = client.get_async_pubsub().await?;
                    pubsub.subscribe(&channel).await?;
                    Ok::<_, redis::RedisError>(pubsub)
                };
                let pubsub = tokio::select! {
                    _ = shutdown.cancelled() => return,
                    p = subscribed => p,
                };
                match pubsub {
                    Ok(mut pubsub) => {
                        info!(channel = %channel, "listening for cancels");
                        backoff = std::time::Duration::from_millis(100);
                        let mut messages = pubsub.on_message();
                        loop {
                            let message = tokio::select! {
                                _ = shutdown.cancelled() => return,
                                m = messages.next() => m,
                            };
                            let Some(message) = message else { break };
                            let Ok(payload) = message.get_payload::<String>() else { continue };
                            if let Ok(run) = RunId::parse(&payload)
                                && runs.stop_local(&run, StopReason::Cancel)
                            {
                                info!(run_id = %run, "cancel announced by another replica");
                            }
                        }
                        warn!("cancel subscription ended; resubscribing");
                    }
                    Err(e) => warn!(error = %e, "cannot subscribe to cancels; retrying"),
                }
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(std::time::Duration::from_secs(5));
            }
        });
    }
}
