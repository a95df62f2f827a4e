//! The keeper of the exported policies: both kept in step with the configuration served
//! (`serve --backstop`, and `serve --mutating-policy` in policy mode).
//!
//! The backstop (a ValidatingAdmissionPolicy with its bindings, [`export::backstop`]) and, in
//! policy mode, the MutatingAdmissionPolicy ([`export::mutating`]) are the export of the
//! configuration this server serves, so they are applied by the server itself: at start,
//! after every reload, and at every re-check (`--reload-interval`), whenever the objects in
//! the cluster are not the export of the configuration served (another digest in their
//! `sidecar-injector.io/config` annotation, or missing), and every five minutes anyway
//! (undoing a hand edit that kept the annotation; an apply that changes nothing writes
//! nothing). Every replica does so; replicas serving different configurations for a moment (a
//! rollout, a ConfigMap edit reaching the pods one after the other) may each apply theirs, and
//! that is harmless: the backstop holds a pod to its contract only when the pod was injected
//! under the same configuration or not at all ([`Status::config`](crate::engine::inject::Status)),
//! so neither version refuses what the other injects. Once every replica serves the same
//! files, the last apply is theirs.
//!
//! A failure (no rights, the API unreachable, a policy the API server refuses, a template the
//! mutating policy cannot express) is retried with a growing delay up to the re-check
//! interval, logged, counted in `sidecar_injector_backstop_syncs_total{result="error"}`, shown
//! by `sidecar_injector_backstop_in_step{policy} == 0`, and reported as a Warning event on the
//! server's pod when `SIDECAR_INJECTOR_POD_NAME` names it. Each policy is kept on its own: one
//! that fails does not keep the other from being applied. Webhooks are served all the while.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};

use super::routes::State;
use crate::engine::config::Injector;
use crate::export::{self, CONFIG_ANNOTATION, MutatingVersion, Selection};

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

/// What `serve` keeps in step: the backstop (`--backstop`), the MutatingAdmissionPolicy
/// (`--mutating-policy`, policy mode), or both.
#[derive(Clone, Debug)]
pub struct Policies {
    pub selection: Selection,
    /// Keep the backstop.
    pub backstop: bool,
    /// Keep the MutatingAdmissionPolicy too, in this API version.
    pub mutating: Option<MutatingApi>,
    /// The cluster-scoped object the policies are owned by: deleting it (`helm uninstall`)
    /// has the garbage collector delete them.
    pub owner: Option<Owner>,
    pub check_images: bool,
    /// How often the objects are checked when nothing changed.
    pub interval: Duration,
}

/// The API version the MutatingAdmissionPolicy is applied in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum MutatingApi {
    /// v1 where the API server serves it (Kubernetes 1.36+), else v1beta1 (1.34-1.35 with
    /// the MutatingAdmissionPolicy feature gate), asked of the API server at every check.
    Auto,
    V1,
    V1beta1,
}

/// The owner of the kept objects: `NAME` (a MutatingWebhookConfiguration, webhook mode) or
/// `ClusterRole/NAME` (policy mode, where there is no webhook configuration). Only
/// cluster-scoped owners: the policies are cluster-scoped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owner {
    pub api_version: &'static str,
    pub kind: &'static str,
    pub name: String,
}

impl std::str::FromStr for Owner {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (api_version, kind, name) = match s.split_once('/') {
            None => (
                "admissionregistration.k8s.io/v1",
                "MutatingWebhookConfiguration",
                s,
            ),
            Some(("MutatingWebhookConfiguration", n)) => (
                "admissionregistration.k8s.io/v1",
                "MutatingWebhookConfiguration",
                n,
            ),
            Some(("ClusterRole", n)) => ("rbac.authorization.k8s.io/v1", "ClusterRole", n),
            Some((kind, _)) => {
                return Err(format!(
                    "owner kind {kind:?}: use NAME (a MutatingWebhookConfiguration) or ClusterRole/NAME"
                ));
            }
        };
        if name.is_empty() {
            return Err("the owner has no name".into());
        }
        Ok(Self {
            api_version,
            kind,
            name: name.to_owned(),
        })
    }
}

fn resource(api_version: &str, kind: &str) -> ApiResource {
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind))
}

/// One exported policy with its bindings, as it is kept.
struct Set {
    /// The policy's name: the metric's label, and the prefix of its bindings' names.
    policy: String,
    docs: Vec<Value>,
}

/// Keeps the policies in step until the task is dropped.
pub async fn run(state: Arc<State>, policies: Policies) {
    let mut retry = FIRST_RETRY;
    let mut reported: Option<String> = None;
    let mut client = None;
    let mut applied_at: Option<tokio::time::Instant> = None;
    loop {
        let force = applied_at.is_none_or(|at| at.elapsed() >= REAPPLY);
        let inj = state.injector.load_full();
        let connected = match client {
            Some(ref c) => Ok(c),
            None => match kube::Client::try_default().await {
                Ok(c) => Ok(&*client.insert(c)),
                Err(e) => Err(format!(
                    "no Kubernetes client (in-cluster service account or KUBECONFIG): {e}"
                )),
            },
        };
        let mut failed = Vec::new();
        let mut applied = false;
        for (policy, outcome) in keep_all(
            connected.as_deref().map_err(String::as_str),
            &inj,
            &policies,
            force,
        )
        .await
        {
            match outcome {
                Ok(result) => {
                    state.metrics.backstop_sync(&policy, result);
                    if result == "applied" {
                        applied = true;
                        tracing::info!(%policy, config = %inj.digest, "policy applied: it is the export of the configuration served");
                    }
                }
                Err(error) => {
                    state.metrics.backstop_sync(&policy, "error");
                    let message = format!("{error:#}");
                    tracing::error!(%policy, error = %message, retry_in = ?retry, "cannot keep the policy in step with the configuration served");
                    failed.push((policy, message));
                }
            }
        }
        if applied {
            applied_at = Some(tokio::time::Instant::now());
        }
        let wait = if failed.is_empty() {
            if reported.take().is_some() {
                tracing::info!("policies in step again");
            }
            retry = FIRST_RETRY;
            policies.interval
        } else {
            let message = failed
                .iter()
                .map(|(p, m)| format!("{p}: {m}"))
                .collect::<Vec<_>>()
                .join("; ");
            if reported.as_deref() != Some(message.as_str()) {
                if let Some(client) = &client {
                    warn_event(client, &message).await;
                }
                reported = Some(message);
            }
            let wait = retry;
            retry = (retry * 2).min(policies.interval);
            wait
        };
        tokio::select! {
            () = state.config_changed.notified() => {}
            () = tokio::time::sleep(wait) => {}
        }
    }
}

/// Checks (and applies where needed) every kept policy; each has its own outcome, so that a
/// template the mutating policy cannot express does not keep the backstop from being applied.
async fn keep_all(
    client: Result<&kube::Client, &str>,
    inj: &Injector,
    policies: &Policies,
    force: bool,
) -> Vec<(String, anyhow::Result<&'static str>)> {
    let base = export::base_name(inj);
    // Each kept policy by name: the backstop (no API version), the mutating policy (its own).
    let mut kept: Vec<(String, Option<MutatingApi>)> = Vec::new();
    if policies.backstop {
        kept.push((format!("{base}-backstop"), None));
    }
    if let Some(api) = policies.mutating {
        kept.push((base, Some(api)));
    }
    let client = match client {
        Ok(c) => c,
        Err(error) => {
            return kept
                .into_iter()
                .map(|(n, _)| (n, Err(anyhow::anyhow!("{error}"))))
                .collect();
        }
    };
    let mut out = Vec::new();
    for (name, mutating) in kept {
        let outcome = async {
            let docs = match mutating {
                Some(api) => {
                    let version = match api {
                        MutatingApi::V1 => MutatingVersion::V1,
                        MutatingApi::V1beta1 => MutatingVersion::V1beta1,
                        MutatingApi::Auto => served_mutating_version(client).await?,
                    };
                    export::mutating(inj, &policies.selection, version).context(
                        "cannot export the MutatingAdmissionPolicy of the configuration served",
                    )?
                }
                None => export::backstop(inj, &policies.selection, policies.check_images)
                    .context("cannot export the backstop of the configuration served")?,
            };
            let set = Set {
                policy: name.clone(),
                docs,
            };
            sync(client, inj, set, policies.owner.as_ref(), force).await
        }
        .await;
        out.push((name, outcome));
    }
    out
}

/// The API version of MutatingAdmissionPolicy this API server serves: v1 if it does, else
/// v1beta1.
async fn served_mutating_version(client: &kube::Client) -> anyhow::Result<MutatingVersion> {
    for version in [MutatingVersion::V1, MutatingVersion::V1beta1] {
        let group = format!("admissionregistration.k8s.io/{}", version.as_str());
        if let Ok(list) = client.list_api_group_resources(&group).await
            && list
                .resources
                .iter()
                .any(|r| r.name == "mutatingadmissionpolicies")
        {
            return Ok(version);
        }
    }
    anyhow::bail!(
        "this API server serves no MutatingAdmissionPolicy (admissionregistration.k8s.io/v1 from \
         Kubernetes 1.36; v1beta1 on 1.34-1.35 with the MutatingAdmissionPolicy feature gate and \
         --runtime-config=admissionregistration.k8s.io/v1beta1=true)"
    )
}

/// One check of one policy and its bindings: `unchanged` when every object is the export of
/// `inj` (and `force` is not set), else `applied` once they are.
async fn sync(
    client: &kube::Client,
    inj: &Injector,
    set: Set,
    owner: Option<&Owner>,
    force: bool,
) -> anyhow::Result<&'static str> {
    let Set { policy, docs } = set;
    let api_of = |doc: &Value| -> Api<DynamicObject> {
        Api::all_with(
            client.clone(),
            &resource(
                doc["apiVersion"].as_str().unwrap_or_default(),
                doc["kind"].as_str().unwrap_or_default(),
            ),
        )
    };
    let name_of = |doc: &Value| doc["metadata"]["name"].as_str().unwrap_or("").to_owned();
    // Bindings of this policy the export no longer has (namespace opt-in or required
    // namespaces turned off).
    let binding = docs.get(1).map(api_of);
    let stale: Vec<String> = [
        policy.clone(),
        format!("{policy}-namespace"),
        format!("{policy}-required"),
    ]
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
    if let Some(bindings) = &binding {
        for name in &stale {
            if bindings.get_opt(name).await?.is_some() {
                in_step = false;
            }
        }
    }
    if in_step && !force {
        return Ok("unchanged");
    }
    // The owner's uid is read only when something is applied.
    let owner = match owner {
        Some(owner) => Some(owner_reference(client, owner).await?),
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
    if let Some(bindings) = &binding {
        for name in &stale {
            match bindings.delete(name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(e).with_context(|| format!("cannot delete binding {name}")),
            }
        }
    }
    Ok("applied")
}

/// An owner reference to `owner`, with its uid.
async fn owner_reference(client: &kube::Client, owner: &Owner) -> anyhow::Result<Value> {
    let api: Api<DynamicObject> =
        Api::all_with(client.clone(), &resource(owner.api_version, owner.kind));
    let object = api.get(&owner.name).await.with_context(|| {
        format!(
            "cannot read {} {} (the policies' owner)",
            owner.kind, owner.name
        )
    })?;
    let uid = object
        .metadata
        .uid
        .with_context(|| format!("{} {} has no uid", owner.kind, owner.name))?;
    Ok(json!({
        "apiVersion": owner.api_version,
        "kind": owner.kind,
        "name": owner.name,
        "uid": uid,
    }))
}

/// A Warning event on the server's pod, when it knows its name; a failure to write it is only
/// logged (the metric and the log line already say what failed).
async fn warn_event(client: &kube::Client, message: &str) {
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
        "message": format!("a policy is not the export of the configuration served: {message}"),
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

#[cfg(test)]
mod tests {
    use super::Owner;

    #[test]
    fn owners_are_named_with_their_kind() {
        let mwc: Owner = "injector".parse().unwrap();
        assert_eq!(
            (mwc.kind, mwc.api_version, mwc.name.as_str()),
            (
                "MutatingWebhookConfiguration",
                "admissionregistration.k8s.io/v1",
                "injector"
            )
        );
        let role: Owner = "ClusterRole/injector-backstop".parse().unwrap();
        assert_eq!(
            (role.kind, role.api_version, role.name.as_str()),
            (
                "ClusterRole",
                "rbac.authorization.k8s.io/v1",
                "injector-backstop"
            )
        );
        assert!(
            "ConfigMap/x"
                .parse::<Owner>()
                .unwrap_err()
                .contains("ConfigMap")
        );
        assert!("ClusterRole/".parse::<Owner>().is_err());
    }
}
