//! Serving certificates: loaded from PEM files and swapped in place when they change, or a
//! self-signed development certificate when none is given.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arc_swap::ArcSwap;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use sha2::{Digest, Sha256};

/// Why a certificate could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{path}: cannot read: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: no PEM certificate found ({detail})")]
    NoCertificate { path: String, detail: String },
    #[error("{path}: no PEM private key found ({detail})")]
    NoKey { path: String, detail: String },
    #[error("certificate and key do not form a usable pair: {0}")]
    Pair(rustls::Error),
    #[error("cannot make a development certificate: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("cannot build the TLS configuration: {0}")]
    Config(rustls::Error),
}

/// A certificate ready to serve, with what the metrics and the reloader need to know of it.
#[derive(Clone)]
pub struct Loaded {
    pub key: Arc<CertifiedKey>,
    /// Seconds since the epoch at which the leaf certificate expires.
    pub not_after: i64,
    /// Hash of the files' bytes: a reload that reads the same bytes changes nothing.
    pub fingerprint: [u8; 32],
}

/// Where the serving certificate comes from.
#[derive(Clone, Debug)]
pub struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl CertFiles {
    /// Reads and checks the pair. Nothing is swapped here: the caller keeps the last good pair
    /// when this fails.
    pub fn load(&self) -> Result<Loaded, TlsError> {
        let (cert_pem, key_pem) = self.read()?;
        from_pem(
            &self.cert,
            &cert_pem,
            &self.key,
            &key_pem,
            fingerprint(&cert_pem, &key_pem),
        )
    }

    /// A hash of both files' bytes, without parsing them.
    pub fn fingerprint(&self) -> Result<[u8; 32], TlsError> {
        let (cert_pem, key_pem) = self.read()?;
        Ok(fingerprint(&cert_pem, &key_pem))
    }

    fn read(&self) -> Result<(Vec<u8>, Vec<u8>), TlsError> {
        let read = |path: &Path| {
            std::fs::read(path).map_err(|source| TlsError::Read {
                path: path.display().to_string(),
                source,
            })
        };
        Ok((read(&self.cert)?, read(&self.key)?))
    }

    /// Directories to watch: kubelet swaps a `..data` symlink in the mounted directory, so the
    /// files themselves are never written to.
    pub fn watch_dirs(&self) -> Vec<PathBuf> {
        [&self.cert, &self.key]
            .iter()
            .filter_map(|p| p.parent().map(Path::to_path_buf))
            .collect()
    }
}

/// A pair held in memory (the self-managed Secret's), checked like files are.
pub fn from_memory(cert_pem: &[u8], key_pem: &[u8]) -> Result<Loaded, TlsError> {
    let secret = Path::new("<Secret tls.crt>");
    from_pem(
        secret,
        cert_pem,
        Path::new("<Secret tls.key>"),
        key_pem,
        fingerprint(cert_pem, key_pem),
    )
}

/// A hash of a pair's bytes: a reload that reads the same bytes changes nothing.
pub fn fingerprint(cert_pem: &[u8], key_pem: &[u8]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(cert_pem);
    h.update([0]);
    h.update(key_pem);
    h.finalize().into()
}

fn from_pem(
    cert_path: &Path,
    cert_pem: &[u8],
    key_path: &Path,
    key_pem: &[u8],
    fingerprint: [u8; 32],
) -> Result<Loaded, TlsError> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<_, _>>()
        .map_err(|e| TlsError::NoCertificate {
            path: cert_path.display().to_string(),
            detail: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate {
            path: cert_path.display().to_string(),
            detail: "the file holds no CERTIFICATE block".into(),
        });
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| TlsError::NoKey {
        path: key_path.display().to_string(),
        detail: e.to_string(),
    })?;
    let not_after = not_after(&certs[0]);
    let provider = rustls::crypto::ring::default_provider();
    let key = CertifiedKey::from_der(certs, key, &provider).map_err(TlsError::Pair)?;
    Ok(Loaded {
        key: Arc::new(key),
        not_after,
        fingerprint,
    })
}

fn not_after(cert: &CertificateDer<'_>) -> i64 {
    x509_parser::parse_x509_certificate(cert.as_ref())
        .map(|(_, c)| c.validity().not_after.timestamp())
        .unwrap_or(0)
}

/// A development certificate: a fresh CA and a leaf for localhost, 127.0.0.1 and ::1.
pub struct DevCert {
    pub loaded: Loaded,
    pub ca_pem: String,
}

pub fn dev_cert() -> Result<DevCert, TlsError> {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    };
    let ca_key = KeyPair::generate()?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "sidecar-injector development CA");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_cert = ca_params.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca_params, ca_key);

    let leaf_key = KeyPair::generate()?;
    let mut leaf_params = CertificateParams::new(vec![
        "localhost".to_owned(),
        "127.0.0.1".to_owned(),
        "::1".to_owned(),
    ])?;
    leaf_params
        .distinguished_name
        .push(DnType::CommonName, "sidecar-injector (development)");
    let leaf = leaf_params.signed_by(&leaf_key, &issuer)?;
    let cert_pem = leaf.pem();
    let key_pem = leaf_key.serialize_pem();
    let loaded = from_pem(
        Path::new("<development>"),
        cert_pem.as_bytes(),
        Path::new("<development>"),
        key_pem.as_bytes(),
        [0; 32],
    )?;
    Ok(DevCert {
        loaded,
        ca_pem: ca_cert.pem(),
    })
}

/// Hands rustls whatever certificate is current; swapping it affects the next handshake only.
#[derive(Debug)]
pub struct Resolver {
    current: ArcSwap<CertifiedKey>,
}

impl Resolver {
    pub fn new(key: Arc<CertifiedKey>) -> Self {
        Self {
            current: ArcSwap::new(key),
        }
    }

    pub fn set(&self, key: Arc<CertifiedKey>) {
        self.current.store(key);
    }
}

impl ResolvesServerCert for Resolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.load_full())
    }
}

/// The server's TLS configuration: TLS 1.2 and 1.3, HTTP/2 and HTTP/1.1 by ALPN.
pub fn server_config(resolver: Arc<Resolver>) -> Result<rustls::ServerConfig, TlsError> {
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(TlsError::Config)?
    .with_no_client_auth()
    .with_cert_resolver(resolver);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}
