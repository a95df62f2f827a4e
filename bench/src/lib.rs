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

/// The review with the env of container `i` replaced by `env[i]` variables (every tenth from a
/// secret), compact: the same bodies as the engine benches' (`benches/engine.rs`), e.g.
/// `&[2_000, 2_000]` for the large pod.
pub fn review_with_env(env: &[usize]) -> anyhow::Result<Vec<u8>> {
    let mut review: serde_json::Value =
        serde_json::from_str(REVIEW).context("bench/review.json")?;
    let containers = review["request"]["object"]["spec"]["containers"]
        .as_array_mut()
        .context("bench/review.json has no containers")?;
    anyhow::ensure!(
        containers.len() >= env.len(),
        "bench/review.json has too few containers"
    );
    for (c, (container, count)) in containers.iter_mut().zip(env).enumerate() {
        container["env"] = (0..*count)
            .map(|i| {
                let name = format!("C{c}_VAR_{i:05}");
                if i % 10 == 9 {
                    serde_json::json!({"name": name, "valueFrom": {"secretKeyRef": {"name": "app-secrets", "key": format!("key-{i}")}}})
                } else {
                    serde_json::json!({"name": name, "value": format!("value-{i}-of-{count}")})
                }
            })
            .collect();
    }
    Ok(serde_json::to_vec(&review)?)
}

/// Checks that `answer` is an AdmissionReview that allows the request with uid `uid` and carries
/// a non-empty JSONPatch: an injection, not an error answered with status 200. Returns the
/// length of the (base64) patch.
///
/// The whole answer is read as strict JSON with the engine's reader (`engine::json`), which
/// checks every value it steps over. serde_json read the patch's base64 a byte at a time: about
/// 7% of the load generator's samples in `perf record`, now about 2%, on the two cores it shares
/// with the server it measures (docs/benchmarks-history.md, "The goal's rate and the load
/// generator's share").
pub fn check_answer(answer: &[u8], uid: &str) -> anyhow::Result<usize> {
    use sidecar_injector::engine::json::{self, Reader};
    let text =
        simdutf8::basic::from_utf8(answer).map_err(|_| anyhow::anyhow!("answer is not UTF-8"))?;
    #[derive(Default)]
    struct Seen<'a> {
        response: bool,
        uid: Option<std::borrow::Cow<'a, str>>,
        allowed: Option<bool>,
        patch_type: Option<std::borrow::Cow<'a, str>>,
        patch: Option<std::borrow::Cow<'a, str>>,
    }
    // A field given twice is refused, as serde_json refuses it: the answer is not one review.
    fn once<'a, T>(
        r: &mut Reader<'a>,
        slot: &mut Option<T>,
        read: impl FnOnce(&mut Reader<'a>) -> json::Result<T>,
    ) -> json::Result<()> {
        let at = r.wrong("duplicate field");
        match slot.replace(read(r)?) {
            Some(_) => Err(at),
            None => Ok(()),
        }
    }
    let mut seen = Seen::default();
    let mut reader = Reader::new(text);
    reader
        .object(|r, key| match &*key {
            "response" if !seen.response => {
                seen.response = true;
                r.object(|r, key| match &*key {
                    "uid" => once(r, &mut seen.uid, Reader::string),
                    "allowed" => once(r, &mut seen.allowed, Reader::bool),
                    "patchType" => once(r, &mut seen.patch_type, Reader::string),
                    "patch" => once(r, &mut seen.patch, Reader::string),
                    _ => r.skip(),
                })
            }
            "response" => Err(r.wrong("duplicate field")),
            _ => r.skip(),
        })
        .and_then(|()| reader.end())
        .context("answer is not an AdmissionReview")?;
    anyhow::ensure!(seen.response, "answer has no response");
    anyhow::ensure!(
        seen.uid.as_deref() == Some(uid),
        "answer does not echo the request's uid"
    );
    anyhow::ensure!(seen.allowed == Some(true), "answer does not allow the pod");
    anyhow::ensure!(
        seen.patch_type.as_deref() == Some("JSONPatch"),
        "answer has no JSONPatch"
    );
    let patch = seen.patch.unwrap_or_default();
    anyhow::ensure!(!patch.is_empty(), "answer has an empty patch");
    Ok(patch.len())
}

/// The uid of the request in an AdmissionReview body.
pub fn request_uid(body: &[u8]) -> anyhow::Result<String> {
    let review: serde_json::Value = serde_json::from_slice(body).context("body is not JSON")?;
    review["request"]["uid"]
        .as_str()
        .map(str::to_owned)
        .context("body has no request.uid")
}

/// `uid` with its last (up to 12) characters replaced by `n` in hexadecimal: as long as `uid`,
/// and another for every `n` below 16^12.
pub fn numbered_uid(uid: &str, n: u64) -> String {
    let digits = uid.chars().rev().take(12).count();
    let keep: String = uid.chars().take(uid.chars().count() - digits).collect();
    let hex = format!("{n:0digits$x}");
    format!("{keep}{}", &hex[hex.len() - digits..])
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
    /// Answers with status 200 that are not an injection (`check_answer` failed: not allowed, no
    /// JSONPatch, another uid), warm-up included; not counted in `requests`.
    #[serde(default)]
    pub invalid: u64,
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
    fn every_request_gets_a_uid_of_its_own_as_long_as_the_body_s() {
        let uid = "0f6b4a4e-6f1c-4a63-9a1e-3c0d1b2c7e55";
        assert_eq!(numbered_uid(uid, 0), "0f6b4a4e-6f1c-4a63-9a1e-000000000000");
        assert_eq!(
            numbered_uid(uid, 0xabc),
            "0f6b4a4e-6f1c-4a63-9a1e-000000000abc"
        );
        assert_eq!(numbered_uid("u1", 0x1f), "1f");
        assert_eq!(numbered_uid("u1", 0x100), "00");
        assert_ne!(numbered_uid(uid, 1), numbered_uid(uid, 2));
    }

    #[test]
    fn percentiles_use_nearest_rank() {
        let samples: Vec<u64> = (1..=100).map(|ms| ms * 1_000_000).collect();
        assert!((percentile_ms(&samples, 0.5) - 50.0).abs() < 1e-9);
        assert!((percentile_ms(&samples, 0.99) - 99.0).abs() < 1e-9);
        assert!((percentile_ms(&samples, 1.0) - 100.0).abs() < 1e-9);
        assert!(percentile_ms(&[], 0.5).is_nan());
    }

    #[test]
    fn answers_are_checked_for_an_injection() {
        let ok = br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":"u1","allowed":true,"patchType":"JSONPatch","patch":"W10="}}"#;
        assert_eq!(check_answer(ok, "u1").expect("an injection"), 4);
        assert!(check_answer(ok, "u2").is_err(), "another uid");
        for bad in [
            r#"{"response":{"uid":"u1","allowed":false,"status":{"message":"no"}}}"#,
            r#"{"response":{"uid":"u1","allowed":true}}"#,
            r#"{"response":{"uid":"u1","allowed":true,"patchType":"JSONPatch","patch":""}}"#,
            r#"{"kind":"AdmissionReview"}"#,
            "not json",
            // Strict JSON throughout, as serde_json read it: a field twice, a broken value
            // where nothing is read, and anything after the review are refused.
            r#"{"response":{"uid":"u1","uid":"u1","allowed":true,"patchType":"JSONPatch","patch":"W10="}}"#,
            r#"{"response":{"uid":"u1","allowed":true,"patchType":"JSONPatch","patch":"W10="},"response":{}}"#,
            r#"{"response":{"uid":"u1","allowed":true,"patchType":"JSONPatch","patch":"W10=","status":[1,,2]}}"#,
            r#"{"response":{"uid":"u1","allowed":true,"patchType":"JSONPatch","patch":"W10="}} x"#,
            r#"{"response":{"uid":"u1","allowed":"true","patchType":"JSONPatch","patch":"W10="}}"#,
        ] {
            assert!(check_answer(bad.as_bytes(), "u1").is_err(), "{bad}");
        }
    }

    #[test]
    fn large_pod_has_the_asked_env() {
        let body = review_with_env(&[20, 30]).expect("builds");
        let review: serde_json::Value = serde_json::from_slice(&body).expect("JSON");
        let containers = &review["request"]["object"]["spec"]["containers"];
        assert_eq!(containers[0]["env"].as_array().map(Vec::len), Some(20));
        assert_eq!(containers[1]["env"].as_array().map(Vec::len), Some(30));
        assert_eq!(
            containers[1]["env"][9]["valueFrom"]["secretKeyRef"]["key"],
            "key-9"
        );
        assert_eq!(
            request_uid(&body).expect("uid"),
            "0f6b4a4e-6f1c-4a63-9a1e-3c0d1b2c7e55"
        );
    }

    #[test]
    fn fixture_is_a_compact_review_of_a_few_kilobytes() {
        let body = review_body().expect("fixture parses");
        assert!((3_000..=4_200).contains(&body.len()), "{}", body.len());
    }
}
