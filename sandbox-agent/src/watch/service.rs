//! `WatchService`: the tonic service; picks the source for each watch.

use std::pin::Pin;
use std::time::Duration;

use futures::Stream;
use shared::error::Error;
use shared::proto::agent::v1::watch_service_server::WatchService;
use shared::proto::agent::v1::{WatchRequest, WatchResponse};
use tokio::sync::mpsc;
use tonic::{Request, Response, Status};

use super::events::DEFAULT_COALESCE;
use super::inotify::{InotifySource, run_inotify};
use super::poll::run_poll;
use super::scope::{Ignore, Scope};
use crate::confine::Root;
use crate::context::AgentContext;

/// Default poll interval.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_millis(1000);

pub struct Watch {
    root: Root,
}

impl Watch {
    pub fn new(ctx: &AgentContext) -> Self {
        Self { root: ctx.root.clone() }
    }
}

type WatchStream = Pin<Box<dyn Stream<Item = Result<WatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl WatchService for Watch {
    type WatchStream = WatchStream;

    async fn watch(&self, req: Request<WatchRequest>) -> Result<Response<Self::WatchStream>, Status> {
        let req = req.into_inner();
        let dir = self.root.resolve(&req.path)?;
        match std::fs::metadata(&dir) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => return Err(Error::invalid_field("path", "not a directory").into()),
            Err(_) => {
                return Err(
                    Error::not_found(format!("no directory {:?} under the sandbox root", req.path)).into()
                );
            }
        }
        let ignore = Ignore::new(&req.ignore, !req.no_default_ignore)?;
        let scope = Scope { root: self.root.clone(), dir, recursive: req.recursive, ignore };
        let window = req.coalesce_ms.map_or(DEFAULT_COALESCE, Duration::from_millis);
        let interval = match req.poll_interval_ms {
            Some(ms) if ms > 0 => Duration::from_millis(ms),
            _ => DEFAULT_POLL_INTERVAL,
        };
        let (tx, rx) = mpsc::channel::<Result<WatchResponse, Status>>(64);
        let inotify = if req.poll { None } else { InotifySource::new(&scope).ok() };
        match inotify {
            Some(source) => {
                tokio::spawn(run_inotify(source, scope, window, tx));
            }
            None => {
                // A poll is one batch per interval: that is its coalescing.
                tokio::spawn(run_poll(scope, interval, tx));
            }
        }
        Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))))
    }
}
