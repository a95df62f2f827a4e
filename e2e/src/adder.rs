//! A second mutating webhook, served from the test binary over TLS (on the suite's host
//! address, 127.0.0.1 but in kind), that adds an
//! application container to opted-in pods. With it the apiserver has to reinvoke the injector
//! (`reinvocationPolicy: IfNeeded`), and the audit log shows in which order it did what.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context as _;
use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use crate::pods::{INJECT_LABEL, app_image, from_json};

/// The port the added container declares.
pub const ADDED_PORT: u16 = 7070;

/// A running adder webhook; stops serving when dropped.
pub struct Adder {
    /// `https://HOST:PORT/add`.
    pub url: String,
    /// PEM of the CA that signed the server's certificate (for `caBundle`).
    pub ca_pem: String,
    /// The container it adds.
    pub container: String,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Adder {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Adder {
    /// Starts serving on an ephemeral port of `host` (an IP address the apiserver can reach)
    /// with a fresh CA and a certificate for that address.
    pub async fn start(host: &str, container: &str) -> anyhow::Result<Self> {
        let ca_key = KeyPair::generate()?;
        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "sidecar-injector e2e adder CA");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca_cert = ca_params.self_signed(&ca_key)?;
        let issuer = Issuer::new(ca_params, ca_key);
        let leaf_key = KeyPair::generate()?;
        let mut leaf_params = CertificateParams::new(vec![host.to_owned()])?;
        leaf_params
            .distinguished_name
            .push(DnType::CommonName, "sidecar-injector e2e adder");
        let leaf = leaf_params.signed_by(&leaf_key, &issuer)?;

        let certs = vec![CertificateDer::from_pem_slice(leaf.pem().as_bytes())?];
        let key = PrivateKeyDer::from_pem_slice(leaf_key.serialize_pem().as_bytes())?;
        let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(certs, key)?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let acceptor = TlsAcceptor::from(Arc::new(config));

        let listener = TcpListener::bind((host, 0)).await?;
        let addr: SocketAddr = listener.local_addr()?;
        let name: Arc<str> = Arc::from(container);
        let task = tokio::spawn(serve(listener, acceptor, name));
        Ok(Self {
            url: format!("https://{addr}/add"),
            ca_pem: ca_cert.pem(),
            container: container.to_owned(),
            task,
        })
    }

    /// A MutatingWebhookConfiguration `name` sending opted-in pods of namespace `ns` (only) to
    /// this server. `reinvocationPolicy: Never`: it runs once, in round 0.
    pub fn configuration(
        &self,
        name: &str,
        ns: &str,
    ) -> anyhow::Result<MutatingWebhookConfiguration> {
        from_json(json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": name},
            "webhooks": [{
                "name": "add.e2e.sidecar-injector.io",
                "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
                "failurePolicy": "Fail",
                "matchPolicy": "Equivalent",
                "reinvocationPolicy": "Never",
                "timeoutSeconds": 5,
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
                "objectSelector": {"matchLabels": {INJECT_LABEL: "true"}},
                "rules": [{
                    "apiGroups": [""],
                    "apiVersions": ["v1"],
                    "operations": ["CREATE"],
                    "resources": ["pods"],
                    "scope": "Namespaced"
                }],
                "clientConfig": {
                    "url": self.url,
                    "caBundle": base64::engine::general_purpose::STANDARD.encode(&self.ca_pem)
                }
            }]
        }))
    }
}

async fn serve(listener: TcpListener, acceptor: TlsAcceptor, container: Arc<str>) {
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            continue;
        };
        let acceptor = acceptor.clone();
        let container = container.clone();
        tokio::spawn(async move {
            let Ok(tls) = acceptor.accept(tcp).await else {
                return;
            };
            let service = hyper::service::service_fn(move |req| answer(req, container.clone()));
            let _ = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(tls), service)
                .await;
        });
    }
}

async fn answer(
    req: Request<Incoming>,
    container: Arc<str>,
) -> Result<Response<Full<Bytes>>, std::convert::Infallible> {
    let reply = match req.into_body().collect().await {
        Ok(body) => review(&body.to_bytes(), &container),
        Err(error) => Err(anyhow::anyhow!("cannot read body: {error}")),
    };
    let (status, body) = match reply {
        Ok(v) => (StatusCode::OK, v.to_string()),
        Err(error) => (StatusCode::BAD_REQUEST, format!("{error:#}")),
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    Ok(response)
}

/// Answers an AdmissionReview: allowed, plus a patch appending the container when it is missing.
fn review(body: &[u8], container: &str) -> anyhow::Result<Value> {
    let review: Value = serde_json::from_slice(body).context("not JSON")?;
    let request = &review["request"];
    let uid = request["uid"].as_str().context("no request.uid")?;
    let present = request["object"]["spec"]["containers"]
        .as_array()
        .is_some_and(|cs| cs.iter().any(|c| c["name"] == container));
    let mut response = json!({"uid": uid, "allowed": true});
    if !present {
        let patch = json!([{
            "op": "add",
            "path": "/spec/containers/-",
            // With a port of its own: the injector must not route to it after the fact
            // (its rendering is frozen at the first call; s19).
            "value": {"name": container, "image": app_image(),
                      "ports": [{"containerPort": ADDED_PORT, "protocol": "TCP"}]}
        }]);
        response["patchType"] = json!("JSONPatch");
        response["patch"] =
            json!(base64::engine::general_purpose::STANDARD.encode(patch.to_string()));
    }
    Ok(json!({
        "apiVersion": review["apiVersion"].as_str().unwrap_or("admission.k8s.io/v1"),
        "kind": "AdmissionReview",
        "response": response
    }))
}
