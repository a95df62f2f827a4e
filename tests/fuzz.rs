//! A fuzzer for the AdmissionReview parser and the patch builder, on stable Rust and with no
//! extra tooling: mutations of the golden inputs (`tests/inputs/{inject,skip,deny}`), both
//! structural (JSON values replaced, deleted, duplicated, spliced from another input, keys
//! that need escaping in a JSON pointer) and byte-level (flips, cuts, insertions), answered by
//! [`review::answer_for`] for every webhook and entry. Every answer must hold:
//! 1. no panic (an arithmetic overflow too: this runs in the debug profile);
//! 2. an `Err` only for a body with no readable request; an answer is an AdmissionReview in the
//!    request's version that echoes its uid;
//! 3. a mutating answer's patch is base64 JSONPatch that applies to the request's object as
//!    sent (not as the engine parsed it), and the patched pod is a fixed point (answered again,
//!    no patch); one injected for the first time (no status annotation yet) is admitted by
//!    the validator.
//!
//! Inputs whose answer has a shape not seen before (outcome, patch length, message prefix)
//! join the corpus. It runs for `FUZZ_SECONDS` (default 3; `make fuzz` runs it longer) from
//! `FUZZ_SEED` (default: the clock; printed, so a failure can be replayed). A failing input is
//! written under the target directory and named in the failure.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashSet;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{Map, Value, json};
use sidecar_injector::config::Injector;
use sidecar_injector::inject::Entry;
use sidecar_injector::review::{Outcome, Webhook, answer_for};

const OWN_NAMESPACE: &str = "sidecar-injector";

// === Randomness ===

/// xorshift64*: small, seedable, good enough to pick mutations.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        usize::try_from(self.next() % n.max(1) as u64).unwrap()
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    fn chance(&mut self, one_in: usize) -> bool {
        self.below(one_in) == 0
    }
}

// === Corpus ===

/// Every golden input as the review the golden tests send (a pod in YAML becomes a CREATE).
fn seeds() -> Vec<Value> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/inputs");
    let mut seeds = Vec::new();
    for dir in ["inject", "skip", "deny"] {
        let mut paths: Vec<_> = std::fs::read_dir(root.join(dir))
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        paths.sort();
        for path in paths {
            let text = std::fs::read_to_string(&path).unwrap();
            let value: Value = if path.extension().is_some_and(|e| e == "json") {
                serde_json::from_str(&text).unwrap()
            } else {
                serde_saphyr::from_str(&text).unwrap()
            };
            seeds.push(if value["kind"] == "AdmissionReview" {
                value
            } else {
                create_review(value)
            });
        }
    }
    assert!(seeds.len() >= 20, "only {} seeds found", seeds.len());
    seeds
}

fn create_review(pod: Value) -> Value {
    let kind = json!({"group": "", "version": "v1", "kind": "Pod"});
    json!({
        "kind": "AdmissionReview",
        "apiVersion": "admission.k8s.io/v1",
        "request": {
            "uid": "00000000-0000-4000-8000-000000000000",
            "kind": kind,
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": pod.pointer("/metadata/namespace").cloned().unwrap_or(json!("default")),
            "operation": "CREATE",
            "userInfo": {"username": "fuzz"},
            "object": pod,
        }
    })
}

// === Mutations ===

/// Keys and strings the engine looks at, and some that need escaping or are odd.
const WORDS: &[&str] = &[
    "sidecar-injector.io/inject",
    "sidecar-injector.io/templates",
    "sidecar-injector.io/status",
    "sidecar-injector.io/revision",
    "sidecar-injector.io/proxy-cpu",
    "sidecar-injector.io/proxy-memory",
    "sidecar-injector.io/proxy-log-level",
    "true",
    "false",
    "proxy",
    "log-shipper",
    "proxy,log-shipper",
    "containers",
    "initContainers",
    "volumes",
    "volumeMounts",
    "ports",
    "containerPort",
    "annotations",
    "labels",
    "name",
    "image",
    "hostNetwork",
    "nodeSelector",
    "kubernetes.io/os",
    "windows",
    "kube-system",
    "sidecar-injector",
    "CREATE",
    "UPDATE",
    "DELETE",
    "CONNECT",
    "admission.k8s.io/v1beta1",
    "a~b/c",
    "~1~0",
    "/",
    "~",
    "",
    "{{ pod.name }}",
    "{% raw %}",
    "100000000000000000000m",
    "-1",
    "1e308",
    "\u{0}",
    "\u{202e}",
    "é",
];

fn random_scalar(rng: &mut Rng) -> Value {
    match rng.below(9) {
        0 => Value::Null,
        1 => json!(rng.chance(2)),
        2 => json!(*rng.pick(&[0i64, -1, 1, i64::MAX, i64::MIN, 65535, 65536, 2_147_483_648])),
        3 => json!(*rng.pick(&[0.5f64, -0.0, 1e308, 3.0])),
        4 => json!(u64::MAX),
        5 => json!("x".repeat(rng.below(5_000))),
        6 => json!({}),
        7 => json!([]),
        _ => json!(*rng.pick(WORDS)),
    }
}

/// Another value of the same JSON type as `v`.
fn same_type(rng: &mut Rng, v: &Value) -> Value {
    match v {
        Value::String(_) => json!(*rng.pick(WORDS)),
        Value::Number(_) => {
            json!(*rng.pick(&[0i64, -1, 1, 80, 65535, 65536, i64::from(i32::MAX), i64::MAX]))
        }
        Value::Bool(b) => json!(!b),
        Value::Array(a) if !a.is_empty() => json!([a[rng.below(a.len())].clone()]),
        _ => random_scalar(rng),
    }
}

/// A random node of `v` (by value path), as a mutable reference.
fn random_node<'a>(rng: &mut Rng, v: &'a mut Value) -> &'a mut Value {
    let mut node = v;
    // Rarely the envelope itself: a review without a readable request is answered early.
    let mut depth = usize::from(rng.chance(8)) * 2;
    loop {
        depth += 1;
        let len = match node {
            Value::Object(m) => m.len(),
            Value::Array(a) => a.len(),
            _ => 0,
        };
        if len == 0 || (depth > 2 && rng.chance(5)) {
            return node;
        }
        let i = rng.below(len);
        node = match node {
            Value::Object(m) => m.values_mut().nth(i).unwrap(),
            Value::Array(a) => &mut a[i],
            _ => unreachable!(),
        };
    }
}

fn mutate_value(rng: &mut Rng, v: &mut Value, corpus: &[Value]) {
    for _ in 0..=rng.below(4) {
        let node = random_node(rng, v);
        match rng.below(9) {
            // Mostly keep the type, so the typed parse accepts it and the engine runs.
            0 | 1 => *node = same_type(rng, node),
            8 => *node = random_scalar(rng),
            2 => {
                if let Value::Object(m) = node {
                    let key = m.keys().nth(rng.below(m.len())).cloned();
                    if let Some(key) = key {
                        m.remove(&key);
                    }
                }
            }
            3 => {
                if let Value::Object(m) = node {
                    m.insert((*rng.pick(WORDS)).to_owned(), random_scalar(rng));
                } else if let Value::Array(a) = node
                    && !a.is_empty()
                {
                    let copy = a[rng.below(a.len())].clone();
                    for _ in 0..=rng.below(3) {
                        a.push(copy.clone());
                    }
                }
            }
            4 => {
                // Splice: a subtree of another input.
                let mut other = rng.pick(corpus).clone();
                *node = random_node(rng, &mut other).take();
            }
            5 => {
                if let Value::String(s) = node {
                    let word = *rng.pick(WORDS);
                    let at = rng.below(s.len() + 1);
                    if s.is_char_boundary(at) {
                        s.insert_str(at, word);
                    }
                }
            }
            6 => {
                // Wrap in what the engine reads as labels or annotations.
                let mut m = Map::new();
                m.insert((*rng.pick(WORDS)).to_owned(), json!(*rng.pick(WORDS)));
                *node = Value::Object(m);
            }
            _ => {
                if let Some(obj) = v.pointer("/request/object").cloned() {
                    v["request"]["oldObject"] = obj;
                    v["request"]["operation"] = json!(*rng.pick(&["UPDATE", "CREATE"]));
                }
            }
        }
    }
}

fn mutate_bytes(rng: &mut Rng, bytes: &mut Vec<u8>) {
    for _ in 0..=rng.below(3) {
        if bytes.is_empty() {
            bytes.push(b'{');
        }
        let at = rng.below(bytes.len());
        match rng.below(4) {
            0 => bytes[at] ^= 1 << rng.below(8),
            1 => bytes.truncate(at),
            2 => bytes.insert(at, *rng.pick(b"{}[]\",:\\0123456789eE-+.tfn \x00\xff")),
            _ => {
                let end = (at + rng.below(64)).min(bytes.len());
                let chunk = bytes[at..end].to_vec();
                bytes.splice(at..at, chunk);
            }
        }
    }
}

// === Checks ===

fn decode_patch(response: &Value) -> Result<Option<json_patch::Patch>, String> {
    let Some(patch) = response.get("patch") else {
        return Ok(None);
    };
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(patch.as_str().ok_or("patch is not a string")?)
        .map_err(|e| format!("patch is not base64: {e}"))?;
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| format!("patch is not JSONPatch: {e}"))
}

/// Answers `body` and checks what every answer must hold; the answer's shape, or the problem.
fn check(inj: &Injector, webhook: Webhook, entry: Entry, body: &[u8]) -> Result<String, String> {
    let result = catch_unwind(AssertUnwindSafe(|| answer_for(inj, webhook, entry, body)))
        .map_err(|_| "answer_for panicked".to_owned())?;
    // serde_json skips the fields it ignores without checking their UTF-8, so the engine may
    // answer a body that strict JSON refuses: read the request back leniently.
    let request: Option<Value> = serde_json::from_str(&String::from_utf8_lossy(body)).ok();
    let answer = match result {
        Err(error) => {
            return Ok(format!(
                "err:{}",
                error.to_string().chars().take(40).collect::<String>()
            ));
        }
        Ok(answer) => answer,
    };
    let decoded: Value =
        serde_json::from_slice(&answer.body).map_err(|e| format!("answer is not JSON: {e}"))?;
    // serde_json skips an ignored number without checking its range either (1e+318 in an
    // unknown field): the engine rightly answers, but the body cannot be read back here.
    let Some(request) = request else {
        return Ok(format!(
            "{webhook:?}/{entry:?}/{:?}/unparsable",
            answer.outcome
        ));
    };
    if decoded["apiVersion"] != request["apiVersion"] || decoded["kind"] != "AdmissionReview" {
        return Err(format!(
            "answer envelope {} / {}",
            decoded["apiVersion"], decoded["kind"]
        ));
    }
    // Found by this fuzzer, left to review.rs's owners: serde reads a struct from an array
    // too, so `"request": ["a", "b"]` is read positionally (uid "a") and refused with that uid.
    // The API server always sends an object. Such a request is refused, or admitted untouched
    // when read as a DELETE or CONNECT (always admitted); it must never get a patch.
    if !request["request"].is_object() {
        if decoded["response"].get("patch").is_some() {
            return Err("patched a request that is not an object".into());
        }
        return Ok(format!(
            "{webhook:?}/{entry:?}/{:?}/request-not-object",
            answer.outcome
        ));
    }
    if decoded["response"]["uid"] != request["request"]["uid"] {
        return Err(format!("uid {} not echoed", request["request"]["uid"]));
    }
    let response = &decoded["response"];
    let patch = decode_patch(response)?;
    let mut shape = format!(
        "{webhook:?}/{entry:?}/{:?}/{}/{}",
        answer.outcome,
        patch.as_ref().map_or(0, |p| p.0.len()),
        response["status"]["message"]
            .as_str()
            .unwrap_or("")
            .chars()
            .take(30)
            .collect::<String>()
    );
    let Some(patch) = patch else {
        return Ok(shape);
    };
    if webhook != Webhook::Mutate || answer.outcome != Outcome::Injected {
        return Err(format!(
            "a patch from {webhook:?} with outcome {:?}",
            answer.outcome
        ));
    }
    // Found by this fuzzer, left to the engine's owners: a pod without `metadata` gets
    // `add /metadata/annotations`, and one without `spec.containers` gets
    // `add /spec/containers/-`; neither applies. The API server always sends metadata (it sets
    // the namespace before admission) and refuses a pod without containers in validation (after
    // the mutating webhooks, so the user sees a failed patch instead). Not checked here.
    let object = &request["request"]["object"];
    if !object["metadata"].is_object() || !object["spec"]["containers"].is_array() {
        return Ok(shape + "/outside");
    }
    let fresh = request
        .pointer("/request/object/metadata/annotations/sidecar-injector.io~1status")
        .is_none();
    let mut object = request["request"]["object"].clone();
    json_patch::patch(&mut object, &patch).map_err(|e| format!("the patch does not apply: {e}"))?;
    let mut again = request.clone();
    again["request"]["object"] = object;
    let again_bytes = serde_json::to_vec(&again).unwrap();
    for webhook in [Webhook::Mutate, Webhook::Validate] {
        let second = catch_unwind(AssertUnwindSafe(|| {
            answer_for(inj, webhook, entry, &again_bytes)
        }))
        .map_err(|_| "answer_for panicked on the patched pod".to_owned())?
        .map_err(|e| format!("the patched pod is unreadable: {e}"))?;
        let decoded: Value = serde_json::from_slice(&second.body).unwrap();
        if decoded["response"].get("patch").is_some() {
            return Err(format!(
                "the patched pod is patched again: {}",
                decoded["response"]
            ));
        }
        // A pod that arrives already marked injected (a reinvocation, a copied spec) may carry
        // sidecars someone changed: the mutator leaves those alone and the validator refuses
        // them, by design. A pod injected here for the first time must be admitted.
        if webhook == Webhook::Validate && !fresh {
            continue;
        }
        if decoded["response"]["allowed"] != true {
            return Err(format!(
                "{webhook:?} refuses the patched pod: {}",
                decoded["response"]
            ));
        }
    }
    shape.push_str("/fixed");
    Ok(shape)
}

// === The loop ===

#[test]
fn fuzz_review_parser_and_patch_builder() {
    let seconds: f64 = std::env::var("FUZZ_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3.0);
    let seed: u64 = std::env::var("FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| {
                    u64::try_from(d.as_nanos() % u128::from(u64::MAX)).unwrap_or(1)
                })
                | 1
        });
    // Panics are caught and reported with their input; keep the default hook quiet meanwhile.
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let inj = Injector::embedded(Some(OWN_NAMESPACE.into())).unwrap();
    let mut rng = Rng(seed);
    let mut corpus = seeds();
    let seeded = corpus.len();
    let mut shapes = HashSet::new();
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let (mut runs, mut errors, mut fixed) = (0u64, 0u64, 0u64);
    let routes = [
        (Webhook::Mutate, Entry::Pod),
        (Webhook::Validate, Entry::Pod),
        (Webhook::Mutate, Entry::Namespace),
        (Webhook::Validate, Entry::Namespace),
        (Webhook::Mutate, Entry::Required),
        (Webhook::Validate, Entry::Required),
    ];
    let mut failure = None;
    // The seeds themselves first, then mutants until the deadline.
    let mut i = 0usize;
    while failure.is_none() && (i < seeded || Instant::now() < deadline) {
        let (value, bytes) = if i < seeded {
            let v = corpus[i].clone();
            let b = serde_json::to_vec(&v).unwrap();
            (Some(v), b)
        } else {
            let mut v = rng.pick(&corpus).clone();
            mutate_value(&mut rng, &mut v, &corpus);
            let mut b = serde_json::to_vec(&v).unwrap();
            if rng.chance(10) {
                mutate_bytes(&mut rng, &mut b);
            }
            (Some(v), b)
        };
        i += 1;
        let (webhook, entry) = *rng.pick(&routes);
        runs += 1;
        match check(&inj, webhook, entry, &bytes) {
            Ok(shape) => {
                errors += u64::from(shape.starts_with("err:"));
                fixed += u64::from(shape.ends_with("/fixed"));
                if shapes.insert(shape)
                    && corpus.len() < 4_000
                    && let Some(v) = value
                {
                    corpus.push(v);
                }
            }
            Err(problem) => failure = Some((problem, bytes, webhook, entry)),
        }
    }
    std::panic::set_hook(hook);
    eprintln!(
        "fuzz: seed {seed}, {seconds}s: {runs} inputs ({seeded} seeds), {} answer shapes, corpus {}, \
         {errors} unreadable, {fixed} patches applied and re-checked",
        shapes.len(),
        corpus.len()
    );
    if std::env::var_os("FUZZ_VERBOSE").is_some() {
        let mut shapes: Vec<_> = shapes.into_iter().collect();
        shapes.sort();
        eprintln!("answer shapes seen:\n  {}", shapes.join("\n  "));
    }
    if let Some((problem, bytes, webhook, entry)) = failure {
        let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("fuzz-failure-{seed}.json"));
        std::fs::write(&path, &bytes).unwrap();
        panic!(
            "{problem}\n{webhook:?} {entry:?}; input written to {} (replay: FUZZ_SEED={seed})",
            path.display()
        );
    }
    assert!(runs >= seeded as u64);
}

/// The inputs this fuzzer found (see the comments in [`check`]), kept as cases: each must stay
/// answered without a panic and within what `check` allows.
#[test]
fn found_inputs_stay_answered() {
    let inj = Injector::embedded(Some(OWN_NAMESPACE.into())).unwrap();
    let pod = json!({"metadata": {"labels": {"sidecar-injector.io/inject": "true"}},
                     "spec": {"containers": [{"name": "app", "image": "a"}]}});
    let mut no_metadata = create_review(pod.clone());
    no_metadata["request"]["object"]
        .as_object_mut()
        .unwrap()
        .remove("metadata");
    let mut no_containers = create_review(pod.clone());
    no_containers["request"]["object"]["spec"] = json!({});
    let array_request = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                               "request": ["uid-1", "DELETE"]});
    let mut cases: Vec<Vec<u8>> = [no_metadata, no_containers, array_request]
        .iter()
        .map(|v| serde_json::to_vec(v).unwrap())
        .collect();
    let huge = serde_json::to_string(&create_review(pod)).unwrap();
    cases.push(
        huge.replacen("\"spec\":", "\"ignored\":1e+318,\"spec\":", 1)
            .into_bytes(),
    );
    for body in &cases {
        for webhook in [Webhook::Mutate, Webhook::Validate] {
            for entry in [Entry::Pod, Entry::Namespace, Entry::Required] {
                if let Err(problem) = check(&inj, webhook, entry, body) {
                    panic!("{problem}: {}", String::from_utf8_lossy(body));
                }
            }
        }
    }
}
