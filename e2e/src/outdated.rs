//! `sidecar-injector outdated` against the suite's cluster, and a template change in the
//! configuration of the server the webhooks call, which it reloads: locally the file
//! e2e/injector.sh made; on a node the chart's ConfigMap, which the kubelet updates in the
//! injector pods.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, ensure};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::PostParams;
use kube::{Api, Client};
use serde_json::Value;

use crate::cluster::dry_run;
use crate::env::{Env, Mode};
use crate::eventually;
use crate::node::injector_pods;
use crate::pods::{PROXY, init_containers, opted_in};

/// The image a changed proxy template injects locally (never pulled: no kubelet runs there).
pub const CHANGED_PROXY_IMAGE: &str = "docker.io/envoyproxy/envoy:v1.33.0";
/// Bound on a configuration change reaching every server (on a node: the kubelet's sync).
pub const RELOAD_WAIT: Duration = Duration::from_secs(90);
/// The line of the proxy template that names its image.
const IMAGE_LINE: &str = "    image: {{ values.proxy.image }}\n";
/// `outdated`'s exit status when something is outdated and was not restarted.
pub const EXIT_OUTDATED: i32 = 3;
/// The pod-template annotation a restart sets.
pub const RESTARTED_AT: &str = "kubectl.kubernetes.io/restartedAt";

/// One run of `outdated -o json`.
#[derive(Debug)]
pub struct Report {
    pub code: i32,
    pub json: Value,
    pub stderr: String,
}

impl Report {
    /// `Kind/name` of the workloads in `state`, sorted.
    pub fn workloads(&self, state: &str) -> Vec<String> {
        self.json["workloads"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|w| w["state"] == state)
            .map(|w| format!("{}/{}", str_of(&w["kind"]), str_of(&w["name"])))
            .collect()
    }

    /// Every workload listed, sorted.
    pub fn all_workloads(&self) -> Vec<String> {
        self.json["workloads"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|w| format!("{}/{}", str_of(&w["kind"]), str_of(&w["name"])))
            .collect()
    }

    /// `(Kind/name, action)` of each restart record.
    pub fn restarts(&self) -> Vec<(String, String)> {
        self.json["restarts"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|r| {
                (
                    format!("{}/{}", str_of(&r["kind"]), str_of(&r["name"])),
                    str_of(&r["action"]).to_owned(),
                )
            })
            .collect()
    }

    /// The restart record of `workload` (`Kind/name`).
    pub fn restart_of(&self, workload: &str) -> Option<&Value> {
        self.json["restarts"]
            .as_array()?
            .iter()
            .find(|r| format!("{}/{}", str_of(&r["kind"]), str_of(&r["name"])) == workload)
    }

    /// Every pod of every outdated workload shows exactly the proxy image change.
    pub fn check_proxy_changed(&self, old: &str, new: &str) -> anyhow::Result<()> {
        let expected = serde_json::json!([{
            "kind": "changed",
            "template": "proxy",
            "sidecars": [{"container": PROXY, "oldImage": old, "newImage": new, "fields": ["image"]}]
        }]);
        for w in self.json["workloads"].as_array().into_iter().flatten() {
            for p in w["pods"].as_array().into_iter().flatten() {
                if p["state"] == "outdated" {
                    ensure!(
                        p["changes"] == expected,
                        "pod {} of {}/{}: changes {}, expected {expected}",
                        p["name"],
                        w["kind"],
                        w["name"],
                        p["changes"]
                    );
                }
            }
        }
        Ok(())
    }
}

fn str_of(v: &Value) -> &str {
    v.as_str().unwrap_or_default()
}

/// Where the server the webhooks call reads its configuration.
#[derive(Clone, Debug)]
enum Source {
    /// Local mode: the process's configuration file (templates beside it).
    File(PathBuf),
    /// Node mode: the chart's ConfigMap, mounted into the injector pods.
    ConfigMap { namespace: String, name: String },
}

impl Source {
    fn of(env: &Env) -> anyhow::Result<Self> {
        match env.mode {
            Mode::Local => Ok(Self::File(
                env.injector_config.clone().context("no injector config")?,
            )),
            Mode::Node | Mode::Kind => Ok(Self::ConfigMap {
                namespace: env.injector_namespace.clone(),
                name: env.webhook_config.clone(),
            }),
        }
    }

    /// The `outdated` flags that read this configuration.
    fn flags(&self) -> Vec<String> {
        match self {
            Self::File(path) => vec!["--config".into(), path.display().to_string()],
            Self::ConfigMap { namespace, name } => {
                vec!["--from-configmap".into(), format!("{namespace}/{name}")]
            }
        }
    }

    async fn read_proxy(&self, client: &Client) -> anyhow::Result<String> {
        match self {
            Self::File(config) => {
                let path = proxy_file(config);
                std::fs::read_to_string(&path)
                    .with_context(|| format!("cannot read {}", path.display()))
            }
            Self::ConfigMap { namespace, name } => {
                let cm = Api::<ConfigMap>::namespaced(client.clone(), namespace)
                    .get(name)
                    .await?;
                cm.data
                    .and_then(|mut d| d.remove("proxy.yaml.j2"))
                    .with_context(|| format!("ConfigMap {namespace}/{name} has no proxy.yaml.j2"))
            }
        }
    }

    async fn write_proxy(&self, client: &Client, source: &str) -> anyhow::Result<()> {
        match self {
            Self::File(config) => {
                let path = proxy_file(config);
                std::fs::write(&path, source)
                    .with_context(|| format!("cannot write {}", path.display()))
            }
            Self::ConfigMap { namespace, name } => {
                let api = Api::<ConfigMap>::namespaced(client.clone(), namespace);
                let mut cm = api.get(name).await?;
                cm.data
                    .get_or_insert_with(Default::default)
                    .insert("proxy.yaml.j2".into(), source.into());
                api.replace(name, &PostParams::default(), &cm).await?;
                Ok(())
            }
        }
    }
}

fn proxy_file(config: &Path) -> PathBuf {
    config
        .parent()
        .unwrap_or(Path::new("."))
        .join("proxy.yaml.j2")
}

/// Runs `sidecar-injector outdated -n NS -o json ARGS`, reading the configuration of the
/// server the webhooks call unless ARGS name `--from-configmap`. Exit statuses other than 0, 1
/// and 3 are errors.
pub async fn outdated(env: &Env, ns: &str, args: &[&str]) -> anyhow::Result<Report> {
    let bin = env.injector_bin.as_ref().context("no E2E_INJECTOR_BIN")?;
    let mut command = tokio::process::Command::new(bin);
    command
        .args(["outdated", "-n", ns, "-o", "json"])
        .args(args);
    if !args.contains(&"--from-configmap") {
        command.args(Source::of(env)?.flags());
    }
    command.env_remove("SIDECAR_INJECTOR_CONFIG");
    let out = tokio::time::timeout(Duration::from_secs(150), command.output())
        .await
        .context("outdated did not finish within 150s")?
        .context("cannot run outdated")?;
    let code = out.status.code().unwrap_or(-1);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    ensure!(
        matches!(code, 0 | 1 | EXIT_OUTDATED),
        "outdated {args:?} exited {code}: {stderr}"
    );
    let json = if stdout.trim().is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&stdout)
            .with_context(|| format!("outdated printed no JSON: {stdout}{stderr}"))?
    };
    Ok(Report { code, json, stderr })
}

/// The proxy template's image changed in the configuration of the server the webhooks call;
/// put back by [`ProxyImage::restore`] (as a last resort, when dropped: at once for a file,
/// by a spawned task for a ConfigMap).
pub struct ProxyImage {
    env: Env,
    client: Client,
    source: Source,
    original: Option<String>,
    /// The image injected before the change.
    pub old: String,
    /// The image injected after it: locally [`CHANGED_PROXY_IMAGE`]; on a node the same local
    /// stand-in under another name (`docker.io/` added), so nothing is pulled.
    pub new: String,
}

impl ProxyImage {
    /// Changes the proxy template's image and waits until every server injects it.
    pub async fn set(env: &Env, client: &Client, pods: &Api<Pod>) -> anyhow::Result<Self> {
        let source = Source::of(env)?;
        let old = proxy_image(pods).await?;
        let new = match env.mode {
            Mode::Local => CHANGED_PROXY_IMAGE.to_owned(),
            _ => match old.strip_prefix("docker.io/") {
                Some(short) => short.to_owned(),
                None => format!("docker.io/{old}"),
            },
        };
        let original = source.read_proxy(client).await?;
        ensure!(
            original.contains(IMAGE_LINE),
            "the proxy template has no line {IMAGE_LINE:?}"
        );
        let changed = original.replacen(IMAGE_LINE, &format!("    image: {new}\n"), 1);
        let before = config_reloads(env, client).await?;
        source.write_proxy(client, &changed).await?;
        let guard = Self {
            env: env.clone(),
            client: client.clone(),
            source,
            original: Some(original),
            old,
            new,
        };
        wait_for_reloads(env, client, &before).await?;
        wait_for_proxy_image(pods, &guard.new).await?;
        Ok(guard)
    }

    /// Puts the template back and waits until every server injects the old image again.
    pub async fn restore(mut self, pods: &Api<Pod>) -> anyhow::Result<()> {
        if let Some(original) = self.original.take() {
            let before = config_reloads(&self.env, &self.client).await?;
            self.source.write_proxy(&self.client, &original).await?;
            wait_for_reloads(&self.env, &self.client, &before).await?;
        }
        wait_for_proxy_image(pods, &self.old).await
    }
}

impl Drop for ProxyImage {
    fn drop(&mut self) {
        let Some(original) = self.original.take() else {
            return;
        };
        let (source, client) = (self.source.clone(), self.client.clone());
        match &source {
            Source::File(config) => {
                let _ = std::fs::write(proxy_file(config), original);
            }
            Source::ConfigMap { .. } => {
                if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                    runtime.spawn(async move {
                        let _ = source.write_proxy(&client, &original).await;
                    });
                }
            }
        }
    }
}

/// The proxy image a server-side dry run of an opted-in pod gets now.
pub async fn proxy_image(pods: &Api<Pod>) -> anyhow::Result<String> {
    let pod = dry_run(pods, &opted_in("image-probe")).await?;
    init_containers(&pod)
        .iter()
        .find(|c| c.name == PROXY)
        .and_then(|c| c.image.clone())
        .context("the dry run has no proxy")
}

/// How many times each server the webhooks call (by its admin address) has loaded a changed
/// configuration (`sidecar_injector_reloads_total{kind="config",result="success"}`).
async fn config_reloads(env: &Env, client: &Client) -> anyhow::Result<Vec<(String, f64)>> {
    let mut counts = Vec::new();
    // Where the injector pods are not reachable, the dry runs are all there is.
    if env.mode == Mode::Kind && !env.pod_network {
        return Ok(counts);
    }
    for (address, text) in injector_metrics_each(env, client).await? {
        let count = crate::metrics::sum(
            &text,
            "sidecar_injector_reloads_total",
            &[("kind", "config"), ("result", "success")],
        );
        counts.push((address, count));
    }
    Ok(counts)
}

/// Waits until every server has loaded a changed configuration since `before`. Dry runs alone
/// cannot tell: the API server may send all of them over one connection to one replica, while
/// the other still injects the previous configuration into the next scenario's pods.
async fn wait_for_reloads(
    env: &Env,
    client: &Client,
    before: &[(String, f64)],
) -> anyhow::Result<()> {
    eventually(
        "every injector to load the changed configuration",
        RELOAD_WAIT,
        || async {
            let now = config_reloads(env, client).await?;
            let done = now.iter().all(|(address, count)| {
                let was = before
                    .iter()
                    .find(|(a, _)| a == address)
                    .map_or(0.0, |(_, c)| *c);
                *count > was
            });
            Ok(done.then_some(()))
        },
    )
    .await
}

/// Waits until server-side dry runs of an opted-in pod come back with `image` on their proxy
/// ten times in a row (after every server has reloaded: see [`wait_for_reloads`]).
pub async fn wait_for_proxy_image(pods: &Api<Pod>, image: &str) -> anyhow::Result<()> {
    eventually(
        &format!("every server to reload and inject proxy {image}"),
        RELOAD_WAIT,
        || async {
            for _ in 0..10 {
                if proxy_image(pods).await? != image {
                    return Ok(None);
                }
            }
            Ok(Some(()))
        },
    )
    .await
}

/// The metrics of the servers the webhooks call: locally the process's admin port; on a node
/// every injector pod's (their admin ports are reachable from the node's network namespace).
pub async fn injector_metrics(env: &Env, client: &Client) -> anyhow::Result<String> {
    let mut all = String::new();
    for (_, text) in injector_metrics_each(env, client).await? {
        all.push_str(&text);
    }
    Ok(all)
}

/// [`injector_metrics`], server by server: (admin address, metrics text).
async fn injector_metrics_each(
    env: &Env,
    client: &Client,
) -> anyhow::Result<Vec<(String, String)>> {
    let mut addresses = Vec::new();
    match env.mode {
        Mode::Local => {
            let port = env
                .injector_admin_port
                .context("no E2E_INJECTOR_ADMIN_PORT")?;
            addresses.push(format!("127.0.0.1:{port}"));
        }
        Mode::Node | Mode::Kind if env.pod_network => {
            for pod in injector_pods(client, &env.injector_namespace, &env.webhook_config).await? {
                let ip = pod
                    .status
                    .and_then(|s| s.pod_ip)
                    .context("pod without IP")?;
                let port = pod
                    .spec
                    .iter()
                    .flat_map(|s| &s.containers)
                    .flat_map(|c| c.ports.iter().flatten())
                    .find(|p| p.name.as_deref() == Some("admin"))
                    .map(|p| p.container_port)
                    .context("no admin port")?;
                addresses.push(format!("{ip}:{port}"));
            }
        }
        Mode::Node | Mode::Kind => {
            anyhow::bail!("the injector pods are not reachable: no E2E_POD_NETWORK")
        }
    }
    let mut each = Vec::new();
    for address in addresses {
        let text = scrape(&address).await?;
        each.push((address, text));
    }
    Ok(each)
}

/// `GET /metrics` of a server's admin `address` over plain HTTP/1.0.
pub async fn scrape(address: &str) -> anyhow::Result<String> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(address).await?;
        stream
            .write_all(b"GET /metrics HTTP/1.0\r\nHost: injector\r\n\r\n")
            .await?;
        let mut body = String::new();
        stream.read_to_string(&mut body).await?;
        anyhow::Ok(body)
    };
    let response = tokio::time::timeout(Duration::from_secs(10), exchange)
        .await
        .with_context(|| format!("{address}/metrics did not answer within 10s"))??;
    ensure!(
        response.starts_with("HTTP/1.0 200") || response.starts_with("HTTP/1.1 200"),
        "GET {address}/metrics: {}",
        response.lines().next().unwrap_or_default()
    );
    Ok(response)
}

/// The `template_hash` values of `sidecar_injector_injections_total` for `template`, sorted.
pub fn injection_hashes(metrics: &str, template: &str) -> Vec<String> {
    let prefix =
        format!("sidecar_injector_injections_total{{template=\"{template}\",template_hash=\"");
    let mut hashes: Vec<String> = metrics
        .lines()
        .filter_map(|l| l.strip_prefix(&prefix))
        .filter_map(|rest| rest.split('"').next())
        .map(str::to_owned)
        .collect();
    hashes.sort();
    hashes.dedup();
    hashes
}
