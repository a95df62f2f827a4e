//! One scenario = one temporary namespace, created before and deleted after, whatever happens.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use kube::api::{DeleteParams, ObjectMeta, PostParams};
use kube::{Api, Client};

use crate::env::{Env, Need};
use crate::eventually;

/// Label on every namespace the suite creates, naming the scenario.
pub const SCENARIO_LABEL: &str = "e2e.sidecar-injector.io/scenario";
/// Bound on one scenario, setup and waits included.
pub const SCENARIO_TIMEOUT: Duration = Duration::from_secs(300);
/// Bound on one wait for the cluster to catch up.
pub const WAIT: Duration = Duration::from_secs(30);

/// What a scenario body gets.
#[derive(Clone)]
pub struct Ctx {
    pub client: Client,
    pub env: Env,
    /// The scenario's own namespace.
    pub ns: String,
    scenario: String,
}

impl Ctx {
    /// Pods of the scenario's namespace.
    pub fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    pub fn pods_in(&self, ns: &str) -> Api<Pod> {
        Api::namespaced(self.client.clone(), ns)
    }

    /// Another temporary namespace, deleted by the caller with [`Ctx::delete_namespace`].
    pub async fn extra_namespace(
        &self,
        suffix: &str,
        labels: &[(&str, &str)],
    ) -> anyhow::Result<String> {
        create_namespace(&self.client, &format!("{}-{suffix}", self.scenario), labels).await
    }

    pub async fn delete_namespace(&self, ns: &str) -> anyhow::Result<()> {
        delete_namespace(&self.client, ns).await
    }

    /// Runs helm (`HELM`) with the suite's kubeconfig; its stdout, or an error with its stderr.
    pub async fn helm(&self, args: &[&str]) -> anyhow::Result<String> {
        let output = tokio::process::Command::new(&self.env.helm)
            .args(args)
            .output()
            .await
            .with_context(|| format!("cannot run {}", self.env.helm))?;
        anyhow::ensure!(
            output.status.success(),
            "helm {} failed ({}): {}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }
}

/// Runs one scenario in a temporary namespace. Skips (returns Ok after saying why) when the
/// environment lacks something the scenario needs; deletes the namespace after the body, also
/// when it fails, panics or times out.
pub async fn scenario<F, Fut>(name: &str, needs: &[Need], body: F) -> anyhow::Result<()>
where
    F: FnOnce(Ctx) -> Fut,
    Fut: Future<Output = anyhow::Result<()>> + Send + 'static,
{
    let env = Env::load()?;
    if let Some(reason) = env.missing(needs)? {
        println!("SKIPPED {name}: {reason}");
        return Ok(());
    }
    // kube's rustls client needs a process-wide provider; a second install is a no-op.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = Client::try_default()
        .await
        .context("cannot build a Kubernetes client from KUBECONFIG")?;
    let ns = create_namespace(&client, name, &[]).await?;
    println!("{name}: namespace {ns}");
    let cx = Ctx {
        client: client.clone(),
        env,
        ns: ns.clone(),
        scenario: name.to_owned(),
    };
    let mut task = tokio::spawn(body(cx));
    let outcome = tokio::select! {
        joined = &mut task => Some(joined),
        () = tokio::time::sleep(SCENARIO_TIMEOUT) => None,
    };
    if outcome.is_none() {
        task.abort();
    }
    if let Err(error) = delete_namespace(&client, &ns).await {
        eprintln!("{name}: could not delete namespace {ns}: {error:#}");
    }
    match outcome {
        None => anyhow::bail!("{name} did not finish within {SCENARIO_TIMEOUT:?}"),
        Some(Ok(result)) => result.with_context(|| format!("scenario {name}")),
        Some(Err(join)) if join.is_panic() => std::panic::resume_unwind(join.into_panic()),
        Some(Err(join)) => Err(join).context(format!("scenario {name} was cancelled")),
    }
}

/// A fresh namespace `e2e-<prefix>-<suffix>` whose `default` ServiceAccount exists (the apiserver
/// refuses pods until it does).
pub async fn create_namespace(
    client: &Client,
    prefix: &str,
    labels: &[(&str, &str)],
) -> anyhow::Result<String> {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    let unique = nanos ^ (std::process::id() << 8) ^ COUNTER.fetch_add(1, Ordering::Relaxed);
    let prefix: String = prefix
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .take(40)
        .collect();
    let name = format!(
        "e2e-{}-{:06x}",
        prefix.trim_matches('-'),
        unique & 0xff_ffff
    );
    let mut all: BTreeMap<String, String> = labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    all.insert(SCENARIO_LABEL.into(), prefix.trim_matches('-').to_owned());
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            labels: Some(all),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .with_context(|| format!("cannot create namespace {name}"))?;
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), &name);
    eventually(
        &format!("ServiceAccount {name}/default (controller-manager)"),
        WAIT,
        || async { Ok(accounts.get_opt("default").await?.map(|_| ())) },
    )
    .await?;
    Ok(name)
}

/// Deletes a namespace without waiting for its finalizers.
pub async fn delete_namespace(client: &Client, name: &str) -> anyhow::Result<()> {
    match Api::<Namespace>::all(client.clone())
        .delete(name, &DeleteParams::default())
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(error) => Err(error).with_context(|| format!("cannot delete namespace {name}")),
    }
}

/// Creates `pod`, which the apiserver must admit, and returns it as stored (read back).
pub async fn accepts(pods: &Api<Pod>, pod: &Pod) -> anyhow::Result<Pod> {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let created = pods
        .create(&PostParams::default(), pod)
        .await
        .with_context(|| format!("pod {name} was refused, expected it to be admitted"))?;
    let name = created.metadata.name.unwrap_or(name);
    pods.get(&name)
        .await
        .with_context(|| format!("cannot read back pod {name}"))
}

/// Creates `pod`, which the apiserver must refuse, and returns the refusal's message. Checks
/// that nothing was stored.
pub async fn rejects(pods: &Api<Pod>, pod: &Pod) -> anyhow::Result<String> {
    let name = pod.metadata.name.clone().unwrap_or_default();
    match pods.create(&PostParams::default(), pod).await {
        Ok(stored) => anyhow::bail!(
            "pod {name} was admitted, expected it to be refused; stored: {}",
            serde_json::to_string(&stored).unwrap_or_default()
        ),
        Err(kube::Error::Api(status)) => {
            if !name.is_empty() {
                anyhow::ensure!(
                    pods.get_opt(&name).await?.is_none(),
                    "pod {name} was refused but is stored anyway"
                );
            }
            Ok(status.message)
        }
        Err(other) => {
            Err(other).context(format!("creating pod {name} failed without an API answer"))
        }
    }
}

/// Waits (at most 60 s) until a dry-run create of `pod` in `pods` comes back injected: a
/// server of a scenario's own and its webhooks are answering. A refusal meanwhile is the
/// last reason given.
pub async fn wait_injecting(pods: &Api<Pod>, pod: &Pod, what: &str) -> anyhow::Result<()> {
    eventually(what, Duration::from_secs(60), || async {
        match dry_run(pods, pod).await {
            Ok(stored) if crate::pods::status_annotation(&stored).is_some() => Ok(Some(())),
            Ok(_) => Ok(None),
            Err(e) => anyhow::bail!("dry run refused: {}", refusal(&e)),
        }
    })
    .await
}

/// A server-side dry-run create: the pod as the apiserver would store it, or the refusal.
pub async fn dry_run(pods: &Api<Pod>, pod: &Pod) -> Result<Pod, kube::Error> {
    pods.create(
        &PostParams {
            dry_run: true,
            ..Default::default()
        },
        pod,
    )
    .await
}

/// The message of an API refusal, or the error itself.
pub fn refusal(error: &kube::Error) -> String {
    match error {
        kube::Error::Api(status) => status.message.clone(),
        other => other.to_string(),
    }
}
