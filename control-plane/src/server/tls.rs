//! TLS on the gRPC listener, with rustls (tonic's own TLS cannot swap its
//! certificate): every connection's handshake asks [`Certificate`] for the
//! current key pair, and [`Certificate::watch`] replaces it on SIGHUP or
//! when either file changes. A new pair that does not load (a half-written
//! file, a key of another certificate) is logged and the old one kept.
//!
//! Handshakes run on their own tasks (bounded in time and stopped at
//! shutdown), so a client that connects and says nothing never holds up
//! the accept loop; finished handshakes reach tonic through a channel.

use std::io;
use std::path::Path;
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use anyhow::Context as _;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, error, info, warn};

use crate::config::TlsFiles;

/// How long a client has to finish its handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the files' modification times are compared.
const POLL_EVERY: Duration = Duration::from_secs(2);
/// Finished handshakes waiting for tonic to take them.
const ACCEPTED_BACKLOG: usize = 64;

/// The listener's current certificate chain and key, swappable.
#[derive(Debug)]
pub(super) struct Certificate {
    files: TlsFiles,
    provider: Arc<CryptoProvider>,
    current: RwLock<Arc<CertifiedKey>>,
}

impl ResolvesServerCert for Certificate {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.read().expect("certificate lock").clone())
    }
}

impl Certificate {
    /// Load the pair once; a server does not start with a bad one.
    pub(super) fn load(files: TlsFiles) -> anyhow::Result<Arc<Self>> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let key = load_pair(&files, &provider)?;
        Ok(Arc::new(Self { files, provider, current: RwLock::new(Arc::new(key)) }))
    }

    /// A rustls server configuration that always asks `self`; HTTP/2 for
    /// gRPC, HTTP/1.1 too for the console and gRPC-Web clients without h2.
    pub(super) fn acceptor(self: &Arc<Self>) -> anyhow::Result<TlsAcceptor> {
        let mut config = rustls::ServerConfig::builder_with_provider(self.provider.clone())
            .with_safe_default_protocol_versions()
            .context("TLS protocol versions")?
            .with_no_client_auth()
            .with_cert_resolver(self.clone());
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(TlsAcceptor::from(Arc::new(config)))
    }

    /// Load the files again; on failure keep serving the current pair.
    fn reload(&self, why: &str) {
        match load_pair(&self.files, &self.provider) {
            Ok(key) => {
                *self.current.write().expect("certificate lock") = Arc::new(key);
                info!(cert = %self.files.cert.display(), why, "tls certificate reloaded");
            }
            Err(e) => error!(
                error = format!("{e:#}"),
                cert = %self.files.cert.display(),
                why,
                "tls certificate not reloaded; still serving the previous one"
            ),
        }
    }

    /// Reload on SIGHUP and whenever either file's modification time,
    /// size or inode changes (a rename into place, a Kubernetes secret's
    /// symlink swap), until `stop`.
    pub(super) fn watch(self: Arc<Self>, stop: CancellationToken, loops: &TaskTracker) -> anyhow::Result<()> {
        use tokio::signal::unix::{SignalKind, signal};
        let mut hangup = signal(SignalKind::hangup()).context("installing the SIGHUP handler")?;
        loops.spawn(async move {
            let mut seen = stamps(&self.files);
            let mut poll = tokio::time::interval(POLL_EVERY);
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = hangup.recv() => {
                        seen = stamps(&self.files);
                        self.reload("sighup");
                    }
                    _ = poll.tick() => {
                        let now = stamps(&self.files);
                        if now != seen {
                            seen = now;
                            self.reload("file changed");
                        }
                    }
                }
            }
        });
        Ok(())
    }
}

/// What tells a changed file from the one loaded: (modified, size, inode)
/// of both, following symlinks; `None` for a file that cannot be read now.
type Stamp = Option<(SystemTime, u64, u64)>;

fn stamps(files: &TlsFiles) -> (Stamp, Stamp) {
    use std::os::unix::fs::MetadataExt;
    let stamp =
        |p: &Path| std::fs::metadata(p).ok().and_then(|m| Some((m.modified().ok()?, m.len(), m.ino())));
    (stamp(&files.cert), stamp(&files.key))
}

fn load_pair(files: &TlsFiles, provider: &CryptoProvider) -> anyhow::Result<CertifiedKey> {
    let chain = CertificateDer::pem_file_iter(&files.cert)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .with_context(|| format!("reading the TLS certificate {}", files.cert.display()))?;
    anyhow::ensure!(!chain.is_empty(), "no certificate in {}", files.cert.display());
    let key = PrivateKeyDer::from_pem_file(&files.key)
        .with_context(|| format!("reading the TLS key {}", files.key.display()))?;
    CertifiedKey::from_der(chain, key, provider).with_context(|| {
        format!("the TLS key {} does not fit the certificate {}", files.key.display(), files.cert.display())
    })
}

/// TLS connections accepted on `listener`, for tonic's
/// `serve_with_incoming_shutdown`. Accepting stops with `stop`; each
/// handshake runs on `loops` for at most [`HANDSHAKE_TIMEOUT`].
pub(super) fn incoming(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    stop: CancellationToken,
    loops: &TaskTracker,
) -> ReceiverStream<io::Result<TlsStream<TcpStream>>> {
    let (tx, rx) = mpsc::channel(ACCEPTED_BACKLOG);
    let handshakes = loops.clone();
    loops.spawn(async move {
        loop {
            let (tcp, peer) = tokio::select! {
                _ = stop.cancelled() => return,
                accepted = listener.accept() => match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        // Out of descriptors and the like: back off, keep listening.
                        warn!(error = %e, "accepting a connection failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
            };
            let _ = tcp.set_nodelay(true);
            let (acceptor, tx, stop) = (acceptor.clone(), tx.clone(), stop.clone());
            handshakes.spawn(async move {
                let handshake = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp));
                let tls = tokio::select! {
                    _ = stop.cancelled() => return,
                    r = handshake => match r {
                        Ok(Ok(tls)) => tls,
                        Ok(Err(e)) => return debug!(%peer, error = %e, "tls handshake failed"),
                        Err(_) => return debug!(%peer, "tls handshake timed out"),
                    },
                };
                tokio::select! {
                    _ = stop.cancelled() => {}
                    _ = tx.send(Ok(tls)) => {}
                }
            });
        }
    });
    ReceiverStream::new(rx)
}
