//! TLS to an `https` route's upstream, spoken by the agent itself (the
//! control plane carries only bytes): rustls with ring, the webpki roots
//! plus the configured extra roots.

use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_rustls::client::TlsStream;

/// The certificates in `pem` (none when it is blank); `Err` says why it
/// cannot be used.
pub fn extra_roots(pem: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    if pem.trim().is_empty() {
        return Ok(Vec::new());
    }
    let certs = CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("not PEM certificates: {e}"))?;
    if certs.is_empty() {
        return Err("no certificate in it".to_string());
    }
    // Each must be usable as a trust anchor.
    let mut store = rustls::RootCertStore::empty();
    for (i, cert) in certs.iter().enumerate() {
        store.add(cert.clone()).map_err(|e| format!("certificate {i}: {e}"))?;
    }
    Ok(certs)
}

/// The client configuration for `https` routes: HTTP/1.1 only (the broker
/// speaks HTTP/1.1 to the upstream).
pub fn client_config(extra_roots_pem: &str) -> Result<Arc<rustls::ClientConfig>, String> {
    let mut roots = rustls::RootCertStore { roots: webpki_roots::TLS_SERVER_ROOTS.to_vec() };
    for cert in extra_roots(extra_roots_pem)? {
        roots.add(cert).map_err(|e| e.to_string())?;
    }
    let mut config =
        rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots)
            .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// A TLS client connection over `io` to `host` (the SNI and the name the
/// certificate must carry).
pub async fn connect<IO>(
    config: Arc<rustls::ClientConfig>,
    host: &str,
    io: IO,
) -> Result<TlsStream<IO>, String>
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    let name =
        ServerName::try_from(host.to_string()).map_err(|e| format!("{host:?} is no TLS server name: {e}"))?;
    tokio_rustls::TlsConnector::from(config).connect(name, io).await.map_err(|e| e.to_string())
}
