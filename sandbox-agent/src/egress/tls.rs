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

/// The most a tunnel's client may send before its ClientHello is complete.
pub const MAX_HELLO: usize = 64 * 1024;

/// What a tunnel's first client bytes say about where they go.
#[derive(Debug, PartialEq, Eq)]
pub enum Hello {
    /// Not a TLS handshake: the bytes go as they are.
    NotTls,
    /// A TLS handshake whose ClientHello is not complete yet.
    Partial,
    /// A complete ClientHello and the server name it asks for.
    ServerName(Option<String>),
    /// A TLS handshake that cannot be read (or is too long).
    Malformed(String),
}

/// Read the ClientHello in `bytes`, the first a tunnel's client sent
/// (parsed by rustls's own acceptor, not by hand).
pub fn client_hello(bytes: &[u8]) -> Hello {
    match bytes.first() {
        None => return Hello::Partial,
        // A TLS handshake record.
        Some(0x16) => {}
        Some(_) => return Hello::NotTls,
    }
    if bytes.len() > MAX_HELLO {
        return Hello::Malformed(format!("no complete ClientHello in the first {MAX_HELLO} bytes"));
    }
    let mut acceptor = rustls::server::Acceptor::default();
    let mut rest = bytes;
    while !rest.is_empty() {
        match acceptor.read_tls(&mut rest) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) => return Hello::Malformed(e.to_string()),
        }
    }
    match acceptor.accept() {
        Ok(Some(accepted)) => Hello::ServerName(accepted.client_hello().server_name().map(str::to_string)),
        Ok(None) => Hello::Partial,
        Err((e, _)) => Hello::Malformed(e.to_string()),
    }
}

/// Whether a ClientHello's server name fits the tunnel's target `host`:
/// the same name (case and a trailing dot aside), and none at all for an
/// IP address (a name there would ask a shared front for another host).
pub fn fits(server_name: Option<&str>, host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']').trim_end_matches('.');
    match server_name {
        None => host.parse::<std::net::IpAddr>().is_ok(),
        Some(name) => name.trim_end_matches('.').eq_ignore_ascii_case(host),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first bytes a rustls client sends for `name`.
    fn hello_for(name: &str) -> Vec<u8> {
        let config = client_config("").unwrap();
        let mut conn =
            rustls::ClientConnection::new(config, ServerName::try_from(name.to_string()).unwrap()).unwrap();
        let mut out = Vec::new();
        conn.write_tls(&mut out).unwrap();
        out
    }

    #[test]
    fn the_server_name_is_read_from_a_client_hello() {
        let hello = hello_for("registry.npmjs.org");
        assert_eq!(client_hello(&hello), Hello::ServerName(Some("registry.npmjs.org".into())));
        assert_eq!(client_hello(&hello[..hello.len() / 2]), Hello::Partial);
        assert_eq!(client_hello(&hello_for("127.0.0.1")), Hello::ServerName(None));
        assert_eq!(client_hello(b"GET / HTTP/1.1\r\n"), Hello::NotTls);
        // A complete handshake message that is no ClientHello.
        assert!(matches!(client_hello(&[0x16, 3, 1, 0, 4, 2, 0, 0, 0]), Hello::Malformed(_)));
        assert!(fits(Some("Registry.npmjs.org"), "registry.npmjs.org."));
        assert!(!fits(Some("evil.example"), "registry.npmjs.org"));
        assert!(!fits(None, "registry.npmjs.org"));
        assert!(fits(None, "127.0.0.1"));
        assert!(!fits(Some("evil.example"), "[::1]"));
    }
}
