//! Admission policies exported by `sidecar-injector export`, installed for one scenario, and a
//! second webhook server serving the same configuration, so that the two roads can be compared.
//!
//! Every binding is narrowed to namespaces labelled [`ROAD_LABEL`] with the road it tests, so
//! the policies never touch the other scenarios' pods; the chart's webhooks are kept out of
//! those namespaces by the chart's own opt-out label ([`CHART_OFF`]), which the policies are
//! exported not to honour.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context as _, ensure};
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{ApiResource, DeleteParams, DynamicObject, GroupVersionKind, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};

use crate::cluster::WAIT;
use crate::env::Env;
use crate::eventually;

/// The namespace label a scenario's bindings and webhook select by.
pub const ROAD_LABEL: &str = "e2e.sidecar-injector.io/road";
/// The chart's opt-out label (`webhook.disabledLabel`): the suite's chart webhooks skip a
/// namespace carrying it with the value "true".
pub const CHART_OFF: &str = "sidecar-injector.io/disabled";
/// The opt-out label the exported policies honour in these scenarios (none of them carry it).
pub const POLICIES_OFF: &str = "e2e.sidecar-injector.io/policies-off";

/// The configuration whose templates can be written as CEL (`e2e/policy/config.yaml`).
pub fn policy_config() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("policy/config.yaml")
}

/// The configuration the suite's own injector serves, as a file: locally the one e2e/injector.sh
/// made; on a node the chart's ConfigMap (its config.yaml and templates), written to a temporary
/// directory removed when the value is dropped.
pub struct InjectorConfig {
    path: PathBuf,
    _dir: Option<TempDir>,
}

impl InjectorConfig {
    pub fn path(&self) -> &Path {
        &self.path
    }
}

pub async fn injector_config(env: &Env, client: &Client) -> anyhow::Result<InjectorConfig> {
    if let Some(path) = &env.injector_config {
        return Ok(InjectorConfig {
            path: path.clone(),
            _dir: None,
        });
    }
    let cm = Api::<ConfigMap>::namespaced(client.clone(), &env.injector_namespace)
        .get(&env.webhook_config)
        .await
        .with_context(|| {
            format!(
                "cannot read ConfigMap {}/{}",
                env.injector_namespace, env.webhook_config
            )
        })?;
    let dir =
        TempDir(std::env::temp_dir().join(format!("e2e-injector-config-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0)?;
    for (name, text) in cm.data.iter().flatten() {
        std::fs::write(dir.0.join(name), text)?;
    }
    Ok(InjectorConfig {
        path: dir.0.join("config.yaml"),
        _dir: Some(dir),
    })
}

/// `sidecar-injector export <kind>` for `config` (None: the bundled configuration), as the
/// injector in `namespace` would: its YAML documents.
pub async fn export(
    env: &Env,
    kind: &str,
    config: Option<&Path>,
    extra: &[&str],
) -> anyhow::Result<Vec<Value>> {
    let bin = env.injector_bin.clone().context("no E2E_INJECTOR_BIN")?;
    let mut cmd = tokio::process::Command::new(&bin);
    cmd.arg("export")
        .arg(kind)
        .args(["--disabled-label", POLICIES_OFF])
        .args(extra)
        .env("SIDECAR_INJECTOR_NAMESPACE", &env.injector_namespace)
        .env_remove("SIDECAR_INJECTOR_CONFIG")
        .stdin(Stdio::null());
    if let Some(config) = config {
        cmd.arg("--config").arg(config);
    }
    let out = cmd
        .output()
        .await
        .context("running sidecar-injector export")?;
    ensure!(
        out.status.success(),
        "sidecar-injector export {kind} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout)?;
    text.split("\n---\n")
        .map(|d| d.trim_start_matches("---\n"))
        .filter(|d| !d.trim().is_empty())
        .map(|d| {
            serde_saphyr::from_str::<Value>(d).context("export wrote a document that is not YAML")
        })
        .collect()
}

/// Whether the API server serves MutatingAdmissionPolicy in `admissionregistration.k8s.io/v1`
/// (1.36+); otherwise `v1beta1` (1.34-1.35 with its feature gate), or neither.
pub async fn mutating_version(client: &Client) -> anyhow::Result<Option<&'static str>> {
    for version in ["v1", "v1beta1"] {
        let list: Result<Value, _> = client
            .request(
                http::Request::get(format!("/apis/admissionregistration.k8s.io/{version}"))
                    .body(Vec::new())?,
            )
            .await;
        if let Ok(list) = list
            && list["resources"]
                .as_array()
                .is_some_and(|r| r.iter().any(|r| r["name"] == "mutatingadmissionpolicies"))
        {
            return Ok(Some(version));
        }
    }
    Ok(None)
}

fn api_for(client: &Client, doc: &Value) -> anyhow::Result<Api<DynamicObject>> {
    let api_version = doc["apiVersion"].as_str().context("no apiVersion")?;
    let (group, version) = api_version
        .split_once('/')
        .context("apiVersion without a group")?;
    let kind = doc["kind"].as_str().context("no kind")?;
    let plural = format!("{}s", kind.to_ascii_lowercase()).replace("policys", "policies");
    let gvk = GroupVersionKind::gvk(group, version, kind);
    Ok(Api::all_with(
        client.clone(),
        &ApiResource::from_gvk_with_plural(&gvk, &plural),
    ))
}

/// Installed policies, deleted with [`Installed::remove`].
pub struct Installed {
    client: Client,
    docs: Vec<Value>,
}

/// Creates the exported documents, each binding narrowed to namespaces whose [`ROAD_LABEL`]
/// is one of `roads`.
pub async fn install(
    client: &Client,
    mut docs: Vec<Value>,
    roads: &[&str],
) -> anyhow::Result<Installed> {
    // Names of the scenario's own, apart from the chart's backstop (installed by default).
    let suffix = format!("-e2e-{}", roads.first().copied().unwrap_or("road"));
    for doc in &mut docs {
        for pointer in ["/metadata/name", "/spec/policyName"] {
            if let Some(field) = doc.pointer_mut(pointer)
                && let Some(name) = field.as_str()
            {
                *field = Value::String(format!("{name}{suffix}"));
            }
        }
    }
    for doc in &mut docs {
        if doc["kind"].as_str().is_some_and(|k| k.ends_with("Binding")) {
            let exprs = &mut doc["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"];
            let list = exprs
                .as_array_mut()
                .context("a binding without namespace expressions")?;
            list.push(json!({"key": ROAD_LABEL, "operator": "In", "values": roads}));
        }
    }
    let installed = Installed {
        client: client.clone(),
        docs,
    };
    for doc in &installed.docs {
        let object: DynamicObject = serde_json::from_value(doc.clone())?;
        let name = object.metadata.name.clone().unwrap_or_default();
        if let Err(error) = api_for(client, doc)?
            .create(&PostParams::default(), &object)
            .await
        {
            installed.remove().await.ok();
            return Err(error).with_context(|| format!("cannot create {} {name}", doc["kind"]));
        }
    }
    Ok(installed)
}

impl Installed {
    pub async fn remove(&self) -> anyhow::Result<()> {
        for doc in self.docs.iter().rev() {
            let name = doc["metadata"]["name"].as_str().unwrap_or_default();
            match api_for(&self.client, doc)?
                .delete(name, &DeleteParams::default())
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(e).with_context(|| format!("cannot delete {name}")),
            }
        }
        Ok(())
    }
}

/// A `sidecar-injector serve` process with its own configuration on the suite's host address
/// (with the run's serving certificate for it, else the server's development certificate for
/// 127.0.0.1), registered as a mutating webhook for one road's namespaces with the chart's
/// selectors. Stopped and unregistered by [`Server::stop`] (or when dropped).
pub struct Server {
    child: tokio::process::Child,
    client: Client,
    webhook: String,
    _dir: TempDir,
}

/// A directory removed when dropped.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

async fn free_port(host: &str) -> anyhow::Result<u16> {
    let listener = tokio::net::TcpListener::bind((host, 0)).await?;
    Ok(listener.local_addr()?.port())
}

impl Server {
    pub async fn start(
        env: &Env,
        client: &Client,
        config: &Path,
        road: &str,
    ) -> anyhow::Result<Self> {
        let bin = env.injector_bin.clone().context("no E2E_INJECTOR_BIN")?;
        let dir = std::env::temp_dir().join(format!("e2e-policy-{road}-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let dir = TempDir(dir);
        let host = env.host.as_str();
        let (port, admin) = (free_port(host).await?, free_port("127.0.0.1").await?);
        // The run's certificate for the host address and its CA, or the development
        // certificate (127.0.0.1) and the CA file the server writes into TMPDIR.
        let (tls, ca): (Vec<&std::ffi::OsStr>, PathBuf) = match (
            &env.injector_cert,
            &env.injector_key,
            &env.ca_cert,
        ) {
            (Some(cert), Some(key), Some(ca)) => (
                vec![
                    "--tls-cert-file".as_ref(),
                    cert.as_os_str(),
                    "--tls-key-file".as_ref(),
                    key.as_os_str(),
                ],
                ca.clone(),
            ),
            _ if host == "127.0.0.1" => (vec![], dir.0.join("sidecar-injector-dev-ca.pem")),
            _ => anyhow::bail!(
                "E2E_HOST_ADDRESS is {host}: a server there needs E2E_INJECTOR_CERT, E2E_INJECTOR_KEY and CA_CERT"
            ),
        };
        let child = tokio::process::Command::new(&bin)
            .args(["serve", "--listen", &format!("{host}:{port}")])
            .args(["--admin-listen", &format!("127.0.0.1:{admin}")])
            .args(&tls)
            .arg("--config")
            .arg(config)
            .env("TMPDIR", &dir.0)
            .env("SIDECAR_INJECTOR_NAMESPACE", &env.injector_namespace)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .context("cannot start a second sidecar-injector serve")?;
        let ready = eventually("the second server's /readyz", WAIT, || async {
            let ok = tokio::net::TcpStream::connect(("127.0.0.1", admin))
                .await
                .is_ok()
                && ca.is_file();
            Ok(ok.then_some(()))
        })
        .await;
        let mut server = Self {
            child,
            client: client.clone(),
            webhook: format!("e2e-road-{road}"),
            _dir: dir,
        };
        if let Err(e) = ready {
            server.stop().await.ok();
            return Err(e);
        }
        let ca = base64::Engine::encode(
            &base64::engine::general_purpose::STANDARD,
            std::fs::read(&ca)?,
        );
        let hook = |entry: &str, path: &str, object: Value, ns_extra: Value| {
            json!({
                "name": format!("{entry}inject.{road}.e2e.sidecar-injector.io"),
                "admissionReviewVersions": ["v1"],
                "clientConfig": {"url": format!("https://{host}:{port}{path}"), "caBundle": ca},
                "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}],
                "objectSelector": object,
                "namespaceSelector": {"matchExpressions": [
                    {"key": ROAD_LABEL, "operator": "In", "values": [road]},
                    {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": [env.injector_namespace]},
                    ns_extra,
                ]},
                "sideEffects": "None",
                "reinvocationPolicy": "IfNeeded",
                "failurePolicy": "Fail",
                "timeoutSeconds": 10,
            })
        };
        let config = json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": server.webhook},
            "webhooks": [
                hook("", "/mutate",
                    json!({"matchLabels": {"sidecar-injector.io/inject": "true"}, "matchExpressions": [{"key": "sidecar-injector.io/rev", "operator": "DoesNotExist"}]}),
                    json!({"key": "sidecar-injector.io/inject", "operator": "NotIn", "values": ["enabled"]})),
                hook("namespace.", "/mutate/namespace",
                    json!({"matchExpressions": [{"key": "sidecar-injector.io/inject", "operator": "NotIn", "values": ["false"]}]}),
                    json!({"key": "sidecar-injector.io/inject", "operator": "In", "values": ["enabled"]})),
            ],
        });
        let config: MutatingWebhookConfiguration = serde_json::from_value(config)?;
        if let Err(e) = Api::<MutatingWebhookConfiguration>::all(client.clone())
            .create(&PostParams::default(), &config)
            .await
        {
            server.stop().await.ok();
            return Err(e).context("cannot register the second server's webhook");
        }
        Ok(server)
    }

    pub async fn stop(&mut self) -> anyhow::Result<()> {
        let deleted = match Api::<MutatingWebhookConfiguration>::all(self.client.clone())
            .delete(&self.webhook, &DeleteParams::default())
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(e).context("cannot delete the second server's webhook"),
        };
        self.child.start_kill().ok();
        tokio::time::timeout(Duration::from_secs(10), self.child.wait())
            .await
            .ok();
        deleted
    }
}
