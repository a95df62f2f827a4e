//! The cluster side of `outdated`: list what is judged, read the chart's ConfigMap, restart a
//! workload and follow its rollout. Everything decided here comes from the pure modules.

use std::time::Duration;

use anyhow::Context as _;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod};
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;

use crate::diagnose::outdated::report::NamespaceLabels;
use crate::diagnose::outdated::workload::{
    Owners, Rollout, Workload, daemonset_rollout, deployment_rollout, restart_patch,
    statefulset_rollout,
};
use crate::engine::config::Injector;

/// Page size of list calls: bounded memory per response on large clusters.
const PAGE: u32 = 500;
/// How often a rollout is looked at.
const POLL: Duration = Duration::from_secs(1);
/// Field manager named on patches, so `managedFields` say who restarted a workload.
const MANAGER: &str = "sidecar-injector-outdated";

fn api<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    <K as Resource>::DynamicType: Default,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

async fn list_all<K>(client: &Client, namespace: Option<&str>, what: &str) -> anyhow::Result<Vec<K>>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug,
    <K as Resource>::DynamicType: Default,
{
    let api: Api<K> = api(client, namespace);
    let mut items = Vec::new();
    let mut params = ListParams::default().limit(PAGE);
    loop {
        let page = api.list(&params).await.with_context(|| {
            format!(
                "cannot list {what} in {}",
                namespace.map_or("all namespaces".into(), |ns| format!("namespace {ns}"))
            )
        })?;
        items.extend(page.items);
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(items),
        }
    }
}

/// Every pod in scope, and the owners needed to name their workloads.
pub async fn pods_and_owners(
    client: &Client,
    namespace: Option<&str>,
) -> anyhow::Result<(Vec<Pod>, Owners)> {
    let pods: Vec<Pod> = list_all(client, namespace, "pods").await?;
    let replica_sets: Vec<ReplicaSet> = list_all(client, namespace, "replicasets").await?;
    let jobs: Vec<Job> = list_all(client, namespace, "jobs").await?;
    Ok((pods, Owners::new(&replica_sets, &jobs)))
}

/// The labels of the namespaces in scope: they decide which webhook entry (the pod's label or
/// its namespace's) opts a pod in. Namespaces are read, never changed.
pub async fn namespace_labels(
    client: &Client,
    namespace: Option<&str>,
) -> anyhow::Result<NamespaceLabels> {
    let api: Api<Namespace> = Api::all(client.clone());
    let labels = |ns: Namespace| {
        (
            ns.metadata.name.unwrap_or_default(),
            ns.metadata.labels.unwrap_or_default(),
        )
    };
    if let Some(name) = namespace {
        let ns = api
            .get(name)
            .await
            .with_context(|| format!("cannot read namespace {name}"))?;
        return Ok([labels(ns)].into_iter().collect());
    }
    let mut out = NamespaceLabels::new();
    let mut params = ListParams::default().limit(PAGE);
    loop {
        let page = api.list(&params).await.context("cannot list namespaces")?;
        out.extend(page.items.into_iter().map(labels));
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(out),
        }
    }
}

/// The configuration in the chart's ConfigMap. The injector's own namespace is the
/// ConfigMap's: the chart installs both in the release namespace.
pub async fn configmap_injector(
    client: &Client,
    (namespace, name): (&str, &str),
) -> anyhow::Result<Injector> {
    let reference = format!("{namespace}/{name}");
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let cm = api
        .get(name)
        .await
        .with_context(|| format!("cannot read ConfigMap {reference}"))?;
    let data = cm.data.unwrap_or_default();
    Ok(crate::load::from_configmap_data(
        &format!("ConfigMap {reference}"),
        &data,
        Some(namespace.to_owned()),
    )?)
}

/// Restarts `workload` as `kubectl rollout restart` does. With `dry_run` the API server checks
/// the patch (and the caller's permission) and stores nothing.
pub async fn restart(
    client: &Client,
    workload: &Workload,
    now: &str,
    dry_run: bool,
) -> anyhow::Result<()> {
    let params = PatchParams {
        dry_run,
        field_manager: Some(MANAGER.into()),
        ..PatchParams::default()
    };
    let patch = Patch::Merge(restart_patch(now));
    let ns = Some(workload.namespace.as_str());
    let name = workload.name.as_str();
    let result = match workload.kind.as_str() {
        "Deployment" => api::<Deployment>(client, ns)
            .patch(name, &params, &patch)
            .await
            .map(drop),
        "StatefulSet" => api::<StatefulSet>(client, ns)
            .patch(name, &params, &patch)
            .await
            .map(drop),
        "DaemonSet" => api::<DaemonSet>(client, ns)
            .patch(name, &params, &patch)
            .await
            .map(drop),
        other => anyhow::bail!("{other} cannot be restarted"),
    };
    result.with_context(|| format!("cannot restart {}/{workload}", workload.namespace))
}

/// Where the rollout of `workload` stands now.
pub async fn rollout(client: &Client, workload: &Workload) -> anyhow::Result<Rollout> {
    let ns = Some(workload.namespace.as_str());
    let name = workload.name.as_str();
    let what = || format!("cannot read {}/{workload}", workload.namespace);
    Ok(match workload.kind.as_str() {
        "Deployment" => deployment_rollout(
            &api::<Deployment>(client, ns)
                .get(name)
                .await
                .with_context(what)?,
        ),
        "StatefulSet" => statefulset_rollout(
            &api::<StatefulSet>(client, ns)
                .get(name)
                .await
                .with_context(what)?,
        ),
        "DaemonSet" => daemonset_rollout(
            &api::<DaemonSet>(client, ns)
                .get(name)
                .await
                .with_context(what)?,
        ),
        other => anyhow::bail!("{other} has no rollout"),
    })
}

/// Follows the rollout of `workload` until it is done, fails, or `timeout` passes; returns the
/// last state seen.
pub async fn wait_for_rollout(
    client: &Client,
    workload: &Workload,
    timeout: Duration,
) -> anyhow::Result<Rollout> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let state = rollout(client, workload).await?;
        if !matches!(state, Rollout::Waiting(_)) || tokio::time::Instant::now() >= deadline {
            return Ok(state);
        }
        tokio::time::sleep(POLL).await;
    }
}
