//! Keeping the backstop in step with the configuration served (`serve --backstop`).
//!
//! The backstop (a ValidatingAdmissionPolicy with its bindings, [`policy::backstop`]) is the
//! export of the configuration this server serves, so it is applied by the server itself: at
//! start, after every reload, and at every re-check (`--reload-interval`), whenever the
//! objects in the cluster are not the export of the configuration served (another digest in
//! their `sidecar-injector.io/config` annotation, or missing), and every five minutes anyway
//! (undoing a hand edit that kept the annotation; an apply that changes nothing writes nothing). Every replica does so; replicas
//! serving different configurations for a moment (a rollout, a ConfigMap edit reaching the
//! pods one after the other) may each apply theirs, and that is harmless: the backstop holds a
//! pod to its contract only when the pod was injected under the same configuration or not at
//! all ([`Status::config`](crate::engine::inject::Status)), so neither version refuses what the
//! other injects. Once every replica serves the same files, the last apply is theirs.
//!
//! A failure (no rights, the API unreachable, a policy the API server refuses) is retried with
//! a growing delay up to the re-check interval, logged, counted in
//! `sidecar_injector_backstop_syncs_total{result="error"}`, shown by
//! `sidecar_injector_backstop_in_step == 0`, and reported as a Warning event on the server's
//! pod when `SIDECAR_INJECTOR_POD_NAME` names it. Webhooks are served all the while.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};

use super::routes::State;
use crate::engine::config::Injector;
use crate::engine::policy::{self, CONFIG_ANNOTATION, Selection};

/// Field manager of the server's applies: `managedFields` say who wrote the backstop.
const MANAGER: &str = "sidecar-injector";
/// The environment variable naming the server's pod (the downward API), for events.
const POD_NAME_ENV: &str = "SIDECAR_INJECTOR_POD_NAME";
/// First delay after a failure; doubled each time, up to the re-check interval.
const FIRST_RETRY: Duration = Duration::from_secs(1);
/// How often the objects are applied even when their annotation says they are in step, so
/// that a hand edit that kept the annotation is undone (an apply that changes nothing writes
/// nothing).
const REAPPLY: Duration = Duration::from_secs(300);

/// What `serve --backstop` keeps in step, and how.
#[derive(Clone, Debug)]
pub struct Backstop {
    pub selection: Selection,
    /// The MutatingWebhookConfiguration the objects are owned by: deleting it (`helm
    /// uninstall`) has the garbage collector delete them.
    pub owner: Option<String>,
    pub check_images: bool,
    /// How often the objects are checked when nothing changed.
    pub interval: Duration,
}

fn resource(kind: &str) -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(
        "admissionregistration.k8s.io",
        "v1",
        kind,
    ))
}

/// Keeps the backstop in step until the task is dropped.
pub async fn run(state: Arc<State>, backstop: Backstop) {
    let mut retry = FIRST_RETRY;
    let mut reported: Option<String> = None;
    let mut client = None;
    let mut applied_at: Option<tokio::time::Instant> = None;
    loop {
        let force = applied_at.is_none_or(|at| at.elapsed() >= REAPPLY);
        let inj = state.injector.load_full();
        let policy = format!("{}-backstop", policy::base_name(&inj));
        let outcome = async {
            let client =
                match &client {
                    Some(c) => c,
                    None => client.insert(kube::Client::try_default().await.context(
                        "no Kubernetes client (in-cluster service account or KUBECONFIG)",
                    )?),
                };
            sync(client, &inj, &backstop, force).await
        }
        .await;
        let wait = match outcome {
            Ok(result) => {
                if result == "applied" {
                    applied_at = Some(tokio::time::Instant::now());
                }
                state.metrics.backstop_sync(&policy, result);
                if result == "applied" {
                    tracing::info!(%policy, config = %inj.digest, "backstop applied: it is the export of the configuration served");
                }
                if reported.take().is_some() {
                    tracing::info!(%policy, "backstop in step again");
                }
                retry = FIRST_RETRY;
                backstop.interval
            }
            Err(error) => {
                state.metrics.backstop_sync(&policy, "error");
                let message = format!("{error:#}");
                tracing::error!(%policy, error = %message, retry_in = ?retry, "cannot keep the backstop in step with the configuration served");
                if reported.as_deref() != Some(message.as_str()) {
                    if let Some(client) = &client {
                        warn_event(client, &policy, &message).await;
                    }
                    reported = Some(message);
                }
                let wait = retry;
                retry = (retry * 2).min(backstop.interval);
                wait
            }
        };
        tokio::select! {
            () = state.config_changed.notified() => {}
            () = tokio::time::sleep(wait) => {}
        }
    }
}

/// One check: `unchanged` when every object is the export of `inj` (and `force` is not
/// set), else `applied` once they are.
async fn sync(
    client: &kube::Client,
    inj: &Injector,
    backstop: &Backstop,
    force: bool,
) -> anyhow::Result<&'static str> {
    let docs = policy::backstop(inj, &backstop.selection, backstop.check_images)
        .context("cannot export the backstop of the configuration served")?;
    let policies: Api<DynamicObject> =
        Api::all_with(client.clone(), &resource("ValidatingAdmissionPolicy"));
    let bindings: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &resource("ValidatingAdmissionPolicyBinding"),
    );
    let api_of = |doc: &Value| match doc["kind"].as_str() {
        Some("ValidatingAdmissionPolicy") => &policies,
        _ => &bindings,
    };
    let name_of = |doc: &Value| doc["metadata"]["name"].as_str().unwrap_or("").to_owned();
    // Bindings of this backstop the export no longer has (namespace opt-in turned off).
    let base = format!("{}-backstop", policy::base_name(inj));
    let stale: Vec<String> = [base.clone(), format!("{base}-namespace")]
        .into_iter()
        .filter(|n| !docs.iter().skip(1).any(|d| name_of(d) == *n))
        .collect();
    let mut in_step = true;
    for doc in &docs {
        let name = name_of(doc);
        let live = api_of(doc)
            .get_opt(&name)
            .await
            .with_context(|| format!("cannot read {} {name}", doc["kind"]))?;
        let digest = live
            .as_ref()
            .and_then(|o| o.metadata.annotations.as_ref())
            .and_then(|a| a.get(CONFIG_ANNOTATION));
        if digest != Some(&inj.digest) {
            in_step = false;
        }
    }
    for name in &stale {
        if bindings.get_opt(name).await?.is_some() {
            in_step = false;
        }
    }
    if in_step && !force {
        return Ok("unchanged");
    }
    let owner = match &backstop.owner {
        Some(name) => Some(owner_reference(client, name).await?),
        None => None,
    };
    for mut doc in docs {
        let name = name_of(&doc);
        if let Some(owner) = &owner {
            doc["metadata"]["ownerReferences"] = json!([owner]);
        }
        let kind = doc["kind"].as_str().unwrap_or("").to_owned();
        api_of(&doc)
            .patch(
                &name,
                &PatchParams::apply(MANAGER).force(),
                &Patch::Apply(&doc),
            )
            .await
            .with_context(|| format!("cannot apply {kind} {name}"))?;
    }
    for name in &stale {
        match bindings.delete(name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => {
                return Err(e).with_context(|| {
                    format!("cannot delete ValidatingAdmissionPolicyBinding {name}")
                });
            }
        }
    }
    Ok("applied")
}

/// An owner reference to the MutatingWebhookConfiguration `name`.
async fn owner_reference(client: &kube::Client, name: &str) -> anyhow::Result<Value> {
    let api: Api<DynamicObject> =
        Api::all_with(client.clone(), &resource("MutatingWebhookConfiguration"));
    let owner = api.get(name).await.with_context(|| {
        format!("cannot read MutatingWebhookConfiguration {name} (--backstop-owner)")
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

/// A Warning event on the server's pod, when it knows its name; a failure to write it is only
/// logged (the metric and the log line already say what failed).
async fn warn_event(client: &kube::Client, policy: &str, message: &str) {
    let (Ok(pod), Some(namespace)) = (std::env::var(POD_NAME_ENV), crate::load::own_namespace())
    else {
        return;
    };
    let now =
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now());
    let event: k8s_openapi::api::core::v1::Event = match serde_json::from_value(json!({
        "metadata": {"generateName": format!("{pod}.backstop-")},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": pod, "namespace": namespace},
        "reason": "BackstopSyncFailed",
        "message": format!("the backstop {policy} is not the export of the configuration served: {message}"),
        "type": "Warning",
        "source": {"component": MANAGER},
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    })) {
        Ok(event) => event,
        Err(error) => return tracing::warn!(%error, "cannot write the backstop event"),
    };
    let events: Api<k8s_openapi::api::core::v1::Event> =
        Api::namespaced(client.clone(), &namespace);
    if let Err(error) = events.create(&PostParams::default(), &event).await {
        tracing::warn!(%error, "cannot record the backstop event");
    }
}
