//! The companion validator: does an opted-in pod carry exactly what the injector would add?
//!
//! It renders the same [`Plan`] the mutator renders and compares the fields the injector owns.
//! The API server defaults some of them after mutation (a port's protocol, a field reference's
//! API version, requests copied from limits); both sides are normalised the same way first.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::Container;
use serde_json::Value;

use crate::engine::config::{Injector, NAMESPACE_REQUIRED};
use crate::engine::inject::{
    Entry, OptOut, Plan, PodFacts, Status, required_opt_out, revision_name,
};
use crate::engine::messages;
use crate::engine::view::{ContainerView, PodView};

/// The container fields the injector owns: changing any of them on a sidecar is a finding.
pub const OWNED_FIELDS: &[&str] = &[
    "image",
    "command",
    "args",
    "ports",
    "env",
    "volumeMounts",
    "resources",
    "securityContext",
    "restartPolicy",
];

/// Everything wrong with `pod` for `plan`, in words a person can act on. Empty: the pod is valid.
/// A sidecar is compared as a typed container; one that k8s-openapi would not read is an error.
pub fn findings(
    inj: &Injector,
    pod: &PodView<'_>,
    plan: &Plan,
) -> Result<Vec<String>, serde_json::Error> {
    let mut out = Vec::new();
    let key = &inj.config.status_annotation;
    let status = pod.annotation(key);
    let parsed = status.map(serde_json::from_str::<Status>);
    let kept: BTreeSet<&str> = match &parsed {
        Some(Ok(status)) => status.kept.iter().map(String::as_str).collect(),
        _ => BTreeSet::new(),
    };
    let containers = pod.containers();
    let init = pod.init_containers();
    let volumes = pod.spec.as_ref().map(|s| s.volumes()).unwrap_or_default();
    for t in &plan.templates {
        let lists = [
            (
                "containers",
                &t.fragment.containers,
                containers,
                "initContainers",
                init,
            ),
            (
                "initContainers",
                &t.fragment.init_containers,
                init,
                "containers",
                containers,
            ),
        ];
        for (list, wanted, actual, other_list, other) in lists {
            for want in wanted {
                let found = actual.iter().find(|c| *c.name == want.name);
                let elsewhere = other.iter().any(|c| *c.name == want.name);
                // A container the pod brought itself under a sidecar's name was left alone.
                if kept.contains(want.name.as_str()) && (found.is_some() || elsewhere) {
                    continue;
                }
                match found {
                    Some(have) => {
                        let changed = changed_fields(want, &have.typed()?);
                        if !changed.is_empty() {
                            out.push(messages::sidecar_changed(&want.name, &t.name, &changed));
                        }
                    }
                    None if elsewhere => out.push(messages::sidecar_in_wrong_list(
                        &want.name, &t.name, list, other_list,
                    )),
                    None => out.push(messages::sidecar_missing(&want.name, &t.name, list)),
                }
            }
        }
        for v in &t.fragment.volumes {
            if !volumes.iter().any(|have| *have.name == v.name) {
                out.push(messages::volume_missing(&v.name, &t.name));
            }
        }
    }
    let wanted: Vec<&str> = plan.templates.iter().map(|t| t.name.as_str()).collect();
    match parsed {
        None => out.push(messages::status_missing(key)),
        Some(Ok(status)) if status.revision != inj.config.revision => out.push(format!(
            "annotation {key} says {} injected the pod, but it belongs to {}",
            revision_name(&status.revision),
            revision_name(&inj.config.revision)
        )),
        Some(Ok(status)) if status.templates == wanted => {}
        Some(Ok(status)) => out.push(format!(
            "annotation {key} lists templates [{}] but the pod asks for [{}]",
            status.templates.join(", "),
            wanted.join(", ")
        )),
        Some(Err(_)) => out.push(format!(
            "annotation {key} is not a status the injector wrote: {:?}",
            status.unwrap_or_default()
        )),
    }
    Ok(out)
}

/// For a pod another revision injected: the containers the pod did not bring itself (those not
/// in the status `context`, so its sidecars) whose owned fields an update changes. That
/// revision's templates are not at hand, but its sidecars may not change either.
pub fn sidecars_changed(
    old: &PodView<'_>,
    new: &PodView<'_>,
    own: &crate::engine::inject::Seen,
) -> Result<Vec<String>, serde_json::Error> {
    let mut out = Vec::new();
    let lists =
        |p: &PodView<'_>| -> Result<[(&'static str, Vec<Container>); 2], serde_json::Error> {
            let typed = |cs: &[ContainerView<'_>]| {
                cs.iter()
                    .map(ContainerView::typed)
                    .collect::<Result<Vec<_>, _>>()
            };
            Ok([
                ("containers", typed(p.containers())?),
                ("initContainers", typed(p.init_containers())?),
            ])
        };
    let owns = [&own.containers, &own.init_containers];
    for (((list, before), (_, after)), own) in lists(old)?.into_iter().zip(lists(new)?).zip(owns) {
        for was in before.iter().filter(|c| !own.contains(&c.name)) {
            match after.iter().find(|c| c.name == was.name) {
                Some(now) => {
                    let changed = changed_fields(was, now);
                    if !changed.is_empty() {
                        out.push(messages::other_revision_sidecar_changed(
                            &was.name, &changed,
                        ));
                    }
                }
                None => out.push(messages::other_revision_sidecar_removed(&was.name, list)),
            }
        }
    }
    Ok(out)
}

/// The owned fields that differ between what the template renders and what the pod carries.
///
/// Other admission plugins legitimately add to a sidecar after us: the ServiceAccount plugin
/// mounts the API token into every container, LimitRanger fills in missing resources, other
/// webhooks add environment variables. So `env`, `volumeMounts` and `resources` must contain
/// everything the template sets, unchanged; the other owned fields must be equal.
fn changed_fields(want: &Container, have: &Container) -> Vec<String> {
    field_problems(want, have)
        .into_iter()
        .map(|(_, problem)| problem)
        .collect()
}

/// [`changed_fields`] with the field each problem is about. `outdated` uses the same comparison
/// to say what a template change altered.
pub fn field_problems(want: &Container, have: &Container) -> Vec<(&'static str, String)> {
    let want = owned(want);
    let have = owned(have);
    let mut changed = Vec::new();
    for field in OWNED_FIELDS {
        let (w, h) = (want.get(*field), have.get(*field));
        let problem = match *field {
            "env" => {
                missing_entries(w, h, "name").map(|names| format!("env {names} removed or changed"))
            }
            "volumeMounts" => missing_entries(w, h, "mountPath")
                .map(|paths| format!("volumeMounts at {paths} removed or changed")),
            "resources" => (!resources_contained(w, h)).then(|| "resources differ".to_owned()),
            _ if w == h => None,
            "image" => Some(format!(
                "image is {} but the template sets {}",
                h.map_or("unset".into(), Value::to_string),
                w.map_or("unset".into(), Value::to_string)
            )),
            f if h.is_none() => Some(format!("{f} was removed")),
            f if w.is_none() => Some(format!("{f} was added")),
            f => Some(format!("{f} differs")),
        };
        changed.extend(problem.map(|p| (*field, p)));
    }
    changed
}

/// The entries of `want` (an array of objects keyed by `key`) missing from `have` or different
/// there, as a comma-separated list of keys; `None` when all are present and equal.
fn missing_entries(want: Option<&Value>, have: Option<&Value>, key: &str) -> Option<String> {
    let have = have
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let missing: Vec<String> = want
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|w| !have.iter().any(|h| h == *w))
        .map(|w| w.get(key).map_or_else(|| w.to_string(), Value::to_string))
        .collect();
    (!missing.is_empty()).then(|| missing.join(", "))
}

/// Every request and limit the template sets is present with the same quantity.
fn resources_contained(want: Option<&Value>, have: Option<&Value>) -> bool {
    ["requests", "limits"].iter().all(|section| {
        let want = want.and_then(|w| w.get(section)).and_then(Value::as_object);
        let have = have.and_then(|h| h.get(section)).and_then(Value::as_object);
        want.into_iter()
            .flatten()
            .all(|(name, quantity)| have.and_then(|h| h.get(name)) == Some(quantity))
    })
}

/// The owned fields of a container, normalised: empty values dropped and the API server's
/// defaults applied, so a rendered container and its stored copy compare equal.
fn owned(c: &Container) -> serde_json::Map<String, Value> {
    let Ok(Value::Object(all)) = serde_json::to_value(c) else {
        return Default::default();
    };
    let mut out = serde_json::Map::new();
    for (key, mut value) in all {
        if !OWNED_FIELDS.contains(&key.as_str()) {
            continue;
        }
        apply_defaults(&key, &mut value);
        if let Some(value) = prune(value) {
            out.insert(key, value);
        }
    }
    out
}

fn apply_defaults(field: &str, value: &mut Value) {
    match field {
        "ports" => {
            for port in value.as_array_mut().into_iter().flatten() {
                if let Some(p) = port.as_object_mut() {
                    p.entry("protocol").or_insert_with(|| "TCP".into());
                }
            }
        }
        "env" => {
            for env in value.as_array_mut().into_iter().flatten() {
                if let Some(field_ref) = env
                    .pointer_mut("/valueFrom/fieldRef")
                    .and_then(Value::as_object_mut)
                {
                    field_ref.entry("apiVersion").or_insert_with(|| "v1".into());
                }
            }
        }
        "resources" => {
            let limits = value.get("limits").and_then(Value::as_object).cloned();
            if let (Some(limits), Some(r)) = (limits, value.as_object_mut()) {
                let requests = r
                    .entry("requests")
                    .or_insert_with(|| Value::Object(Default::default()));
                if let Some(requests) = requests.as_object_mut() {
                    for (name, quantity) in limits {
                        requests.entry(name).or_insert(quantity);
                    }
                }
            }
        }
        _ => {}
    }
}

/// Drops nulls and empty arrays and objects, as the API server does when it stores an object.
fn prune(value: Value) -> Option<Value> {
    match value {
        Value::Null => None,
        Value::Array(items) => {
            let items: Vec<Value> = items.into_iter().filter_map(prune).collect();
            (!items.is_empty()).then_some(Value::Array(items))
        }
        Value::Object(map) => {
            let map: serde_json::Map<String, Value> = map
                .into_iter()
                .filter_map(|(k, v)| prune(v).map(|v| (k, v)))
                .collect();
            (!map.is_empty()).then_some(Value::Object(map))
        }
        other => Some(other),
    }
}

/// The message a person sees when the validator denies a pod sent by `entry`.
pub fn denial_message(inj: &Injector, entry: Entry, pod_name: &str, problems: &[String]) -> String {
    let list: Vec<String> = problems
        .iter()
        .enumerate()
        .map(|(i, p)| format!("({}) {p}", i + 1))
        .collect();
    let label = &inj.config.inject_label;
    let has = if problems.len() == 1 {
        "has a problem"
    } else {
        "has problems"
    };
    let list = list.join("; ");
    let recreate = "To fix: create the pod with the injector's mutating webhook available and leave its sidecars unchanged \
         (for a controller's pod, delete it and let the controller recreate it)";
    match entry {
        // Its namespace requires sidecars: removing a label does not let it out.
        Entry::Required => format!(
            "sidecar-injector: pod {pod_name} is in a namespace that requires sidecars ({label}={NAMESPACE_REQUIRED}) but {has}: {list}. {recreate}"
        ),
        Entry::Pod | Entry::Namespace => format!(
            "sidecar-injector: pod {pod_name} opted in to sidecar injection ({label}=true) but {has}: {list}. {recreate}, or opt out by removing the label {label}"
        ),
    }
}

/// The refusal of a pod that opts out where its namespace requires sidecars and whose service
/// account is not exempt; `None` for any other pod. `pod_name` as [`denial_message`] takes it.
pub fn required_refusal(inj: &Injector, facts: &PodFacts<'_>, pod_name: &str) -> Option<String> {
    if required_opt_out(inj, facts)? != OptOut::Refused {
        return None;
    }
    let cfg = &inj.config;
    Some(messages::required_opt_out(
        pod_name,
        &cfg.inject_label,
        NAMESPACE_REQUIRED,
        facts.namespace,
        facts.service_account(),
        &messages::listed(&cfg.required.exempt_in(facts.namespace)),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::inject::{Decision, PodFacts, apply, decide, plan_edits};
    use crate::engine::view::pod_json;
    use k8s_openapi::api::core::v1::Pod;

    fn findings(inj: &Injector, pod: &Pod, plan: &Plan) -> Vec<String> {
        let json = pod_json(pod);
        super::findings(inj, &PodView::parse(&json).expect("view"), plan).expect("reads")
    }

    fn injected() -> (Injector, Pod, Plan) {
        let inj = Injector::embedded(None).expect("embedded loads");
        let mut pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "labels": {"sidecar-injector.io/inject": "true"}},
            "spec": {"containers": [{"name": "app", "image": "nginx:1.27"}]}
        }))
        .expect("pod");
        let json = pod_json(&pod);
        let view = PodView::parse(&json).expect("view");
        let Ok(Decision::Inject(plan)) = decide(&inj, &PodFacts::new(&view, Some("default")))
        else {
            unreachable!("opted-in pod is injected")
        };
        let edits = plan_edits(&inj, &view, &plan);
        apply(&mut pod, &edits);
        (inj, pod, plan)
    }

    #[test]
    fn injected_pod_has_no_findings() {
        let (inj, pod, plan) = injected();
        assert_eq!(findings(&inj, &pod, &plan), Vec::<String>::new());
    }

    #[test]
    fn api_server_defaults_are_not_findings() {
        let (inj, mut pod, plan) = injected();
        let spec = pod.spec.as_mut().expect("spec");
        for c in spec
            .containers
            .iter_mut()
            .chain(spec.init_containers.iter_mut().flatten())
        {
            c.image_pull_policy = Some("IfNotPresent".into());
            c.termination_message_path = Some("/dev/termination-log".into());
            for p in c.ports.iter_mut().flatten() {
                p.protocol = None;
            }
        }
        assert_eq!(findings(&inj, &pod, &plan), Vec::<String>::new());
    }

    #[test]
    fn changed_image_is_named() {
        let (inj, mut pod, plan) = injected();
        let init = pod
            .spec
            .as_mut()
            .and_then(|s| s.init_containers.as_mut())
            .expect("init");
        let proxy = init.iter_mut().find(|c| c.name == "proxy").expect("proxy");
        proxy.image = Some("evil:latest".into());
        let f = findings(&inj, &pod, &plan);
        assert_eq!(f.len(), 1, "{f:?}");
        assert!(
            f[0].contains("\"proxy\"") && f[0].contains("evil:latest"),
            "{f:?}"
        );
    }

    #[test]
    fn missing_sidecar_volume_and_status_are_each_reported() {
        let (inj, mut pod, plan) = injected();
        let spec = pod.spec.as_mut().expect("spec");
        if let Some(init) = spec.init_containers.as_mut() {
            init.retain(|c| c.name != "log-shipper");
        }
        spec.volumes = None;
        pod.metadata.annotations = None;
        let f = findings(&inj, &pod, &plan);
        assert_eq!(f.len(), 3, "{f:?}");
        let message = denial_message(&inj, Entry::Pod, "\"web\"", &f);
        assert!(
            message.contains("(1)") && message.contains("(3)"),
            "{message}"
        );
    }

    #[test]
    fn sidecar_in_wrong_list_is_reported() {
        let (inj, mut pod, plan) = injected();
        let spec = pod.spec.as_mut().expect("spec");
        let proxy = spec.init_containers.as_mut().expect("init").remove(0);
        spec.containers.push(proxy);
        let f = findings(&inj, &pod, &plan);
        assert!(
            f.iter()
                .any(|m| m.contains("must be in spec.initContainers")),
            "{f:?}"
        );
    }

    /// The refusal names the namespace, who is exempt there (the entries for it and for every
    /// namespace, each service account once) and the pod's own service account; an exempt
    /// pod, or one sent by another entry, is not refused.
    #[test]
    fn an_opt_out_in_a_required_namespace_is_refused_with_who_may() {
        let inj = Injector::exempting("ci/runner, \"*/backup\", shop/backup");
        let json = br#"{"metadata":{"name":"web","labels":{"sidecar-injector.io/inject":"false"}},"spec":{"serviceAccountName":"app","containers":[{"name":"app"}]}}"#;
        let pod = PodView::parse(json).expect("view");
        let refusal = |ns: &str, entry: Entry| {
            let facts = PodFacts::new(&pod, Some(ns)).with_entry(entry);
            required_refusal(&inj, &facts, "\"web\"")
        };
        let message = refusal("shop", Entry::Required).expect("refused");
        assert_eq!(
            message,
            "sidecar-injector: pod \"web\" opts out of sidecar injection (sidecar-injector.io/inject=\"false\"), but its namespace \"shop\" requires sidecars (sidecar-injector.io/inject=required). Only pods of the service accounts the injector's configuration exempts (required.exempt) may run there without them; exempt in \"shop\": \"backup\"; the pod runs as \"app\". To fix: remove the label sidecar-injector.io/inject from the pod so that it is injected, or ask the injector's operator to add \"shop/app\" to required.exempt"
        );
        assert!(
            refusal("ci", Entry::Required)
                .expect("refused")
                .contains("exempt in \"ci\": \"runner\", \"backup\";")
        );
        assert_eq!(refusal("shop", Entry::Namespace), None);
        let exempt = br#"{"metadata":{"name":"web","labels":{"sidecar-injector.io/inject":"false"}},"spec":{"serviceAccountName":"backup","containers":[{"name":"app"}]}}"#;
        let pod = PodView::parse(exempt).expect("view");
        let facts = PodFacts::new(&pod, Some("shop")).with_entry(Entry::Required);
        assert_eq!(required_refusal(&inj, &facts, "\"web\""), None);
        // Without exemptions, the sentence says so.
        let plain = Injector::embedded(None).expect("loads");
        let pod = PodView::parse(json).expect("view");
        let facts = PodFacts::new(&pod, Some("shop")).with_entry(Entry::Required);
        let message = required_refusal(&plain, &facts, "\"web\"").expect("refused");
        assert!(message.contains("exempt in \"shop\": none;"), "{message}");
    }

    #[test]
    fn a_required_namespace_denial_does_not_advise_opting_out() {
        let inj = Injector::embedded(None).expect("loads");
        let problems = ["a problem".to_owned()];
        let required = denial_message(&inj, Entry::Required, "\"web\"", &problems);
        assert!(required.contains("requires sidecars (sidecar-injector.io/inject=required) but has a problem: (1) a problem. To fix:"), "{required}");
        assert!(!required.contains("opt out"), "{required}");
        let pod = denial_message(&inj, Entry::Pod, "\"web\"", &problems);
        assert!(
            pod.ends_with("or opt out by removing the label sidecar-injector.io/inject"),
            "{pod}"
        );
    }
}
