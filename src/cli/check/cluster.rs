//! The cluster side of `check`: every read, the dry run, and the TLS handshake with a url.
//! Nothing is decided here: each call answers with what it got ([`Got`]), and
//! [`crate::diagnose::check`] judges.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams, PostParams};
use kube::{Api, Client, Resource};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, verify_tls12_signature, verify_tls13_signature};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use serde::de::DeserializeOwned;

use crate::diagnose::check::probe::Answer;
use crate::diagnose::check::{Got, tls};

/// How long the handshake with a url may take.
const DIAL: Duration = Duration::from_secs(5);
/// Page size of the list of mutating webhook configurations.
const PAGE: u32 = 500;

/// What an API error means for a check.
fn got<T>(result: Result<T, kube::Error>, right: impl FnOnce() -> String) -> Got<T> {
    match result {
        Ok(t) => Got::Found(t),
        Err(kube::Error::Api(s)) if s.code == 404 => Got::Missing,
        Err(kube::Error::Api(s)) if s.code == 403 => Got::Forbidden(right()),
        Err(e) => Got::Failed(format!("{e}")),
    }
}

fn plural<K: Resource<DynamicType = ()>>() -> String {
    K::plural(&()).into_owned()
}

/// A cluster-scoped object by name.
pub async fn get_cluster<K>(client: &Client, name: &str) -> Got<K>
where
    K: Resource<Scope = k8s_openapi::ClusterResourceScope, DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug,
{
    let api: Api<K> = Api::all(client.clone());
    got(api.get(name).await, || {
        format!("get {} {name}", plural::<K>())
    })
}

/// A namespaced object by name.
pub async fn get_namespaced<K>(client: &Client, namespace: &str, name: &str) -> Got<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug,
{
    let api: Api<K> = Api::namespaced(client.clone(), namespace);
    got(api.get(name).await, || {
        format!("get {} {name} in namespace {namespace}", plural::<K>())
    })
}

/// Every object of a cluster-scoped kind.
pub async fn list_cluster<K>(client: &Client) -> Got<Vec<K>>
where
    K: Resource<Scope = k8s_openapi::ClusterResourceScope, DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug,
{
    list_selected(client, "").await
}

/// [`list_cluster`], only the objects `selector` (a label selector; empty: all) selects.
pub async fn list_selected<K>(client: &Client, selector: &str) -> Got<Vec<K>>
where
    K: Resource<Scope = k8s_openapi::ClusterResourceScope, DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug,
{
    let api: Api<K> = Api::all(client.clone());
    let mut items = Vec::new();
    let mut params = ListParams::default().limit(PAGE);
    if !selector.is_empty() {
        params = params.labels(selector);
    }
    loop {
        match got(api.list(&params).await, || {
            format!("list {}", plural::<K>())
        }) {
            Got::Found(page) => {
                items.extend(page.items);
                match page.metadata.continue_.filter(|c| !c.is_empty()) {
                    Some(token) => params = params.continue_token(&token),
                    None => return Got::Found(items),
                }
            }
            Got::Missing => return Got::Found(items),
            Got::Forbidden(r) => return Got::Forbidden(r),
            Got::Failed(e) => return Got::Failed(e),
        }
    }
}

/// The EndpointSlices of a Service.
pub async fn endpoint_slices(
    client: &Client,
    namespace: &str,
    service: &str,
) -> Got<Vec<EndpointSlice>> {
    let api: Api<EndpointSlice> = Api::namespaced(client.clone(), namespace);
    let params = ListParams::default().labels(&format!("kubernetes.io/service-name={service}"));
    got(api.list(&params).await.map(|l| l.items), || {
        format!("list endpointslices in namespace {namespace}")
    })
}

/// The backstop objects' annotations, by name: the policy, its binding, and the binding of
/// required namespaces (`<name>-required`).
pub async fn backstop(client: &Client, name: &str) -> [Got<BTreeMap<String, String>>; 3] {
    let get = |kind, name: String| async move { admission_object(client, "v1", kind, &name).await };
    [
        get("ValidatingAdmissionPolicy", name.to_owned()).await,
        get("ValidatingAdmissionPolicyBinding", name.to_owned()).await,
        get(
            "ValidatingAdmissionPolicyBinding",
            format!("{name}-required"),
        )
        .await,
    ]
}

/// The annotations of the cluster-scoped `kind` `name` in `admissionregistration.k8s.io/<version>`.
async fn admission_object(
    client: &Client,
    version: &str,
    kind: &str,
    name: &str,
) -> Got<BTreeMap<String, String>> {
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(
        "admissionregistration.k8s.io",
        version,
        kind,
    ));
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
    match got(api.get(name).await, || {
        format!("get {} {name}", resource.plural)
    }) {
        Got::Found(o) => Got::Found(o.metadata.annotations.unwrap_or_default()),
        other => other.absent(),
    }
}

/// What was read of the MutatingAdmissionPolicy `name`: the API version it was found in, and
/// the annotations of the policy, its binding and the binding of required namespaces
/// (`<name>-required`).
pub struct MutatingPolicyRead {
    pub api_version: Option<String>,
    pub policy: Got<BTreeMap<String, String>>,
    pub binding: Got<BTreeMap<String, String>>,
    pub required_binding: Got<BTreeMap<String, String>>,
}

/// The MutatingAdmissionPolicy `name` and its bindings, by their annotations, with the API
/// version the policy was found in: v1 (Kubernetes 1.36+) first, then v1beta1 (1.34-1.35).
pub async fn mutating_policy(client: &Client, name: &str) -> MutatingPolicyRead {
    // Not served in a version (404), or not there: the next version may have it. A refusal or
    // an error is reported unless a version has it.
    let mut unread = None;
    for version in ["v1", "v1beta1"] {
        match admission_object(client, version, "MutatingAdmissionPolicy", name).await {
            Got::Missing => {}
            Got::Found(policy) => {
                let binding = |name: String| async move {
                    admission_object(client, version, "MutatingAdmissionPolicyBinding", &name).await
                };
                return MutatingPolicyRead {
                    api_version: Some(version.to_owned()),
                    policy: Got::Found(policy),
                    binding: binding(name.to_owned()).await,
                    required_binding: binding(format!("{name}-required")).await,
                };
            }
            other => {
                unread.get_or_insert(other);
            }
        }
    }
    let why = unread.unwrap_or(Got::Missing);
    MutatingPolicyRead {
        api_version: None,
        policy: why.clone(),
        binding: why.clone(),
        required_binding: why,
    }
}

/// A server-side dry-run create of `pod` in `namespace`: stores nothing, runs every admission
/// webhook and policy.
pub async fn dry_run(client: &Client, namespace: &str, pod: &serde_json::Value) -> Answer {
    let pod: Pod = match serde_json::from_value(pod.clone()) {
        Ok(p) => p,
        Err(e) => return Answer::Failed(format!("the probe pod is not a pod: {e}")),
    };
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let params = PostParams {
        dry_run: true,
        field_manager: Some("sidecar-injector-check".into()),
    };
    match api.create(&params, &pod).await {
        Ok(p) => Answer::Admitted(Box::new(p)),
        Err(kube::Error::Api(s))
            if s.code == 403 && s.message.contains("cannot create resource") =>
        {
            Answer::Forbidden(format!(
                "create pods in namespace {namespace} (a dry run needs it)"
            ))
        }
        Err(kube::Error::Api(s)) if s.code == 404 => Answer::Failed(format!(
            "namespace {namespace} not found: choose one with --pod-namespace"
        )),
        Err(kube::Error::Api(s)) => Answer::Refused(s.message),
        Err(e) => Answer::Failed(e.to_string()),
    }
}

/// Records the chain a server presents and accepts it: the chain is judged afterwards, against
/// the webhook's caBundle ([`tls::verify`]). Nothing is sent over the connection.
#[derive(Debug)]
struct Record {
    chain: Mutex<Vec<Vec<u8>>>,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for Record {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if let Ok(mut chain) = self.chain.lock() {
            *chain = std::iter::once(end_entity)
                .chain(intermediates)
                .map(|c| c.to_vec())
                .collect();
        }
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// The chain the server at `url` presents in a TLS handshake.
pub async fn handshake(url: &str) -> tls::Served {
    let (host, port) = match tls::url_host_port(url) {
        Some(hp) => hp,
        None => {
            return tls::Served {
                managed: None,
                source: format!("the server at {url}"),
                from_secret: false,
                chain: Got::Failed("not an https url with a host".into()),
            };
        }
    };
    let source = format!("the server at {host}:{port}");
    let chain = match tokio::time::timeout(DIAL, dial(&host, port)).await {
        Ok(Ok(chain)) => Got::Found(chain),
        Ok(Err(error)) => Got::Failed(error),
        Err(_) => Got::Failed(format!("no answer within {DIAL:?}")),
    };
    tls::Served {
        managed: None,
        source,
        from_secret: false,
        chain,
    }
}

async fn dial(host: &str, port: u16) -> Result<Vec<Vec<u8>>, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let record = Arc::new(Record {
        chain: Mutex::new(Vec::new()),
        provider: provider.clone(),
    });
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .dangerous()
        .with_custom_certificate_verifier(record.clone())
        .with_no_client_auth();
    let name = ServerName::try_from(host.to_owned()).map_err(|e| format!("{host}: {e}"))?;
    let tcp = tokio::net::TcpStream::connect((host, port))
        .await
        .map_err(|e| format!("cannot connect: {e}"))?;
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .map_err(|e| format!("TLS handshake failed: {e}"))?;
    let chain = record.chain.lock().map(|c| c.clone()).unwrap_or_default();
    if chain.is_empty() {
        return Err("the server presented no certificate".into());
    }
    Ok(chain)
}
