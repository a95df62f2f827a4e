//! The webhook configurations: read them, change them for one scenario, put them back, and wait
//! until the apiserver acts on a change (it picks configurations up after a short delay).

use std::future::Future;

use anyhow::Context as _;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhook, MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
    WebhookClientConfig,
};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client};

use crate::cluster::{WAIT, dry_run, refusal};
use crate::eventually;
use crate::pods::{opted_in, status_annotation};

/// The names the chart gives the two webhooks (`charts/sidecar-injector/templates/`).
pub const MUTATING_WEBHOOK: &str = "inject.sidecar-injector.io";
pub const VALIDATING_WEBHOOK: &str = "validate.sidecar-injector.io";

pub fn mutating(client: &Client) -> Api<MutatingWebhookConfiguration> {
    Api::all(client.clone())
}

pub fn validating(client: &Client) -> Api<ValidatingWebhookConfiguration> {
    Api::all(client.clone())
}

/// Changes the MutatingWebhookConfiguration `name` with `change`, runs `body`, and always puts
/// the configuration's webhooks back as they were (waiting until injection works again).
pub async fn with_mutating_changed<C, F, Fut>(
    client: &Client,
    name: &str,
    probe_ns: &str,
    change: C,
    body: F,
) -> anyhow::Result<()>
where
    C: FnOnce(&mut MutatingWebhook) -> anyhow::Result<()>,
    F: FnOnce() -> Fut,
    Fut: Future<Output = anyhow::Result<()>>,
{
    with_mutating_webhooks_changed(
        client,
        name,
        probe_ns,
        |hooks| {
            let hook = hooks
                .iter_mut()
                .find(|w| w.name == MUTATING_WEBHOOK)
                .ok_or_else(|| anyhow::anyhow!("{name} has no webhook {MUTATING_WEBHOOK}"))?;
            change(hook)
        },
        body,
    )
    .await
}

/// Changes the whole list of webhooks of the MutatingWebhookConfiguration `name` (delete an
/// entry, ...), runs `body`, and always puts them back (waiting until injection works again).
pub async fn with_mutating_webhooks_changed<C, F, Fut>(
    client: &Client,
    name: &str,
    probe_ns: &str,
    change: C,
    body: F,
) -> anyhow::Result<()>
where
    C: FnOnce(&mut Vec<MutatingWebhook>) -> anyhow::Result<()>,
    F: FnOnce() -> Fut,
    Fut: Future<Output = anyhow::Result<()>>,
{
    let api = mutating(client);
    let original = api
        .get(name)
        .await
        .with_context(|| format!("cannot read MutatingWebhookConfiguration {name}"))?;
    let mut changed = original.clone();
    change(changed.webhooks.get_or_insert_with(Vec::new))?;
    api.replace(name, &PostParams::default(), &changed)
        .await
        .with_context(|| format!("cannot change MutatingWebhookConfiguration {name}"))?;
    let result = body().await;
    let restored = restore_mutating(client, &original, probe_ns).await;
    result.and(restored)
}

async fn restore_mutating(
    client: &Client,
    original: &MutatingWebhookConfiguration,
    probe_ns: &str,
) -> anyhow::Result<()> {
    let api = mutating(client);
    let name = original.metadata.name.clone().unwrap_or_default();
    let mut current = api.get(&name).await?;
    current.webhooks = original.webhooks.clone();
    api.replace(&name, &PostParams::default(), &current)
        .await
        .with_context(|| format!("cannot restore MutatingWebhookConfiguration {name}"))?;
    wait_for_injection(client, probe_ns).await.map(drop)
}

/// Polls server-side dry-run creates of an opted-in pod in `ns` until it comes back injected.
pub async fn wait_for_injection(client: &Client, ns: &str) -> anyhow::Result<Pod> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    eventually(
        &format!("a dry-run pod in {ns} to come back injected"),
        WAIT,
        || async {
            match dry_run(&pods, &opted_in("probe")).await {
                Ok(pod) if status_annotation(&pod).is_some() => Ok(Some(pod)),
                Ok(_) => anyhow::bail!("dry-run pod came back without the status annotation"),
                Err(error) => anyhow::bail!("dry-run refused: {}", refusal(&error)),
            }
        },
    )
    .await
}

/// Polls dry-run creates of an opted-in pod in `ns` until the refusal contains `needle`
/// (the apiserver has picked up a changed configuration). Returns the refusal.
pub async fn wait_for_refusal(client: &Client, ns: &str, needle: &str) -> anyhow::Result<String> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    eventually(
        &format!("a dry-run pod in {ns} to be refused with {needle:?}"),
        WAIT,
        || async {
            match dry_run(&pods, &opted_in("probe")).await {
                Ok(_) => anyhow::bail!("dry-run pod was admitted"),
                Err(error) => {
                    let message = refusal(&error);
                    if message.contains(needle) {
                        Ok(Some(message))
                    } else {
                        anyhow::bail!("refused with: {message}")
                    }
                }
            }
        },
    )
    .await
}

/// A port of `host` nothing listens on (bound and released; nothing else here binds it again).
pub async fn closed_port(host: &str) -> anyhow::Result<u16> {
    let listener = tokio::net::TcpListener::bind((host, 0)).await?;
    Ok(listener.local_addr()?.port())
}

/// Points a webhook's client at `port` on the same host: the port of a `url`, or the Service port.
pub fn point_at_port(client_config: &mut WebhookClientConfig, port: u16) -> anyhow::Result<()> {
    if let Some(url) = client_config.url.as_mut() {
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| anyhow::anyhow!("webhook url {url:?} has no scheme"))?;
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        let host = match authority.rsplit_once(':') {
            Some((host, _)) if !host.ends_with(']') || authority.starts_with('[') => host,
            _ => authority,
        };
        *url = format!("{scheme}://{host}:{port}/{path}");
    } else if let Some(service) = client_config.service.as_mut() {
        service.port = Some(i32::from(port));
    } else {
        anyhow::bail!("webhook clientConfig has neither url nor service");
    }
    Ok(())
}

/// Deletes a Mutating- or ValidatingWebhookConfiguration if it exists.
pub async fn delete_mutating(client: &Client, name: &str) -> anyhow::Result<()> {
    match mutating(client)
        .delete(name, &DeleteParams::default())
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => {
            Err(e).with_context(|| format!("cannot delete MutatingWebhookConfiguration {name}"))
        }
    }
}
