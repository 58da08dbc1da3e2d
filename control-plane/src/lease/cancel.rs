//! Cancels between replicas. `CancelRun` lands on any replica; the run's
//! driver may be another one. The record's `cancel_requested` is the
//! authority; this bus is how a driver hears of it: Redis pub/sub when
//! replicas share a Redis, a no-op on a single node, where the driver is in
//! this process. Drivers never poll the record: a drive reads it once when
//! it starts, and a replica whose subscription (re)starts reads the records
//! of the runs it drives (a message published while it was down is lost).

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use futures::StreamExt;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

#[derive(Clone, Debug)]
pub enum CancelBus {
    /// One node: the driver is in this process and hears of a cancel directly.
    Local,
    Redis {
        client: redis::Client,
        channel: String,
    },
}

impl CancelBus {
    pub fn new(redis_url: Option<&str>, namespace: &str) -> Result<Self, redis::RedisError> {
        match redis_url {
            None => Ok(CancelBus::Local),
            Some(url) => Ok(CancelBus::Redis {
                client: redis::Client::open(url)?,
                channel: format!("{namespace}:cancel"),
            }),
        }
    }

    /// Announce a cancel of `run` to every replica. Best effort: a replica
    /// that was not subscribed reads the record when it subscribes again.
    pub async fn publish(&self, run: &str) {
        let CancelBus::Redis { client, channel } = self else { return };
        let result: Result<i64, redis::RedisError> = async {
            let mut conn = client.get_multiplexed_async_connection().await?;
            redis::cmd("PUBLISH").arg(channel).arg(run).query_async(&mut conn).await
        }
        .await;
        match result {
            Ok(receivers) => debug!(run_id = %run, receivers, "cancel published"),
            Err(e) => {
                warn!(run_id = %run, error = %e, "could not publish the cancel")
            }
        }
    }

    /// Hand every announced run id to `on_cancel` until `shutdown`,
    /// resubscribing (with backoff) when the subscription breaks, and call
    /// `on_subscribed` each time the subscription starts (what was announced
    /// before it is to be read from the records). Returns at once on a
    /// single node.
    pub async fn listen(
        &self,
        shutdown: CancellationToken,
        on_cancel: impl Fn(&str),
        on_subscribed: impl Fn(),
    ) {
        let CancelBus::Redis { client, channel } = self else { return };
        let backoff = ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(100))
            .with_max_delay(Duration::from_secs(5))
            .without_max_times();
        let mut delays = backoff.build();
        loop {
            let subscribed = async {
                let mut pubsub = client.get_async_pubsub().await?;
                pubsub.subscribe(channel).await?;
                Ok::<_, redis::RedisError>(pubsub)
            };
            let pubsub = tokio::select! {
                _ = shutdown.cancelled() => return,
                p = subscribed => p,
            };
            match pubsub {
                Ok(mut pubsub) => {
                    info!(channel = %channel, "listening for cancels");
                    delays = backoff.build();
                    on_subscribed();
                    let mut messages = pubsub.on_message();
                    loop {
                        let message = tokio::select! {
                            _ = shutdown.cancelled() => return,
                            m = messages.next() => m,
                        };
                        let Some(message) = message else { break };
                        if let Ok(payload) = message.get_payload::<String>() {
                            on_cancel(&payload);
                        }
                    }
                    warn!("cancel subscription ended; resubscribing");
                }
                Err(e) => warn!(error = %e, "cannot subscribe to cancels; retrying"),
            }
            let delay = delays.next().unwrap_or(Duration::from_secs(5));
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(delay) => {}
            }
        }
    }
}
