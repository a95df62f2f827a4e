//! The load benchmarks of sidecar-injector: a transport ceiling server (`ceiling`), a load
//! generator (`loadgen`) and the driver that runs both against the real webhook (`bench-run`).
//! Everything here talks to 127.0.0.1 only.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::Arc;

use anyhow::Context as _;
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, ServerName};
use serde::{Deserialize, Serialize};

/// A typical mutating review: a Deployment's pod (generateName, two containers, probes, env,
/// mounts) opted in with `sidecar-injector.io/inject: "true"`. Pretty-printed for reading.
pub const REVIEW: &str = include_str!("../review.json");

/// The address every server of the benchmark listens on.
pub const LOOPBACK: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// The review as the API server sends it: compact JSON.
pub fn review_body() -> anyhow::Result<Vec<u8>> {
    let value: serde_json::Value = serde_json::from_str(REVIEW).context("bench/review.json")?;
    Ok(serde_json::to_vec(&value)?)
}

/// A free port on 127.0.0.1 (bound, then released for the server about to be started).
pub fn free_port() -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind(SocketAddr::new(LOOPBACK, 0))?;
    Ok(listener.local_addr()?.port())
}

/// TLS client configuration trusting only the PEM CA in `ca`, offering one ALPN protocol.
pub fn client_config(ca: &Path, alpn: &[u8]) -> anyhow::Result<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).with_context(|| ca.display().to_string())? {
        roots.add(cert?)?;
    }
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = vec![alpn.to_vec()];
    Ok(config)
}

/// The name the client checks the server's certificate against.
pub fn server_name() -> ServerName<'static> {
    ServerName::IpAddress(LOOPBACK.into())
}

/// A certificate authority and a serving certificate for 127.0.0.1 and localhost, as PEM.
pub struct TestPki {
    pub ca_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
}

/// Makes a fresh CA and a leaf signed by it (ECDSA P-256, as the webhook's development
/// certificate).
pub fn make_pki() -> anyhow::Result<TestPki> {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    };
    let ca_key = KeyPair::generate()?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "sidecar-injector bench CA");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_cert = ca_params.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca_params, ca_key);
    let leaf_key = KeyPair::generate()?;
    let mut leaf_params =
        CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])?;
    leaf_params
        .distinguished_name
        .push(DnType::CommonName, "sidecar-injector bench");
    let leaf = leaf_params.signed_by(&leaf_key, &issuer)?;
    Ok(TestPki {
        ca_pem: ca_cert.pem(),
        cert_pem: leaf.pem(),
        key_pem: leaf_key.serialize_pem(),
    })
}

/// What one load run measured; `loadgen` prints it as one JSON line.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct LoadReport {
    /// `closed` (each worker sends as fast as answers come) or `open` (sends at fixed times).
    pub mode: String,
    /// 1 for HTTP/1.1, 2 for HTTP/2.
    pub http: u8,
    pub connections: usize,
    /// Concurrent requests per connection (HTTP/2 streams; 1 for HTTP/1.1).
    pub streams: usize,
    /// Requests per second asked for (open loop only).
    pub offered_rps: Option<f64>,
    /// Answers with status 200 completed inside the measured window.
    pub requests: u64,
    /// Failed requests (transport errors or a status other than 200), warm-up included.
    pub errors: u64,
    /// Open loop: requests never sent because the server was too far behind (their latency is
    /// counted up to the moment they were given up).
    #[serde(default)]
    pub unsent: u64,
    /// Length of the measured window (open loop: up to the last answer, if later).
    pub seconds: f64,
    pub rps: f64,
    /// Latency in milliseconds; in the open loop from the time a request was due to be sent.
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
}

/// Nearest-rank percentile of sorted nanosecond samples, in milliseconds.
pub fn percentile_ms(sorted_ns: &[u64], q: f64) -> f64 {
    if sorted_ns.is_empty() {
        return f64::NAN;
    }
    let rank = (q * sorted_ns.len() as f64).ceil() as usize;
    let index = rank.clamp(1, sorted_ns.len()) - 1;
    sorted_ns[index] as f64 / 1e6
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_nearest_rank() {
        let samples: Vec<u64> = (1..=100).map(|ms| ms * 1_000_000).collect();
        assert!((percentile_ms(&samples, 0.5) - 50.0).abs() < 1e-9);
        assert!((percentile_ms(&samples, 0.99) - 99.0).abs() < 1e-9);
        assert!((percentile_ms(&samples, 1.0) - 100.0).abs() < 1e-9);
        assert!(percentile_ms(&[], 0.5).is_nan());
    }

    #[test]
    fn fixture_is_a_compact_review_of_a_few_kilobytes() {
        let body = review_body().expect("fixture parses");
        assert!((3_000..=4_200).contains(&body.len()), "{}", body.len());
    }
}
