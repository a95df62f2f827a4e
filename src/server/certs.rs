//! Self-managed certificates (`serve --certificates-secret`): the shell around
//! [`certs::plan`](crate::certs::plan). It reads the TLS Secret and the `caBundle` of the
//! webhook configurations it keeps, asks the plan for the next step, takes it, and asks again
//! until the plan says to wait; then it serves what the Secret holds and looks again after
//! the wait (at most `--reload-interval`).
//!
//! Replicas coordinate through the API server: the Secret is created once (a second create is
//! refused with AlreadyExists) and replaced with the resourceVersion it was read at (a
//! replica that read an older one is refused with Conflict); either way the replica reads
//! again and decides on what the other wrote. Every replica serves the Secret it read, not a
//! mounted file, so a new serving certificate reaches every replica within one re-check.
//!
//! The `caBundle` is written by server-side apply under the field manager
//! `sidecar-injector-certificates`, that field alone, so a `helm upgrade` or a GitOps sync
//! owns everything else of the configurations; one that resets it is mended at the next
//! re-check. The Secret is owned by the MutatingWebhookConfiguration, so `helm uninstall`
//! (which deletes that) has the garbage collector delete it.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use base64::Engine as _;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::json;

use super::routes::State;
use super::tls;
use crate::certs::plan::{self, Observed, Policy, Step};
use crate::certs::stored::{self, CA_CRT, CA_KEY, Pems, TLS_CRT, TLS_KEY};
use crate::certs::{issue, plan::Stored};

/// Field manager of the `caBundle` applies.
const MANAGER: &str = "sidecar-injector-certificates";
/// Steps taken in one look before it counts as a failure (a healthy roll-over takes at most
/// three in a row: mend, add, mend).
const MAX_STEPS: usize = 8;
/// First delay after a failure; doubled each time, up to the re-check interval.
const FIRST_RETRY: Duration = Duration::from_secs(1);
/// How long a starting server waits for a usable certificate before it gives up (and its pod
/// restarts).
const START_TIMEOUT: Duration = Duration::from_secs(120);

/// A webhook configuration whose `caBundle` is kept.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WebhookConfig {
    Mutating(String),
    Validating(String),
}

impl std::str::FromStr for WebhookConfig {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.split_once('/') {
            Some(("mutating", name)) if !name.is_empty() => Ok(Self::Mutating(name.to_owned())),
            Some(("validating", name)) if !name.is_empty() => Ok(Self::Validating(name.to_owned())),
            _ => Err(format!(
                "{s:?}: use mutating/NAME (a MutatingWebhookConfiguration) or validating/NAME"
            )),
        }
    }
}

/// What the server looks after.
#[derive(Clone, Debug)]
pub struct Managed {
    pub secret: String,
    /// The Secret's namespace; `None`: the client's (the pod's own namespace in a cluster).
    pub namespace: Option<String>,
    /// What the serving certificate must be valid for.
    pub names: Vec<String>,
    pub webhooks: Vec<WebhookConfig>,
    pub policy: Policy,
}

/// A server with a certificate to serve, and what it served it from.
pub struct Started {
    client: kube::Client,
    managed: Managed,
    pub loaded: tls::Loaded,
    /// When the plan next has something to do.
    until: i64,
}

/// One look's end: the Secret's serving pair, and when to look again.
struct Settled {
    tls_crt: Vec<u8>,
    tls_key: Vec<u8>,
    until: i64,
    signer_not_after: Option<i64>,
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// Brings the Secret and the bundles to a state the plan is content with, and loads the
/// serving certificate; retried until [`START_TIMEOUT`].
pub async fn start(managed: Managed, state: &State) -> anyhow::Result<Started> {
    let deadline = tokio::time::Instant::now() + START_TIMEOUT;
    let mut retry = FIRST_RETRY;
    loop {
        let attempt = async {
            let client = kube::Client::try_default()
                .await
                .context("cannot reach the API server for the certificates")?;
            let settled = settle(&client, &managed, state).await?;
            let loaded = tls::from_memory(&settled.tls_crt, &settled.tls_key)?;
            anyhow::Ok((client, loaded, settled))
        };
        match attempt.await {
            Ok((client, loaded, settled)) => {
                note_served(state, &loaded, settled.signer_not_after);
                tracing::info!(secret = %managed.secret, not_after = loaded.not_after, "serving the self-managed certificate");
                return Ok(Started {
                    client,
                    managed,
                    loaded,
                    until: settled.until,
                });
            }
            Err(error) if tokio::time::Instant::now() + retry < deadline => {
                state.metrics.certificate_step("check", false);
                tracing::warn!(
                    error = format!("{error:#}"),
                    "no usable certificate yet; trying again"
                );
                tokio::time::sleep(retry).await;
                retry = (retry * 2).min(Duration::from_secs(10));
            }
            Err(error) => {
                return Err(error.context(format!(
                    "no usable certificate in Secret {} after {START_TIMEOUT:?}",
                    managed.secret
                )));
            }
        }
    }
}

fn note_served(state: &State, loaded: &tls::Loaded, signer_not_after: Option<i64>) {
    state.metrics.certificate_expiry(loaded.not_after);
    if let Some(at) = signer_not_after {
        state.metrics.ca_expiry(at);
    }
}

/// Looks after the certificates until the task is dropped, serving each new pair through
/// `resolver`.
pub async fn run(
    started: Started,
    resolver: Arc<tls::Resolver>,
    state: Arc<State>,
    interval: Duration,
) {
    let Started {
        client,
        managed,
        loaded,
        mut until,
    } = started;
    let mut served = loaded.fingerprint;
    let mut retry = FIRST_RETRY;
    loop {
        let wait = u64::try_from(until - now()).unwrap_or(0).max(1);
        tokio::time::sleep(Duration::from_secs(wait).min(interval)).await;
        match settle(&client, &managed, &state).await {
            Ok(settled) => {
                retry = FIRST_RETRY;
                until = settled.until;
                let fingerprint = tls::fingerprint(&settled.tls_crt, &settled.tls_key);
                if fingerprint == served {
                    continue;
                }
                match tls::from_memory(&settled.tls_crt, &settled.tls_key) {
                    Ok(loaded) => {
                        resolver.set(loaded.key.clone());
                        served = loaded.fingerprint;
                        note_served(&state, &loaded, settled.signer_not_after);
                        tracing::info!(
                            not_after = loaded.not_after,
                            "serving a new certificate from the Secret"
                        );
                    }
                    Err(error) => {
                        state.metrics.certificate_step("check", false);
                        tracing::error!(%error, "the Secret's serving certificate is unusable; still serving the previous one");
                    }
                }
            }
            Err(error) => {
                state.metrics.certificate_step("check", false);
                tracing::warn!(
                    error = format!("{error:#}"),
                    "cannot look after the certificates; trying again"
                );
                until = now() + i64::try_from(retry.as_secs()).unwrap_or(1);
                retry = (retry * 2).min(interval);
            }
        }
    }
}

/// Takes the plan's steps until it says to wait.
async fn settle(client: &kube::Client, m: &Managed, state: &State) -> anyhow::Result<Settled> {
    let secrets: Api<Secret> = match &m.namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::default_namespaced(client.clone()),
    };
    for _ in 0..MAX_STEPS {
        let secret = secrets
            .get_opt(&m.secret)
            .await
            .with_context(|| format!("cannot read Secret {}", m.secret))?;
        let data = secret.as_ref().and_then(|s| s.data.as_ref());
        let value = |key: &str| data.and_then(|d| d.get(key)).map_or(&[][..], |b| &b.0[..]);
        let pems = Pems {
            ca_crt: value(CA_CRT),
            ca_key: value(CA_KEY),
            tls_crt: value(TLS_CRT),
            tls_key: value(TLS_KEY),
        };
        let read = stored::read(pems, &m.names);
        let configs = read_configs(client, &m.webhooks).await?;
        let trusted: Vec<Vec<[u8; 32]>> = configs
            .iter()
            .flat_map(|c| c.webhooks.iter().map(|(_, ids)| ids.clone()))
            .collect();
        let now = now();
        let seen = Observed {
            stored: read.as_ref().map_err(String::as_str),
            trusted: &trusted,
            now,
        };
        let step = plan::next(&m.policy, &seen);
        let name = step_name(&step);
        match &step {
            Step::Wait { until } => {
                state.metrics.certificate_step("check", true);
                return Ok(Settled {
                    tls_crt: pems.tls_crt.to_vec(),
                    tls_key: pems.tls_key.to_vec(),
                    until: *until,
                    signer_not_after: read.as_ref().ok().and_then(signer_not_after),
                });
            }
            Step::MendBundles => {
                let done = mend(client, &configs, pems.ca_crt).await;
                state.metrics.certificate_step(name, done.is_ok());
                done?;
                tracing::info!("caBundle of the webhook configurations set to the Secret's CAs");
            }
            _ => {
                let written = async {
                    let contents = issue::take(&step, pems, &m.names, &m.policy, now)
                        .map_err(anyhow::Error::msg)?
                        .context("the step writes nothing")?;
                    write(client, &secrets, m, secret.as_ref(), contents).await
                }
                .await;
                state.metrics.certificate_step(name, written.is_ok());
                if !written? {
                    tracing::info!(
                        step = name,
                        "another replica wrote the Secret first; reading it again"
                    );
                    continue;
                }
                match &step {
                    Step::Issue { why } => tracing::info!(step = name, %why, "certificates issued"),
                    Step::RenewServing { why } => {
                        tracing::info!(step = name, %why, "serving certificate renewed")
                    }
                    _ => tracing::info!(step = name, "CA bundle changed"),
                }
            }
        }
    }
    anyhow::bail!("the certificates did not settle within {MAX_STEPS} steps")
}

fn signer_not_after(stored: &Stored) -> Option<i64> {
    let id = stored.signer?;
    stored
        .bundle
        .iter()
        .find(|ca| ca.id == id)
        .map(|ca| ca.not_after)
}

fn step_name(step: &Step) -> &'static str {
    match step {
        Step::Issue { .. } => "issue",
        Step::MendBundles => "mend_bundles",
        Step::AddCa => "add_ca",
        Step::RenewServing { .. } => "renew_serving",
        Step::DropCa { .. } => "drop_ca",
        Step::Wait { .. } => "check",
    }
}

impl WebhookConfig {
    fn kind(&self) -> &'static str {
        match self {
            Self::Mutating(_) => "MutatingWebhookConfiguration",
            Self::Validating(_) => "ValidatingWebhookConfiguration",
        }
    }

    fn name(&self) -> &str {
        match self {
            Self::Mutating(name) | Self::Validating(name) => name,
        }
    }

    fn api(&self, client: &kube::Client) -> Api<DynamicObject> {
        let gvk = GroupVersionKind::gvk("admissionregistration.k8s.io", "v1", self.kind());
        Api::all_with(client.clone(), &ApiResource::from_gvk(&gvk))
    }
}

/// A kept configuration as read: its webhooks' names, and the CAs each one's `caBundle` holds.
struct Seen<'a> {
    config: &'a WebhookConfig,
    webhooks: Vec<(String, Vec<[u8; 32]>)>,
}

async fn read_configs<'a>(
    client: &kube::Client,
    configs: &'a [WebhookConfig],
) -> anyhow::Result<Vec<Seen<'a>>> {
    let mut seen = Vec::with_capacity(configs.len());
    for config in configs {
        let object = config
            .api(client)
            .get(config.name())
            .await
            .with_context(|| format!("cannot read {} {}", config.kind(), config.name()))?;
        let webhooks = object.data["webhooks"]
            .as_array()
            .map_or(&[][..], Vec::as_slice);
        let webhooks = webhooks
            .iter()
            .map(|w| {
                let name = w["name"].as_str().unwrap_or_default().to_owned();
                let bundle = w["clientConfig"]["caBundle"]
                    .as_str()
                    .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
                    .unwrap_or_default();
                (name, stored::ids(&bundle))
            })
            .collect();
        seen.push(Seen { config, webhooks });
    }
    Ok(seen)
}

/// Sets every webhook's `caBundle` of the kept configurations to `ca_crt`, by server-side
/// apply of that field alone.
async fn mend(client: &kube::Client, seen: &[Seen<'_>], ca_crt: &[u8]) -> anyhow::Result<()> {
    let bundle = base64::engine::general_purpose::STANDARD.encode(ca_crt);
    let params = PatchParams::apply(MANAGER).force();
    for Seen { config, webhooks } in seen {
        let patch = json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": config.kind(),
            "metadata": {"name": config.name()},
            "webhooks": webhooks.iter().map(|(name, _)| json!({
                "name": name,
                "clientConfig": {"caBundle": bundle},
            })).collect::<Vec<_>>(),
        });
        config
            .api(client)
            .patch(config.name(), &params, &Patch::Apply(&patch))
            .await
            .with_context(|| {
                format!(
                    "cannot set the caBundle of {} {}",
                    config.kind(),
                    config.name()
                )
            })?;
    }
    Ok(())
}

/// Writes the Secret: created when there was none (owned by the MutatingWebhookConfiguration),
/// else replaced at the resourceVersion read. `Ok(false)` when another replica wrote first.
async fn write(
    client: &kube::Client,
    secrets: &Api<Secret>,
    m: &Managed,
    existing: Option<&Secret>,
    contents: issue::Contents,
) -> anyhow::Result<bool> {
    let data = [
        (CA_CRT, contents.ca_crt),
        (CA_KEY, contents.ca_key),
        (TLS_CRT, contents.tls_crt),
        (TLS_KEY, contents.tls_key),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), ByteString(v.into_bytes())))
    .collect();
    let result = match existing {
        Some(existing) => {
            let mut secret = existing.clone();
            secret.data = Some(data);
            secret.metadata.managed_fields = None;
            secrets
                .replace(&m.secret, &PostParams::default(), &secret)
                .await
        }
        None => {
            let owner = match m
                .webhooks
                .iter()
                .find(|w| matches!(w, WebhookConfig::Mutating(_)))
            {
                Some(config) => Some(owner_reference(client, config).await?),
                None => None,
            };
            let secret: Secret = serde_json::from_value(json!({
                "metadata": {
                    "name": m.secret,
                    "labels": {"app.kubernetes.io/managed-by": "sidecar-injector"},
                    "ownerReferences": owner.into_iter().collect::<Vec<_>>(),
                },
                "type": "kubernetes.io/tls",
            }))?;
            let secret = Secret {
                data: Some(data),
                ..secret
            };
            secrets.create(&PostParams::default(), &secret).await
        }
    };
    match result {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
        Err(error) => Err(error).with_context(|| format!("cannot write Secret {}", m.secret)),
    }
}

async fn owner_reference(
    client: &kube::Client,
    config: &WebhookConfig,
) -> anyhow::Result<serde_json::Value> {
    let name = config.name();
    let owner = config.api(client).get(name).await.with_context(|| {
        format!("cannot read MutatingWebhookConfiguration {name}, the Secret's owner")
    })?;
    let uid = owner
        .metadata
        .uid
        .with_context(|| format!("MutatingWebhookConfiguration {name} has no uid"))?;
    Ok(json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "name": name,
        "uid": uid,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn webhook_configurations_are_named_with_their_kind() {
        assert_eq!(
            "mutating/a".parse::<WebhookConfig>(),
            Ok(WebhookConfig::Mutating("a".into()))
        );
        assert_eq!(
            "validating/b".parse::<WebhookConfig>(),
            Ok(WebhookConfig::Validating("b".into()))
        );
        for bad in ["a", "mutating/", "other/a"] {
            assert!(bad.parse::<WebhookConfig>().is_err(), "{bad}");
        }
    }
}
