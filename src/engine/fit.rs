//! Whether a template's sidecars leave a pod's fate as it was: a pod that runs to completion
//! still completes, and a namespace that enforces Pod Security's `restricted` profile still
//! admits the pod. The words a template author (when a configuration is loaded) and a pod owner
//! (in an admission warning, `inject` and `explain`) read about it are written here, once.

use k8s_openapi::api::core::v1::{Container, SecurityContext};

use crate::engine::template::Fragment;

/// The note for a pod that runs to completion (`why`: its `restartPolicy`, or the Job it belongs
/// to) given a regular container: the pod keeps running after the application ends.
pub fn regular_sidecar_in_finite_pod(template: &str, container: &str, why: &str) -> String {
    format!(
        "template {template:?} adds {container:?} as a regular container to a pod that runs to completion ({why}): the pod does not finish while {container:?} runs, nor does a Job it belongs to; the template should make it a native sidecar (under initContainers, with restartPolicy: Always)"
    )
}

/// What a configuration's author is told once, when it is loaded, about template `name`
/// rendered for the plainest pod: each regular container (a Job's pod would never complete),
/// and each container or volume that a namespace enforcing `restricted` refuses.
pub fn advisories(name: &str, fragment: &Fragment) -> Vec<String> {
    let mut out = Vec::new();
    for c in &fragment.containers {
        out.push(format!(
            "template {name:?} adds {:?} as a regular container: a pod that runs to completion (a Job's, restartPolicy Never or OnFailure) does not finish while it runs; injected so, such pods are admitted with a warning. A native sidecar (under initContainers, with restartPolicy: Always) is stopped by the kubelet once the application has ended",
            c.name
        ));
    }
    for c in fragment.containers.iter().chain(&fragment.init_containers) {
        let problems = restricted_problems(c);
        if !problems.is_empty() {
            out.push(format!(
                "template {name:?}: container {:?} is refused in namespaces that enforce Pod Security \"restricted\" (pod-security.kubernetes.io/enforce): {}",
                c.name,
                problems.join("; ")
            ));
        }
    }
    for v in &fragment.volumes {
        let kinds = volume_kinds(v);
        let refused: Vec<&str> = kinds
            .iter()
            .map(String::as_str)
            .filter(|k| !RESTRICTED_VOLUMES.contains(k))
            .collect();
        if !refused.is_empty() {
            out.push(format!(
                "template {name:?}: volume {:?} is of type {}, which Pod Security \"restricted\" refuses (allowed: {})",
                v.name,
                refused.join(", "),
                RESTRICTED_VOLUMES.join(", ")
            ));
        }
    }
    out
}

/// The volume types the `restricted` profile admits.
const RESTRICTED_VOLUMES: &[&str] = &[
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
];

/// The one capability `restricted` lets a container add.
const ADDABLE: &str = "NET_BIND_SERVICE";

fn volume_kinds(v: &k8s_openapi::api::core::v1::Volume) -> Vec<String> {
    match serde_json::to_value(v) {
        Ok(serde_json::Value::Object(fields)) => fields
            .into_iter()
            .map(|(k, _)| k)
            .filter(|k| k != "name")
            .collect(),
        _ => Vec::new(),
    }
}

/// What of the `restricted` profile (Pod Security Standards) container `c` breaks by itself.
/// `runAsNonRoot` and `seccompProfile` may come from the pod instead: a container that sets
/// neither is admitted only in pods that do, so it is named too.
pub fn restricted_problems(c: &Container) -> Vec<String> {
    let none = SecurityContext::default();
    let sc = c.security_context.as_ref().unwrap_or(&none);
    let mut out = Vec::new();
    if sc.privileged == Some(true) {
        out.push("privileged: true".to_owned());
    }
    if sc.allow_privilege_escalation != Some(false) {
        out.push("allowPrivilegeEscalation is not false".to_owned());
    }
    let caps = sc.capabilities.as_ref();
    let added: Vec<&str> = caps
        .and_then(|c| c.add.as_ref())
        .into_iter()
        .flatten()
        .map(String::as_str)
        .filter(|c| *c != ADDABLE)
        .collect();
    if !added.is_empty() {
        out.push(format!(
            "capabilities.add has {} (only {ADDABLE} may be added)",
            added.join(", ")
        ));
    }
    let drops_all = caps
        .and_then(|c| c.drop.as_ref())
        .is_some_and(|d| d.iter().any(|c| c == "ALL"));
    if !drops_all {
        out.push("capabilities.drop does not include ALL".to_owned());
    }
    match (sc.run_as_non_root, sc.run_as_user) {
        (_, Some(0)) => out.push("runAsUser: 0 (root)".to_owned()),
        (Some(false), _) => out.push("runAsNonRoot: false".to_owned()),
        (None, _) => out.push(
            "runAsNonRoot is not set (admitted only where the pod sets runAsNonRoot: true)"
                .to_owned(),
        ),
        (Some(true), _) => {}
    }
    match sc.seccomp_profile.as_ref().map(|p| p.type_.as_str()) {
        Some("RuntimeDefault" | "Localhost") => {}
        Some(other) => out.push(format!("seccompProfile.type: {other}")),
        None => out.push(
            "seccompProfile is not set (admitted only where the pod sets RuntimeDefault or Localhost)"
                .to_owned(),
        ),
    }
    if sc
        .windows_options
        .as_ref()
        .and_then(|w| w.host_process)
        .unwrap_or(false)
    {
        out.push("windowsOptions.hostProcess: true".to_owned());
    }
    if sc.proc_mount.as_deref().is_some_and(|m| m != "Default") {
        out.push("procMount is not Default".to_owned());
    }
    let host_ports: Vec<String> = c
        .ports
        .iter()
        .flatten()
        .filter_map(|p| p.host_port.filter(|h| *h != 0))
        .map(|h| h.to_string())
        .collect();
    if !host_ports.is_empty() {
        out.push(format!("hostPort {}", host_ports.join(", ")));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn container(security_context: serde_json::Value) -> Container {
        serde_json::from_value(serde_json::json!({
            "name": "agent", "image": "agent:1", "securityContext": security_context
        }))
        .expect("a container")
    }

    fn compliant() -> serde_json::Value {
        serde_json::json!({
            "runAsNonRoot": true, "allowPrivilegeEscalation": false,
            "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]},
            "seccompProfile": {"type": "RuntimeDefault"}
        })
    }

    #[test]
    fn a_compliant_container_has_no_problem() {
        assert_eq!(
            restricted_problems(&container(compliant())),
            Vec::<String>::new()
        );
    }

    #[test]
    fn each_breach_of_restricted_is_named() {
        let mut sc = compliant();
        sc["privileged"] = true.into();
        sc["allowPrivilegeEscalation"] = true.into();
        sc["capabilities"]["add"] = serde_json::json!(["NET_ADMIN", "NET_BIND_SERVICE"]);
        sc["capabilities"]["drop"] = serde_json::json!([]);
        sc["runAsUser"] = 0.into();
        sc["seccompProfile"]["type"] = "Unconfined".into();
        let problems = restricted_problems(&container(sc));
        assert_eq!(
            problems,
            [
                "privileged: true",
                "allowPrivilegeEscalation is not false",
                "capabilities.add has NET_ADMIN (only NET_BIND_SERVICE may be added)",
                "capabilities.drop does not include ALL",
                "runAsUser: 0 (root)",
                "seccompProfile.type: Unconfined",
            ]
        );
        let bare = restricted_problems(&container(serde_json::json!({})));
        assert_eq!(bare.len(), 4, "{bare:?}");
        assert!(
            bare.iter().any(|p| p.contains("runAsNonRoot is not set")),
            "{bare:?}"
        );
    }

    #[test]
    fn regular_containers_and_refused_volumes_are_advised_once_each() {
        let fragment: Fragment = serde_json::from_value(serde_json::json!({
            "containers": [{"name": "agent", "image": "a:1", "securityContext": compliant()}],
            "initContainers": [{"name": "native", "image": "n:1", "restartPolicy": "Always",
                                "securityContext": compliant()}],
            "volumes": [{"name": "logs", "emptyDir": {}}, {"name": "host", "hostPath": {"path": "/var/log"}}]
        }))
        .expect("a fragment");
        let advice = advisories("audit", &fragment);
        assert_eq!(advice.len(), 2, "{advice:#?}");
        assert!(advice[0].starts_with("template \"audit\" adds \"agent\" as a regular container"));
        assert!(
            advice[1].contains("volume \"host\" is of type hostPath"),
            "{}",
            advice[1]
        );
    }
}
