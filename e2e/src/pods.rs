//! Pods the scenarios create, and what an injected or untouched pod looks like once stored.
//!
//! The expectations follow the bundled templates (`templates/`): `log-shipper` and `proxy` are
//! native sidecars (init containers with `restartPolicy: Always`), in that order (the default
//! templates'), placed before the pod's own init containers; the log shipper brings the volume
//! `sidecar-logs`, mounted with `APP_LOG_DIR` into application containers, and the proxy gives
//! them `SIDECAR_PROXY_PORT`.

use anyhow::ensure;
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use kube::api::ObjectMeta;
use serde_json::json;

pub const INJECT_LABEL: &str = "sidecar-injector.io/inject";
pub const TEMPLATES_ANNOTATION: &str = "sidecar-injector.io/templates";
pub const STATUS_ANNOTATION: &str = "sidecar-injector.io/status";
/// The image of every container the suite writes itself: `E2E_APP_IMAGE`, or the pause image
/// (without a node nothing pulls it; e2e/node/run.sh names an image imported into its node).
pub fn app_image() -> String {
    std::env::var("E2E_APP_IMAGE")
        .ok()
        .filter(|i| !i.is_empty())
        .unwrap_or_else(|| "registry.k8s.io/pause:3.10".into())
}
/// Names the revision that injects a pod (on the pod or the namespace that opts in).
pub const REVISION_LABEL: &str = "sidecar-injector.io/rev";
/// The inject label's value on a namespace whose pods are all injected.
pub const NAMESPACE_ENABLED: &str = "enabled";
pub const PROXY: &str = "proxy";
pub const LOG_SHIPPER: &str = "log-shipper";
pub const LOGS_VOLUME: &str = "sidecar-logs";
pub const LOG_DIR: &str = "/var/log/app";
pub const PROXY_PORT: &str = "15001";
/// Names of containers that are sidecars, not application containers, in the order the
/// default templates place them at the head of the init containers.
pub const SIDECARS: &[&str] = &[LOG_SHIPPER, PROXY];

/// A pod with one application container and one init container of its own; no labels.
pub fn app_pod(name: &str) -> Pod {
    let container = |name: &str| Container {
        name: name.into(),
        image: Some(app_image()),
        ..Default::default()
    };
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some([("app".to_owned(), name.to_owned())].into()),
            ..Default::default()
        },
        spec: Some(PodSpec {
            init_containers: Some(vec![container("app-init")]),
            containers: vec![container("app")],
            termination_grace_period_seconds: Some(0),
            ..Default::default()
        }),
        status: None,
    }
}

/// `app_pod` carrying the opt-in label.
pub fn opted_in(name: &str) -> Pod {
    labelled(app_pod(name), INJECT_LABEL, "true")
}

pub fn labelled(mut pod: Pod, key: &str, value: &str) -> Pod {
    pod.metadata
        .labels
        .get_or_insert_with(Default::default)
        .insert(key.into(), value.into());
    pod
}

pub fn annotated(mut pod: Pod, key: &str, value: &str) -> Pod {
    pod.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(key.into(), value.into());
    pod
}

/// Builds a typed object from JSON written in a test.
pub fn from_json<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> anyhow::Result<T> {
    serde_json::from_value(value)
        .map_err(|e| anyhow::anyhow!("test object does not deserialize: {e}"))
}

pub fn containers(pod: &Pod) -> &[Container] {
    pod.spec.as_ref().map_or(&[], |s| s.containers.as_slice())
}

pub fn init_containers(pod: &Pod) -> &[Container] {
    pod.spec
        .as_ref()
        .and_then(|s| s.init_containers.as_deref())
        .unwrap_or_default()
}

fn names(list: &[Container]) -> Vec<&str> {
    list.iter().map(|c| c.name.as_str()).collect()
}

/// How many containers and init containers are called `name`.
pub fn count_named(pod: &Pod, name: &str) -> usize {
    containers(pod)
        .iter()
        .chain(init_containers(pod))
        .filter(|c| c.name == name)
        .count()
}

pub fn volume_count(pod: &Pod, name: &str) -> usize {
    pod.spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .map_or(0, |v| v.iter().filter(|v| v.name == name).count())
}

pub fn env_value<'a>(container: &'a Container, name: &str) -> Option<&'a str> {
    container
        .env
        .iter()
        .flatten()
        .find(|e| e.name == name)
        .map(|e| e.value.as_deref().unwrap_or_default())
}

fn has_logs_mount(container: &Container) -> bool {
    container
        .volume_mounts
        .iter()
        .flatten()
        .any(|m| m.name == LOGS_VOLUME && m.mount_path == LOG_DIR)
}

/// Application containers (containers that are not sidecars).
pub fn app_containers(pod: &Pod) -> impl Iterator<Item = &Container> {
    containers(pod)
        .iter()
        .filter(|c| !SIDECARS.contains(&c.name.as_str()))
}

pub fn status_annotation(pod: &Pod) -> Option<&str> {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(STATUS_ANNOTATION))
        .map(String::as_str)
}

/// The application container `name` got what the templates give every application container.
pub fn check_app_container_injected(pod: &Pod, name: &str) -> anyhow::Result<()> {
    let c = containers(pod)
        .iter()
        .find(|c| c.name == name)
        .ok_or_else(|| anyhow::anyhow!("no container {name:?} in {:?}", names(containers(pod))))?;
    ensure!(
        env_value(c, "APP_LOG_DIR") == Some(LOG_DIR),
        "container {name:?} lacks APP_LOG_DIR={LOG_DIR}: env {:?}",
        c.env
    );
    ensure!(
        env_value(c, "SIDECAR_PROXY_PORT") == Some(PROXY_PORT),
        "container {name:?} lacks SIDECAR_PROXY_PORT={PROXY_PORT}: env {:?}",
        c.env
    );
    ensure!(
        has_logs_mount(c),
        "container {name:?} lacks the {LOGS_VOLUME} mount at {LOG_DIR}: {:?}",
        c.volume_mounts
    );
    let env_names: Vec<&str> = c.env.iter().flatten().map(|e| e.name.as_str()).collect();
    for n in &env_names {
        ensure!(
            env_names.iter().filter(|m| *m == n).count() == 1,
            "container {name:?} has env {n} twice"
        );
    }
    Ok(())
}

/// The stored pod carries both default templates exactly once, in the right places, and the
/// status annotation.
pub fn check_injected(pod: &Pod) -> anyhow::Result<()> {
    let init = init_containers(pod);
    let pod_name = pod.metadata.name.as_deref().unwrap_or("<unnamed>");
    ensure!(
        count_named(pod, PROXY) == 1 && count_named(pod, LOG_SHIPPER) == 1,
        "pod {pod_name}: expected one proxy and one log-shipper, got init {:?}, containers {:?}",
        names(init),
        names(containers(pod))
    );
    for (i, sidecar) in SIDECARS.iter().enumerate() {
        let c = init.get(i).filter(|c| c.name == *sidecar).ok_or_else(|| {
            anyhow::anyhow!(
                "pod {pod_name}: {sidecar} is not init container #{i}: {:?}",
                names(init)
            )
        })?;
        ensure!(
            c.restart_policy.as_deref() == Some("Always"),
            "pod {pod_name}: {sidecar} is not a native sidecar (restartPolicy {:?})",
            c.restart_policy
        );
    }
    ensure!(
        volume_count(pod, LOGS_VOLUME) == 1,
        "pod {pod_name}: expected one volume {LOGS_VOLUME}"
    );
    let apps: Vec<&str> = app_containers(pod).map(|c| c.name.as_str()).collect();
    ensure!(!apps.is_empty(), "pod {pod_name}: no application container");
    for app in apps {
        check_app_container_injected(pod, app)?;
    }
    let status = status_annotation(pod)
        .ok_or_else(|| anyhow::anyhow!("pod {pod_name}: no {STATUS_ANNOTATION} annotation"))?;
    let status: serde_json::Value = serde_json::from_str(status)?;
    ensure!(
        status["templates"] == json!([LOG_SHIPPER, PROXY]),
        "pod {pod_name}: status annotation lists {}",
        status["templates"]
    );
    ensure!(
        status["hash"].as_str().is_some_and(|h| !h.is_empty()),
        "pod {pod_name}: status annotation has no hash: {status}"
    );
    Ok(())
}

/// The pod's own init containers come after the native sidecars (those of [`SIDECARS`] the
/// pod has as init containers, in that order), in their original order.
pub fn check_own_init_after_sidecars(pod: &Pod, own: &[&str]) -> anyhow::Result<()> {
    let init = names(init_containers(pod));
    let mut expected: Vec<&str> = SIDECARS
        .iter()
        .copied()
        .filter(|s| init.contains(s))
        .collect();
    expected.extend_from_slice(own);
    ensure!(
        init == expected,
        "init containers are {init:?}, expected {expected:?}"
    );
    Ok(())
}

/// Nothing of the injector's is on the stored pod.
pub fn check_untouched(pod: &Pod) -> anyhow::Result<()> {
    let pod_name = pod.metadata.name.as_deref().unwrap_or("<unnamed>");
    for sidecar in SIDECARS {
        ensure!(
            count_named(pod, sidecar) == 0,
            "pod {pod_name} got sidecar {sidecar}"
        );
    }
    ensure!(
        volume_count(pod, LOGS_VOLUME) == 0,
        "pod {pod_name} got volume {LOGS_VOLUME}"
    );
    ensure!(
        status_annotation(pod).is_none(),
        "pod {pod_name} got the status annotation"
    );
    for c in containers(pod) {
        ensure!(
            env_value(c, "APP_LOG_DIR").is_none() && env_value(c, "SIDECAR_PROXY_PORT").is_none(),
            "pod {pod_name}: container {} got the injector's env",
            c.name
        );
        ensure!(
            !has_logs_mount(c),
            "pod {pod_name}: container {} got the logs mount",
            c.name
        );
    }
    Ok(())
}

fn is_token_volume(name: &str) -> bool {
    name.starts_with("kube-api-access-")
}

/// Removes the ServiceAccount token mount the apiserver adds (its volume has a random name; the
/// apiserver adds a new one when the container is used in another pod).
pub fn without_token_mount(mut c: Container) -> Container {
    if let Some(mounts) = c.volume_mounts.as_mut() {
        mounts.retain(|m| !is_token_volume(&m.name));
    }
    c
}

/// A pod to create again from what the apiserver returned for another one: its name, labels,
/// annotations and spec, minus what admission plugins compute themselves (the ServiceAccount
/// token volume, priority).
pub fn recreate_from(stored: &Pod, name: &str) -> Pod {
    let mut pod = Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: stored.metadata.labels.clone(),
            annotations: stored.metadata.annotations.clone(),
            ..Default::default()
        },
        spec: stored.spec.clone(),
        status: None,
    };
    if let Some(spec) = pod.spec.as_mut() {
        if let Some(volumes) = spec.volumes.as_mut() {
            volumes.retain(|v| !is_token_volume(&v.name));
        }
        spec.containers = std::mem::take(&mut spec.containers)
            .into_iter()
            .map(without_token_mount)
            .collect();
        spec.init_containers = spec
            .init_containers
            .take()
            .map(|cs| cs.into_iter().map(without_token_mount).collect());
        spec.node_name = None;
        // Computed by the Priority admission plugin, which refuses a pod that sets them itself.
        spec.priority = None;
        spec.preemption_policy = None;
    }
    pod
}

/// The status annotation, parsed.
pub fn status(pod: &Pod) -> anyhow::Result<serde_json::Value> {
    let text = status_annotation(pod).ok_or_else(|| anyhow::anyhow!("no status annotation"))?;
    Ok(serde_json::from_str(text)?)
}

/// `app_pod` whose application container declares these TCP ports.
pub fn with_ports(mut pod: Pod, ports: &[i32]) -> Pod {
    if let Some(c) = pod.spec.as_mut().and_then(|s| s.containers.first_mut()) {
        c.ports = Some(
            ports
                .iter()
                .map(|p| k8s_openapi::api::core::v1::ContainerPort {
                    container_port: *p,
                    protocol: Some("TCP".into()),
                    ..Default::default()
                })
                .collect(),
        );
    }
    pod
}

/// The injected proxy's Envoy configuration (its `--config-yaml` argument): the application
/// ports its clusters route to, and the ports its listeners listen on.
pub fn proxy_routes(pod: &Pod) -> anyhow::Result<(Vec<u64>, Vec<u64>)> {
    let proxy = init_containers(pod)
        .iter()
        .find(|c| c.name == PROXY)
        .ok_or_else(|| anyhow::anyhow!("no proxy"))?;
    let args = proxy.args.clone().unwrap_or_default();
    let position = args
        .iter()
        .position(|a| a == "--config-yaml")
        .ok_or_else(|| anyhow::anyhow!("the proxy has no --config-yaml: {args:?}"))?;
    let config: serde_json::Value = serde_json::from_str(
        args.get(position + 1)
            .ok_or_else(|| anyhow::anyhow!("--config-yaml has no value"))?,
    )?;
    let port = |v: &serde_json::Value, pointer: &str| v.pointer(pointer).and_then(|p| p.as_u64());
    let resources = &config["static_resources"];
    let clusters = resources["clusters"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| {
            port(
                c,
                "/load_assignment/endpoints/0/lb_endpoints/0/endpoint/address/socket_address/port_value",
            )
        })
        .collect();
    let listeners = resources["listeners"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|l| port(l, "/address/socket_address/port_value"))
        .collect();
    Ok((clusters, listeners))
}
