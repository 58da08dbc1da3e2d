//! The sandbox's interception CA: the agent terminates the TLS of
//! connections to a brokered credential's hosts with certificates it signs,
//! so it can put the credential into their requests. Made on first use, one
//! per sandbox (per journal dir); its key stays in the journal dir (mode
//! 600, a dir only the agent's user may enter) and in the agent's memory.
//! Its certificate is written where every process may read it, alone and in
//! a bundle with the system roots, and (when the agent is root, as in a
//! container) appended to the image's system store.

use std::collections::HashMap;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

const KEY_FILE: &str = "egress-ca.key";
const CERT_FILE: &str = "egress-ca.pem";
/// The system stores a bundle is made from (Debian/Ubuntu/Alpine, RHEL/Fedora,
/// and the BSD-style name some images use); the first found.
const SYSTEM_BUNDLES: [&str; 3] =
    ["/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt", "/etc/ssl/cert.pem"];
/// Where a root agent writes the trust files (readable by everyone).
const ROOT_TRUST_DIR: &str = "/etc/sandhold";
/// Leaf certificates kept at most (one per intercepted host).
const MAX_LEAVES: usize = 256;

/// The CA, and the server configurations it made so far.
pub struct InterceptCa {
    issuer: Issuer<'static, KeyPair>,
    cert_pem: String,
    cert_der: CertificateDer<'static>,
    /// One key for every leaf: a leaf certifies a name, not a key.
    leaf_key: KeyPair,
    leaves: Mutex<HashMap<String, Arc<rustls::ServerConfig>>>,
}

/// The trust files a sandbox's processes are pointed at.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrustFiles {
    pub cert: PathBuf,
    pub bundle: PathBuf,
}

/// The CA's own certificate: the same parameters every time, so a key read
/// back signs leaves that chain to the certificate written first.
fn ca_params() -> CertificateParams {
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("no names to parse");
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.distinguished_name.push(DnType::CommonName, "Sandhold sandbox egress CA");
    params.distinguished_name.push(DnType::OrganizationName, "Sandhold");
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    params
}

impl InterceptCa {
    /// The CA kept in `journal_dir`, made there when it has none.
    pub fn load_or_make(journal_dir: &Path) -> Result<Self, String> {
        let (key_path, cert_path) = (journal_dir.join(KEY_FILE), journal_dir.join(CERT_FILE));
        let kept = std::fs::read_to_string(&key_path).ok().zip(std::fs::read_to_string(&cert_path).ok());
        let (key, cert_pem) = match kept {
            Some((key_pem, cert_pem)) => (
                KeyPair::from_pem(&key_pem).map_err(|e| format!("reading the egress CA key: {e}"))?,
                cert_pem,
            ),
            None => {
                let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(|e| e.to_string())?;
                let cert = ca_params().self_signed(&key).map_err(|e| e.to_string())?;
                write_private(&key_path, key.serialize_pem().as_bytes())?;
                write_private(&cert_path, cert.pem().as_bytes())?;
                (key, cert.pem())
            }
        };
        let cert_der = rustls::pki_types::pem::PemObject::from_pem_slice(cert_pem.as_bytes())
            .map_err(|e| format!("reading the egress CA certificate: {e}"))?;
        let leaf_key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(|e| e.to_string())?;
        Ok(Self {
            issuer: Issuer::new(ca_params(), key),
            cert_pem,
            cert_der,
            leaf_key,
            leaves: Mutex::default(),
        })
    }

    /// A TLS server configuration presenting a certificate for `host` (a
    /// name or an IP address), HTTP/1.1 only.
    pub fn server_config(&self, host: &str) -> Result<Arc<rustls::ServerConfig>, String> {
        let host = host.trim_start_matches('[').trim_end_matches(']').to_ascii_lowercase();
        if let Some(config) = self.leaves.lock().expect("leaves poisoned").get(&host) {
            return Ok(config.clone());
        }
        let mut params = CertificateParams::new(vec![host.clone()]).map_err(|e| format!("{host:?}: {e}"))?;
        params.distinguished_name.push(DnType::CommonName, host.clone());
        params.use_authority_key_identifier_extension = true;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        let leaf = params.signed_by(&self.leaf_key, &self.issuer).map_err(|e| e.to_string())?;
        let key = PrivateKeyDer::try_from(self.leaf_key.serialize_der()).map_err(|e| e.to_string())?;
        let mut config =
            rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .map_err(|e| e.to_string())?
                .with_no_client_auth()
                .with_single_cert(vec![leaf.der().clone(), self.cert_der.clone()], key)
                .map_err(|e| e.to_string())?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let config = Arc::new(config);
        let mut leaves = self.leaves.lock().expect("leaves poisoned");
        if leaves.len() >= MAX_LEAVES {
            leaves.clear();
        }
        leaves.insert(host, config.clone());
        Ok(config)
    }

    /// Write the trust files: into /etc/sandhold when the agent is root
    /// (the run user cannot change them), with the CA appended to the
    /// system store too; else into `journal_dir/egress-trust` (the agent's
    /// user is the run user: no isolation to keep).
    pub fn publish(&self, journal_dir: &Path, as_root: bool) -> Result<TrustFiles, String> {
        let dir = if as_root { PathBuf::from(ROOT_TRUST_DIR) } else { journal_dir.join("egress-trust") };
        std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        if as_root {
            use std::os::unix::fs::PermissionsExt;
            let _ = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755));
        }
        let system = SYSTEM_BUNDLES.iter().find_map(|p| std::fs::read_to_string(p).ok().map(|b| (*p, b)));
        let mut bundle = system.as_ref().map(|(_, b)| b.clone()).unwrap_or_default();
        if !bundle.is_empty() && !bundle.ends_with('\n') {
            bundle.push('\n');
        }
        if !bundle.contains(&self.cert_pem) {
            bundle.push_str(&self.cert_pem);
        }
        let files = TrustFiles { cert: dir.join("egress-ca.pem"), bundle: dir.join("ca-bundle.pem") };
        write_public(&files.cert, self.cert_pem.as_bytes())?;
        write_public(&files.bundle, bundle.as_bytes())?;
        if as_root
            && let Some((path, current)) = system
            && !current.contains(&self.cert_pem)
        {
            let appended = std::fs::OpenOptions::new()
                .append(true)
                .open(path)
                .and_then(|mut f| f.write_all(format!("\n{}", self.cert_pem).as_bytes()));
            if let Err(e) = appended {
                tracing::warn!(path, error = %e, "egress: adding the CA to the system store failed");
            }
        }
        Ok(files)
    }
}

fn write_private(path: &Path, body: &[u8]) -> Result<(), String> {
    let _ = std::fs::remove_file(path);
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .and_then(|mut f| f.write_all(body).and_then(|()| f.sync_all()))
        .map_err(|e| format!("writing {}: {e}", path.display()))
}

/// Replace `path` atomically with `body`, readable by everyone.
fn write_public(path: &Path, body: &[u8]) -> Result<(), String> {
    let tmp = path.with_extension(format!("tmp-{:016x}", rand::random::<u64>()));
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(&tmp)
        .and_then(|mut f| f.write_all(body))
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            format!("writing {}: {e}", path.display())
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A key read back signs leaves a client verifies against the
    /// certificate written first; the key file is the agent's alone.
    #[test]
    fn a_reloaded_ca_signs_leaves_that_chain_to_its_first_certificate() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let first = InterceptCa::load_or_make(dir.path()).unwrap();
        let mode = std::fs::metadata(dir.path().join(KEY_FILE)).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let again = InterceptCa::load_or_make(dir.path()).unwrap();
        assert_eq!(first.cert_pem, again.cert_pem);
        let files = again.publish(dir.path(), false).unwrap();
        assert!(std::fs::read_to_string(&files.bundle).unwrap().contains(&first.cert_pem));
        for host in ["git.example.test", "127.0.0.2"] {
            let server = again.server_config(host).unwrap();
            let mut roots = rustls::RootCertStore::empty();
            roots.add(first.cert_der.clone()).unwrap();
            let client = rustls::ClientConfig::builder_with_provider(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
            let name = rustls::pki_types::ServerName::try_from(host.to_string()).unwrap();
            let mut c = rustls::ClientConnection::new(Arc::new(client), name).unwrap();
            let mut s = rustls::ServerConnection::new(server).unwrap();
            // Drive the handshake in memory.
            for _ in 0..10 {
                let mut buf = Vec::new();
                c.write_tls(&mut buf).unwrap();
                s.read_tls(&mut buf.as_slice()).unwrap();
                s.process_new_packets().unwrap();
                let mut buf = Vec::new();
                s.write_tls(&mut buf).unwrap();
                c.read_tls(&mut buf.as_slice()).unwrap();
                c.process_new_packets().unwrap_or_else(|e| panic!("{host}: {e}"));
            }
            assert!(!c.is_handshaking(), "{host}");
        }
    }
}
