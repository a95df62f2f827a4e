//! What the runner (`e2e/run.sh` or `e2e/kind/run.sh`) tells the suite, through the environment.

use std::path::PathBuf;

/// Where the suite runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// `e2e/run.sh`: local control plane, server process on 127.0.0.1, audit log on disk.
    Local,
    /// `e2e/kind/run.sh`: the chart's in-cluster Deployment; no audit log, no process control.
    Kind,
    /// `e2e/node/run.sh`: a whole cluster with a real node in a network namespace; the chart's
    /// in-cluster Deployment serves the webhooks, the suite runs inside the namespace (so its
    /// own webhooks on 127.0.0.1 are reachable), stopping the server scales the Deployment to 0,
    /// and a second server process on 127.0.0.1 serves the url-mode chart scenario.
    Node,
}

/// Something a scenario needs beyond a cluster with the webhooks registered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    /// The apiserver's audit log (`AUDIT_LOG`), with pods logged at `Request` level.
    AuditLog,
    /// Stopping and starting the server process (`E2E_INJECTOR_CTL`).
    ProcessControl,
    /// A webhook served from the test binary that the apiserver can call: on 127.0.0.1, or in
    /// kind on the address the node containers reach this machine at (`E2E_HOST_ADDRESS`).
    LoopbackWebhooks,
    /// A server outside the cluster that the apiserver can call (`E2E_WEBHOOK_URL`) and its CA
    /// (`CA_CERT`), to install the chart in url mode.
    ServerUrl,
    /// A node that runs pods (kubelet, container runtime), and the chart's in-cluster Deployment.
    Node,
    /// Pod addresses the suite can dial (the suite runs in the node's network namespace).
    PodNetwork,
    /// The key of the CA that signed the in-cluster serving certificate (`E2E_CA_KEY`), to make
    /// a new one for rotation.
    CaKey,
    /// Changing a template of the server the webhooks call, reading its metrics, and running
    /// `sidecar-injector outdated` (`E2E_INJECTOR_BIN`). Locally: the configuration file the
    /// server process reads (`E2E_WORKDIR/injector-config/config.yaml`) and its admin port
    /// (`E2E_INJECTOR_ADMIN_PORT`); on a node: the chart's ConfigMap and the pods' admin ports.
    TemplateChange,
    /// A Prometheus scraping the injector's pods with the chart's alert rules
    /// (`E2E_PROMETHEUS_URL`, `E2E_PROMETHEUS_RULES`), and stopping and starting the server.
    Prometheus,
    /// Running `sidecar-injector` commands from the suite (`E2E_INJECTOR_BIN`).
    InjectorBin,
    /// The local control plane, where the suite runs servers of its own on loopback against
    /// the API server directly (the self-managed certificates' rotation in seconds). The node
    /// and kind runs leave such scenarios out: what they prove is the in-cluster server.
    LocalControlPlane,
    /// Two nodes, the second of which the suite can fail and revive (`E2E_NODES=2`,
    /// `E2E_NODE_CTL`: e2e/node/node.sh fail2|revive2). A one-node run leaves these scenarios
    /// out (e2e/node/run.sh).
    TwoNodes,
    /// The node's containers are processes of this machine that the suite (root, in the same
    /// PID namespace) can signal: the node suite (e2e/node/run.sh). The kind run leaves these
    /// scenarios out, counted: what they prove does not differ there.
    NodeProcesses,
}

/// The environment of one run.
#[derive(Clone, Debug)]
pub struct Env {
    pub mode: Mode,
    /// Pod addresses are reachable from the suite: always on the node; in kind when the
    /// runner routes the pod network into its namespace (`E2E_POD_NETWORK=1`,
    /// e2e/kind/run-here.sh).
    pub pod_network: bool,
    /// `AUDIT_LOG`: the apiserver's audit log (local mode).
    pub audit_log: Option<PathBuf>,
    /// `E2E_INJECTOR_CTL`: a program taking `stop` or `start` for the server process.
    pub injector_ctl: Option<PathBuf>,
    /// `E2E_HOST_ADDRESS`: the address the suite's own webhook servers listen on, which the
    /// apiserver can call: 127.0.0.1 (local and node mode), the kind network's gateway (kind
    /// in a network namespace of the run's own, e2e/kind/run-here.sh).
    pub host: String,
    /// `E2E_WEBHOOK_URL`: `https://HOST:PORT` of a server process outside the cluster.
    pub webhook_url: Option<String>,
    /// `E2E_INJECTOR_CERT`, `E2E_INJECTOR_KEY`: a serving certificate for `host`, signed by
    /// `CA_CERT`, for the servers the suite starts.
    pub injector_cert: Option<PathBuf>,
    pub injector_key: Option<PathBuf>,
    /// `CA_CERT`: the CA that signed the certificates of the servers outside the cluster (and,
    /// on a node, the in-cluster one).
    pub ca_cert: Option<PathBuf>,
    /// `E2E_CHART`: the chart directory.
    pub chart: PathBuf,
    /// `HELM`: the helm binary.
    pub helm: String,
    /// `E2E_RELEASE_NAMESPACE`: the injector's namespace (the server's `SIDECAR_INJECTOR_NAMESPACE`).
    pub injector_namespace: String,
    /// `E2E_WEBHOOK_CONFIG`: name of the Mutating- and ValidatingWebhookConfiguration.
    pub webhook_config: String,
    /// `E2E_CA_KEY`: the CA key of the in-cluster serving certificate (node mode).
    pub ca_key: Option<PathBuf>,
    /// `E2E_SERVICE_DNS`: the name the apiserver verifies the in-cluster server as
    /// (`<release>.<namespace>.svc`).
    pub service_dns: Option<String>,
    /// `ADMISSION_PLUGINS` names AlwaysPullImages: the apiserver rewrites every container's
    /// `imagePullPolicy` after the webhooks (local mode; a node without a registry cannot have it).
    pub always_pull_images: bool,
    /// `E2E_INJECTOR_BIN`: the sidecar-injector binary (local and node mode).
    pub injector_bin: Option<PathBuf>,
    /// The configuration file the server reads and reloads (local mode, see e2e/injector.sh).
    pub injector_config: Option<PathBuf>,
    /// `E2E_INJECTOR_ADMIN_PORT`: the server's admin port on 127.0.0.1 (local mode).
    pub injector_admin_port: Option<u16>,
    /// `E2E_PROMETHEUS_URL`: `http://127.0.0.1:PORT` of the Prometheus scraping the injector
    /// (node mode).
    pub prometheus_url: Option<String>,
    /// `E2E_PROMETHEUS_RULES`: the rule file that Prometheus loaded (the chart's rules).
    pub prometheus_rules: Option<PathBuf>,
    /// `E2E_NODES=2`: the node run has a second node, `E2E_NODE2_NAME` (default `e2e-node-2`).
    pub two_nodes: bool,
    /// `E2E_NODE_CTL`: e2e/node/node.sh, to fail and revive the second node (with `E2E_WORKDIR`).
    pub node_ctl: Option<PathBuf>,
    /// `E2E_WORKDIR`: the run's directory.
    pub workdir: Option<PathBuf>,
}

/// The host address of the suite's own servers unless `E2E_HOST_ADDRESS` names another.
const LOOPBACK: &str = "127.0.0.1";

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

impl Env {
    pub fn load() -> anyhow::Result<Self> {
        let mode = match var("E2E_MODE").as_deref() {
            None | Some("local") => Mode::Local,
            Some("kind") => Mode::Kind,
            Some("node") => Mode::Node,
            Some(other) => anyhow::bail!("E2E_MODE must be local, kind or node, got {other:?}"),
        };
        anyhow::ensure!(
            var("KUBECONFIG").is_some(),
            "KUBECONFIG is not set: run the suite through e2e/run.sh or e2e/kind/run.sh"
        );
        let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
        Ok(Self {
            mode,
            pod_network: mode == Mode::Node || var("E2E_POD_NETWORK").as_deref() == Some("1"),
            audit_log: var("AUDIT_LOG").map(PathBuf::from),
            injector_ctl: var("E2E_INJECTOR_CTL").map(PathBuf::from),
            host: var("E2E_HOST_ADDRESS").unwrap_or_else(|| LOOPBACK.into()),
            webhook_url: var("E2E_WEBHOOK_URL"),
            injector_cert: var("E2E_INJECTOR_CERT").map(PathBuf::from),
            injector_key: var("E2E_INJECTOR_KEY").map(PathBuf::from),
            ca_cert: var("CA_CERT").map(PathBuf::from),
            chart: var("E2E_CHART")
                .map(PathBuf::from)
                .unwrap_or_else(|| repo.join("charts/sidecar-injector")),
            helm: var("HELM").unwrap_or_else(|| "helm".into()),
            injector_namespace: var("E2E_RELEASE_NAMESPACE")
                .unwrap_or_else(|| "sidecar-injector".into()),
            webhook_config: var("E2E_WEBHOOK_CONFIG").unwrap_or_else(|| "sidecar-injector".into()),
            ca_key: var("E2E_CA_KEY").map(PathBuf::from),
            service_dns: var("E2E_SERVICE_DNS"),
            always_pull_images: var("ADMISSION_PLUGINS")
                .is_some_and(|p| p.split(',').any(|p| p == "AlwaysPullImages")),
            injector_bin: var("E2E_INJECTOR_BIN").map(PathBuf::from),
            injector_config: var("E2E_WORKDIR")
                .map(|w| PathBuf::from(w).join("injector-config/config.yaml"))
                .filter(|p| p.is_file()),
            injector_admin_port: var("E2E_INJECTOR_ADMIN_PORT").and_then(|p| p.parse().ok()),
            prometheus_url: var("E2E_PROMETHEUS_URL"),
            prometheus_rules: var("E2E_PROMETHEUS_RULES").map(PathBuf::from),
            two_nodes: var("E2E_NODES").as_deref() == Some("2"),
            node_ctl: var("E2E_NODE_CTL").map(PathBuf::from),
            workdir: var("E2E_WORKDIR").map(PathBuf::from),
        })
    }

    /// Why a scenario needing `needs` cannot run here, or `None` when it can. In local mode a
    /// missing piece is an error of the runner, not a reason to skip.
    pub fn missing(&self, needs: &[Need]) -> anyhow::Result<Option<String>> {
        for need in needs {
            let (present, kind_reason) = match need {
                Need::AuditLog => (
                    self.audit_log.is_some(),
                    "kind's apiserver writes no audit log the suite can read (it needs apiserver flags)",
                ),
                Need::ProcessControl => (
                    self.injector_ctl.is_some(),
                    "no E2E_INJECTOR_CTL: nothing to stop and start the server with",
                ),
                Need::LoopbackWebhooks => (
                    self.mode != Mode::Kind || self.host != LOOPBACK,
                    "kind's apiserver runs in a container: it cannot call a webhook on this machine's 127.0.0.1, and no E2E_HOST_ADDRESS names an address it can (e2e/kind/run-here.sh does)",
                ),
                Need::ServerUrl => (
                    self.webhook_url.is_some() && self.ca_cert.is_some(),
                    "installing the chart in url mode needs a server outside the cluster that the apiserver can reach (E2E_WEBHOOK_URL, CA_CERT; e2e/kind/run-here.sh sets them)",
                ),
                Need::Node => (
                    self.mode != Mode::Local,
                    "the local control plane has no kubelet: pods never run (e2e/node/run.sh has one)",
                ),
                Need::PodNetwork => (
                    self.pod_network,
                    "pod addresses are only reachable from inside the node's network namespace (e2e/node/run.sh)",
                ),
                Need::CaKey => (
                    self.ca_key.is_some() && self.ca_cert.is_some() && self.service_dns.is_some(),
                    "rotating the in-cluster certificate needs the key of the CA that signed it (E2E_CA_KEY, CA_CERT, E2E_SERVICE_DNS): the kind run installs the chart with its default certificates (selfManaged), as a user would: the server issues and rotates them itself",
                ),
                Need::TemplateChange => (
                    match self.mode {
                        Mode::Local => {
                            self.injector_bin.is_some()
                                && self.injector_config.is_some()
                                && self.injector_admin_port.is_some()
                        }
                        Mode::Node | Mode::Kind => self.injector_bin.is_some() && self.pod_network,
                    },
                    "kind's run has no sidecar-injector binary for the suite (E2E_INJECTOR_BIN), or the injector pods' admin ports are not reachable from the test machine (E2E_POD_NETWORK)",
                ),
                Need::InjectorBin => (
                    self.injector_bin.is_some(),
                    "kind's run has no sidecar-injector binary for the suite (E2E_INJECTOR_BIN)",
                ),
                Need::Prometheus => (
                    self.prometheus_url.is_some()
                        && self.prometheus_rules.is_some()
                        && self.injector_ctl.is_some(),
                    "only the node suite (e2e/node/run.sh) runs a Prometheus scraping the injector",
                ),
                Need::LocalControlPlane => {
                    if self.mode != Mode::Local {
                        return Ok(Some(
                            "runs on the local control plane only (e2e/run.sh): the node and kind runs prove the in-cluster server".into(),
                        ));
                    }
                    (
                        self.injector_bin.is_some(),
                        "no E2E_INJECTOR_BIN for the suite's own server",
                    )
                }
                Need::TwoNodes => (
                    self.two_nodes && self.node_ctl.is_some() && self.workdir.is_some(),
                    "only the node suite with E2E_NODES=2 has a second node it can fail and revive",
                ),
                Need::NodeProcesses => (
                    self.mode == Mode::Node,
                    "kept to the node suite (e2e/node/run.sh), whose containers are processes the suite can signal; kind runs the same version and this does not differ there",
                ),
            };
            // Pods never run without a node: in local mode that is a reason, not a runner error.
            if !present
                && self.mode == Mode::Local
                && matches!(
                    need,
                    Need::Node
                        | Need::PodNetwork
                        | Need::CaKey
                        | Need::Prometheus
                        | Need::TwoNodes
                        | Need::NodeProcesses
                )
            {
                return Ok(Some(kind_reason.into()));
            }
            if present {
                continue;
            }
            match self.mode {
                Mode::Kind => return Ok(Some(kind_reason.into())),
                Mode::Local | Mode::Node => anyhow::bail!(
                    "{:?} mode but {need:?} is not available: set AUDIT_LOG, E2E_INJECTOR_CTL, E2E_WEBHOOK_URL, CA_CERT, E2E_INJECTOR_BIN, E2E_INJECTOR_ADMIN_PORT and E2E_WORKDIR (e2e/run.sh and e2e/node/run.sh do)",
                    self.mode
                ),
            }
        }
        Ok(None)
    }
}

impl Env {
    /// Runs `E2E_NODE_CTL action E2E_WORKDIR` (e2e/node/node.sh fail2|revive2).
    pub async fn node_ctl(&self, action: &str) -> anyhow::Result<()> {
        let (Some(ctl), Some(workdir)) = (self.node_ctl.as_ref(), self.workdir.as_ref()) else {
            anyhow::bail!("no E2E_NODE_CTL or E2E_WORKDIR");
        };
        let mut command = tokio::process::Command::new("bash");
        command.arg(ctl).arg(action).arg(workdir);
        run_ctl(command, ctl, action).await
    }

    /// Stops or starts the server the webhooks call (`E2E_INJECTOR_CTL stop|start`: the local
    /// process, or on a node the Deployment scaled to 0 and back).
    pub async fn injector(&self, action: &str) -> anyhow::Result<()> {
        let ctl = self
            .injector_ctl
            .as_ref()
            .ok_or_else(|| anyhow::anyhow!("no E2E_INJECTOR_CTL"))?;
        let mut command = tokio::process::Command::new(ctl);
        command.arg(action);
        run_ctl(command, ctl, action).await
    }
}

/// Runs a control script (`ctl action ...`); fails naming it unless it exits 0.
async fn run_ctl(
    mut command: tokio::process::Command,
    ctl: &std::path::Path,
    action: &str,
) -> anyhow::Result<()> {
    let status = command.status().await?;
    anyhow::ensure!(
        status.success(),
        "{} {action} failed: {status}",
        ctl.display()
    );
    Ok(())
}
