//! `EgressService`: configuring the listener and taking carriers; one
//! shared state for the agent's life.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use shared::error::Error;
use shared::proto::agent::v1::egress_service_server::EgressService;
use shared::proto::agent::v1::{
    CarryRequest, CarryResponse, ConfigureEgressRequest, ConfigureEgressResponse, ModelUsage,
    ReadUsageRequest, ReadUsageResponse,
};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};

use super::ca::{InterceptCa, TrustFiles};
use super::carrier::Pool;
use super::config::{self, EgressConfig, Saved};
use super::ledger::Ledger;
use super::listener::{self, Broker, Table};
use crate::context::AgentContext;

/// How long a client request waits for a carrier when none is open.
pub const CARRIER_WAIT: Duration = Duration::from_secs(10);
/// How long a dial waits for the control plane's `dialed`.
pub const DIAL_TIMEOUT: Duration = Duration::from_secs(30);

/// Usage records one `ReadUsage` answers with at most.
pub const MAX_USAGE_RECORDS: usize = 1000;

/// The waits (shorter in tests).
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    pub carrier_wait: Duration,
    pub dial_timeout: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Self { carrier_wait: CARRIER_WAIT, dial_timeout: DIAL_TIMEOUT }
    }
}

/// The service and its state. Cheap to clone; [`Egress::stop`] closes the
/// listener.
#[derive(Clone)]
pub struct Egress {
    inner: Arc<Inner>,
}

struct Inner {
    journal_dir: PathBuf,
    /// The agent is root beside a run user: the trust files go where the
    /// run user cannot change them.
    as_root: bool,
    broker: Arc<Broker>,
    /// The listener's port once it listens; held across a `Configure`, so
    /// two never interleave.
    port: tokio::sync::Mutex<Option<u16>>,
    stop: CancellationToken,
}

impl Egress {
    /// The service, serving again what the journal dir keeps (on the same
    /// port when it is free). Call within the runtime.
    pub fn new(ctx: &AgentContext) -> Self {
        Self::with_settings(ctx, Settings::default())
    }

    pub fn with_settings(ctx: &AgentContext, settings: Settings) -> Self {
        let saved = config::load(&ctx.journal_dir);
        let config = saved.as_ref().map(|s| s.config.clone()).unwrap_or_default();
        let tls = super::tls::client_config(&config.extra_roots_pem).unwrap_or_else(|e| {
            tracing::warn!(error = %e, "the saved egress extra roots do not load; using the webpki roots only");
            super::tls::client_config("").expect("the webpki roots load")
        });
        let ca = if !config.intercepting() {
            None
        } else {
            InterceptCa::load_or_make(&ctx.journal_dir)
                .inspect_err(|e| tracing::warn!(error = %e, "egress: the interception CA does not load"))
                .ok()
                .map(Arc::new)
        };
        let broker = Arc::new(Broker {
            table: RwLock::new(Arc::new(Table { config, tls, ca })),
            pool: Pool::new(settings.carrier_wait, settings.dial_timeout, ctx.journal_dir.clone()),
            vault: ctx.vault.clone(),
            ledger: Arc::new(Ledger::new(&ctx.journal_dir)),
        });
        let egress = Self {
            inner: Arc::new(Inner {
                journal_dir: ctx.journal_dir.clone(),
                as_root: ctx.run_user.is_some(),
                broker,
                port: tokio::sync::Mutex::new(None),
                stop: CancellationToken::new(),
            }),
        };
        if let Some(saved) = saved {
            let port = egress.listen(saved.port);
            if port != saved.port {
                let kept = Saved {
                    port,
                    config: egress.inner.broker.table.read().expect("poisoned").config.clone(),
                };
                if let Err(e) = config::save(&egress.inner.journal_dir, &kept) {
                    tracing::warn!(error = %e.message, "egress: saving the new port failed");
                }
            }
            *egress.inner.port.try_lock().expect("nobody else holds it yet") = Some(port);
        }
        egress
    }

    /// Start the listener on 127.0.0.1:`port` (0: any), falling back to a
    /// new port when that one is taken. Returns the port; 0 when no port
    /// could be had at all (logged).
    fn listen(&self, port: u16) -> u16 {
        let bound = std::net::TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, port))).or_else(|e| {
            if port == 0 {
                return Err(e);
            }
            tracing::warn!(port, error = %e, "egress: the saved port is taken, listening on a new one");
            std::net::TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
        });
        let listener = bound
            .and_then(|l| {
                l.set_nonblocking(true)?;
                tokio::net::TcpListener::from_std(l)
            })
            .and_then(|l| Ok((l.local_addr()?.port(), l)));
        match listener {
            Ok((port, listener)) => {
                tracing::info!(port, "egress listener on 127.0.0.1");
                tokio::spawn(listener::serve(listener, self.inner.broker.clone(), self.inner.stop.clone()));
                port
            }
            Err(e) => {
                tracing::error!(error = %e, "egress: cannot listen on 127.0.0.1");
                0
            }
        }
    }

    /// Apply a configuration; returns the listener's port, and with
    /// credentials their placeholders and the trust files.
    pub async fn configure(&self, req: &ConfigureEgressRequest) -> Result<ConfigureEgressResponse, Error> {
        let mut port = self.inner.port.lock().await;
        let (current, ca) = {
            let table = self.inner.broker.table.read().expect("egress table poisoned");
            (table.config.clone(), table.ca.clone())
        };
        let next: EgressConfig = config::apply(&current, req)?;
        let tls = super::tls::client_config(&next.extra_roots_pem)
            .map_err(|why| Error::invalid_field("extra_roots_pem", why))?;
        let (ca, trust) = match (ca, !next.intercepting()) {
            (_, true) => (None, TrustFiles::default()),
            (kept, false) => {
                let ca = match kept {
                    Some(ca) => ca,
                    None => {
                        Arc::new(InterceptCa::load_or_make(&self.inner.journal_dir).map_err(Error::internal)?)
                    }
                };
                let trust =
                    ca.publish(&self.inner.journal_dir, self.inner.as_root).map_err(Error::internal)?;
                (Some(ca), trust)
            }
        };
        let listening = match *port {
            Some(p) if p != 0 => p,
            _ => match self.listen(0) {
                0 => return Err(Error::internal("the egress listener cannot listen on 127.0.0.1")),
                p => p,
            },
        };
        config::save(&self.inner.journal_dir, &Saved { port: listening, config: next.clone() })?;
        *port = Some(listening);
        tracing::info!(
            port = listening,
            routes = next.routes.len(),
            credentials = next.credentials.len(),
            "egress configured"
        );
        let placeholders =
            next.credentials.iter().map(|c| (c.secret_name.clone(), c.placeholder.clone())).collect();
        *self.inner.broker.table.write().expect("egress table poisoned") =
            Arc::new(Table { config: next, tls, ca });
        Ok(ConfigureEgressResponse {
            port: u32::from(listening),
            placeholders,
            ca_cert_path: trust.cert.display().to_string(),
            ca_bundle_path: trust.bundle.display().to_string(),
        })
    }

    /// The usage records of a run after `after_seq`, at most `max`.
    pub fn read_usage(&self, req: &ReadUsageRequest) -> Result<Vec<ModelUsage>, Error> {
        shared::ids::RunId::parse(&req.run_id).map_err(|e| Error::invalid_field("run_id", e.to_string()))?;
        let max = match req.max_records {
            0 => MAX_USAGE_RECORDS,
            n => (n as usize).min(MAX_USAGE_RECORDS),
        };
        let records = self.inner.broker.ledger.read(&req.run_id, req.after_seq, max);
        Ok(records
            .into_iter()
            .map(|r| ModelUsage {
                seq: r.seq,
                api: r.api,
                model: r.usage.model,
                input_tokens: r.usage.input_tokens,
                output_tokens: r.usage.output_tokens,
                cache_read_tokens: r.usage.cache_read_tokens,
                cache_write_tokens: r.usage.cache_write_tokens,
                at_ms: r.at_ms,
            })
            .collect())
    }

    /// Close the listener and every connection it serves, and end the idle
    /// carriers.
    pub fn stop(&self) {
        self.inner.stop.cancel();
        self.inner.broker.pool.close();
    }
}

#[tonic::async_trait]
impl EgressService for Egress {
    type CarryStream = ReceiverStream<Result<CarryResponse, Status>>;

    async fn configure(
        &self,
        req: Request<ConfigureEgressRequest>,
    ) -> Result<Response<ConfigureEgressResponse>, Status> {
        Ok(Response::new(Egress::configure(self, req.get_ref()).await?))
    }

    async fn carry(
        &self,
        req: Request<Streaming<CarryRequest>>,
    ) -> Result<Response<Self::CarryStream>, Status> {
        Ok(Response::new(ReceiverStream::new(self.inner.broker.pool.add(req.into_inner()))))
    }

    async fn read_usage(
        &self,
        req: Request<ReadUsageRequest>,
    ) -> Result<Response<ReadUsageResponse>, Status> {
        let records = Egress::read_usage(self, req.get_ref())?;
        Ok(Response::new(ReadUsageResponse { records }))
    }
}

#[cfg(test)]
mod tests {
    use shared::proto::agent::v1::EgressRoute;
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

    use super::*;

    /// One response: its head and its body (by its content-length).
    async fn exchange(port: u16, request: &str) -> String {
        let mut tcp = tokio::net::TcpStream::connect((Ipv4Addr::LOCALHOST, port)).await.unwrap();
        tcp.write_all(request.as_bytes()).await.unwrap();
        let mut tcp = BufReader::new(tcp);
        let mut answer = String::new();
        let mut length = 0;
        loop {
            let mut line = String::new();
            tcp.read_line(&mut line).await.unwrap();
            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                length = v.trim().parse().unwrap();
            }
            answer.push_str(&line);
            if line.trim_end().is_empty() {
                break;
            }
        }
        let mut body = vec![0u8; length];
        tcp.read_exact(&mut body).await.unwrap();
        answer + &String::from_utf8(body).unwrap()
    }

    #[tokio::test]
    async fn with_no_carrier_a_request_waits_then_gets_503() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = crate::testing::context(dir.path());
        ctx.vault.put([("MODEL_KEY".to_string(), "value-0123456789".to_string())]).unwrap();
        let wait = Duration::from_millis(300);
        let egress = Egress::with_settings(&ctx, Settings { carrier_wait: wait, dial_timeout: DIAL_TIMEOUT });
        let req = ConfigureEgressRequest {
            routes: vec![EgressRoute {
                placeholder: "placeholder-0123456789".to_string(),
                scheme: "http".to_string(),
                host: "api.model.test".to_string(),
                port: 80,
                secret_name: "MODEL_KEY".to_string(),
                label: "codex".to_string(),
                ..Default::default()
            }],
            ..Default::default()
        };
        let port = egress.configure(&req).await.unwrap().port as u16;
        for request in [
            "POST /v1/responses HTTP/1.1\r\nhost: x\r\nauthorization: Bearer placeholder-0123456789\r\n\
             content-length: 0\r\nconnection: close\r\n\r\n",
            "CONNECT registry.test:443 HTTP/1.1\r\nhost: registry.test:443\r\n\r\n",
        ] {
            let started = tokio::time::Instant::now();
            let answer = exchange(port, request).await;
            assert!(started.elapsed() >= wait, "answered before the wait was over");
            assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
            assert!(answer.contains("no control plane is carrying egress"), "{answer}");
            assert!(!answer.contains("value-0123456789"), "{answer}");
        }
        egress.stop();
        // The listener is closed with the agent.
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(tokio::net::TcpStream::connect((Ipv4Addr::LOCALHOST, port)).await.is_err());
    }
}
