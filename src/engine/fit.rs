//! Whether a template's sidecars leave a pod's fate as it was: a pod that runs to completion
//! still completes, a namespace that enforces Pod Security's `restricted` profile still
//! admits the pod, a `Guaranteed` pod stays so, and no sidecar takes a port the pod uses. The
//! words a template author (when a configuration is loaded) and a pod owner (in an admission
//! warning, `inject` and `explain`) read about it are written here, once.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Container, SecurityContext};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::engine::template::{Fragment, Guaranteed};
use crate::engine::view::PodView;

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

/// The resources a pod's QoS class is decided on.
const QOS_RESOURCES: [&str; 2] = ["cpu", "memory"];

/// Two quantities as Kubernetes compares them (`1` and `1000m` are equal). The plain forms
/// the API server writes (digits and a suffix) are compared as numbers; others are parsed.
fn same_quantity(a: &str, b: &str) -> bool {
    use kube_quantity::ParsedQuantity;
    if a == b {
        return true;
    }
    if let (Some(a), Some(b)) = (plain_quantity(a), plain_quantity(b)) {
        return a == b;
    }
    match (ParsedQuantity::try_from(a), ParsedQuantity::try_from(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

/// A quantity written as whole digits and one of the usual suffixes, in thousandths of its
/// unit: the forms the API server writes for cpu and memory; `None` for any other form.
fn plain_quantity(q: &str) -> Option<u128> {
    let split = q.find(|c: char| !c.is_ascii_digit()).unwrap_or(q.len());
    let (digits, suffix) = q.split_at(split);
    if digits.is_empty() || digits.len() > 18 {
        return None;
    }
    let n: u128 = digits.parse().ok()?;
    let scale: u128 = match suffix {
        "m" => 1,
        "" => 1_000,
        "k" => 1_000_000,
        "M" => 1_000_000_000,
        "G" => 1_000_000_000_000,
        "T" => 1_000_000_000_000_000,
        "Ki" => 1_000 << 10,
        "Mi" => 1_000 << 20,
        "Gi" => 1_000 << 30,
        "Ti" => 1_000 << 40,
        _ => return None,
    };
    n.checked_mul(scale)
}

/// Whether requirements written as `json` (a container's or the pod's `resources`) are of the
/// Guaranteed kind: a cpu and a memory limit, and requests, where given, equal to them (the
/// API server sets a missing request to its limit).
fn guaranteed_resources(json: Option<&str>) -> bool {
    let Some(json) = json else { return false };
    let judge = |[requests, limits]: [[Option<&str>; 2]; 2]| {
        (0..QOS_RESOURCES.len()).all(|i| match (limits[i], requests[i]) {
            (Some(limit), Some(request)) => same_quantity(limit, request),
            (Some(_), None) => true,
            (None, _) => false,
        })
    };
    if let Some(amounts) = plain_amounts(json) {
        return judge(amounts);
    }
    let Ok(lists) = crate::engine::view::resource_amounts(json) else {
        return false;
    };
    judge(
        lists
            .each_ref()
            .map(|list| list.each_ref().map(|a| a.as_deref())),
    )
}

/// [`crate::engine::view::resource_amounts`] of the form the API server writes, read in one
/// step over the bytes: an object of `requests` and `limits` (any order), each an object of
/// strings without escapes, no whitespace. `None` for any other form (it is read then).
fn plain_amounts(json: &str) -> Option<[[Option<&str>; 2]; 2]> {
    let b = json.as_bytes();
    let mut at = 0;
    // A string without escapes at `at` (its opening quote), and the index after it.
    let string = |at: usize| -> Option<(&str, usize)> {
        if b.get(at) != Some(&b'"') {
            return None;
        }
        let len = b[at + 1..].iter().position(|&c| c == b'"' || c == b'\\')?;
        let end = at + 1 + len;
        (b[end] == b'"').then(|| (&json[at + 1..end], end + 1))
    };
    let mut out: [[Option<&str>; 2]; 2] = Default::default();
    if b.first() != Some(&b'{') {
        return None;
    }
    at += 1;
    if b.get(at) == Some(&b'}') {
        return (at + 1 == b.len()).then_some(out);
    }
    loop {
        let (list, next) = string(at)?;
        let slot = match list {
            "requests" => 0,
            "limits" => 1,
            _ => return None,
        };
        if b.get(next) != Some(&b':') || b.get(next + 1) != Some(&b'{') {
            return None;
        }
        at = next + 2;
        if b.get(at) == Some(&b'}') {
            at += 1;
        } else {
            loop {
                let (resource, next) = string(at)?;
                if b.get(next) != Some(&b':') {
                    return None;
                }
                let (amount, next) = string(next + 1)?;
                match resource {
                    "cpu" => out[slot][0] = Some(amount),
                    "memory" => out[slot][1] = Some(amount),
                    _ => {}
                }
                match b.get(next) {
                    Some(b',') => at = next + 1,
                    Some(b'}') => {
                        at = next + 1;
                        break;
                    }
                    _ => return None,
                }
            }
        }
        match b.get(at) {
            Some(b',') => at += 1,
            Some(b'}') => return (at + 1 == b.len()).then_some(out),
            _ => return None,
        }
    }
}

#[cfg(test)]
mod amounts {
    use super::*;

    #[test]
    fn the_api_servers_form_is_read_as_the_reader_reads_it() {
        for json in [
            r#"{"limits":{"cpu":"1","memory":"512Mi"},"requests":{"cpu":"250m","memory":"256Mi"}}"#,
            r#"{"requests":{"memory":"64Mi","cpu":"50m"},"limits":{"memory":"160Mi"}}"#,
            r#"{"limits":{"nvidia.com/gpu":"1","cpu":"2"},"requests":{}}"#,
            r#"{}"#,
        ] {
            let read = crate::engine::view::resource_amounts(json).expect("JSON");
            let read = read.each_ref().map(|l| l.each_ref().map(|a| a.as_deref()));
            assert_eq!(plain_amounts(json), Some(read), "{json}");
        }
        // Any other form is left to the reader.
        for json in [
            r#"{"limits": {"cpu":"1"}}"#,
            r#"{"limits":{"cpu":"1\u0030"}}"#,
            r#"{"claims":[{"name":"gpu"}],"limits":{"cpu":"1"}}"#,
            r#"{"limits":{"cpu":1}}"#,
            r#"{"limits":{"cpu":"1"}}x"#,
            r#"{"limits":{"cpu":"1"}"#,
        ] {
            assert_eq!(plain_amounts(json), None, "{json}");
        }
        assert!(guaranteed_resources(Some(
            r#"{"limits":{"cpu":"1","memory":"1Gi"},"requests":{"cpu":"1000m","memory":"1Gi"}}"#
        )));
        assert!(guaranteed_resources(Some(
            r#"{"limits": {"cpu": "1", "memory": "1Gi"}}"#
        )));
        assert!(!guaranteed_resources(Some(
            r#"{"limits":{"cpu":"1","memory":"1Gi"},"requests":{"cpu":"500m"}}"#
        )));
    }

    #[test]
    fn plain_quantities_are_compared_as_numbers() {
        for (a, b, same) in [
            ("1", "1000m", true),
            ("1Gi", "1024Mi", true),
            ("1k", "1000", true),
            ("250m", "1", false),
            ("512Mi", "0.5Gi", true),
            ("999999999999999999Ti", "999999999999999999Ti", true),
            ("1x", "1", false),
        ] {
            assert_eq!(same_quantity(a, b), same, "{a} {b}");
        }
        assert_eq!(plain_quantity("0"), Some(0));
        assert_eq!(plain_quantity("250m"), Some(250));
        assert_eq!(plain_quantity("2Ki"), Some(2_000 << 10));
        assert_eq!(plain_quantity("1.5"), None);
        assert_eq!(plain_quantity(""), None);
        assert_eq!(plain_quantity("m"), None);
        assert_eq!(plain_quantity("1234567890123456789"), None);
    }
}

/// Whether pod-level `resources` (the pod's budget) are set: then they, not the containers,
/// decide the pod's QoS class (Kubernetes 1.34+).
fn pod_level(json: Option<&str>) -> bool {
    json.and_then(|j| crate::engine::view::resource_amounts(j).ok())
        .is_some_and(|lists| lists.iter().flatten().any(Option::is_some))
}

/// Whether the pod's QoS class is `Guaranteed`, as the kubelet decides it: from its pod-level
/// resources when it sets them, or else every container and init container has cpu and memory
/// limits and requests equal to them. The sidecars of `owned` (every template's) are left out,
/// so the pod as it arrives and the pod as injected are judged alike.
pub fn guaranteed(pod: &PodView<'_>, owned: &BTreeSet<String>) -> bool {
    let budget = pod.spec.as_ref().and_then(|s| s.resources).map(|r| r.get());
    if pod_level(budget) {
        return guaranteed_resources(budget);
    }
    // One pass, stopping at the first container that settles it (most pods' first).
    let mut any = false;
    for c in pod.containers().iter().chain(pod.init_containers()) {
        if owned.contains(c.name.as_str()) {
            continue;
        }
        if !guaranteed_resources(c.resources.map(|r| r.get())) {
            return false;
        }
        any = true;
    }
    any
}

/// A sidecar, as JSON, for a `Guaranteed` pod: its cpu and memory limits are its requests (a
/// resource with only a limit gets a request equal to it), so that the pod keeps its class.
/// The resources it sets neither for are returned: it cannot be made so. The one rule, read
/// by the webhook ([`for_guaranteed`]) and by the exporter (on the template's JSON, whose
/// values may stand for expressions).
pub fn guaranteed_sidecar(container: &mut serde_json::Value) -> Vec<&'static str> {
    use serde_json::{Map, Value};
    let Some(fields) = container.as_object_mut() else {
        return QOS_RESOURCES.to_vec();
    };
    let mut unbounded = Vec::new();
    let resources = fields
        .entry("resources")
        .or_insert_with(|| Value::Object(Map::new()));
    let Some(r) = resources.as_object_mut() else {
        return QOS_RESOURCES.to_vec();
    };
    for res in QOS_RESOURCES {
        let amount =
            |r: &Map<String, Value>, list: &str| r.get(list).and_then(|m| m.get(res)).cloned();
        let (request, limit) = (amount(r, "requests"), amount(r, "limits"));
        let (list, value) = match (request, limit) {
            (Some(q), _) => ("limits", q),
            (None, Some(q)) => ("requests", q),
            (None, None) => {
                unbounded.push(res);
                continue;
            }
        };
        if let Some(m) = r
            .entry(list)
            .or_insert_with(|| Value::Object(Map::new()))
            .as_object_mut()
        {
            m.insert(res.to_owned(), value);
        }
    }
    if r.is_empty() {
        fields.remove("resources");
    }
    unbounded
}

/// The rendering for a `Guaranteed` pod ([`guaranteed_sidecar`] for each sidecar), with the
/// sidecars that cannot be made so, and the resource. Made once per rendering
/// ([`guaranteed_variant`] keeps it).
pub fn for_guaranteed(fragment: &Fragment) -> Guaranteed {
    let mut out = fragment.clone();
    let mut unbounded = Vec::new();
    for c in out
        .containers
        .iter_mut()
        .chain(out.init_containers.iter_mut())
    {
        let Ok(mut json) = serde_json::to_value(&*c) else {
            continue;
        };
        for res in guaranteed_sidecar(&mut json) {
            unbounded.push((c.name.clone(), res));
        }
        // What was read as a container stays one with requests and limits moved.
        if let Ok(fitted) = serde_json::from_value(json) {
            *c = fitted;
        }
    }
    Guaranteed {
        fragment: std::sync::Arc::new(out.seal()),
        unbounded,
    }
}

/// [`for_guaranteed`] of a rendering, made the first time a pod needs it and kept with it.
pub fn guaranteed_variant(fragment: &Fragment) -> &Guaranteed {
    fragment.guaranteed.get_or_init(|| for_guaranteed(fragment))
}

/// The note of a Guaranteed pod given a sidecar with neither a request nor a limit for
/// `resource`: the pod becomes Burstable.
pub fn loses_guaranteed(template: &str, container: &str, resource: &str) -> String {
    format!(
        "template {template:?}'s sidecar {container:?} sets no {resource} request or limit: the pod, Guaranteed by its own containers, becomes Burstable (its QoS class)"
    )
}

/// A port the pod's own containers declare that a sidecar declares too: both would bind it in
/// the pod's one network namespace, and one of them could not start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortClash {
    pub sidecar: String,
    pub port: i32,
    pub protocol: String,
    pub container: String,
}

/// The first port a sidecar of `renderings` (each with what it came from) declares that a
/// container of the pod, other than a template's sidecar, declares too (same number and
/// protocol): the native sidecars first, then the regular ones, each in rendering order (the
/// order they have in the injected pod, where the backstop looks for the same clash), and
/// the first such container, of its containers then its init containers. A sidecar `kept`
/// (the pod's own, of the same name) is not added, so not checked.
pub fn port_clash<'a, T: Copy>(
    pod: &PodView<'_>,
    owned: &BTreeSet<String>,
    renderings: impl Iterator<Item = (T, &'a Fragment)> + Clone,
    kept: impl Fn(&str) -> bool,
) -> Option<(T, PortClash)> {
    if renderings.clone().all(|(_, f)| f.ports.is_empty()) {
        return None;
    }
    // The pod's own ports, read only where the text of a container's ports holds a sidecar's
    // port number at all (most pods' ports are nowhere near a sidecar's: then none is read).
    let mut theirs: Vec<(i32, std::borrow::Cow<'static, str>, &str)> = Vec::new();
    for c in pod.containers().iter().chain(pod.init_containers()) {
        if owned.contains(c.name.as_str()) {
            continue;
        }
        let Some(ports) = c.ports else { continue };
        let text = ports.get();
        let near = renderings
            .clone()
            .any(|(_, f)| f.ports.iter().any(|p| text.contains(p.digits.as_str())));
        if !near {
            continue;
        }
        // The view read the member: it is JSON.
        let _ = crate::engine::view::each_port(text, |port, protocol| {
            let protocol = match protocol {
                "TCP" => "TCP".into(),
                "UDP" => "UDP".into(),
                "SCTP" => "SCTP".into(),
                other => other.to_owned().into(),
            };
            theirs.push((port, protocol, c.name.as_str()));
        });
    }
    if theirs.is_empty() {
        return None;
    }
    for init in [true, false] {
        for (from, f) in renderings.clone() {
            for p in f.ports.iter().filter(|p| p.init == init) {
                if kept(&p.sidecar) {
                    continue;
                }
                if let Some((_, _, container)) = theirs
                    .iter()
                    .find(|(port, proto, _)| *port == p.number && *proto == p.protocol)
                {
                    return Some((
                        from,
                        PortClash {
                            sidecar: p.sidecar.clone(),
                            port: p.number,
                            protocol: p.protocol.clone(),
                            container: (*container).to_owned(),
                        },
                    ));
                }
            }
        }
    }
    None
}

/// A pod-level budget (`spec.resources`, as JSON) grown by what the sidecars added (`inits`,
/// `containers`) request and are limited to, for each cpu and memory amount the budget sets,
/// so that the pod's own containers keep the share they had (the API server refuses a pod
/// whose containers ask for more than its budget). A sidecar with a limit and no request is
/// counted at its limit for requests, as the API server defaults it. Each amount is `(list,
/// resource, new value)`, summed as the mutating policy's CEL sums it (as floats: the order
/// changes nothing once rounded to a millicore or a byte) and written by [`budget_amount`].
pub fn grown_budget(
    budget: Option<&str>,
    inits: &[&Container],
    containers: &[&Container],
) -> Vec<(&'static str, &'static str, String)> {
    budget_by(budget, inits, containers, 1.0)
}

/// A pod-level budget shrunk back by what the sidecars `uninject` removes (`inits`,
/// `containers`) request and are limited to: [`grown_budget`] undone, amounts written by
/// [`budget_amount`] (a budget written `1000m` comes back `1`). An amount that would not stay
/// above zero (the budget was changed since) is left as it is.
pub fn shrunk_budget(
    budget: Option<&str>,
    inits: &[&Container],
    containers: &[&Container],
) -> Vec<(&'static str, &'static str, String)> {
    budget_by(budget, inits, containers, -1.0)
}

/// The budget's amounts moved by `sign` times what `inits` and `containers` ask for.
fn budget_by(
    budget: Option<&str>,
    inits: &[&Container],
    containers: &[&Container],
    sign: f64,
) -> Vec<(&'static str, &'static str, String)> {
    let Some(Ok(lists)) = budget.map(crate::engine::view::resource_amounts) else {
        return Vec::new();
    };
    let float = |q: &str| {
        kube_quantity::ParsedQuantity::try_from(q)
            .ok()
            .and_then(|q| q.to_bytes_f64())
    };
    let mut out = Vec::new();
    for (list, amounts) in ["requests", "limits"].into_iter().zip(&lists) {
        for (res, given) in QOS_RESOURCES.into_iter().zip(amounts) {
            let Some(start) = given.as_deref().and_then(float) else {
                continue;
            };
            let amount = |c: &Container| {
                let r = c.resources.as_ref()?;
                let (requests, limits) = (amount_of(&r.requests, res), amount_of(&r.limits, res));
                match list {
                    "requests" => requests.or(limits),
                    _ => limits,
                }
                .and_then(float)
            };
            let sum =
                |cs: &[&Container]| cs.iter().filter_map(|c| amount(c)).fold(0.0, |a, b| a + b);
            let grew = inits.iter().chain(containers).any(|c| amount(c).is_some());
            let moved = start + sign * (sum(inits) + sum(containers));
            if grew && (sign > 0.0 || moved > 0.0) {
                out.push((list, res, budget_amount(res, moved)));
            }
        }
    }
    out
}

fn amount_of<'a>(list: &'a Option<BTreeMap<String, Quantity>>, resource: &str) -> Option<&'a str> {
    list.as_ref()?.get(resource).map(|q| q.0.as_str())
}

/// An amount of a pod's budget as it is written back, in the form the API server would store
/// it: cpu in whole cores or millicores (`3`, `2600m`), memory with the largest binary suffix
/// that is exact (`448Mi`, `2Gi`) or in bytes; rounded half up to a millicore or a byte, as the
/// mutating policy's CEL rounds.
fn budget_amount(resource: &str, value: f64) -> String {
    match resource {
        "cpu" => {
            let millis = (value * 1000.0 + 0.5).floor() as i64;
            match millis % 1000 {
                0 => format!("{}", millis / 1000),
                _ => format!("{millis}m"),
            }
        }
        _ => {
            let bytes = (value + 0.5).floor() as i64;
            BINARY_SUFFIXES
                .iter()
                .find(|(_, unit)| bytes != 0 && bytes % unit == 0)
                .map_or_else(
                    || bytes.to_string(),
                    |(suffix, unit)| format!("{}{suffix}", bytes / unit),
                )
        }
    }
}

/// The binary suffixes a memory amount is written with, largest first.
pub const BINARY_SUFFIXES: [(&str, i64); 4] = [
    ("Ti", 1 << 40),
    ("Gi", 1 << 30),
    ("Mi", 1 << 20),
    ("Ki", 1 << 10),
];

#[cfg(test)]
mod quantity_tests {
    use super::same_quantity;

    /// The plain forms compared as numbers agree with the parser on every pair, equal or not.
    #[test]
    fn quantities_compare_as_kubernetes_compares_them() {
        let equal = [
            ("1", "1000m"),
            ("1Gi", "1024Mi"),
            ("0.5", "500m"),
            ("1k", "1000"),
            ("64Mi", "67108864"),
            ("2", "2"),
        ];
        let unequal = [("250m", "1"), ("1G", "1Gi"), ("64Mi", "64M"), ("0.5", "5")];
        for (a, b) in equal {
            assert!(same_quantity(a, b) && same_quantity(b, a), "{a} = {b}");
        }
        for (a, b) in unequal {
            assert!(!same_quantity(a, b) && !same_quantity(b, a), "{a} != {b}");
        }
    }
}
