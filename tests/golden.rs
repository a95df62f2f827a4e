//! Golden files for the engine. Every file under `tests/inputs/{inject,skip,deny}/` is answered
//! by [`review::answer`], the function the server and `sidecar-injector review` both call, and
//! the decoded answer is a snapshot, so a reviewer sees every behaviour change as a diff.
//!
//! Inputs are AdmissionReview JSON (v1 or v1beta1) as the API server sends it, or a pod as YAML,
//! which is sent as a v1 CREATE review. The file name picks the few things a review cannot say:
//! - `deny/mutate-*`: answered by the mutating webhook (all other `deny/` files: the validator);
//! - `warn-mode-*`: the default configuration with `validation.mode: warn`;
//! - `deny/*-pre-existing-*`: an UPDATE that does not introduce its problem: admitted with a
//!   warning, as in warn mode;
//! - `tilde-*`: a configuration whose keys contain `/` and `~` (see [`tilde_injector`]);
//! - `canary-*`: the default configuration with `revision: canary`;
//! - `required-*`: sent by the required entry (`/mutate/required`, `/validate/required`: its
//!   namespace is labelled `sidecar-injector.io/inject: required`), to the default
//!   configuration with `required.exempt` (see [`required_injector`]); `required-warn-mode-*`:
//!   the same with `validation.mode: warn`.
//!
//! `tests/inputs/kubectl/` holds what `kubectl get ... -o yaml|json` prints (a `kind: List`),
//! through `inject` and `explain` ([`kubectl`]).
//!
//! Every injector runs as if deployed in the namespace `sidecar-injector`.

use std::collections::BTreeSet;
use std::path::Path;

use base64::Engine as _;
use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};
use sidecar_injector::config::{BUNDLED_TEMPLATES, DEFAULT_CONFIG, Injector};
use sidecar_injector::inject::{Decision, Entry, PodFacts, decide, plan_edits};
use sidecar_injector::review::{Outcome, Webhook, answer, answer_for};
use sidecar_injector::view::{PodView, pod_json};
use sidecar_injector::{explain, manifest};

const OWN_NAMESPACE: &str = "sidecar-injector";

// === Injectors ===

fn embedded() -> Injector {
    Injector::embedded(Some(OWN_NAMESPACE.into())).expect("embedded configuration loads")
}

fn bundled_templates() -> Vec<(String, String)> {
    BUNDLED_TEMPLATES
        .iter()
        .map(|(n, s)| ((*n).to_owned(), (*s).to_owned()))
        .collect()
}

/// Replaces `from` (which must occur) in the default configuration.
fn default_config_with(edits: &[(&str, &str)]) -> String {
    let mut config = DEFAULT_CONFIG.to_owned();
    for (from, to) in edits {
        assert!(
            config.contains(from),
            "default config no longer has {from:?}"
        );
        config = config.replace(from, to);
    }
    config
}

fn warn_injector() -> Injector {
    let config = default_config_with(&[("mode: enforce", "mode: warn")]);
    Injector::from_sources(
        "warn.yaml",
        &config,
        bundled_templates(),
        Some(OWN_NAMESPACE.into()),
    )
    .expect("warn configuration loads")
}

/// A template whose label and annotation keys need escaping in a JSON pointer, and which may
/// go into Windows pods (the bundled ones may not).
const MARKS_TEMPLATE: &str = "supportsWindows: true\nlabels:\n  marks.example.com/team~owner: platform\nannotations:\n  marks.example.com/note~x/y: \"injected by {{ pod.namespace }}\"\n";

/// The default configuration with a status annotation key holding `/` and `~`, and a third
/// default template writing a label and an annotation whose keys hold both.
fn tilde_injector() -> Injector {
    let config = default_config_with(&[
        (
            "statusAnnotation: sidecar-injector.io/status",
            "statusAnnotation: \"sidecar-injector.io/status~v1\"",
        ),
        (
            "defaultTemplates: [log-shipper, proxy]",
            "defaultTemplates: [log-shipper, proxy, marks]",
        ),
    ]);
    let mut templates = bundled_templates();
    templates.push(("marks".into(), MARKS_TEMPLATE.into()));
    Injector::from_sources("tilde.yaml", &config, templates, Some(OWN_NAMESPACE.into()))
        .expect("tilde configuration loads")
}

/// The default configuration as revision `canary`.
fn canary_injector() -> Injector {
    let config = default_config_with(&[("revision: \"\"", "revision: canary")]);
    Injector::from_sources(
        "canary.yaml",
        &config,
        bundled_templates(),
        Some(OWN_NAMESPACE.into()),
    )
    .expect("canary configuration loads")
}

/// The default configuration exempting, in a required namespace, the service account `backup`
/// of `shop` and `ci-runner` of every namespace.
fn required_injector() -> Injector {
    required_injector_from(DEFAULT_CONFIG.to_owned())
}

/// [`required_injector`] with `validation.mode: warn`.
fn required_warn_injector() -> Injector {
    required_injector_from(default_config_with(&[("mode: enforce", "mode: warn")]))
}

fn required_injector_from(base: String) -> Injector {
    let config = format!("{base}required:\n  exempt: [shop/backup, \"*/ci-runner\"]\n");
    Injector::from_sources(
        "required.yaml",
        &config,
        bundled_templates(),
        Some(OWN_NAMESPACE.into()),
    )
    .expect("required configuration loads")
}

fn file_name(path: &Path) -> &str {
    path.file_name().and_then(|n| n.to_str()).unwrap_or("")
}

fn injector_for(path: &Path) -> Injector {
    let name = file_name(path);
    if name.starts_with("warn-mode-") {
        warn_injector()
    } else if name.starts_with("tilde-") {
        tilde_injector()
    } else if name.starts_with("canary-") {
        canary_injector()
    } else if name.starts_with("required-warn-mode-") {
        required_warn_injector()
    } else if name.starts_with("required-") {
        required_injector()
    } else {
        embedded()
    }
}

/// The webhook entry that sends a golden input: its file name says (see the module's head).
fn entry_for(path: &Path) -> Entry {
    match file_name(path).starts_with("required-") {
        true => Entry::Required,
        false => Entry::Pod,
    }
}

// === Reviews ===

/// A stable, UUID-shaped uid for a pod given as YAML, derived from its file name.
fn uid_for(name: &str) -> String {
    let hex: String = Sha256::digest(name.as_bytes())
        .iter()
        .take(16)
        .map(|b| format!("{b:02x}"))
        .collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// A v1 CREATE review of `pod`, as the API server sends it for `kubectl apply`.
fn create_review(uid: &str, pod: Value) -> Value {
    let namespace = pod
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or("default")
        .to_owned();
    let name = pod
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    let pods = json!({"group": "", "version": "v1", "resource": "pods"});
    let kind = json!({"group": "", "version": "v1", "kind": "Pod"});
    json!({
        "kind": "AdmissionReview",
        "apiVersion": "admission.k8s.io/v1",
        "request": {
            "uid": uid,
            "kind": kind,
            "resource": pods,
            "requestKind": kind,
            "requestResource": pods,
            "name": name,
            "namespace": namespace,
            "operation": "CREATE",
            "userInfo": {"username": "alice@example.com", "groups": ["system:authenticated"]},
            "object": pod,
            "oldObject": null,
            "dryRun": false,
            "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"}
        }
    })
}

fn load_review(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).expect("input is readable");
    let value: Value = if path.extension().is_some_and(|e| e == "json") {
        serde_json::from_str(&text).expect("input is JSON")
    } else {
        serde_saphyr::from_str(&text).expect("input is YAML")
    };
    if value["kind"] == "AdmissionReview" {
        value
    } else {
        create_review(&uid_for(file_name(path)), value)
    }
}

/// The same review with another object, as a reinvocation or the validator would see it.
fn with_object(review: &Value, object: &Value) -> Value {
    let mut review = review.clone();
    review["request"]["object"] = object.clone();
    review
}

fn ask(inj: &Injector, webhook: Webhook, review: &Value) -> (Outcome, Value) {
    let bytes = serde_json::to_vec(review).expect("review serializes");
    let answer = answer(inj, webhook, &bytes).expect("a review with a uid is always answered");
    (answer.outcome, decode(&answer.body))
}

/// The answer as JSON, with the base64 patch decoded into its operations.
fn decode(body: &[u8]) -> Value {
    let mut review: Value = serde_json::from_slice(body).expect("the answer is JSON");
    if let Some(patch) = review.pointer_mut("/response/patch") {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(patch.as_str().expect("the patch is a base64 string"))
            .expect("the patch is base64");
        *patch = serde_json::from_slice(&bytes).expect("the patch is JSON");
    }
    review
}

/// The decoded answer's patch applied to the request's object.
fn patched(request: &Value, decoded: &Value) -> Result<Value, String> {
    let ops: json_patch::Patch =
        serde_json::from_value(decoded["response"]["patch"].clone()).map_err(|e| e.to_string())?;
    let mut object = request["request"]["object"].clone();
    json_patch::patch(&mut object, &ops).map_err(|e| format!("the patch does not apply: {e}"))?;
    Ok(object)
}

// === Checks ===

/// What every answer must satisfy: it is an AdmissionReview in the request's version, for
/// the request's uid.
fn check_envelope(request: &Value, decoded: &Value, problems: &mut Vec<String>) {
    if decoded["apiVersion"] != request["apiVersion"] {
        problems.push(format!(
            "answered in {} to a {} review",
            decoded["apiVersion"], request["apiVersion"]
        ));
    }
    if decoded["kind"] != "AdmissionReview" {
        problems.push(format!("kind is {}", decoded["kind"]));
    }
    if decoded["response"]["uid"] != request["request"]["uid"] {
        problems.push(format!(
            "uid {} does not echo the request's {}",
            decoded["response"]["uid"], request["request"]["uid"]
        ));
    }
}

fn check_no_patch(decoded: &Value, problems: &mut Vec<String>) {
    let response = &decoded["response"];
    if response.get("patch").is_some() || response.get("patchType").is_some() {
        problems.push(format!("unexpected patch: {}", response["patch"]));
    }
}

fn check_inject(
    inj: &Injector,
    entry: Entry,
    request: &Value,
    outcome: Outcome,
    decoded: &Value,
) -> Vec<String> {
    let mut problems = Vec::new();
    check_envelope(request, decoded, &mut problems);
    let response = &decoded["response"];
    if outcome != Outcome::Injected || response["allowed"] != true {
        problems.push(format!("not injected ({outcome:?}): {response}"));
        return problems;
    }
    if response["patchType"] != "JSONPatch" {
        problems.push(format!("patchType is {}", response["patchType"]));
    }
    if response["auditAnnotations"]["injected"].as_str().is_none() {
        problems.push("no `injected` audit annotation".into());
    }
    let patched = match patched(request, decoded) {
        Ok(p) => p,
        Err(e) => {
            problems.push(e);
            return problems;
        }
    };
    // Each pointer must name the member it adds: with `/` or `~` unescaped it names another.
    for op in response["patch"].as_array().into_iter().flatten() {
        let path = op["path"].as_str().unwrap_or("");
        if op["op"] != "add" {
            problems.push(format!("{} at {path}: the injector only adds", op["op"]));
        }
        if !path.ends_with("/-") && patched.pointer(path).is_none() {
            problems.push(format!("{path} names nothing in the patched pod"));
        }
        let is_entry =
            path.starts_with("/metadata/labels/") || path.starts_with("/metadata/annotations/");
        if is_entry && patched.pointer(path) != Some(&op["value"]) {
            problems.push(format!("{path} does not hold {}", op["value"]));
        }
    }
    let pod: Pod = match serde_json::from_value(patched.clone()) {
        Ok(p) => p,
        Err(e) => {
            problems.push(format!("the patched pod does not parse: {e}"));
            return problems;
        }
    };
    let spec = pod.spec.as_ref().expect("a patched pod has a spec");
    let mut names = BTreeSet::new();
    for c in spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
    {
        if !names.insert(c.name.as_str()) {
            problems.push(format!("container {:?} is there twice", c.name));
        }
    }
    // The fixed point: the engine asked again about its own output has nothing to add.
    let namespace = request["request"]["namespace"].as_str();
    let json = pod_json(&pod);
    let view = PodView::parse(&json).expect("a pod reads through the view");
    match decide(inj, &PodFacts::new(&view, namespace).with_entry(entry)) {
        Ok(Decision::Inject(plan)) => {
            let again = plan_edits(inj, &view, &plan);
            if !again.is_empty() {
                problems.push(format!("planning the patched pod again gives {again:?}"));
            }
        }
        other => problems.push(format!("the patched pod is no longer injected: {other:?}")),
    }
    let second = with_object(request, &patched);
    let (outcome, again) = ask_as(inj, Webhook::Mutate, entry, &second);
    if outcome != Outcome::Allowed || again["response"].get("patch").is_some() {
        problems.push(format!(
            "a reinvocation on the patched pod answers {outcome:?}: {again}"
        ));
    }
    // The companion validator admits what the mutator made, without a word.
    let (outcome, verdict) = ask_as(inj, Webhook::Validate, entry, &second);
    if outcome != Outcome::Allowed
        || verdict["response"]["allowed"] != true
        || verdict["response"].get("warnings").is_some()
    {
        problems.push(format!(
            "the validator does not simply admit the patched pod: {verdict}"
        ));
    }
    problems
}

/// A pod creation this installation is asked for: the pod opts in and names its revision
/// (none for the default revision).
fn is_opted_in_pod_create(inj: &Injector, request: &Value) -> bool {
    let req = &request["request"];
    let labels = &req["object"]["metadata"]["labels"];
    req["operation"] == "CREATE"
        && req["kind"]["kind"] == "Pod"
        && labels["sidecar-injector.io/inject"] == "true"
        && labels["sidecar-injector.io/rev"].as_str().unwrap_or("") == inj.config.revision
}

fn check_skip(
    inj: &Injector,
    request: &Value,
    mutate: (Outcome, &Value),
    validate: (Outcome, &Value),
) -> Vec<String> {
    let mut problems = Vec::new();
    for (webhook, (_, decoded)) in [("mutate", mutate), ("validate", validate)] {
        check_envelope(request, decoded, &mut problems);
        check_no_patch(decoded, &mut problems);
        if decoded["response"]["allowed"] != true {
            problems.push(format!("{webhook}: not allowed: {}", decoded["response"]));
        }
    }
    let (outcome, decoded) = mutate;
    let response = &decoded["response"];
    if is_opted_in_pod_create(inj, request) {
        // Opted in but skipped by a rule: the person who applied it is told why.
        let warned = response["warnings"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|w| {
                w.as_str()
                    .is_some_and(|w| w.starts_with("sidecar-injector: pod not injected: "))
            });
        if outcome != Outcome::Skipped || !warned {
            problems.push(format!(
                "mutate: opted in, but no skip warning ({outcome:?})"
            ));
        }
        if response["auditAnnotations"]["skipped"].as_str().is_none() {
            problems.push("mutate: no `skipped` audit annotation".into());
        }
    } else if outcome != Outcome::Allowed || response.get("warnings").is_some() {
        // Not asked for (or not a pod creation): nothing to say.
        problems.push(format!(
            "mutate: expected a silent admission, got {outcome:?}"
        ));
    }
    problems
}

fn check_deny(request: &Value, warned: bool, outcome: Outcome, decoded: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    check_envelope(request, decoded, &mut problems);
    check_no_patch(decoded, &mut problems);
    let response = &decoded["response"];
    if warned {
        let warnings = response["warnings"].as_array().map_or(0, Vec::len);
        if response["allowed"] != true || outcome != Outcome::Allowed || warnings == 0 {
            problems.push(format!("must be admitted with warnings: {response}"));
        }
        return problems;
    }
    let code = response["status"]["code"].as_u64().unwrap_or(0);
    if response["allowed"] != false || outcome != Outcome::Denied {
        problems.push(format!("not denied ({outcome:?}): {response}"));
    }
    if !(400..500).contains(&code) {
        problems.push(format!("status code {code} is not a 4xx"));
    }
    let message = response["status"]["message"].as_str().unwrap_or("");
    if !message.starts_with("sidecar-injector") {
        problems.push(format!("message does not say who refused: {message:?}"));
    }
    problems
}

/// Runs `check` over every input of `dir`, snapshotting what it returns; fails once at the end
/// with every file's problems, so one broken input does not hide the others.
fn each_input(dir: &str, mut check: impl FnMut(&Path) -> (Value, Vec<String>)) {
    let mut failures = Vec::new();
    insta::glob!(&format!("inputs/{dir}/*.{{json,yaml}}"), |path| {
        let (snapshot, problems) = check(path);
        for p in &problems {
            eprintln!("{dir}/{}: {p}", file_name(path));
            failures.push(format!("{dir}/{}: {p}", file_name(path)));
        }
        // Named after the directory: golden__<dir>@<file>.snap.
        insta::assert_yaml_snapshot!(dir, snapshot);
    });
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

// === Golden tests ===

#[test]
fn inject() {
    each_input("inject", |path| {
        let (inj, entry) = (injector_for(path), entry_for(path));
        let request = load_review(path);
        let (outcome, decoded) = ask_as(&inj, Webhook::Mutate, entry, &request);
        let problems = check_inject(&inj, entry, &request, outcome, &decoded);
        let patched = patched(&request, &decoded).unwrap_or(Value::Null);
        (json!({"answer": decoded, "patched": patched}), problems)
    });
}

#[test]
fn skip() {
    each_input("skip", |path| {
        let (inj, entry) = (injector_for(path), entry_for(path));
        let request = load_review(path);
        let (m_outcome, mutate) = ask_as(&inj, Webhook::Mutate, entry, &request);
        let (v_outcome, validate) = ask_as(&inj, Webhook::Validate, entry, &request);
        let problems = check_skip(&inj, &request, (m_outcome, &mutate), (v_outcome, &validate));
        (json!({"mutate": mutate, "validate": validate}), problems)
    });
}

#[test]
fn deny() {
    each_input("deny", |path| {
        let (inj, entry) = (injector_for(path), entry_for(path));
        let request = load_review(path);
        let name = file_name(path);
        let webhook = if name.starts_with("mutate-") {
            Webhook::Mutate
        } else {
            Webhook::Validate
        };
        let (outcome, decoded) = ask_as(&inj, webhook, entry, &request);
        // Admitted with warnings: warn mode, and a problem an UPDATE did not introduce.
        let warned = name.contains("warn-mode-") || name.contains("-pre-existing-");
        let problems = check_deny(&request, warned, outcome, &decoded);
        (decoded, problems)
    });
}

// === What kubectl prints ===

/// The pod template of a workload as kubectl prints it: `spec.template`, or a CronJob's
/// `spec.jobTemplate.spec.template`.
fn workload_template(item: &Value) -> Option<&Value> {
    item.pointer("/spec/jobTemplate/spec/template")
        .or_else(|| item.pointer("/spec/template"))
}

fn without_workload_template(mut item: Value) -> Value {
    for path in ["/spec/jobTemplate/spec/template", "/spec/template"] {
        if let Some(t) = item.pointer_mut(path) {
            *t = Value::Null;
            break;
        }
    }
    item
}

fn item_id(item: &Value) -> String {
    format!(
        "{}/{}",
        item["kind"].as_str().unwrap_or(""),
        item["metadata"]["name"].as_str().unwrap_or("")
    )
}

/// What `inject` must do to the `kind: List` `input` that it turned into `output`, naming
/// `left_alone` on stderr: the same List (its metadata, its items in their order); each item
/// whose pod template carries the opt-in label either injected (sidecars and status annotation
/// in its template, all else kept) or kept as it is and named; every other item kept.
fn check_list(input: &Value, output: &Value, left_alone: &[String]) -> Vec<String> {
    let mut problems = Vec::new();
    for key in ["apiVersion", "kind", "metadata"] {
        if input[key] != output[key] {
            problems.push(format!("the List's {key} changed: {}", output[key]));
        }
    }
    let (Some(before), Some(after)) = (input["items"].as_array(), output["items"].as_array())
    else {
        return vec![format!("not a List with items: {output}")];
    };
    let ids = |items: &[Value]| items.iter().map(item_id).collect::<Vec<_>>();
    if ids(before) != ids(after) {
        problems.push(format!("items {:?} became {:?}", ids(before), ids(after)));
        return problems;
    }
    for (old, new) in before.iter().zip(after) {
        let id = item_id(old);
        let named = left_alone.iter().any(|l| l.starts_with(&format!("{id}: ")));
        let opted_in = workload_template(old)
            .is_some_and(|t| t["metadata"]["labels"]["sidecar-injector.io/inject"] == "true");
        if old == new {
            if opted_in && !named {
                problems.push(format!("{id} is opted in, left alone, and not named"));
            }
            if !opted_in && named {
                problems.push(format!("{id} is not opted in, and named: {left_alone:?}"));
            }
            continue;
        }
        if !opted_in || named {
            problems.push(format!(
                "{id} changed (opted in: {opted_in}; named: {named})"
            ));
        }
        let Some(template) = workload_template(new) else {
            problems.push(format!("{id} lost its pod template"));
            continue;
        };
        let init = template["spec"]["initContainers"]
            .as_array()
            .into_iter()
            .flatten();
        if !init.into_iter().any(|c| c["name"] == "log-shipper") {
            problems.push(format!("{id} changed but has no log-shipper"));
        }
        if template["metadata"]["annotations"]["sidecar-injector.io/status"].is_null() {
            problems.push(format!("{id} changed but has no status annotation"));
        }
        if without_workload_template(old.clone()) != without_workload_template(new.clone()) {
            problems.push(format!("{id} changed outside its pod template"));
        }
    }
    problems
}

/// `kubectl get ... -o yaml|json` output under `tests/inputs/kubectl/`, through `inject` and
/// `explain`: the snapshot is what `explain` says, what `inject` names on stderr and what it
/// writes; injecting that output again changes nothing and names every opted-in template.
#[test]
fn kubectl() {
    let inj = embedded();
    let mut failures = Vec::new();
    insta::glob!("inputs/kubectl/*.{json,yaml}", |path| {
        let text = std::fs::read_to_string(path).expect("input is readable");
        let name = file_name(path);
        let input: Value = serde_saphyr::from_str(&text).expect("input is one YAML document");
        let injected = manifest::inject(&inj, &text, None).expect("injects");
        let output: Value =
            serde_saphyr::from_str(&injected.yaml).expect("output is one YAML document");
        let mut problems = check_list(&input, &output, &injected.left_alone);
        let again = manifest::inject(&inj, &injected.yaml, None).expect("injects again");
        if again.yaml != injected.yaml {
            problems.push("injecting the output again changes it".into());
        }
        problems.extend(check_list(&output, &output, &again.left_alone));
        for p in &problems {
            failures.push(format!("kubectl/{name}: {p}"));
        }
        let report = explain::explain(&inj, &text, None).expect("explains");
        let seen = format!(
            "# explain\n{report}\n# inject: standard error\n{}\n\n# inject: standard output\n{}",
            injected.left_alone.join("\n"),
            injected.yaml
        );
        insta::assert_snapshot!("kubectl", seen);
    });
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Manifests of the shapes public repositories hold (`tests/inputs/manifests/shapes/`): YAML
/// 1.1 octal modes, a flow-style JSON document after `---`, pod templates without metadata,
/// JSON documents in a YAML stream, a file without a final newline, one document that cannot
/// be read among others. The snapshot is what `inject` writes and says; every document it did
/// not change is byte for byte the input's, every document reads back as its typed kind
/// (k8s-openapi), injecting the output again changes nothing, and `explain` reads the same
/// file and names the same documents.
#[test]
fn manifest_shapes() {
    use k8s_openapi::api::{apps::v1 as apps, batch::v1 as batch, core::v1 as core};
    let inj = embedded();
    let target = manifest::Target {
        namespace: None,
        namespace_labels: None,
    };
    let mut failures = Vec::new();
    insta::glob!("inputs/manifests/shapes/*.yaml", |path| {
        let text = std::fs::read_to_string(path).expect("input is readable");
        let name = file_name(path);
        let mut problems = Vec::new();
        let injected = manifest::inject_each(&inj, &text, &target);
        let (before, after) = (
            manifest::split_documents(&text),
            manifest::split_documents(&injected.yaml),
        );
        if before.len() != after.len() {
            problems.push(format!(
                "{} documents in, {} out",
                before.len(),
                after.len()
            ));
        }
        for (i, (b, a)) in before.iter().zip(&after).enumerate() {
            if b.marker != a.marker {
                problems.push(format!("document {}: its marker changed", i + 1));
            }
            let Ok(value) = manifest::read_document(a.text) else {
                if a.text != b.text {
                    problems.push(format!("document {}: unreadable and changed", i + 1));
                }
                continue;
            };
            let changed = a.text != b.text;
            let typed = match value["kind"].as_str().unwrap_or("") {
                "Pod" => serde_json::from_value::<core::Pod>(value.clone()).err(),
                "Service" => serde_json::from_value::<core::Service>(value.clone()).err(),
                "Secret" => serde_json::from_value::<core::Secret>(value.clone()).err(),
                "Namespace" => serde_json::from_value::<core::Namespace>(value.clone()).err(),
                "Deployment" => serde_json::from_value::<apps::Deployment>(value.clone()).err(),
                "StatefulSet" => serde_json::from_value::<apps::StatefulSet>(value.clone()).err(),
                "DaemonSet" => serde_json::from_value::<apps::DaemonSet>(value.clone()).err(),
                "Job" => serde_json::from_value::<batch::Job>(value.clone()).err(),
                "CronJob" => serde_json::from_value::<batch::CronJob>(value.clone()).err(),
                other => Some(serde::de::Error::custom(format!(
                    "no typed kind for {other:?}"
                ))),
            };
            // A document left as it came because it cannot be injected may not read as its
            // kind (that is why it was left).
            if let (Some(e), true) = (typed, changed) {
                problems.push(format!("document {}: not a valid object: {e}", i + 1));
            }
            let opted_in = a.text.contains("sidecar-injector.io/status");
            if changed != opted_in {
                problems.push(format!(
                    "document {}: changed {changed}, injected {opted_in}",
                    i + 1
                ));
            }
        }
        if injected.yaml.ends_with('\n') != text.ends_with('\n') {
            problems.push("the last byte changed".into());
        }
        let again = manifest::inject_each(&inj, &injected.yaml, &target);
        if again.yaml != injected.yaml {
            problems.push("injecting the output again changes it".into());
        }
        let report = explain::explain_for(&inj, &text, &target);
        if report.errors.len() != injected.errors.len() {
            problems.push(format!(
                "explain could not read {} documents, inject {}",
                report.errors.len(),
                injected.errors.len()
            ));
        }
        for p in &problems {
            failures.push(format!("manifests/shapes/{name}: {p}"));
        }
        let errors: Vec<String> = injected.errors.iter().map(ToString::to_string).collect();
        let seen = format!(
            "# explain\n{}\n# inject: standard error\n{}\n\n# inject: standard output\n{}",
            report.text,
            injected
                .left_alone
                .iter()
                .chain(&errors)
                .cloned()
                .collect::<Vec<_>>()
                .join("\n"),
            injected.yaml
        );
        insta::assert_snapshot!("shapes", seen);
    });
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// kubectl's `-o json` and `-o yaml` of the same objects are injected alike.
#[test]
fn kubectl_json_and_yaml_agree() {
    let inj = embedded();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/inputs/kubectl");
    let mut pairs = 0;
    for entry in std::fs::read_dir(&dir).expect("inputs/kubectl") {
        let json = entry.expect("entry").path();
        if json.extension().is_none_or(|e| e != "json") {
            continue;
        }
        let yaml = json.with_extension("yaml");
        let inject = |path: &Path| {
            let text = std::fs::read_to_string(path).expect("readable");
            let injected = manifest::inject(&inj, &text, None).expect("injects");
            let value: Value = serde_saphyr::from_str(&injected.yaml).expect("YAML");
            (value, injected.left_alone)
        };
        assert_eq!(inject(&json), inject(&yaml), "{}", json.display());
        pairs += 1;
    }
    assert!(
        pairs > 0,
        "no JSON input with a YAML twin in {}",
        dir.display()
    );
}

/// A snapshot whose input was renamed or deleted is never checked again: refuse it.
#[test]
fn every_snapshot_has_its_input() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let snapshots = std::fs::read_dir(root.join("snapshots")).expect("tests/snapshots exists");
    for entry in snapshots {
        let name = entry
            .expect("entry")
            .file_name()
            .to_string_lossy()
            .into_owned();
        let Some(rest) = name.strip_prefix("golden__") else {
            continue;
        };
        let Some((dir, input)) = rest.strip_suffix(".snap").and_then(|r| r.split_once('@')) else {
            continue;
        };
        // The manifest shapes live beside the CLI's manifests.
        let dir = match dir {
            "shapes" => "manifests/shapes",
            "uninject_kubectl" => "kubectl",
            dir => dir,
        };
        let input = root.join("inputs").join(dir).join(input);
        assert!(input.is_file(), "{name} has no input {}", input.display());
    }
}

// === Inputs built in code ===

fn env_vars(prefix: &str, n: usize) -> Vec<Value> {
    (0..n)
        .map(|i| json!({"name": format!("{prefix}_{i:04}"), "value": format!("value-{i}")}))
        .collect()
}

/// Two containers with 2,000 environment variables each: the patch only appends what is
/// missing, whatever the size of what is there.
#[test]
fn two_thousand_env_vars_per_container() {
    let inj = embedded();
    let pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "settings-heavy",
            "namespace": "perf",
            "labels": {"app": "settings-heavy", "sidecar-injector.io/inject": "true"}
        },
        "spec": {
            "containers": [
                {"name": "app", "image": "registry.example.com/app:1", "env": env_vars("APP", 2000)},
                {"name": "worker", "image": "registry.example.com/worker:1", "env": env_vars("WORKER", 2000)}
            ]
        }
    });
    let request = create_review("0f1e2d3c-4b5a-4968-8776-a5b4c3d2e1f0", pod);
    let (outcome, decoded) = ask(&inj, Webhook::Mutate, &request);
    let problems = check_inject(&inj, Entry::Pod, &request, outcome, &decoded);
    assert!(problems.is_empty(), "{}", problems.join("\n"));

    let patched = patched(&request, &decoded).expect("patch applies");
    for (i, prefix) in [(0, "APP"), (1, "WORKER")] {
        let env = patched["spec"]["containers"][i]["env"]
            .as_array()
            .expect("env");
        let names: Vec<&str> = env.iter().filter_map(|e| e["name"].as_str()).collect();
        assert_eq!(names.len(), 2002, "container {i}");
        assert_eq!(names[0], format!("{prefix}_0000"));
        assert_eq!(names[1999], format!("{prefix}_1999"));
        assert_eq!(&names[2000..], ["APP_LOG_DIR", "SIDECAR_PROXY_PORT"]);
    }
    // The answer names only the additions, so it is small enough to read whole.
    insta::assert_yaml_snapshot!(decoded);
}

/// The pointers into maps escape `/` as `~1` and `~` as `~0` (RFC 6901), by construction.
#[test]
fn pointers_escape_slash_and_tilde() {
    let inj = tilde_injector();
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/inputs/inject/tilde-and-slash-keys.yaml");
    let (_, decoded) = ask(&inj, Webhook::Mutate, &load_review(&path));
    let paths: Vec<&str> = decoded["response"]["patch"]
        .as_array()
        .expect("a patch")
        .iter()
        .filter_map(|op| op["path"].as_str())
        .collect();
    for expected in [
        "/metadata/annotations/sidecar-injector.io~1status~0v1",
        "/metadata/annotations/marks.example.com~1note~0x~1y",
        "/metadata/labels/marks.example.com~1team~0owner",
        "/metadata/annotations/sidecar-injector.io~1proxy-port",
    ] {
        assert!(paths.contains(&expected), "{expected} not in {paths:#?}");
    }
}

// === Known problems ===

/// What the API server's ServiceAccount admission plugin does to a pod, and does again after a
/// webhook changed it (in-tree mutating plugins are re-run then): it mounts the token volume
/// into every container and init container that lacks it, the injected sidecars included.
fn mount_service_account_token(pod: &mut Value) {
    let mount = json!({
        "name": "kube-api-access-x7k2p",
        "readOnly": true,
        "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"
    });
    for list in ["containers", "initContainers"] {
        for c in pod["spec"][list].as_array_mut().into_iter().flatten() {
            let mounts = c["volumeMounts"].as_array().cloned().unwrap_or_default();
            if !mounts.iter().any(|m| m["mountPath"] == mount["mountPath"]) {
                let mut mounts = mounts;
                mounts.push(mount.clone());
                c["volumeMounts"] = Value::Array(mounts);
            }
        }
    }
}

/// A pod as it is stored after injection in a cluster that automounts service account tokens
/// (the default) must pass the validator: the token mount on a sidecar is not a change made by
/// a person, and denying it refuses every injected pod.
#[test]
fn the_service_account_token_mount_on_sidecars_is_not_a_finding() {
    let inj = embedded();
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/inputs/inject/pod-v1.json");
    let request = load_review(&path);
    let (_, decoded) = ask(&inj, Webhook::Mutate, &request);
    let mut stored = patched(&request, &decoded).expect("patch applies");
    mount_service_account_token(&mut stored);
    let (outcome, verdict) = ask(&inj, Webhook::Validate, &with_object(&request, &stored));
    assert_eq!(outcome, Outcome::Allowed, "{verdict:#}");
    assert_eq!(verdict["response"].get("warnings"), None, "{verdict:#}");
}

fn proxy_of(patched: &Value) -> Value {
    patched["spec"]["initContainers"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["name"] == "proxy")
        .cloned()
        .unwrap_or(Value::Null)
}

fn simple_pod(namespace: &str, service_account: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "web", "namespace": namespace, "labels": {"sidecar-injector.io/inject": "true"}},
        "spec": {
            "serviceAccountName": service_account,
            "containers": [{"name": "web", "image": "nginx:1.27"}]
        }
    })
}

/// `null` is a valid namespace name (a DNS label). The bundled proxy template writes the
/// namespace as a bare YAML scalar, which then reads as YAML null, not as the string "null".
#[test]
fn a_namespace_named_null_is_injected() {
    let inj = embedded();
    let request = create_review(
        "5e4d3c2b-1a09-4f8e-9d7c-6b5a4f3e2d1c",
        simple_pod("null", "default"),
    );
    let (outcome, decoded) = ask(&inj, Webhook::Mutate, &request);
    assert_eq!(outcome, Outcome::Injected, "{decoded:#}");
    let patched = patched(&request, &decoded).expect("patch applies");
    assert_eq!(proxy_of(&patched)["args"][1], "null", "{patched:#}");
}

/// `null` is a valid service account name; the proxy must see it, not an unset variable.
#[test]
fn a_service_account_named_null_reaches_the_proxy() {
    let inj = embedded();
    let request = create_review(
        "6f5e4d3c-2b1a-4098-8e7d-7c6b5a4f3e2d",
        simple_pod("shop", "null"),
    );
    let (outcome, decoded) = ask(&inj, Webhook::Mutate, &request);
    assert_eq!(outcome, Outcome::Injected, "{decoded:#}");
    let patched = patched(&request, &decoded).expect("patch applies");
    assert_eq!(
        proxy_of(&patched)["env"],
        json!([{"name": "SERVICE_ACCOUNT", "value": "null"}]),
        "{patched:#}"
    );
}

// === The whole pod in the context ===

/// The proxy's `--config-yaml` argument, parsed.
fn proxy_config(patched: &Value) -> Value {
    let args = proxy_of(patched)["args"].clone();
    let position = args
        .as_array()
        .and_then(|a| a.iter().position(|v| v == "--config-yaml"))
        .expect("the proxy has --config-yaml");
    serde_json::from_str(args[position + 1].as_str().expect("a string")).expect("valid JSON")
}

/// The proxy routes to the application's declared TCP ports, each once, and to nothing when
/// there are none (one listener that closes connections, so its startup probe still passes).
#[test]
fn the_proxy_routes_to_the_declared_ports() {
    let inj = embedded();
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/inputs/inject/proxy-routes-app-ports.yaml");
    let request = load_review(&path);
    let (_, decoded) = ask(&inj, Webhook::Mutate, &request);
    let stored = patched(&request, &decoded).expect("patch applies");
    let config = proxy_config(&stored);
    let clusters: Vec<u64> = config["static_resources"]["clusters"]
        .as_array()
        .expect("clusters")
        .iter()
        .map(|c| {
            c["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]
                ["socket_address"]["port_value"]
                .as_u64()
                .expect("a port")
        })
        .collect();
    assert_eq!(clusters, [8080, 9090, 9100]);
    let listeners: Vec<u64> = config["static_resources"]["listeners"]
        .as_array()
        .expect("listeners")
        .iter()
        .map(|l| {
            l["address"]["socket_address"]["port_value"]
                .as_u64()
                .expect("port")
        })
        .collect();
    assert_eq!(listeners, [15001, 15002, 15003]);
    let proxy = proxy_of(&stored);
    let ports: Vec<&Value> = proxy["ports"]
        .as_array()
        .expect("ports")
        .iter()
        .map(|p| &p["containerPort"])
        .collect();
    assert_eq!(ports, [15001, 15002, 15003]);

    let request = create_review(
        "7a6b5c4d-3e2f-4a1b-9c8d-7e6f5a4b3c2d",
        simple_pod("shop", "default"),
    );
    let (_, decoded) = ask(&inj, Webhook::Mutate, &request);
    let patched = patched(&request, &decoded).expect("patch applies");
    let config = proxy_config(&patched);
    assert_eq!(config["static_resources"]["clusters"], json!([]));
    let listeners = &config["static_resources"]["listeners"];
    assert_eq!(listeners.as_array().map(Vec::len), Some(1), "{config:#}");
    assert_eq!(
        listeners[0]["address"]["socket_address"]["port_value"],
        15001
    );
    assert_eq!(
        listeners[0]["filter_chains"][0]["filters"][0]["name"],
        "envoy.filters.network.direct_response"
    );
}

/// Everything the API server and other admission plugins change between our mutating call and
/// our validating call, done to an injected pod: the ServiceAccount token volume and its mount
/// (on every container, ours included), AlwaysPullImages, LimitRanger's resources,
/// DefaultTolerationSeconds' tolerations, and another webhook's container with ports of its own
/// and a volume. The validator renders exactly what the mutator rendered and admits the pod
/// without a word; a reinvocation changes nothing.
#[test]
fn what_admission_adds_after_us_does_not_change_the_rendering() {
    let inj = embedded();
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/inputs/inject/proxy-routes-app-ports.yaml");
    let request = load_review(&path);
    let (_, decoded) = ask(&inj, Webhook::Mutate, &request);
    let mut stored = patched(&request, &decoded).expect("patch applies");
    let rendered = proxy_of(&stored);
    let status = stored["metadata"]["annotations"]["sidecar-injector.io/status"].clone();

    mount_service_account_token(&mut stored);
    if stored["spec"]["volumes"].is_null() {
        stored["spec"]["volumes"] = json!([]);
    }
    stored["spec"]["volumes"]
        .as_array_mut()
        .expect("volumes")
        .push(
            json!({"name": "kube-api-access-x7k2p", "projected": {"sources": [
            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}}]}}),
        );
    stored["spec"]["volumes"]
        .as_array_mut()
        .expect("volumes")
        .push(json!({"name": "vault-secrets", "emptyDir": {"medium": "Memory"}}));
    stored["spec"]["containers"]
        .as_array_mut()
        .expect("containers")
        .push(
            json!({"name": "vault-agent", "image": "hashicorp/vault:1.18",
            "ports": [{"containerPort": 8200, "protocol": "TCP"}]}),
        );
    for list in ["containers", "initContainers"] {
        for c in stored["spec"][list].as_array_mut().into_iter().flatten() {
            c["imagePullPolicy"] = json!("Always");
            if c["resources"].is_null() {
                c["resources"] = json!({"requests": {"cpu": "100m"}});
            }
        }
    }
    stored["spec"]["tolerations"] = json!([
        {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}
    ]);

    let later = with_object(&request, &stored);
    let (outcome, verdict) = ask(&inj, Webhook::Validate, &later);
    assert_eq!(outcome, Outcome::Allowed, "{verdict:#}");
    assert_eq!(verdict["response"].get("warnings"), None, "{verdict:#}");
    // The validator rendered what the mutator rendered: the plan for the changed pod is the
    // stored proxy and the stored status.
    let pod: Pod = serde_json::from_value(stored.clone()).expect("a pod");
    let json = pod_json(&pod);
    let view = PodView::parse(&json).expect("a pod reads through the view");
    let Ok(Decision::Inject(plan)) = decide(&inj, &PodFacts::new(&view, Some("shop"))) else {
        panic!("the changed pod is still injected")
    };
    assert_eq!(plan.status.text, status.as_str().expect("a status"));
    let proxy = plan.templates[0].fragment.init_containers[0].clone();
    assert_eq!(json!(proxy.args), rendered["args"]);
    assert_eq!(json!(proxy.ports), rendered["ports"]);
    // The mutator called again (reinvocation) has nothing to add but the other webhook's
    // container's env and mount.
    let (_, again) = ask(&inj, Webhook::Mutate, &later);
    let paths: Vec<&str> = again["response"]["patch"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|op| op["path"].as_str())
        .collect();
    assert!(
        paths.iter().all(|p| p.starts_with("/spec/containers/2/")),
        "{paths:?}"
    );
}

/// A fresh rendering (no status yet) of the same pod with another webhook's container present
/// does see it: only a rendering that already happened is frozen.
#[test]
fn a_first_rendering_sees_every_container_present() {
    let inj = embedded();
    let mut pod = simple_pod("shop", "default");
    pod["spec"]["containers"][0]["ports"] = json!([{"containerPort": 8080}]);
    pod["spec"]["containers"]
        .as_array_mut()
        .expect("containers")
        .push(json!({"name": "side", "image": "x:1", "ports": [{"containerPort": 7000}]}));
    let request = create_review("8b7c6d5e-4f3a-4b2c-8d9e-0f1a2b3c4d5e", pod);
    let (_, decoded) = ask(&inj, Webhook::Mutate, &request);
    let patched = patched(&request, &decoded).expect("patch applies");
    assert_eq!(
        proxy_config(&patched)["static_resources"]["clusters"]
            .as_array()
            .map(Vec::len),
        Some(2)
    );
}

/// `pod.owner` names the Deployment of a ReplicaSet's pod (from its pod-template-hash), and
/// the controller otherwise.
#[test]
fn templates_see_the_controlling_workload() {
    let template =
        "annotations:\n  example.com/owner: \"{{ pod.owner.kind }}/{{ pod.owner.name }}\"\n";
    let config = default_config_with(&[(
        "defaultTemplates: [log-shipper, proxy]",
        "defaultTemplates: [owner]",
    )]);
    let inj = Injector::from_sources(
        "owner.yaml",
        &config,
        vec![("owner".into(), template.into())],
        None,
    )
    .expect("loads");
    let owner_of = |owner: Value, hash: Option<&str>| {
        let mut pod = simple_pod("shop", "default");
        pod["metadata"]["ownerReferences"] = json!([owner]);
        if let Some(hash) = hash {
            pod["metadata"]["labels"]["pod-template-hash"] = json!(hash);
        }
        let request = create_review("9c8d7e6f-5a4b-4c3d-9e0f-1a2b3c4d5e6f", pod);
        let (_, decoded) = ask(&inj, Webhook::Mutate, &request);
        let patched = patched(&request, &decoded).expect("patch applies");
        patched["metadata"]["annotations"]["example.com/owner"].clone()
    };
    let rs = |name: &str| json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": name, "uid": "u", "controller": true});
    assert_eq!(owner_of(rs("web-7d4b9c"), Some("7d4b9c")), "Deployment/web");
    assert_eq!(owner_of(rs("web-7d4b9c"), None), "ReplicaSet/web-7d4b9c");
    assert_eq!(
        owner_of(
            json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db", "uid": "u", "controller": true}),
            None
        ),
        "StatefulSet/db"
    );
    assert_eq!(
        owner_of(
            json!({"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "u"}),
            None
        ),
        "/"
    );
}

// === Overrides ===

#[test]
fn accepted_overrides_are_rendered() {
    let inj = embedded();
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/inputs/inject/proxy-overrides-accepted.yaml");
    let request = load_review(&path);
    let (_, decoded) = ask(&inj, Webhook::Mutate, &request);
    let proxy = proxy_of(&patched(&request, &decoded).expect("patch applies"));
    assert_eq!(
        proxy["resources"]["requests"],
        json!({"cpu": "250m", "memory": "128Mi"})
    );
    assert_eq!(proxy["args"][3], "debug");
}

/// The validator checks overrides too: a pod carrying a bad value is refused by both webhooks,
/// with the same words.
#[test]
fn a_bad_override_is_refused_by_both_webhooks() {
    let inj = embedded();
    let mut pod = simple_pod("shop", "default");
    pod["metadata"]["annotations"] = json!({"sidecar-injector.io/proxy-memory": "4Gi"});
    let request = create_review("0d9e8f7a-6b5c-4d4e-8f0a-1b2c3d4e5f6a", pod);
    for webhook in [Webhook::Mutate, Webhook::Validate] {
        let (outcome, decoded) = ask(&inj, webhook, &request);
        assert_eq!(outcome, Outcome::Denied, "{decoded:#}");
        let message = decoded["response"]["status"]["message"]
            .as_str()
            .unwrap_or("");
        assert!(
            message.contains(
                "annotation sidecar-injector.io/proxy-memory: \"4Gi\" is not allowed: a memory quantity"
            ) && message.contains("from 32Mi to 256Mi"),
            "{message}"
        );
    }
}

// === Namespace opt-in and revisions ===

fn ask_as(inj: &Injector, webhook: Webhook, entry: Entry, review: &Value) -> (Outcome, Value) {
    let bytes = serde_json::to_vec(review).expect("review serializes");
    let answer = answer_for(inj, webhook, entry, &bytes).expect("answered");
    (answer.outcome, decode(&answer.body))
}

/// Sent by the namespace entry (`/mutate/namespace`), a pod without the label is injected and
/// one saying "false" is not; the validator agrees on both.
#[test]
fn the_namespace_entry_injects_unless_the_pod_opts_out() {
    let inj = embedded();
    let mut pod = simple_pod("team-a", "default");
    pod["metadata"]["labels"] = json!({"app": "web"});
    let request = create_review("1e0f9a8b-7c6d-4e5f-9a0b-2c3d4e5f6a7b", pod.clone());
    let (outcome, decoded) = ask_as(&inj, Webhook::Mutate, Entry::Namespace, &request);
    assert_eq!(outcome, Outcome::Injected, "{decoded:#}");
    let stored = patched(&request, &decoded).expect("patch applies");
    let later = with_object(&request, &stored);
    let (outcome, verdict) = ask_as(&inj, Webhook::Validate, Entry::Namespace, &later);
    assert_eq!(outcome, Outcome::Allowed, "{verdict:#}");
    assert_eq!(verdict["response"].get("warnings"), None, "{verdict:#}");
    // Not injected, the pod is refused by the namespace entry's validator...
    let (outcome, _) = ask_as(&inj, Webhook::Validate, Entry::Namespace, &request);
    assert_eq!(outcome, Outcome::Denied);
    // ...and the pod-label entry would not have touched it.
    let (outcome, _) = ask_as(&inj, Webhook::Mutate, Entry::Pod, &request);
    assert_eq!(outcome, Outcome::Allowed);

    pod["metadata"]["labels"]["sidecar-injector.io/inject"] = json!("false");
    let request = create_review("2f1a0b9c-8d7e-4f6a-8b1c-3d4e5f6a7b8c", pod);
    for webhook in [Webhook::Mutate, Webhook::Validate] {
        let (outcome, decoded) = ask_as(&inj, webhook, Entry::Namespace, &request);
        assert_eq!(outcome, Outcome::Allowed, "{decoded:#}");
        check_no_patch(&decoded, &mut Vec::new());
        assert!(decoded["response"].get("patch").is_none());
    }
}

/// A pod the canary revision injected, updated later when its namespace is already served by
/// the default revision: admitted with a warning saying how to move it, never held to templates
/// that are not its own. On creation, a status naming another revision is a finding.
#[test]
fn the_validator_checks_a_pod_against_the_revision_that_injected_it() {
    let canary = canary_injector();
    let default = embedded();
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/inputs/inject/canary-pod-names-the-revision.yaml");
    let request = load_review(&path);
    let (_, decoded) = ask(&canary, Webhook::Mutate, &request);
    let mut stored = patched(&request, &decoded).expect("patch applies");
    let status: Value = serde_json::from_str(
        stored["metadata"]["annotations"]["sidecar-injector.io/status"]
            .as_str()
            .expect("status"),
    )
    .expect("JSON");
    assert_eq!(status["revision"], "canary");
    let (outcome, _) = ask(&canary, Webhook::Validate, &with_object(&request, &stored));
    assert_eq!(outcome, Outcome::Allowed);

    stored["metadata"]["labels"]
        .as_object_mut()
        .expect("labels")
        .remove("sidecar-injector.io/rev");
    let mut update = with_object(&request, &stored);
    update["request"]["operation"] = json!("UPDATE");
    update["request"]["oldObject"] = stored.clone();
    let (outcome, verdict) = ask(&default, Webhook::Validate, &update);
    assert_eq!(outcome, Outcome::Allowed, "{verdict:#}");
    let warning = verdict["response"]["warnings"][0].as_str().unwrap_or("");
    assert!(
        warning.contains("injected by sidecar-injector revision \"canary\""),
        "{warning}"
    );

    // Its sidecars still may not change: the containers the status does not list as the pod's
    // own are held to what they were.
    let mut changed = stored.clone();
    for c in changed["spec"]["initContainers"]
        .as_array_mut()
        .expect("init containers")
    {
        if c["name"] == "proxy" {
            c["image"] = json!("docker.io/envoyproxy/envoy:v0.0.1");
        }
    }
    update["request"]["object"] = changed;
    let (outcome, verdict) = ask(&default, Webhook::Validate, &update);
    assert_eq!(outcome, Outcome::Denied, "{verdict:#}");
    let message = verdict["response"]["status"]["message"]
        .as_str()
        .unwrap_or("");
    assert!(
        message.contains("sidecar \"proxy\" was changed: image is"),
        "{message}"
    );

    let (outcome, verdict) = ask(&default, Webhook::Validate, &with_object(&request, &stored));
    assert_eq!(outcome, Outcome::Denied, "{verdict:#}");
    let message = verdict["response"]["status"]["message"]
        .as_str()
        .unwrap_or("");
    assert!(
        message.contains("says revision \"canary\" injected the pod"),
        "{message}"
    );
}

// === uninject ===

/// Each document of a YAML stream, read (`Null` for one that cannot be).
fn read_all(text: &str) -> Vec<Value> {
    manifest::split_documents(text)
        .iter()
        .map(|d| manifest::read_document(d.text).unwrap_or(Value::Null))
        .collect()
}

/// A document with its pod template's `metadata` dropped when it is `null` or `{}`:
/// injection gives such a template a metadata of its own, and `uninject` removes it when it
/// is left empty, as when the template had none (docs/COMMANDS.md).
fn without_empty_metadata(mut doc: Value) -> Value {
    let Some(path) = manifest::template_path(&doc) else {
        return doc;
    };
    let pointer = path.iter().map(|t| format!("/{t}")).collect::<String>();
    if let Some(template) = doc.pointer_mut(&pointer).and_then(Value::as_object_mut) {
        let empty = template
            .get("metadata")
            .is_some_and(|m| m.is_null() || m.as_object().is_some_and(|m| m.is_empty()));
        if empty {
            template.remove("metadata");
        }
    }
    doc
}

/// What `uninject` did to `injected`, against `original` (what was injected): every document
/// reads back as the original's, and injecting the result again gives `injected` back.
fn check_uninject(
    inj: &Injector,
    original: &str,
    injected: &str,
    namespace: Option<&str>,
) -> (sidecar_injector::uninject::Uninjected, Vec<String>) {
    let mut problems = Vec::new();
    let undone = sidecar_injector::uninject::uninject(inj, injected, namespace);
    for e in &undone.errors {
        problems.push(format!("uninject: {e}"));
    }
    let (want, got) = (read_all(original), read_all(&undone.yaml));
    if want.len() != got.len() {
        problems.push(format!("{} documents in, {} out", want.len(), got.len()));
    }
    for (i, (w, g)) in want.iter().zip(&got).enumerate() {
        if without_empty_metadata(w.clone()) != *g {
            problems.push(format!(
                "document {}: uninject(inject(x)) is not x:\n{}\n---- got\n{}",
                i + 1,
                serde_json::to_string_pretty(w).unwrap_or_default(),
                serde_json::to_string_pretty(g).unwrap_or_default()
            ));
        }
    }
    let target = manifest::Target {
        namespace,
        namespace_labels: None,
    };
    let again = manifest::inject_each(inj, &undone.yaml, &target);
    if read_all(&again.yaml) != read_all(injected) {
        problems.push("inject(uninject(inject(x))) is not inject(x)".into());
    }
    (undone, problems)
}

/// `kubectl get ... -o yaml|json` output (a `kind: List`), injected and then uninjected: the
/// List comes back as it was, item by item, and the snapshot is what `uninject` says and
/// writes.
#[test]
fn uninject_kubectl() {
    let inj = embedded();
    let mut failures = Vec::new();
    insta::glob!("inputs/kubectl/*.{json,yaml}", |path| {
        let text = std::fs::read_to_string(path).expect("input is readable");
        let injected = manifest::inject(&inj, &text, None).expect("injects");
        let (undone, problems) = check_uninject(&inj, &text, &injected.yaml, None);
        if undone.removed == 0 {
            failures.push(format!("kubectl/{}: nothing removed", file_name(path)));
        }
        failures.extend(
            problems
                .iter()
                .map(|p| format!("kubectl/{}: {p}", file_name(path))),
        );
        let seen = format!(
            "# uninject: standard error\n{}\n\n# uninject: standard output\n{}",
            undone.notes.join("\n"),
            undone.yaml
        );
        insta::assert_snapshot!("uninject_kubectl", seen);
    });
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

const CRONJOB: &str = "# A nightly report, its pod template two levels down.
apiVersion: batch/v1
kind: CronJob
metadata:
  name: report
  namespace: shop
spec:
  schedule: \"0 3 * * *\"
  jobTemplate:
    spec:
      template:
        metadata:
          labels:
            app: report
            sidecar-injector.io/inject: \"true\"
        spec:
          restartPolicy: OnFailure
          containers:
            - name: report
              image: registry.example.com/report:2
              env:
                - {name: MODE, value: nightly}
              volumeMounts:
                - {name: out, mountPath: /out}
          volumes:
            - name: out
              emptyDir: {}
";

/// A CronJob, injected and uninjected: its pod template is found at
/// `spec.jobTemplate.spec.template` and comes back as the author wrote it.
#[test]
fn uninject_cronjob() {
    let inj = embedded();
    let injected = manifest::inject(&inj, CRONJOB, None).expect("injects");
    assert!(injected.yaml.contains("log-shipper"), "{}", injected.yaml);
    let (undone, problems) = check_uninject(&inj, CRONJOB, &injected.yaml, None);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    let seen = format!(
        "# uninject: standard error\n{}\n\n# uninject: standard output\n{}",
        undone.notes.join("\n"),
        undone.yaml
    );
    insta::assert_snapshot!("uninject_cronjob", seen);
}

/// Every pod of `tests/inputs/inject/` that is not injected yet, injected by the webhook and
/// uninjected offline: the pod comes back as it came, and injecting it again gives the same
/// pod (with `log-shipper-already-present`, the pod's own `log-shipper`, recorded as kept,
/// stays).
#[test]
fn uninject_undoes_the_webhook() {
    let mut failures = Vec::new();
    let mut checked = 0;
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/inputs/inject");
    let mut paths: Vec<_> = std::fs::read_dir(&dir)
        .expect("inputs/inject")
        .map(|e| e.expect("entry").path())
        .collect();
    paths.sort();
    for path in paths {
        let inj = injector_for(&path);
        let request = load_review(&path);
        let mut pod = request["request"]["object"].clone();
        let status = inj.config.status_annotation.clone();
        if pod
            .pointer("/metadata/annotations")
            .and_then(|a| a.get(&status))
            .is_some()
        {
            continue; // Injected already: what it was before is not known.
        }
        let (_, decoded) = ask(&inj, Webhook::Mutate, &request);
        let Ok(injected) = patched(&request, &decoded) else {
            continue;
        };
        if injected == pod {
            continue;
        }
        checked += 1;
        // As a document: a pod that names its kind.
        let mut injected = injected;
        for p in [&mut pod, &mut injected] {
            p["apiVersion"] = json!("v1");
            p["kind"] = json!("Pod");
        }
        let namespace = request["request"]["namespace"].as_str();
        let text = |v: &Value| serde_json::to_string_pretty(v).expect("JSON");
        let undone = sidecar_injector::uninject::uninject(&inj, &text(&injected), namespace);
        let name = file_name(&path);
        for e in &undone.errors {
            failures.push(format!("inject/{name}: uninject: {e}"));
        }
        let got = read_all(&undone.yaml);
        if got.first() != Some(&pod) {
            failures.push(format!(
                "inject/{name}: uninject(inject(x)) is not x:\n{}\n---- got\n{}",
                text(&pod),
                got.first().map(text).unwrap_or_default()
            ));
        }
        let again = with_object(&request, got.first().unwrap_or(&Value::Null));
        let (_, decoded) = ask(&inj, Webhook::Mutate, &again);
        let reinjected = patched(&again, &decoded).map(|mut v| {
            v["apiVersion"] = json!("v1");
            v["kind"] = json!("Pod");
            v
        });
        if reinjected.as_ref() != Ok(&injected) {
            failures.push(format!(
                "inject/{name}: inject(uninject(inject(x))) is not inject(x)"
            ));
        }
    }
    assert!(checked >= 5, "only {checked} inputs injected");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Every manifest `inject` reads (`tests/inputs/manifests/`, its shapes too), injected and
/// uninjected: every document comes back as it was.
#[test]
fn uninject_undoes_inject_for_every_manifest() {
    let inj = embedded();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/inputs/manifests");
    let mut failures = Vec::new();
    let mut files = Vec::new();
    for dir in [root.clone(), root.join("shapes")] {
        for entry in std::fs::read_dir(&dir).expect("inputs/manifests") {
            let path = entry.expect("entry").path();
            if path.extension().is_some_and(|e| e == "yaml" || e == "json") {
                files.push(path);
            }
        }
    }
    files.sort();
    assert!(files.len() >= 5, "{files:?}");
    for path in files {
        let text = std::fs::read_to_string(&path).expect("input is readable");
        let target = manifest::Target {
            namespace: Some("shop"),
            namespace_labels: None,
        };
        let injected = manifest::inject_each(&inj, &text, &target);
        let (_, problems) = check_uninject(&inj, &text, &injected.yaml, Some("shop"));
        // A document `inject` could not read is written back as it came by both.
        let unreadable = injected.errors.len();
        failures.extend(
            problems
                .iter()
                .filter(|p| unreadable == 0 || !p.starts_with("uninject: "))
                .map(|p| format!("{}: {p}", path.display())),
        );
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
