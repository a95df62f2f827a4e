//! What only a real node shows (`e2e/node/run.sh`, `tests/node.rs`): containers' logs read
//! through the apiserver, the injector's own Deployment and its pods, a steady stream of pod
//! creations that counts every refusal, and the certificate a server pod really serves.

use std::os::unix::ffi::OsStrExt as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, LogParams, PostParams};
use kube::{Api, Client};
use rustls_pki_types::{CertificateDer, ServerName, pem::PemObject};

use crate::cluster::{WAIT, refusal};
use crate::eventually;
use crate::pods::{labelled, opted_in, status_annotation};

/// The busybox image imported into the node (`e2e/node/images.sh`).
pub const BUSYBOX: &str = "local/busybox:1";
/// A node-selector label no node has: stream pods are admitted and stored, never scheduled.
const NEVER_SCHEDULED: (&str, &str) = ("e2e.sidecar-injector.io/never", "scheduled");

/// One line of a container's log, with the time the runtime stamped on it.
#[derive(Clone, Debug)]
pub struct LogLine {
    /// RFC 3339 with nanoseconds, as the kubelet returns it; compares as time when the
    /// lengths match (the runtime always writes nine digits).
    pub at: String,
    pub text: String,
}

/// A container's log through the apiserver (the kubelet's logs endpoint), with timestamps.
pub async fn logs(pods: &Api<Pod>, pod: &str, container: &str) -> anyhow::Result<Vec<LogLine>> {
    let text = pods
        .logs(
            pod,
            &LogParams {
                container: Some(container.into()),
                timestamps: true,
                ..Default::default()
            },
        )
        .await
        .with_context(|| format!("cannot read the log of {pod}/{container}"))?;
    Ok(text
        .lines()
        .filter_map(|line| {
            let (at, text) = line.split_once(' ')?;
            Some(LogLine {
                at: at.to_owned(),
                text: text.to_owned(),
            })
        })
        .collect())
}

/// The first line containing `needle`, or an error showing the whole log.
pub fn line_with<'a>(log: &'a [LogLine], needle: &str, what: &str) -> anyhow::Result<&'a LogLine> {
    log.iter()
        .find(|l| l.text.contains(needle))
        .with_context(|| {
            format!(
                "{what}: no line with {needle:?} in:\n{}",
                log.iter()
                    .map(|l| format!("  {} {}", l.at, l.text))
                    .collect::<Vec<_>>()
                    .join("\n")
            )
        })
}

/// Waits until the Deployment `name` has rolled out: its newest generation observed, every
/// replica updated, ready and available, no old replica left.
pub async fn wait_rolled_out(
    client: &Client,
    ns: &str,
    name: &str,
    timeout: Duration,
) -> anyhow::Result<()> {
    let api: Api<Deployment> = Api::namespaced(client.clone(), ns);
    eventually(
        &format!("Deployment {ns}/{name} to roll out"),
        timeout,
        || async {
            let d = api.get(name).await?;
            let want = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
            let generation = d.metadata.generation.unwrap_or_default();
            let Some(s) = d.status else { return Ok(None) };
            let done = s.observed_generation.unwrap_or_default() >= generation
                && s.updated_replicas.unwrap_or_default() == want
                && s.ready_replicas.unwrap_or_default() == want
                && s.available_replicas.unwrap_or_default() == want
                && s.replicas.unwrap_or_default() == want;
            Ok(done.then_some(()))
        },
    )
    .await
}

/// The running, ready pods of the injector's Deployment (label `app.kubernetes.io/instance`).
pub async fn injector_pods(client: &Client, ns: &str, release: &str) -> anyhow::Result<Vec<Pod>> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let list = pods
        .list(&ListParams::default().labels(&format!("app.kubernetes.io/instance={release}")))
        .await?;
    Ok(list
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none() && is_ready(p))
        .collect())
}

/// The endpoints of Service `service` in `ns`, from its EndpointSlices.
pub async fn service_endpoints(
    client: &Client,
    ns: &str,
    service: &str,
) -> anyhow::Result<Vec<k8s_openapi::api::discovery::v1::Endpoint>> {
    let slices: Api<k8s_openapi::api::discovery::v1::EndpointSlice> =
        Api::namespaced(client.clone(), ns);
    Ok(slices
        .list(&ListParams::default().labels(&format!("kubernetes.io/service-name={service}")))
        .await?
        .items
        .into_iter()
        .flat_map(|s| s.endpoints)
        .collect())
}

/// The addresses of the ready endpoints of Service `service` in `ns`.
pub async fn ready_addresses(
    client: &Client,
    ns: &str,
    service: &str,
) -> anyhow::Result<Vec<String>> {
    Ok(service_endpoints(client, ns, service)
        .await?
        .into_iter()
        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) == Some(true))
        .flat_map(|e| e.addresses)
        .collect())
}

pub fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// What a [`PodStream`] saw.
#[derive(Debug, Default)]
pub struct StreamReport {
    pub created: usize,
    /// Refusals and errors, in order: "name: message".
    pub failures: Vec<String>,
    /// Pods stored without the status annotation.
    pub not_injected: Vec<String>,
    /// The longest a creation took, from the request to the API server's answer.
    pub longest: Duration,
}

/// Opted-in pods created one after another at a fixed pace until stopped (and at most `limit`),
/// each checked to be stored injected. The pods can never be scheduled: the stream measures
/// admission, not the node.
pub struct PodStream {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<StreamReport>,
}

impl PodStream {
    pub fn start(client: &Client, ns: &str, every: Duration, limit: usize) -> Self {
        Self::start_labelled(client, ns, every, limit, &[])
    }

    /// As [`PodStream::start`], each pod also carrying `labels` (a revision's, say).
    pub fn start_labelled(
        client: &Client,
        ns: &str,
        every: Duration,
        limit: usize,
        labels: &[(&str, &str)],
    ) -> Self {
        let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
        let labels: Vec<(String, String)> = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let task = tokio::spawn(async move {
            let mut report = StreamReport::default();
            let mut tick = tokio::time::interval(every);
            for i in 0..limit {
                if flag.load(Ordering::Relaxed) {
                    break;
                }
                tick.tick().await;
                let name = format!("stream-{i:04}");
                let mut pod = opted_in(&name);
                if let Some(spec) = pod.spec.as_mut() {
                    spec.node_selector =
                        Some([(NEVER_SCHEDULED.0.to_owned(), NEVER_SCHEDULED.1.to_owned())].into());
                }
                let pod = labels.iter().fold(
                    labelled(pod, "e2e.sidecar-injector.io/stream", "true"),
                    |pod, (k, v)| labelled(pod, k, v),
                );
                let sent = std::time::Instant::now();
                let answer = pods.create(&PostParams::default(), &pod).await;
                report.longest = report.longest.max(sent.elapsed());
                match answer {
                    Ok(stored) => {
                        report.created += 1;
                        if status_annotation(&stored).is_none() {
                            report.not_injected.push(name);
                        }
                    }
                    Err(error) => report.failures.push(format!("{name}: {}", refusal(&error))),
                }
            }
            report
        });
        Self { stop, task }
    }

    pub async fn stop(self) -> anyhow::Result<StreamReport> {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.context("the pod stream task failed")
    }
}

/// The leaf certificate a server pod presents at `ip:port`, verified against `ca_pem` for
/// `server_name` (what the apiserver checks when it calls the Service).
pub async fn served_certificate(
    ip: &str,
    port: u16,
    server_name: &str,
    ca_pem: &[u8],
) -> anyhow::Result<CertificateDer<'static>> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem) {
        roots.add(cert.context("bad CA PEM")?)?;
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::time::timeout(WAIT, tokio::net::TcpStream::connect((ip, port)))
        .await
        .context("connect timed out")??;
    let name = ServerName::try_from(server_name.to_owned())?;
    let tls = tokio::time::timeout(WAIT, connector.connect(name, tcp))
        .await
        .context("TLS handshake timed out")?
        .with_context(|| format!("TLS handshake with {ip}:{port} as {server_name}"))?;
    let (_, session) = tls.get_ref();
    session
        .peer_certificates()
        .and_then(|c| c.first())
        .map(|c| c.clone().into_owned())
        .context("the server presented no certificate")
}

/// What became of one creation of a [`TimedStream`].
#[derive(Clone, Debug)]
pub enum Outcome {
    /// Stored with the status annotation.
    Injected,
    /// Stored without it: an opted-in pod without its sidecars.
    NotInjected,
    /// Refused (or failed), with the message.
    Refused(String),
}

/// One creation: when it started (since the stream started), how long the caller waited.
#[derive(Clone, Debug)]
pub struct Sample {
    pub name: String,
    pub started: Duration,
    pub waited: Duration,
    pub outcome: Outcome,
}

/// Opted-in pods created at a fixed pace whether or not the earlier ones were answered (as many
/// callers would), at most `limit` and for at most `max` in all, each timed: what callers see
/// while an endpoint hangs. The pods are never scheduled.
pub struct TimedStream {
    stop: Arc<AtomicBool>,
    started: tokio::time::Instant,
    task: tokio::task::JoinHandle<Vec<Sample>>,
}

impl TimedStream {
    pub fn start(client: &Client, ns: &str, every: Duration, limit: usize, max: Duration) -> Self {
        let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let started = tokio::time::Instant::now();
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut running = tokio::task::JoinSet::new();
            for i in 0..limit {
                if flag.load(Ordering::Relaxed) || started.elapsed() >= max {
                    break;
                }
                tick.tick().await;
                let name = format!("timed-{i:04}");
                let mut pod = opted_in(&name);
                if let Some(spec) = pod.spec.as_mut() {
                    spec.node_selector =
                        Some([(NEVER_SCHEDULED.0.to_owned(), NEVER_SCHEDULED.1.to_owned())].into());
                }
                let pod = labelled(pod, "e2e.sidecar-injector.io/stream", "true");
                let pods = pods.clone();
                running.spawn(async move {
                    let at = tokio::time::Instant::now();
                    let result = pods.create(&PostParams::default(), &pod).await;
                    let outcome = match result {
                        Ok(stored) if status_annotation(&stored).is_some() => Outcome::Injected,
                        Ok(_) => Outcome::NotInjected,
                        Err(error) => Outcome::Refused(refusal(&error)),
                    };
                    Sample {
                        name,
                        started: at.duration_since(started),
                        waited: at.elapsed(),
                        outcome,
                    }
                });
            }
            let mut samples = Vec::new();
            while let Some(done) = running.join_next().await {
                if let Ok(sample) = done {
                    samples.push(sample);
                }
            }
            samples.sort_by_key(|s| s.started);
            samples
        });
        Self {
            stop,
            started,
            task,
        }
    }

    /// Time since the stream started (the clock of [`Sample::started`]).
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// Stops creating, waits for the creations under way, returns every sample.
    pub async fn stop(self) -> anyhow::Result<Vec<Sample>> {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.context("the timed stream task failed")
    }
}

/// A refusal's message, shortened to its kind for a table: which webhook or policy, and why.
pub fn refusal_kind(message: &str) -> String {
    let hook = if message.contains("validate.sidecar-injector.io") {
        "validating"
    } else if message.contains("inject.sidecar-injector.io") {
        "mutating"
    } else if message.contains("ValidatingAdmissionPolicy") {
        return "backstop (ValidatingAdmissionPolicy) refused it".into();
    } else {
        return message.chars().take(120).collect();
    };
    let why = if message.contains("failed calling webhook") {
        if message.contains("deadline exceeded") || message.contains("Timeout") {
            "call timed out"
        } else if message.contains("no endpoints available") {
            "no endpoints"
        } else if message.contains("connection refused") {
            "connection refused"
        } else {
            "call failed"
        }
    } else if message.contains("denied the request") {
        "denied"
    } else {
        "refused"
    };
    format!("{hook} webhook: {why}")
}

/// Sends SIGKILL to the process of the pod with `pod_uid` whose command line starts with a
/// program named `program`, and returns its pid. On the suite's own node (e2e/node/run.sh)
/// the containers' processes share the suite's PID namespace, and each one's cgroup path
/// names its pod (`pod<uid>`: the kubelet's cgroupfs layout; `pod<uid with _>` under systemd).
pub async fn sigkill_in_pod(pod_uid: &str, program: &str) -> anyhow::Result<u32> {
    let marks = [
        format!("pod{pod_uid}"),
        format!("pod{}", pod_uid.replace('-', "_")),
    ];
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc")?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        // A process may end while it is read: it is then not the one.
        let (Ok(cgroup), Ok(cmdline)) = (
            std::fs::read_to_string(entry.path().join("cgroup")),
            std::fs::read(entry.path().join("cmdline")),
        ) else {
            continue;
        };
        let argv0 = cmdline.split(|b| *b == 0).next().unwrap_or_default();
        let named = std::path::Path::new(std::ffi::OsStr::from_bytes(argv0))
            .file_name()
            .is_some_and(|n| n == program);
        if named && marks.iter().any(|m| cgroup.contains(m.as_str())) {
            found.push(pid);
        }
    }
    let [pid] = found[..] else {
        anyhow::bail!("expected one {program} process of pod {pod_uid}, found {found:?}");
    };
    let status = tokio::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .await?;
    anyhow::ensure!(status.success(), "kill -KILL {pid}: {status}");
    Ok(pid)
}
