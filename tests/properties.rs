//! Properties the engine must always hold, over arbitrary pods:
//! 1. injection is a fixed point: planning the injected pod again gives no edits, and the
//!    webhook answers it without a patch;
//! 2. the JSONPatch applied to the pod's JSON equals the typed edits applied to the pod;
//! 3. the validator admits whatever the mutator produced, and refuses an injected pod that lost
//!    a sidecar or had a sidecar's image changed;
//! 4. `review::answer` never panics, and answers with JSON or an error, whatever the bytes;
//! 5. `outdated` judges a pod the mutator just injected current, and does not list a pod the
//!    injector passed over;
//! 6. the borrowed view and the typed road answer alike, on hostile bodies too;
//! 7. a warm render cache answers as a cold one;
//! 8. the memory of recent answers answers as the engine;
//! 9. and so it does for replicas whose token volumes have names of their own;
//! 10. every patch applies to the pod as it was sent, malformed pods included, and a pod the
//!     API server will refuse is let through unchanged or refused for its own mistake;
//! 11. a pod template with its `metadata` absent, `null` or `{}` is injected offline (the
//!     patch makes what it writes into) and injecting the output again changes nothing, and a
//!     review of a pod without metadata (which the API server refuses) is never patched;
//! 12. `uninject` undoes `inject`: the pod comes back, or, where it had an item the same as one
//!     a template adds, comes back without it, and injecting it again gives the same pod.

use std::collections::BTreeSet;

use base64::Engine as _;
use k8s_openapi::api::core::v1::Pod;
use proptest::prelude::*;
use proptest::sample::Index;
use serde_json::{Map, Value, json};
use sidecar_injector::config::{BUNDLED_TEMPLATES, DEFAULT_CONFIG, Injector};
use sidecar_injector::inject::{
    Decision, Entry, InjectError, Plan, PodFacts, apply, decide, plan_edits, to_patch,
    to_patch_base64,
};
use sidecar_injector::outdated::check::{PodState, check};
use sidecar_injector::review::{Webhook, answer, answer_for};
use sidecar_injector::view::{PodView, pod_json};

const OWN_NAMESPACE: &str = "sidecar-injector";
const SIDECARS: [&str; 2] = ["log-shipper", "proxy"];

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 256,
        ..ProptestConfig::default()
    }
}

// === Injectors ===

fn embedded() -> Injector {
    Injector::embedded(Some(OWN_NAMESPACE.into())).expect("embedded configuration loads")
}

/// A template that exercises the edits the bundled ones never make (labels, image pull
/// secrets), with keys that need escaping in a JSON pointer.
const MARKS_TEMPLATE: &str = "labels:\n  marks.example.com/team~owner: platform\nannotations:\n  marks.example.com/note~x/y: \"{{ pod.namespace }}\"\nimagePullSecrets:\n  - name: marks-registry\n";

/// The default configuration with a status annotation key holding `/` and `~`, and a third
/// template that adds labels, annotations and an image pull secret.
fn marks() -> Injector {
    let config = DEFAULT_CONFIG
        .replace(
            "statusAnnotation: sidecar-injector.io/status",
            "statusAnnotation: \"sidecar-injector.io/status~v1\"",
        )
        .replace(
            "defaultTemplates: [log-shipper, proxy]",
            "defaultTemplates: [log-shipper, proxy, marks]",
        );
    assert_ne!(
        config, DEFAULT_CONFIG,
        "the default configuration changed shape"
    );
    let mut templates: Vec<(String, String)> = BUNDLED_TEMPLATES
        .iter()
        .map(|(n, s)| ((*n).to_owned(), (*s).to_owned()))
        .collect();
    templates.push(("marks".into(), MARKS_TEMPLATE.into()));
    Injector::from_sources("marks.yaml", &config, templates, Some(OWN_NAMESPACE.into()))
        .expect("marks configuration loads")
}

thread_local! {
    static INJECTORS: [Injector; 2] = [embedded(), marks()];
}

fn with_injector<T>(which: usize, f: impl FnOnce(&Injector) -> T) -> T {
    INJECTORS.with(|all| f(&all[which % all.len()]))
}

// === Arbitrary pods ===

/// Map keys as found in the wild, and some that need escaping in a JSON pointer.
fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z]{1,8}",
        "[a-z]{1,5}\\.example\\.com/[a-z~]{1,6}",
        "[a-z~/]{1,6}",
        Just("~".to_owned()),
        Just("/".to_owned()),
        Just("~1".to_owned()),
        Just("sidecar-injector.io/proxy-port".to_owned()),
    ]
}

fn extra_map() -> impl Strategy<Value = Map<String, Value>> {
    prop::collection::btree_map(key(), "[a-z0-9]{0,6}", 0..4)
        .prop_map(|m| m.into_iter().map(|(k, v)| (k, Value::String(v))).collect())
}

fn container_name() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => Just("app".to_owned()),
        2 => Just("web".to_owned()),
        1 => Just("proxy".to_owned()),
        1 => Just("log-shipper".to_owned()),
        2 => "[a-z]{1,6}",
    ]
}

fn env() -> impl Strategy<Value = Option<Vec<Value>>> {
    let name = prop_oneof![
        Just("APP_LOG_DIR".to_owned()),
        Just("SIDECAR_PROXY_PORT".to_owned()),
        "[A-Z]{1,5}",
    ];
    prop::option::of(prop::collection::vec(
        (name, "[a-z0-9]{0,4}").prop_map(|(n, v)| json!({"name": n, "value": v})),
        0..3,
    ))
}

fn mounts() -> impl Strategy<Value = Option<Vec<Value>>> {
    let name = prop_oneof![
        Just("sidecar-logs".to_owned()),
        Just("data".to_owned()),
        "[a-z]{1,5}"
    ];
    let path = prop_oneof![
        Just("/var/log/app".to_owned()),
        Just("/data".to_owned()),
        "/[a-z]{1,5}"
    ];
    prop::option::of(prop::collection::vec(
        (name, path).prop_map(|(n, p)| json!({"name": n, "mountPath": p})),
        0..3,
    ))
}

/// Declared ports: the bundled proxy routes to the TCP ones.
fn ports() -> impl Strategy<Value = Option<Vec<Value>>> {
    let port = (
        prop_oneof![Just(8080), Just(9090), 1u16..10000],
        prop_oneof![Just(None), Just(Some("TCP")), Just(Some("UDP"))],
    )
        .prop_map(|(p, protocol)| match protocol {
            Some(protocol) => json!({"containerPort": p, "protocol": protocol}),
            None => json!({"containerPort": p}),
        });
    prop::option::of(prop::collection::vec(port, 0..3))
}

fn container() -> impl Strategy<Value = Value> {
    (
        container_name(),
        "[a-z]{1,6}:[0-9]",
        env(),
        mounts(),
        ports(),
    )
        .prop_map(|(name, image, env, mounts, ports)| {
            let mut c = json!({"name": name, "image": image});
            if let Some(env) = env {
                c["env"] = Value::Array(env);
            }
            if let Some(mounts) = mounts {
                c["volumeMounts"] = Value::Array(mounts);
            }
            if let Some(ports) = ports {
                c["ports"] = Value::Array(ports);
            }
            c
        })
}

fn volumes() -> impl Strategy<Value = Option<Vec<Value>>> {
    let name = prop_oneof![Just("sidecar-logs".to_owned()), "[a-z]{1,5}"];
    prop::option::of(prop::collection::vec(
        name.prop_map(|n| json!({"name": n, "emptyDir": {}})),
        0..3,
    ))
}

fn labels() -> impl Strategy<Value = Option<Map<String, Value>>> {
    let inject = prop_oneof![
        6 => Just(Some("true")),
        1 => Just(Some("false")),
        1 => Just(None),
    ];
    // Label values as Kubernetes allows them; templates render `app` into their output.
    let app = prop::option::of("[a-z0-9]([a-z0-9.-]{0,10}[a-z0-9])?");
    // Mostly present: a pod without labels is never opted in.
    prop::option::weighted(
        0.9,
        (inject, app, extra_map()).prop_map(|(inject, app, mut m)| {
            if let Some(v) = inject {
                m.insert("sidecar-injector.io/inject".into(), v.into());
            }
            if let Some(app) = app {
                m.insert("app".into(), app.into());
            }
            m
        }),
    )
}

fn annotations() -> impl Strategy<Value = Option<Map<String, Value>>> {
    let templates = prop::option::of(prop_oneof![
        Just("proxy"),
        Just("log-shipper"),
        Just("log-shipper,proxy"),
        Just(" proxy , proxy"),
        Just("marks"),
        Just(""),
    ]);
    let status = prop::option::of(prop_oneof![
        Just("not json"),
        Just(r#"{"templates":["log-shipper"],"hash":"0000000000000000"}"#),
    ]);
    prop::option::of((templates, status, extra_map()).prop_map(|(t, s, mut m)| {
        if let Some(t) = t {
            m.insert("sidecar-injector.io/templates".into(), t.into());
        }
        if let Some(s) = s {
            m.insert("sidecar-injector.io/status".into(), s.into());
            m.insert("sidecar-injector.io/status~v1".into(), s.into());
        }
        m
    }))
}

/// An arbitrary pod and the namespace of the request that carries it.
#[derive(Clone, Debug)]
struct Case {
    pod: Value,
    namespace: String,
}

fn pod() -> impl Strategy<Value = Case> {
    let namespace = prop_oneof![
        6 => Just("default"),
        4 => Just("shop"),
        1 => Just("kube-system"),
        1 => Just(OWN_NAMESPACE),
    ];
    let naming = prop_oneof![
        3 => "[a-z]{1,8}".prop_map(|n| json!({"name": n})),
        1 => "[a-z]{1,8}-".prop_map(|g| json!({"generateName": g})),
    ];
    let spec = (
        // At least one: a pod with none is malformed (property 10).
        prop::collection::vec(container(), 1..=3),
        prop::option::of(prop::collection::vec(container(), 0..=2)),
        volumes(),
        prop::option::of(prop::collection::vec(
            "[a-z]{1,5}".prop_map(|n| json!({"name": n})),
            0..2,
        )),
        prop_oneof![6 => Just(None), 1 => Just(Some(true)), 1 => Just(Some(false))],
        prop_oneof![8 => Just(None), 1 => Just(Some("windows")), 1 => Just(Some("linux"))],
        prop::option::of(prop_oneof![Just("default"), Just("api"), Just("")]),
    );
    (
        namespace,
        any::<bool>(),
        naming,
        labels(),
        annotations(),
        spec,
    )
        .prop_map(
            |(namespace, in_object, naming, labels, annotations, spec)| {
                let (containers, init, volumes, secrets, host_network, os, sa) = spec;
                let mut meta = naming;
                // The API server often leaves metadata.namespace to the request.
                if in_object {
                    meta["namespace"] = namespace.into();
                }
                if let Some(l) = labels {
                    meta["labels"] = Value::Object(l);
                }
                if let Some(a) = annotations {
                    meta["annotations"] = Value::Object(a);
                }
                let mut spec = json!({"containers": containers});
                let optional = [
                    ("initContainers", init.map(Value::Array)),
                    ("volumes", volumes.map(Value::Array)),
                    ("imagePullSecrets", secrets.map(Value::Array)),
                    ("hostNetwork", host_network.map(Value::Bool)),
                    ("nodeSelector", os.map(|os| json!({"kubernetes.io/os": os}))),
                    ("serviceAccountName", sa.map(Value::from)),
                ];
                for (field, value) in optional {
                    if let Some(value) = value {
                        spec[field] = value;
                    }
                }
                Case {
                    pod: json!({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}),
                    namespace: namespace.to_owned(),
                }
            },
        )
}

// === Helpers ===

fn typed(pod: &Value) -> Pod {
    serde_json::from_value(pod.clone()).expect("generated pods are pods")
}

/// The decision for a pod, read through the view as the webhook reads it.
fn decide_for(inj: &Injector, pod: &Pod, namespace: &str) -> Result<Decision, InjectError> {
    let json = pod_json(pod);
    let view = PodView::parse(&json).expect("a pod reads through the view");
    decide(inj, &PodFacts::new(&view, Some(namespace)))
}

/// The plan for a pod, or None when it is not injected (or asks for a template the
/// configuration lacks).
fn plan_for(inj: &Injector, pod: &Pod, namespace: &str) -> Option<Plan> {
    match decide_for(inj, pod, namespace) {
        Ok(Decision::Inject(plan)) => Some(plan),
        _ => None,
    }
}

fn review(operation: &str, namespace: &str, object: &Value, old: Option<&Value>) -> Vec<u8> {
    let pods = json!({"group": "", "version": "v1", "resource": "pods"});
    let kind = json!({"group": "", "version": "v1", "kind": "Pod"});
    let body = json!({
        "kind": "AdmissionReview",
        "apiVersion": "admission.k8s.io/v1",
        "request": {
            "uid": "d0c9a8b7-6e5f-4d3c-8b2a-1f0e9d8c7b6a",
            "kind": kind,
            "resource": pods,
            "namespace": namespace,
            "operation": operation,
            "userInfo": {"username": "proptest"},
            "object": object,
            "oldObject": old,
        }
    });
    serde_json::to_vec(&body).expect("serializes")
}

/// The `response` of an answer, its patch decoded.
fn respond(inj: &Injector, webhook: Webhook, body: &[u8]) -> Value {
    let answer = answer(inj, webhook, body).expect("a review with a uid is answered");
    decoded(&answer.body)
}

/// An answer's `response`, its patch decoded.
fn decoded(body: &[u8]) -> Value {
    let mut value: Value = serde_json::from_slice(body).expect("answers are JSON");
    let mut response = value["response"].take();
    if let Some(patch) = response.get_mut("patch") {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(patch.as_str().expect("patch is a string"))
            .expect("patch is base64");
        *patch = serde_json::from_slice(&bytes).expect("patch is JSON");
    }
    response
}

/// What the API server does with the mutator's answer: the object it goes on with, or None
/// when the mutator refused.
fn mutated(inj: &Injector, case: &Case) -> Option<Value> {
    let response = respond(
        inj,
        Webhook::Mutate,
        &review("CREATE", &case.namespace, &case.pod, None),
    );
    if response["allowed"] != true {
        return None;
    }
    let mut object = case.pod.clone();
    if let Some(patch) = response.get("patch") {
        let patch: json_patch::Patch = serde_json::from_value(patch.clone()).expect("a JSONPatch");
        json_patch::patch(&mut object, &patch).expect("the mutator's patch applies");
    }
    Some(object)
}

fn names(pod: &Value) -> Vec<String> {
    ["containers", "initContainers"]
        .iter()
        .flat_map(|list| pod["spec"][list].as_array().cloned().unwrap_or_default())
        .filter_map(|c| c["name"].as_str().map(str::to_owned))
        .collect()
}

/// Whether the pod's own containers have unique names, none of them a sidecar's.
fn no_collisions(pod: &Value) -> bool {
    let names = names(pod);
    let unique: BTreeSet<&String> = names.iter().collect();
    unique.len() == names.len() && !names.iter().any(|n| SIDECARS.contains(&n.as_str()))
}

/// The sidecars of an injected pod: (list, index) of each.
fn sidecars_in(pod: &Value) -> Vec<(&'static str, usize)> {
    let mut found = Vec::new();
    for list in ["containers", "initContainers"] {
        for (i, c) in pod["spec"][list]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            if c["name"].as_str().is_some_and(|n| SIDECARS.contains(&n)) {
                found.push((list, i));
            }
        }
    }
    found
}

fn validate(inj: &Injector, namespace: &str, pod: &Value) -> Value {
    respond(
        inj,
        Webhook::Validate,
        &review("CREATE", namespace, pod, None),
    )
}

// === 1. Fixed point ===

proptest! {
    #![proptest_config(config())]

    #[test]
    fn injection_is_a_fixed_point(case in pod(), which in 0usize..2) {
        with_injector(which, |inj| {
            let mut pod = typed(&case.pod);
            let Some(plan) = plan_for(inj, &pod, &case.namespace) else {
                return Ok(());
            };
            let pod_bytes = pod_json(&pod);
            let view = PodView::parse(&pod_bytes).expect("a pod reads through the view");
            let first = plan_edits(inj, &view, &plan);
            apply(&mut pod, &first);
            let described: Vec<String> = first.iter().map(|e| e.describe()).collect();
            let again = plan_for(inj, &pod, &case.namespace).map(|plan| {
                let pod_bytes = pod_json(&pod);
                let view = PodView::parse(&pod_bytes).expect("a pod reads through the view");
                plan_edits(inj, &view, &plan).iter().map(|e| e.describe()).collect::<Vec<_>>()
            });
            prop_assert_eq!(again, Some(vec![]), "after {:?}", described);

            let object = serde_json::to_value(&pod).expect("pods serialize");
            let response = respond(inj, Webhook::Mutate, &review("CREATE", &case.namespace, &object, None));
            prop_assert_eq!(&response["allowed"], &json!(true));
            prop_assert!(response.get("patch").is_none(), "{}", response);
            Ok(())
        })?;
    }
}

// === 2. The patch and the typed edits agree ===

proptest! {
    #![proptest_config(config())]

    #[test]
    fn patch_equals_apply(case in pod(), which in 0usize..2) {
        with_injector(which, |inj| {
            let pod = typed(&case.pod);
            let Some(plan) = plan_for(inj, &pod, &case.namespace) else {
                return Ok(());
            };
            let pod_bytes = pod_json(&pod);
            let view = PodView::parse(&pod_bytes).expect("a pod reads through the view");
            let edits = plan_edits(inj, &view, &plan);
            let mut applied = pod.clone();
            apply(&mut applied, &edits);

            let mut json = serde_json::to_value(&pod).expect("pods serialize");
            let bytes = to_patch(&view, &edits).json().into_owned();
            // The SIMD-encoded base64 is the reference encoder's base64 of the patch.
            let written = to_patch_base64(&view, &edits);
            prop_assert_eq!(
                String::from_utf8_lossy(&written),
                base64::engine::general_purpose::STANDARD.encode(&bytes)
            );
            let patch: json_patch::Patch =
                serde_json::from_slice(&bytes).expect("the patch is a JSONPatch");
            if let Err(e) = json_patch::patch(&mut json, &patch) {
                return Err(TestCaseError::fail(format!("{e}: {patch:?}")));
            }
            let patched: Pod = serde_json::from_value(json.clone()).expect("a patched pod is a pod");
            prop_assert_eq!(&patched, &applied);
            prop_assert_eq!(json, serde_json::to_value(&applied).expect("serializes"));

            // The same holds against the JSON as the API server sent it, absent and empty
            // arrays as they were.
            let mut raw = case.pod.clone();
            json_patch::patch(&mut raw, &patch).expect("applies to the raw pod");
            prop_assert_eq!(typed(&raw), applied);
            Ok(())
        })?;
    }
}

// === 3. The validator and the mutator agree ===

/// What the API server and other admission plugins do to a pod after our mutating webhook
/// and before our validating one: the ServiceAccount token volume and its mount in every
/// container, AlwaysPullImages, LimitRanger's defaults, DefaultTolerationSeconds, and another
/// webhook's container (with a port) and volume.
fn admitted_by_others(pod: &mut Value) {
    let token = json!({"name": "kube-api-access-q8z2w", "readOnly": true,
                       "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"});
    for list in ["containers", "initContainers"] {
        for c in pod["spec"][list].as_array_mut().into_iter().flatten() {
            let mut mounts = c["volumeMounts"].as_array().cloned().unwrap_or_default();
            if !mounts.iter().any(|m| m["mountPath"] == token["mountPath"]) {
                mounts.push(token.clone());
                c["volumeMounts"] = Value::Array(mounts);
            }
            c["imagePullPolicy"] = json!("Always");
            if c["resources"].is_null() {
                c["resources"] = json!({"requests": {"cpu": "100m"}});
            }
        }
    }
    if pod["spec"]["volumes"].is_null() {
        pod["spec"]["volumes"] = json!([]);
    }
    if let Some(volumes) = pod["spec"]["volumes"].as_array_mut() {
        volumes.push(
            json!({"name": "kube-api-access-q8z2w", "projected": {"sources": [
            {"serviceAccountToken": {"path": "token"}}]}}),
        );
        volumes.push(json!({"name": "added-by-other-zz", "emptyDir": {}}));
    }
    if let Some(containers) = pod["spec"]["containers"].as_array_mut() {
        containers.push(json!({"name": "added-by-other-zz", "image": "other:1",
                               "ports": [{"containerPort": 7070, "protocol": "TCP"}]}));
    }
    pod["spec"]["tolerations"] = json!([{"key": "node.kubernetes.io/not-ready",
        "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}]);
}

proptest! {
    #![proptest_config(config())]

    /// The rendering the validator (and a reinvocation) makes of the pod the mutator made is
    /// the mutator's, whatever other admission plugins add in between: same status, same
    /// verdict.
    #[test]
    fn what_others_add_after_us_does_not_change_the_rendering(case in pod(), which in 0usize..2) {
        with_injector(which, |inj| {
            let Some(object) = mutated(inj, &case) else {
                return Ok(());
            };
            let before = validate(inj, &case.namespace, &object);
            let status_key = inj.config.status_annotation.clone();
            let mut later = object.clone();
            admitted_by_others(&mut later);
            let after = validate(inj, &case.namespace, &later);
            prop_assert_eq!(&before, &after, "{:#}", later);
            let plan = |pod: &Value| match decide_for(inj, &typed(pod), &case.namespace) {
                Ok(Decision::Inject(plan)) => Some(plan.status),
                _ => None,
            };
            if let Some(status) = plan(&object) {
                prop_assert_eq!(
                    object["metadata"]["annotations"][&status_key].as_str(),
                    Some(status.text.as_str())
                );
                prop_assert_eq!(plan(&later), Some(status));
            }
            Ok(())
        })?;
    }
}

proptest! {
    #![proptest_config(config())]

    /// Pods whose own containers do not use a sidecar's name.
    #[test]
    fn validator_admits_what_the_mutator_made(case in pod(), which in 0usize..2) {
        prop_assume!(no_collisions(&case.pod));
        with_injector(which, |inj| {
            let Some(object) = mutated(inj, &case) else {
                return Ok(());
            };
            let verdict = validate(inj, &case.namespace, &object);
            prop_assert_eq!(&verdict["allowed"], &json!(true), "{}\n{:#}", verdict, object);
            prop_assert!(verdict.get("warnings").is_none(), "{}", verdict);
            Ok(())
        })?;
    }

    /// Any pod, its own containers named like sidecars included: the mutator either refuses
    /// it or produces a pod the validator admits. It must never hand the validator a pod the
    /// validator then refuses, with advice ("create the pod with the injector's mutating
    /// webhook available") that cannot help.
    #[test]
    fn validator_admits_what_the_mutator_made_even_with_name_collisions(
        case in pod(),
        which in 0usize..2,
    ) {
        with_injector(which, |inj| {
            let Some(object) = mutated(inj, &case) else {
                return Ok(());
            };
            let verdict = validate(inj, &case.namespace, &object);
            prop_assert_eq!(&verdict["allowed"], &json!(true), "{}\n{:#}", verdict, object);
            Ok(())
        })?;
    }

    #[test]
    fn validator_refuses_a_lost_or_changed_sidecar(
        case in pod(),
        which in 0usize..2,
        pick in any::<Index>(),
        remove in any::<bool>(),
    ) {
        prop_assume!(no_collisions(&case.pod));
        with_injector(which, |inj| {
            let Some(mut object) = mutated(inj, &case) else {
                return Ok(());
            };
            let sidecars = sidecars_in(&object);
            if sidecars.is_empty() {
                // Not opted in, or skipped: nothing of the injector's to lose.
                return Ok(());
            }
            let (list, i) = sidecars[pick.index(sidecars.len())];
            let items = object["spec"][list].as_array_mut().expect("a list");
            if remove {
                items.remove(i);
            } else {
                items[i]["image"] = "registry.example.com/tampered:1".into();
            }
            let verdict = validate(inj, &case.namespace, &object);
            prop_assert_eq!(&verdict["allowed"], &json!(false), "{}", verdict);
            prop_assert_eq!(&verdict["status"]["code"], &json!(403), "{}", verdict);
            Ok(())
        })?;
    }
}

// === 4. Any bytes in, an answer or an error out ===

fn arbitrary_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        ".{0,12}".prop_map(Value::String),
        Just(Value::String("admission.k8s.io/v1".into())),
        Just(Value::String("Pod".into())),
        Just(Value::String("CREATE".into())),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(
                prop_oneof![
                    ".{0,8}",
                    Just("apiVersion".to_owned()),
                    Just("kind".to_owned()),
                    Just("request".to_owned()),
                    Just("uid".to_owned()),
                    Just("object".to_owned()),
                ],
                inner,
                0..6
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Every pointer into `value`, the root included.
fn pointers(value: &Value, at: String, out: &mut Vec<String>) {
    match value {
        Value::Object(m) => {
            for (k, v) in m {
                let escaped = k.replace('~', "~0").replace('/', "~1");
                pointers(v, format!("{at}/{escaped}"), out);
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                pointers(v, format!("{at}/{i}"), out);
            }
        }
        _ => {}
    }
    out.push(at);
}

/// A well-formed review with one node replaced by arbitrary JSON.
fn damaged_review() -> impl Strategy<Value = Vec<u8>> {
    let operation = prop_oneof![
        Just("CREATE"),
        Just("UPDATE"),
        Just("DELETE"),
        Just("CONNECT"),
        Just("BOGUS")
    ];
    let version = prop_oneof![
        Just("admission.k8s.io/v1"),
        Just("admission.k8s.io/v1beta1"),
        Just("admission.k8s.io/v2")
    ];
    (
        pod(),
        pod(),
        operation,
        version,
        any::<Index>(),
        arbitrary_json(),
    )
        .prop_map(|(case, old, operation, version, at, replacement)| {
            let mut body: Value = serde_json::from_slice(&review(
                operation,
                &case.namespace,
                &case.pod,
                Some(&old.pod),
            ))
            .expect("JSON");
            body["apiVersion"] = version.into();
            let mut all = Vec::new();
            pointers(&body, String::new(), &mut all);
            let target = &all[at.index(all.len())];
            match body.pointer_mut(target) {
                Some(node) => *node = replacement,
                None => body = replacement,
            }
            serde_json::to_vec(&body).expect("JSON")
        })
}

fn check_answers(body: &[u8]) -> Result<(), TestCaseError> {
    for inj_index in 0..2 {
        for webhook in [Webhook::Mutate, Webhook::Validate] {
            let result = with_injector(inj_index, |inj| answer(inj, webhook, body));
            let Ok(answer) = result else {
                continue;
            };
            let value: Value = match serde_json::from_slice(&answer.body) {
                Ok(v) => v,
                Err(e) => return Err(TestCaseError::fail(format!("answer is not JSON: {e}"))),
            };
            prop_assert_eq!(&value["kind"], &json!("AdmissionReview"));
            prop_assert!(value["response"]["uid"].is_string(), "{}", value);
            prop_assert!(value["response"]["allowed"].is_boolean(), "{}", value);
            if let Some(patch) = value["response"].get("patch") {
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(patch.as_str().unwrap_or("!"))
                    .map_err(|e| TestCaseError::fail(format!("patch is not base64: {e}")))?;
                prop_assert!(serde_json::from_slice::<json_patch::Patch>(&bytes).is_ok());
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn any_bytes_are_answered_or_refused(body in prop::collection::vec(any::<u8>(), 0..256)) {
        check_answers(&body)?;
    }

    #[test]
    fn any_json_is_answered_or_refused(value in arbitrary_json()) {
        check_answers(&serde_json::to_vec(&value).expect("JSON"))?;
    }

    #[test]
    fn any_damaged_review_is_answered_or_refused(body in damaged_review()) {
        check_answers(&body)?;
    }
}

// === 5. `outdated` agrees with the mutator ===

proptest! {
    #![proptest_config(config())]

    /// Rendering again on the stored pod (its status annotation and everything the templates
    /// added included) gives the same templates and hash, so a fresh injection is current.
    #[test]
    fn outdated_judges_a_fresh_injection_current(case in pod(), which in 0usize..2) {
        with_injector(which, |inj| {
            let Some(mut object) = mutated(inj, &case) else {
                return Ok(());
            };
            // The API server stores the request's namespace on the object.
            object["metadata"]["namespace"] = case.namespace.clone().into();
            let before = typed(&case.pod);
            let injected = matches!(
                decide_for(inj, &before, &case.namespace),
                Ok(Decision::Inject(_))
            );
            let had_status = case.pod["metadata"]["annotations"]
                .get(&inj.config.status_annotation)
                .is_some();
            let verdict = check(inj, &typed(&object), &Default::default());
            if injected {
                prop_assert_eq!(verdict, Some(PodState::Current), "{:#}", object);
            } else if !had_status {
                prop_assert_eq!(verdict, None, "{:#}", object);
            }
            Ok(())
        })?;
    }
}

// === 6. The borrowed view and the typed road give the same bytes ===
//
// `review::answer_for` reads a body through the borrowed view; `review::answer_typed` reads it
// as k8s-openapi types first. On every body both must write the same answer, byte for byte, or
// refuse it the same way. The bodies are reviews of generated pods (CREATE and UPDATE, both
// webhook entries), some turned hostile: a key written twice, an array made huge, a value
// nested past the parser's depth limit, a string written with `\u` escapes or as a lone
// surrogate, a number where a string belongs.

#[derive(Clone, Copy, Debug)]
enum Hostile {
    None,
    DuplicateKey,
    HugeArray,
    DeepNesting,
    Escaped,
    LoneSurrogate,
    NumberForString,
}

fn hostile() -> impl Strategy<Value = Hostile> {
    prop_oneof![
        2 => Just(Hostile::None),
        1 => Just(Hostile::DuplicateKey),
        1 => Just(Hostile::HugeArray),
        1 => Just(Hostile::DeepNesting),
        1 => Just(Hostile::Escaped),
        1 => Just(Hostile::LoneSurrogate),
        1 => Just(Hostile::NumberForString),
    ]
}

/// JSON text of `value`, with `how` done to the node at pointer `target`.
fn write_hostile(value: &Value, at: &str, target: &str, how: Hostile, out: &mut String) {
    let here = at == target;
    match value {
        Value::Object(m) => {
            out.push('{');
            let mut first = true;
            let member = |out: &mut String, k: &str, v: &Value, first: &mut bool| {
                if !*first {
                    out.push(',');
                }
                *first = false;
                out.push_str(&serde_json::to_string(k).expect("a key"));
                out.push(':');
                let escaped = k.replace('~', "~0").replace('/', "~1");
                write_hostile(v, &format!("{at}/{escaped}"), target, how, out);
            };
            if here
                && matches!(how, Hostile::DuplicateKey)
                && let Some((k, v)) = m.iter().next()
            {
                // The same key with another value first: the last one is the one that counts.
                let other = if v.is_string() {
                    json!("other")
                } else {
                    json!(null)
                };
                member(out, k, &other, &mut first);
            }
            for (k, v) in m {
                member(out, k, v, &mut first);
            }
            out.push('}');
        }
        Value::Array(items) => {
            let copies = if here && matches!(how, Hostile::HugeArray) {
                2000 / items.len().max(1)
            } else {
                1
            };
            out.push('[');
            let mut first = true;
            for _ in 0..copies {
                for (i, v) in items.iter().enumerate() {
                    if !first {
                        out.push(',');
                    }
                    first = false;
                    write_hostile(v, &format!("{at}/{i}"), target, how, out);
                }
            }
            out.push(']');
        }
        Value::String(s) if here => match how {
            Hostile::Escaped => {
                out.push('"');
                for c in s.chars() {
                    let mut units = [0u16; 2];
                    for unit in c.encode_utf16(&mut units) {
                        out.push_str(&format!("\\u{unit:04x}"));
                    }
                }
                out.push('"');
            }
            Hostile::LoneSurrogate => out.push_str("\"a\\ud800b\""),
            Hostile::NumberForString => out.push_str("42"),
            _ => out.push_str(&serde_json::to_string(s).expect("a string")),
        },
        _ if here && matches!(how, Hostile::DeepNesting) => {
            out.push_str(&"[".repeat(200));
            out.push_str(&value.to_string());
            out.push_str(&"]".repeat(200));
        }
        other => out.push_str(&other.to_string()),
    }
}

fn two_roads_review() -> impl Strategy<Value = (Vec<u8>, Vec<u8>, String)> {
    (pod(), prop::bool::ANY, any::<Index>(), hostile()).prop_map(|(case, update, at, how)| {
        let object = case.pod.clone();
        let old = update.then(|| {
            let mut old = case.pod.clone();
            old["metadata"]["labels"]["old"] = "yes".into();
            old
        });
        let operation = if update { "UPDATE" } else { "CREATE" };
        let body: Value =
            serde_json::from_slice(&review(operation, &case.namespace, &object, old.as_ref()))
                .expect("JSON");
        let mut all = Vec::new();
        pointers(&body, String::new(), &mut all);
        let target = all[at.index(all.len())].clone();
        let mut text = String::new();
        write_hostile(&body, "", &target, how, &mut text);
        let clean = serde_json::to_vec(&body).expect("JSON");
        (text.into_bytes(), clean, format!("{how:?} at {target}"))
    })
}

/// Both roads answer `body` alike. The one way they may part: the typed road refuses a body
/// for a hostile value in a field the view did not need for its answer (a field the injector
/// never reads, or the containers of a pod that is not opted in); then the view must answer
/// exactly what it answers for the body without the hostile value (`clean`).
fn same_on_both_roads(body: &[u8], clean: &[u8], what: &str) -> Result<(), TestCaseError> {
    use sidecar_injector::inject::Entry;
    use sidecar_injector::review::{answer_for, answer_typed};
    for which in 0..2 {
        for webhook in [Webhook::Mutate, Webhook::Validate] {
            for entry in [Entry::Pod, Entry::Namespace, Entry::Required] {
                let (view, typed, view_clean) = with_injector(which, |inj| {
                    (
                        answer_for(inj, webhook, entry, body),
                        answer_typed(inj, webhook, entry, body),
                        answer_for(inj, webhook, entry, clean),
                    )
                });
                match (view, typed) {
                    (Ok(v), Ok(t))
                        if v.body != t.body
                            && String::from_utf8_lossy(&t.body)
                                .contains("cannot read this AdmissionReview") =>
                    {
                        let clean = view_clean.map(|a| a.body).unwrap_or_default();
                        prop_assert_eq!(
                            String::from_utf8_lossy(&v.body),
                            String::from_utf8_lossy(&clean),
                            "{} {:?} {:?}: the typed road refused it; the view must answer as for the clean body",
                            what,
                            webhook,
                            entry
                        );
                    }
                    (Ok(v), Ok(t)) => {
                        prop_assert_eq!(
                            String::from_utf8_lossy(&v.body),
                            String::from_utf8_lossy(&t.body),
                            "{} {:?} {:?}",
                            what,
                            webhook,
                            entry
                        );
                        prop_assert_eq!(v.outcome, t.outcome);
                    }
                    (Err(v), Err(t)) => prop_assert_eq!(v.to_string(), t.to_string()),
                    (v, t) => prop_assert!(
                        false,
                        "{} {:?} {:?}: view {:?}, typed {:?}",
                        what,
                        webhook,
                        entry,
                        v.map(|a| String::from_utf8_lossy(&a.body).into_owned()),
                        t.map(|a| String::from_utf8_lossy(&a.body).into_owned())
                    ),
                }
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn the_view_and_the_typed_road_answer_alike((body, clean, what) in two_roads_review()) {
        same_on_both_roads(&body, &clean, &what)?;
    }
}

// === 7. A warm render cache answers as a cold one ===
//
// The render cache keys a rendering by what each template reads of the pod. The injectors of
// the other properties have rendered for every pod generated before: their answers must equal
// those of an injector that has rendered nothing, for the pod and for one that differs in
// labels (another ReplicaSet, maybe another app).

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn a_warm_render_cache_answers_as_a_cold_one(
        case in pod(),
        which in 0usize..2,
        relabel in any::<u8>(),
    ) {
        let mut other = case.pod.clone();
        if other["metadata"]["labels"].is_null() {
            other["metadata"]["labels"] = json!({});
        }
        other["metadata"]["labels"]["pod-template-hash"] = format!("h{relabel}").into();
        other["metadata"]["labels"]["app"] = format!("app{}", relabel % 3).into();
        let cold = if which == 0 { embedded() } else { marks() };
        for pod in [&case.pod, &other] {
            let body = review("CREATE", &case.namespace, pod, None);
            for webhook in [Webhook::Mutate, Webhook::Validate] {
                let text = |answer: Result<sidecar_injector::review::Answer, _>| match answer {
                    Ok(a) => String::from_utf8_lossy(&a.body).into_owned(),
                    Err(e) => format!("error: {e}"),
                };
                let warm = with_injector(which, |inj| text(answer(inj, webhook, &body)));
                prop_assert_eq!(warm, text(answer(&cold, webhook, &body)), "{:?}", webhook);
            }
        }
    }
}

// === 8. The memory of recent answers answers as the engine ===
//
// `memo::Memo` answers a body that equals a remembered one outside `request.uid` from memory.
// On every body of property 6 (hostile ones included: a key written twice, an escaped uid) and
// on the same body with another uid (plain, or one that needs escaping), it must answer what
// `review::answer_for` answers, and a plain uid on a clean body must come from memory (else
// the memory is not doing its work).

thread_local! {
    static SHARED: [std::sync::Arc<Injector>; 2] =
        [std::sync::Arc::new(embedded()), std::sync::Arc::new(marks())];
}

const UID: &str = "d0c9a8b7-6e5f-4d3c-8b2a-1f0e9d8c7b6a";

fn another_uid() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => "[a-zA-Z0-9 ._:-]{0,40}",
        1 => "[a-z]{0,4}[\"\\\\é\u{1}][a-z]{0,4}",
    ]
}

fn same_as_the_engine(
    memo: &sidecar_injector::memo::Memo,
    inj: &std::sync::Arc<Injector>,
    webhook: Webhook,
    entry: sidecar_injector::inject::Entry,
    body: &[u8],
) -> Result<sidecar_injector::memo::Recall, TestCaseError> {
    let (recalled, how) = memo.answer(inj, webhook, entry, body);
    let reviewed = sidecar_injector::review::answer_for(inj, webhook, entry, body);
    match (recalled, reviewed) {
        (Ok(m), Ok(r)) => {
            prop_assert_eq!(
                String::from_utf8_lossy(&m.body),
                String::from_utf8_lossy(&r.body),
                "{:?}",
                how
            );
            prop_assert_eq!(m.outcome, r.outcome);
            prop_assert_eq!(&m.summary, &r.summary);
            prop_assert_eq!(&m.injected, &r.injected);
        }
        (Err(m), Err(r)) => prop_assert_eq!(m.to_string(), r.to_string()),
        (m, r) => prop_assert!(false, "memory {:?}, engine {:?}", m.is_ok(), r.is_ok()),
    }
    Ok(how)
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn the_memory_answers_as_the_engine(
        (body, clean, what) in two_roads_review(),
        uid in another_uid(),
        which in 0usize..2,
    ) {
        use sidecar_injector::inject::Entry;
        use sidecar_injector::memo::{Memo, Recall};
        let text = String::from_utf8_lossy(&body).into_owned();
        let plain_uid = !uid.contains(['"', '\\', 'é', '\u{1}']);
        // The body with `uid` written (escaped as JSON escapes it) where the first one was.
        let quoted = serde_json::to_string(&uid).expect("a string");
        let again = text.replacen(&format!("\"{UID}\""), &quoted, 1).into_bytes();
        SHARED.with(|shared| -> Result<(), TestCaseError> {
            let inj = &shared[which];
            for webhook in [Webhook::Mutate, Webhook::Validate] {
                for entry in [Entry::Pod, Entry::Namespace] {
                    let memo = Memo::new(4);
                    let first = same_as_the_engine(&memo, inj, webhook, entry, &body)?;
                    // Kept the second time it comes.
                    same_as_the_engine(&memo, inj, webhook, entry, &body)?;
                    let second = same_as_the_engine(&memo, inj, webhook, entry, &again)?;
                    same_as_the_engine(&memo, inj, webhook, entry, &clean)?;
                    if what.starts_with("None") && plain_uid {
                        prop_assert_eq!(first, Recall::Miss, "{}", what);
                        prop_assert_eq!(second, Recall::Hit, "{}", what);
                    }
                    // Another injector (a reload) is never answered from this one's memory.
                    let other = &shared[1 - which];
                    prop_assert_ne!(
                        same_as_the_engine(&memo, other, webhook, entry, &again)?,
                        Recall::Hit
                    );
                }
            }
            Ok(())
        })?;
    }
}

// === 9. Replicas with their own token names are answered from memory as the engine ===
//
// The API server names each pod's ServiceAccount token volume `kube-api-access-` and a random
// suffix, in the volume and in every container's mount of it. `memo::Memo` answers a replica
// that differs from a remembered body only there (and in its uid) from memory. On generated
// pods, with the token name also written where the view does not read it as one (a label, an
// annotation, another volume, an env var, a container, a port, an owner), as the remembered
// suffix or as the replica's, the memory must answer what `review::answer_for` answers; and a
// plain replica must come from memory.

/// Where a stray copy of a token name goes.
#[derive(Clone, Copy, Debug)]
enum Stray {
    Label,
    Annotation,
    Volume,
    Env,
    Container,
    Port,
    Owner,
}

/// `pod` with the ServiceAccount token volume `kube-api-access-<suffix>` and its mount in every
/// container and init container, as the ServiceAccount admission plugin adds them.
fn with_token(pod: &Value, suffix: &str, stray: Option<(Stray, &str)>) -> Value {
    let mut pod = pod.clone();
    let name = format!("kube-api-access-{suffix}");
    for list in ["containers", "initContainers"] {
        for c in pod["spec"][list].as_array_mut().into_iter().flatten() {
            let mut mounts = c["volumeMounts"].as_array().cloned().unwrap_or_default();
            mounts.push(json!({"name": name, "readOnly": true,
                               "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}));
            c["volumeMounts"] = Value::Array(mounts);
        }
    }
    let mut volumes = pod["spec"]["volumes"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    volumes.push(json!({"name": name, "projected": {"sources": [
        {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}}]}}));
    pod["spec"]["volumes"] = Value::Array(volumes);
    if let Some((stray, suffix)) = stray {
        let other = format!("kube-api-access-{suffix}");
        let first = |pod: &mut Value, list: &str| -> Option<Value> {
            pod["spec"][list]
                .as_array_mut()?
                .first_mut()
                .map(Value::take)
        };
        match stray {
            Stray::Label => pod["metadata"]["labels"]["stray"] = other.into(),
            Stray::Annotation => pod["metadata"]["annotations"]["stray"] = other.into(),
            Stray::Volume => {
                if let Some(v) = pod["spec"]["volumes"].as_array_mut() {
                    v.insert(0, json!({"name": other, "emptyDir": {}}));
                }
            }
            Stray::Env | Stray::Port => {
                if let Some(mut c) = first(&mut pod, "containers") {
                    let (field, item) = match stray {
                        Stray::Env => ("env", json!({"name": other, "value": "x"})),
                        _ => ("ports", json!({"name": other, "containerPort": 8081})),
                    };
                    let mut items = c[field].as_array().cloned().unwrap_or_default();
                    items.push(item);
                    c[field] = Value::Array(items);
                    pod["spec"]["containers"][0] = c;
                }
            }
            Stray::Container => {
                if let Some(list) = pod["spec"]["containers"].as_array_mut() {
                    list.push(json!({"name": other, "image": "other:1"}));
                }
            }
            Stray::Owner => {
                pod["metadata"]["ownerReferences"] = json!([{"apiVersion": "apps/v1",
                    "kind": "ReplicaSet", "name": other, "uid": "1", "controller": true}]);
            }
        }
    }
    pod
}

/// Whose token name a stray copy names.
#[derive(Clone, Copy, Debug)]
enum Whose {
    /// Each body's own: the name is written once more where the view does not read it as a
    /// token volume's, so another suffix changes that place too.
    Own,
    /// The first body's, in every body.
    First,
    /// The replica's, in every body.
    Replica,
}

fn stray() -> impl Strategy<Value = Option<(Stray, Whose)>> {
    let place = prop_oneof![
        Just(Stray::Label),
        Just(Stray::Annotation),
        Just(Stray::Volume),
        Just(Stray::Env),
        Just(Stray::Container),
        Just(Stray::Port),
        Just(Stray::Owner),
    ];
    let whose =
        prop_oneof![2 => Just(Whose::Own), 1 => Just(Whose::First), 1 => Just(Whose::Replica)];
    prop_oneof![1 => Just(None), 3 => (place, whose).prop_map(Some)]
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn replicas_with_their_own_token_names_are_answered_as_the_engine(
        case in pod(),
        suffixes in ("[a-z0-9]{5}", "[a-z0-9]{5}", "[a-z0-9]{5}"),
        stray in stray(),
        which in 0usize..2,
    ) {
        use sidecar_injector::inject::Entry;
        use sidecar_injector::memo::{Memo, Recall};
        let (a, b, c) = suffixes;
        prop_assume!(a != b && b != c && a != c);
        // A pod without containers has no place for some stray copies.
        let stray = stray.filter(|(place, _)| {
            with_token(&case.pod, &a, Some((*place, "x"))) != with_token(&case.pod, &a, None)
        });
        let body = |suffix: &str, uid: &str| {
            let copy = stray.map(|(place, whose)| {
                let named = match whose {
                    Whose::Own => suffix,
                    Whose::First => &a,
                    Whose::Replica => &b,
                };
                (place, named.to_owned())
            });
            let pod = with_token(&case.pod, suffix, copy.as_ref().map(|(p, s)| (*p, s.as_str())));
            String::from_utf8(review("CREATE", &case.namespace, &pod, None))
                .expect("UTF-8")
                .replacen(UID, uid, 1)
                .into_bytes()
        };
        SHARED.with(|shared| -> Result<(), TestCaseError> {
            let inj = &shared[which];
            for webhook in [Webhook::Mutate, Webhook::Validate] {
                for entry in [Entry::Pod, Entry::Namespace] {
                    let memo = Memo::new(4);
                    same_as_the_engine(&memo, inj, webhook, entry, &body(&a, "uid-1"))?;
                    // Kept the second time its kind comes: another replica.
                    same_as_the_engine(&memo, inj, webhook, entry, &body(&c, "uid-2"))?;
                    let replica = body(&b, "uid-3");
                    let recall = same_as_the_engine(&memo, inj, webhook, entry, &replica)?;
                    let plain = !replica.windows(2).any(|w| w == b"\\u");
                    if stray.is_none() && plain {
                        prop_assert_eq!(recall, Recall::Hit);
                    }
                    if stray.is_some() {
                        prop_assert_ne!(recall, Recall::Hit);
                    }
                }
            }
            Ok(())
        })?;
    }
}

// === 10. Every patch applies, malformed pods included ===

/// A way a pod arrives broken: before the API server validates it, a mutating webhook sees
/// what a person wrote.
#[derive(Clone, Copy, Debug)]
enum Damage {
    NoSpec,
    NullSpec,
    EmptySpec,
    NoContainers,
    NullContainers,
    EmptyContainers,
    NullInitContainers,
    NullVolumes,
    NullEnv,
    NullMounts,
    NoMetadata,
    NullLabels,
    NullAnnotations,
    UnnamedContainer,
    ContainersNotAList,
    EnvNotAList,
    LabelsNotAMap,
}

fn damage() -> impl Strategy<Value = Damage> {
    use Damage::*;
    prop::sample::select(vec![
        NoSpec,
        NullSpec,
        EmptySpec,
        NoContainers,
        NullContainers,
        EmptyContainers,
        NullInitContainers,
        NullVolumes,
        NullEnv,
        NullMounts,
        NoMetadata,
        NullLabels,
        NullAnnotations,
        UnnamedContainer,
        ContainersNotAList,
        EnvNotAList,
        LabelsNotAMap,
    ])
}

fn first(pod: &mut Value) -> Option<&mut Value> {
    pod.get_mut("spec")?.get_mut("containers")?.get_mut(0)
}

fn damaged(mut pod: Value, how: Damage) -> Value {
    match how {
        Damage::NoSpec => drop(pod.as_object_mut().map(|o| o.remove("spec"))),
        Damage::NullSpec => pod["spec"] = Value::Null,
        Damage::EmptySpec => pod["spec"] = json!({}),
        Damage::NoContainers => drop(pod["spec"].as_object_mut().map(|o| o.remove("containers"))),
        Damage::NullContainers => pod["spec"]["containers"] = Value::Null,
        Damage::EmptyContainers => pod["spec"]["containers"] = json!([]),
        Damage::NullInitContainers => pod["spec"]["initContainers"] = Value::Null,
        Damage::NullVolumes => pod["spec"]["volumes"] = Value::Null,
        Damage::NullEnv => {
            if let Some(c) = first(&mut pod) {
                c["env"] = Value::Null;
            }
        }
        Damage::NullMounts => {
            if let Some(c) = first(&mut pod) {
                c["volumeMounts"] = Value::Null;
            }
        }
        Damage::NoMetadata => drop(pod.as_object_mut().map(|o| o.remove("metadata"))),
        Damage::NullLabels => pod["metadata"]["labels"] = Value::Null,
        Damage::NullAnnotations => pod["metadata"]["annotations"] = Value::Null,
        Damage::UnnamedContainer => {
            if let Some(c) = first(&mut pod) {
                drop(c.as_object_mut().map(|o| o.remove("name")));
            }
        }
        Damage::ContainersNotAList => pod["spec"]["containers"] = json!({"name": "app"}),
        Damage::EnvNotAList => {
            if let Some(c) = first(&mut pod) {
                c["env"] = json!("X=1");
            }
        }
        Damage::LabelsNotAMap => pod["metadata"]["labels"] = json!(["sidecar-injector.io/inject"]),
    }
    pod
}

proptest! {
    #![proptest_config(config())]

    /// Whatever the pod, the mutator either refuses it naming the pod's mistake (not a
    /// template), or admits it with a patch that applies to the pod as it was sent, after which
    /// the mutator has nothing more to add; the validator agrees with it; and the offline
    /// commands answer the same (`review` is this function).
    #[test]
    fn every_patch_applies(case in pod(), how in damage(), which in 0usize..2, by_namespace in any::<bool>()) {
        with_injector(which, |inj| {
            let pod = damaged(case.pod.clone(), how);
            let body = review("CREATE", &case.namespace, &pod, None);
            // The namespace entry opts in a pod whatever its labels: a pod with no metadata too.
            let entry = if by_namespace { Entry::Namespace } else { Entry::Pod };
            let respond = |inj: &Injector, webhook: Webhook, body: &[u8]| {
                let answer = answer_for(inj, webhook, entry, body).expect("a review with a uid is answered");
                decoded(&answer.body)
            };
            let response = respond(inj, Webhook::Mutate, &body);
            if response["allowed"] != true {
                let message = response["status"]["message"].as_str().unwrap_or_default();
                // The pod's mistake (a field of the wrong type, an unknown template), never a
                // template that failed to render.
                prop_assert!(
                    !message.contains("render"),
                    "{:?}: refused as the injector's fault: {}", how, message
                );
                let code = response["status"]["code"].as_u64().unwrap_or(0);
                prop_assert!((400..500).contains(&code), "{:?}: {} {}", how, code, message);
                return Ok(());
            }
            let mut object = pod.clone();
            if let Some(patch) = response.get("patch") {
                let patch: json_patch::Patch = serde_json::from_value(patch.clone()).expect("a JSONPatch");
                if let Err(e) = json_patch::patch(&mut object, &patch) {
                    return Err(TestCaseError::fail(format!("{how:?}: {e}: {patch:?} on {pod}")));
                }
                let again = respond(inj, Webhook::Mutate, &review("CREATE", &case.namespace, &object, None));
                prop_assert_eq!(&again["allowed"], &json!(true), "{:?}", how);
                prop_assert!(again.get("patch").is_none(), "{:?}: a second patch {}", how, again);
            }
            // The validator says nothing against what the mutator let through unchanged.
            if response.get("patch").is_none() {
                let verdict = respond(inj, Webhook::Validate, &review("CREATE", &case.namespace, &object, None));
                let skipped = response["warnings"].as_array().is_some_and(|w| {
                    w.iter().any(|w| w.as_str().is_some_and(|w| w.contains("not injected")))
                });
                if skipped {
                    prop_assert_eq!(&verdict["allowed"], &json!(true), "{:?}: {}", how, verdict);
                }
            }
            Ok(())
        })?;
    }
}

// === 11. Patches make the maps they write into ===

proptest! {
    #![proptest_config(config())]

    #[test]
    fn a_template_without_metadata_is_injected(case in pod(), form in 0usize..3) {
        let inj = embedded();
        let mut template = json!({"spec": case.pod["spec"].clone()});
        match form {
            0 => {}
            1 => template["metadata"] = Value::Null,
            _ => template["metadata"] = json!({}),
        }
        let deployment = json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "shop"},
            "spec": {"selector": {"matchLabels": {"app": "web"}}, "template": template},
        });
        let target = sidecar_injector::manifest::Target {
            namespace: None,
            namespace_labels: Some(
                [("sidecar-injector.io/inject".to_owned(), "enabled".to_owned())].into(),
            ),
        };
        let text = serde_json::to_string(&deployment).expect("JSON");
        let once = sidecar_injector::manifest::inject_each(&inj, &text, &target);
        for error in &once.errors {
            // A pod the engine refuses (a port clash) is named; a patch never fails.
            prop_assert!(
                matches!(error, sidecar_injector::manifest::ManifestError::Inject { .. }),
                "form {}: {}", form, error
            );
        }
        if once.errors.is_empty() && once.yaml != text {
            let out: Value = serde_json::from_str(&once.yaml).expect("JSON stays JSON");
            prop_assert!(
                out.pointer("/spec/template/metadata/annotations/sidecar-injector.io~1status").is_some(),
                "form {}: {}", form, once.yaml
            );
        }
        let twice = sidecar_injector::manifest::inject_each(&inj, &once.yaml, &target);
        prop_assert_eq!(&twice.yaml, &once.yaml, "form {}: not a fixed point", form);

        // The webhook's road: a pod without metadata is one the API server refuses (it has
        // no name); it is let through unchanged, whichever entry sent it, never patched.
        let mut pod = case.pod.clone();
        pod.as_object_mut().expect("a pod").remove("metadata");
        let body = review("CREATE", &case.namespace, &pod, None);
        for entry in [Entry::Pod, Entry::Namespace, Entry::Required] {
            let answer = answer_for(&inj, Webhook::Mutate, entry, &body)
                .expect("a review with a uid is answered");
            let response = decoded(&answer.body);
            prop_assert_eq!(&response["allowed"], &json!(true), "{}", response);
            prop_assert!(response.get("patch").is_none(), "{}", response);
        }
    }
}

// === 12. uninject undoes inject ===

/// Whether `small` is `big` with items of its lists and entries of its maps removed, nothing
/// added or changed.
fn removed_from(small: &Value, big: &Value) -> bool {
    match (small, big) {
        (Value::Object(s), Value::Object(b)) => s
            .iter()
            .all(|(k, v)| b.get(k).is_some_and(|bv| removed_from(v, bv))),
        (Value::Array(s), Value::Array(b)) => {
            let mut rest = b.iter();
            s.iter().all(|item| rest.any(|b| removed_from(item, b)))
        }
        _ => small == big,
    }
}

proptest! {
    #![proptest_config(config())]

    /// `uninject` gives back the pod `inject` was given: exactly, or, where the pod already
    /// had an item the same as one a template adds (which the status does not record, see
    /// docs/COMMANDS.md), that pod without it. Either way, injecting it again gives the
    /// injected pod back: it loses nothing of the author's that injection would not add
    /// again as it was.
    #[test]
    fn uninject_undoes_inject(case in pod(), which in 0usize..2) {
        with_injector(which, |inj| {
            let text = serde_json::to_string(&case.pod).expect("JSON");
            let namespace = Some(case.namespace.as_str());
            let target = sidecar_injector::manifest::Target { namespace, namespace_labels: None };
            let injected = sidecar_injector::manifest::inject_each(inj, &text, &target);
            if !injected.errors.is_empty() {
                return Ok(());
            }
            let undone = sidecar_injector::uninject::uninject(inj, &injected.yaml, namespace);
            if injected.yaml == text {
                // Not injected: written back as it came (with an error when it carries a
                // status of its own that does not parse or hash as ours).
                prop_assert_eq!(&undone.yaml, &text, "a pod not injected is left as it is");
                return Ok(());
            }
            prop_assert!(undone.errors.is_empty(), "{:?}", undone.errors);
            let (x, y): (Value, Value) = (
                serde_json::from_str(&text).expect("JSON"),
                serde_json::from_str(&undone.yaml).expect("JSON stays JSON"),
            );
            let again = sidecar_injector::manifest::inject_each(inj, &undone.yaml, &target);
            let (ix, iy): (Value, Value) = (
                serde_json::from_str(&injected.yaml).expect("JSON"),
                serde_json::from_str(&again.yaml).expect("JSON"),
            );
            prop_assert_eq!(&iy, &ix, "inject(uninject(inject(x))) is not inject(x)");
            if y != x {
                prop_assert!(removed_from(&y, &x), "uninject(inject(x)) is not x: {}", undone.yaml);
            }
            Ok(())
        })?;
    }
}
