//! Test certificates (a private CA and server certificates it signs, made
//! with `rcgen`) and a bare TLS client that reports what a server presents.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, SerialNumber};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};

/// A private CA. Ed25519 keys: every PEM it writes has a fixed length for
/// fields of a fixed length, so a test can replace a file by one of the
/// same size.
pub struct TestCa {
    issuer: Issuer<'static, KeyPair>,
    pem: String,
}

/// A server certificate, its key and the CA's certificate, as files.
#[derive(Clone, Debug)]
pub struct ServerFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: PathBuf,
}

/// A server certificate in memory: the DER a client sees, and the PEMs.
pub struct Leaf {
    pub der: Vec<u8>,
    pub cert_pem: String,
    pub key_pem: String,
}

impl TestCa {
    pub fn new(name: &str) -> Self {
        let key = KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let cert = params.self_signed(&key).unwrap();
        Self { pem: cert.pem(), issuer: Issuer::new(params, key) }
    }

    /// A certificate for `localhost` and 127.0.0.1 with this serial.
    pub fn leaf(&self, serial: u64) -> Leaf {
        let key = KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
        let mut params =
            CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
        params.serial_number = Some(SerialNumber::from(serial));
        params.distinguished_name.push(DnType::CommonName, format!("sandhold-test-{serial}"));
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Leaf { der: cert.der().to_vec(), cert_pem: cert.pem(), key_pem: key.serialize_pem() }
    }

    /// A certificate for `names` (DNS names or IP addresses), good for a
    /// server and a client alike (the node protocol's mutual TLS).
    pub fn leaf_for(&self, names: &[&str], serial: u64) -> Leaf {
        let key = KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
        let mut params =
            CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>()).unwrap();
        params.serial_number = Some(SerialNumber::from(serial));
        params.distinguished_name.push(DnType::CommonName, format!("sandhold-test-{serial}"));
        params.extended_key_usages =
            vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth, rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Leaf { der: cert.der().to_vec(), cert_pem: cert.pem(), key_pem: key.serialize_pem() }
    }

    /// The CA's certificate and `leaf` written into `dir` (key mode 600).
    pub fn write(&self, dir: &Path, leaf: &Leaf) -> ServerFiles {
        let files =
            ServerFiles { cert: dir.join("cert.pem"), key: dir.join("key.pem"), ca: dir.join("ca.pem") };
        std::fs::write(&files.ca, &self.pem).unwrap();
        leaf.write(&files);
        files
    }

    pub fn pem(&self) -> &str {
        &self.pem
    }
}

impl Leaf {
    /// Overwrite the certificate and key files in place.
    pub fn write(&self, files: &ServerFiles) {
        std::fs::write(&files.cert, &self.cert_pem).unwrap();
        std::fs::write(&files.key, &self.key_pem).unwrap();
        std::fs::set_permissions(&files.key, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    }
}

/// A TLS connection to `addr` as `localhost`, trusting `ca` and offering
/// the ALPN protocols `alpn`.
pub async fn connect(
    addr: &str,
    ca: &Path,
    alpn: &[&[u8]],
) -> anyhow::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca)? {
        roots.add(cert?)?;
    }
    let mut config =
        rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("localhost")?, tcp)
        .await?)
}

/// What a TLS server at `addr` presents to a new connection that trusts
/// `ca` and offers ALPN `h2`: its certificate (DER) and the protocol agreed.
pub async fn presented(addr: &str, ca: &Path) -> anyhow::Result<(Vec<u8>, Option<Vec<u8>>)> {
    let tls = connect(addr, ca, &[b"h2"]).await?;
    let (_, connection) = tls.get_ref();
    let cert = connection.peer_certificates().and_then(|c| c.first()).map(|c| c.to_vec());
    Ok((
        cert.ok_or_else(|| anyhow::anyhow!("no certificate presented"))?,
        connection.alpn_protocol().map(<[u8]>::to_vec),
    ))
}
