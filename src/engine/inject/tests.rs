use std::sync::Arc;

use serde_json::json;

use k8s_openapi::api::core::v1::Pod;

use super::decide::*;
use super::facts::*;
use super::patch::*;
use super::plan::*;
use super::rules::*;
use super::status::*;
use std::collections::BTreeMap;

use crate::engine::config::Injector;
use crate::engine::context::Seen;
use crate::engine::template::Piece;
use crate::engine::view::PodView;

fn injector() -> Injector {
    Injector::embedded(Some("sidecar-injector".into())).expect("embedded config loads")
}

fn decide_for(inj: &Injector, p: &Pod, namespace: Option<&str>) -> Result<Decision, InjectError> {
    let json = crate::engine::view::pod_json(p);
    let view = PodView::parse(&json).expect("view");
    decide(inj, &PodFacts::new(&view, namespace))
}

fn pod(json: serde_json::Value) -> Pod {
    serde_json::from_value(json).expect("valid pod")
}

fn opted_in() -> Pod {
    pod(serde_json::json!({
        "metadata": {"name": "web", "labels": {"sidecar-injector.io/inject": "true"}},
        "spec": {"containers": [{"name": "app", "image": "nginx:1.27"}]}
    }))
}

/// The base64 of a patch whose long pieces are copied from their kept base64 is the
/// base64 of its bytes: pieces at every offset against the groups of three, of every length
/// around a multiple of three, each kept for the first offset asked and encoded anew for
/// the others.
#[test]
fn kept_piece_base64_joins_as_one_encoding() {
    use base64::Engine as _;
    let pieces: Vec<Piece> = (0..6)
        .map(|i| {
            Piece::new(format!(
                "{{\"n\":\"{}\"}}",
                "x".repeat(Piece::BASE64_KEPT + i)
            ))
        })
        .collect();
    for lead in 0..6 {
        for between in 0..4 {
            let mut w = PatchWriter {
                out: Vec::new(),
                pieces: Vec::new(),
            };
            w.text(&b"["[..]);
            w.text("a".repeat(lead).as_bytes());
            for piece in &pieces {
                w.piece(piece);
                w.text("b".repeat(between).as_bytes());
            }
            w.piece(&pieces[0]);
            let patch = w.finish();
            assert_eq!(patch.pieces.len(), pieces.len() + 1);
            let mut ours = Vec::new();
            patch.base64_into(&mut ours);
            let json = patch.json();
            assert_eq!(json.len(), patch.len());
            let reference = base64::engine::general_purpose::STANDARD.encode(&json);
            assert_eq!(
                String::from_utf8_lossy(&ours),
                reference,
                "{lead} {between}"
            );
        }
    }
}

proptest::proptest! {
    /// Any bytes, given in stretches of any lengths (a group's bytes split across
    /// stretches, stretches short and long), encode as one standard encoding of them all.
    #[test]
    fn base64_writer_encodes_any_stretches(
        bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..400),
        cuts in proptest::collection::vec(0usize..400, 0..8),
    ) {
        use base64::Engine as _;
        let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(bytes.len())).collect();
        cuts.push(bytes.len());
        cuts.sort_unstable();
        let mut out = Vec::new();
        let mut w = Base64Writer { out: &mut out, carry: [0; 3], carried: 0 };
        let mut done = 0;
        for cut in cuts {
            w.plain(&bytes[done..cut]);
            done = cut;
        }
        w.finish();
        proptest::prop_assert_eq!(
            String::from_utf8_lossy(&out),
            base64::engine::general_purpose::STANDARD.encode(&bytes)
        );
    }
}

#[test]
fn index_tokens_are_decimal() {
    for i in (0..=1000).chain([usize::MAX]) {
        let mut buf = [0; 20];
        assert_eq!(index_token(i, &mut buf), i.to_string());
    }
}

/// A path token is escaped as RFC 6901 and then JSON say, whatever it holds: every ASCII
/// byte, `~` and `/` together, non-ASCII text.
#[test]
fn path_tokens_are_escaped_as_pointers_then_json() {
    let mut tokens: Vec<String> = (0u8..0x80).map(|b| format!("a{}z", b as char)).collect();
    tokens.extend(
        [
            "",
            "plain",
            "example.com/name",
            "a~b/c~/~1",
            "\"quoted\"/~",
            "back\\slash~",
            "é ü 🦀",
            "\u{7f}\u{80}",
        ]
        .map(String::from),
    );
    tokens.push((0u8..0x20).map(char::from).collect());
    for token in tokens {
        let mut w = PatchWriter {
            out: Vec::new(),
            pieces: Vec::new(),
        };
        w.op(&[], Some(&token), |w| w.text(b"1"));
        let ours = String::from_utf8(w.out).expect("UTF-8");
        let pointer = format!("/{}", token.replace('~', "~0").replace('/', "~1"));
        let expected = format!(
            r#"[{{"op":"add","path":{},"value":1}}"#,
            serde_json::to_string(&pointer).expect("serializes")
        );
        assert_eq!(ours, expected, "{token:?}");
    }
}

/// Statuses are remembered by a key of their parts: statuses that differ only in how
/// their names split or which list holds them still get their own bytes.
#[test]
fn remembered_statuses_are_told_apart() {
    let inj = injector();
    let names = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    let seen = |c: &[&str], i: &[&str], v: &[&str]| Seen {
        containers: names(c),
        init_containers: names(i),
        volumes: names(v),
    };
    let cases = [
        (names(&[]), seen(&["a", "b"], &[], &[])),
        (names(&[]), seen(&["ab"], &[], &[])),
        (names(&[]), seen(&["a"], &["b"], &[])),
        (names(&[]), seen(&["a"], &[], &["b"])),
        (names(&["a"]), seen(&["b"], &[], &[])),
        (names(&["a", "b"]), seen(&[], &[], &[])),
    ];
    for _ in 0..2 {
        for (kept, seen) in &cases {
            let expected = serde_json::to_string(&Status {
                templates: vec![],
                hash: "h".into(),
                config: inj.digest.clone(),
                kept: kept.clone(),
                revision: String::new(),
                context: Some(seen.clone()),
            })
            .expect("serializes");
            let got = status_json(&inj, &[], "h".into(), kept.clone(), "", seen);
            assert_eq!(got.text, expected);
            assert_eq!(
                got.json,
                serde_json::to_string(&expected).expect("serializes")
            );
        }
    }
}

#[test]
fn names_are_a_set_short_or_long() {
    let many: Vec<String> = (0..40).map(|i| format!("n{i}")).collect();
    let mut names = Names::with_capacity(3);
    for name in &many[..3] {
        names.insert(name);
    }
    assert!(matches!(&names, Names::Few(list) if list.len() == 3));
    for (i, name) in many.iter().enumerate() {
        assert_eq!(names.insert(name), i >= 3, "{name}");
    }
    assert!(matches!(names, Names::Many(_)));
    assert!(many.iter().all(|n| names.contains(n)) && !names.contains("n40"));
    // Room asked for more than the inline list holds: hashed from the start.
    let mut long = Names::with_capacity(many.len() + 1);
    assert!(matches!(long, Names::Many(_)));
    for name in many.iter().map(String::as_str).chain(["n0"]) {
        long.insert(name);
    }
    assert!(matches!(long, Names::Many(_)) && long.contains("n39"));
    // The empty name is a name like any other.
    let mut empty = Names::new();
    assert!(!empty.contains(""));
    assert!(empty.insert("") && empty.contains("") && !empty.insert(""));
}

#[test]
fn label_must_be_exactly_true() {
    let inj = injector();
    for value in ["false", "True", "yes", ""] {
        let mut p = opted_in();
        p.metadata.labels =
            Some([("sidecar-injector.io/inject".to_owned(), value.to_owned())].into());
        let d = decide_for(&inj, &p, Some("default")).expect("decides");
        assert_eq!(d, Decision::NotOptedIn, "value {value:?}");
    }
}

fn canary() -> Injector {
    let config =
        crate::engine::config::DEFAULT_CONFIG.replace("revision: \"\"", "revision: canary");
    Injector::from_sources(
        "canary.yaml",
        &config,
        crate::engine::config::bundled_templates(),
        None,
    )
    .expect("canary config loads")
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// Which rule opts a pod in, for every combination of pod label, revision label and entry
/// (the path the API server called), as the chart's selectors route them.
#[test]
fn the_entry_and_the_revision_decide_the_opt_in() {
    let (default, canary) = (injector(), canary());
    let pod_with = |pairs: &[(&str, &str)]| {
        let mut p = opted_in();
        p.metadata.labels = Some(labels(pairs));
        p
    };
    let inject = "sidecar-injector.io/inject";
    let rev = "sidecar-injector.io/rev";
    // Pod labels, the entry that sent the pod, and which entry opts it in for the default
    // and the canary revision.
    type Case<'a> = (
        &'a [(&'a str, &'a str)],
        Entry,
        Option<Entry>,
        Option<Entry>,
    );
    let cases: [Case<'_>; 8] = [
        (&[(inject, "true")], Entry::Pod, Some(Entry::Pod), None),
        (
            &[(inject, "true"), (rev, "canary")],
            Entry::Pod,
            None,
            Some(Entry::Pod),
        ),
        (&[], Entry::Pod, None, None),
        (&[(inject, "false")], Entry::Pod, None, None),
        (
            &[],
            Entry::Namespace,
            Some(Entry::Namespace),
            Some(Entry::Namespace),
        ),
        (
            &[(inject, "yes")],
            Entry::Namespace,
            Some(Entry::Namespace),
            Some(Entry::Namespace),
        ),
        (&[(inject, "false")], Entry::Namespace, None, None),
        (
            &[(inject, "true"), (rev, "other")],
            Entry::Namespace,
            Some(Entry::Namespace),
            Some(Entry::Namespace),
        ),
    ];
    for (pairs, entry, for_default, for_canary) in cases {
        let p = pod_with(pairs);
        let json = crate::engine::view::pod_json(&p);
        let view = PodView::parse(&json).expect("view");
        let facts = PodFacts::new(&view, Some("shop")).with_entry(entry);
        assert_eq!(
            opt_in(&default, &facts).ok(),
            for_default,
            "{pairs:?} {entry:?}"
        );
        assert_eq!(
            opt_in(&canary, &facts).ok(),
            for_canary,
            "{pairs:?} {entry:?}"
        );
    }
}

/// With the namespace's labels known (offline), they pick the entry as the chart would.
#[test]
fn known_namespace_labels_pick_the_entry() {
    let (default, canary) = (injector(), canary());
    let p = pod(
        serde_json::json!({"metadata": {"name": "web"}, "spec": {"containers": [{"name": "app"}]}}),
    );
    let enabled = labels(&[("sidecar-injector.io/inject", "enabled")]);
    let enabled_canary = labels(&[
        ("sidecar-injector.io/inject", "enabled"),
        ("sidecar-injector.io/rev", "canary"),
    ]);
    let plain = labels(&[("team", "a")]);
    let decide_with = |inj: &Injector, ns: &BTreeMap<String, String>| {
        let json = crate::engine::view::pod_json(&p);
        let view = PodView::parse(&json).expect("view");
        let mut facts = PodFacts::new(&view, Some("shop"));
        facts.namespace_labels = Some(ns);
        opt_in(inj, &facts)
    };
    assert_eq!(decide_with(&default, &enabled), Ok(Entry::Namespace));
    assert_eq!(decide_with(&canary, &enabled_canary), Ok(Entry::Namespace));
    let why = decide_with(&default, &enabled_canary).expect_err("another revision's");
    assert!(why.contains("revision \"canary\""), "{why}");
    assert!(decide_with(&canary, &enabled).is_err());
    let why = decide_with(&default, &plain).expect_err("not opted in");
    assert!(why.contains("its namespace does not carry"), "{why}");
}

/// An injector whose configuration exempts `ci/runner` and `backup` in every namespace.
fn with_exemptions() -> Injector {
    Injector::exempting("ci/runner, \"*/backup\"")
}

/// Sent by the required entry, a pod is injected as by the namespace entry unless it says
/// "false"; then it is not injected, and it opts out lawfully only if its service account
/// (default: `default`) is exempt in its namespace, by an entry naming it or `*`.
#[test]
fn the_required_entry_injects_and_judges_an_opt_out() {
    let inj = with_exemptions();
    let decide_as = |labels_: &[(&str, &str)], sa: Option<&str>, ns: &str| {
        let mut p = opted_in();
        p.metadata.labels = Some(labels(labels_));
        if let Some(sa) = sa {
            p.spec.as_mut().expect("spec").service_account_name = Some(sa.into());
        }
        let json = crate::engine::view::pod_json(&p);
        let view = PodView::parse(&json).expect("view");
        let facts = PodFacts::new(&view, Some(ns)).with_entry(Entry::Required);
        let decision = decide(&inj, &facts).expect("decides");
        let why = opt_in(&inj, &facts).err();
        let verdict = required_opt_out(&inj, &facts).map(|o| match o {
            OptOut::Exempt(e) => Some(e.to_owned()),
            OptOut::Refused => None,
        });
        (decision, why, verdict)
    };
    let inject = "sidecar-injector.io/inject";
    for pod_labels in [&[][..], &[(inject, "true")], &[(inject, "yes")]] {
        let (decision, _, verdict) = decide_as(pod_labels, None, "shop");
        let Decision::Inject(plan) = decision else {
            panic!("{pod_labels:?}: {decision:?}")
        };
        assert_eq!(plan.entry, Entry::Required);
        assert_eq!(verdict, None, "{pod_labels:?} does not opt out");
    }
    let out = &[(inject, "false")][..];
    let (decision, why, verdict) = decide_as(out, None, "shop");
    assert_eq!(decision, Decision::NotOptedIn);
    assert_eq!(verdict, Some(None), "default is exempt nowhere");
    let why = why.expect("a reason");
    assert!(
        why.contains("inject=required") && why.contains("refuse") && why.contains("\"default\""),
        "{why}"
    );
    assert_eq!(decide_as(out, Some("runner"), "shop").2, Some(None));
    let (_, why, verdict) = decide_as(out, Some("runner"), "ci");
    assert_eq!(verdict, Some(Some("ci/runner".into())));
    assert!(
        why.expect("a reason")
            .contains("is exempt (required.exempt: \"ci/runner\")")
    );
    assert_eq!(
        decide_as(out, Some("backup"), "shop").2,
        Some(Some("*/backup".into()))
    );
    // An excluded namespace is never injected, so it never requires anything.
    assert_eq!(decide_as(out, None, "kube-system").2, None);
    // Nor is a pod configuration skips anyway: a hostNetwork one, a Windows one.
    for spec in [
        serde_json::json!({"hostNetwork": true}),
        serde_json::json!({"nodeSelector": {"kubernetes.io/os": "windows"}}),
    ] {
        let mut p = opted_in();
        p.metadata.labels = Some(labels(out));
        let mut json = serde_json::to_value(&p).expect("json");
        for (k, v) in spec.as_object().expect("object") {
            json["spec"][k] = v.clone();
        }
        let json = serde_json::to_vec(&json).expect("bytes");
        let view = PodView::parse(&json).expect("view");
        let facts = PodFacts::new(&view, Some("shop")).with_entry(Entry::Required);
        assert_eq!(required_opt_out(&inj, &facts), None, "{spec}");
    }
    // By the namespace entry, an opt-out is lawful whoever runs the pod.
    let mut p = opted_in();
    p.metadata.labels = Some(labels(out));
    let json = crate::engine::view::pod_json(&p);
    let view = PodView::parse(&json).expect("view");
    let facts = PodFacts::new(&view, Some("shop")).with_entry(Entry::Namespace);
    assert_eq!(required_opt_out(&inj, &facts), None);
}

/// Known namespace labels (offline) pick the required entry as the chart's selectors would,
/// with the namespace's revision.
#[test]
fn known_required_namespace_labels_pick_the_required_entry() {
    let (default, canary) = (injector(), canary());
    let p = pod(serde_json::json!({
        "metadata": {"name": "web", "labels": {"sidecar-injector.io/inject": "false"}},
        "spec": {"containers": [{"name": "app"}]}
    }));
    let required = labels(&[("sidecar-injector.io/inject", "required")]);
    let required_canary = labels(&[
        ("sidecar-injector.io/inject", "required"),
        ("sidecar-injector.io/rev", "canary"),
    ]);
    let json = crate::engine::view::pod_json(&p);
    let view = PodView::parse(&json).expect("view");
    let judge = |inj: &Injector, ns: &BTreeMap<String, String>| {
        let mut facts = PodFacts::new(&view, Some("shop"));
        facts.namespace_labels = Some(ns);
        let refused = required_opt_out(inj, &facts) == Some(OptOut::Refused);
        (opt_in(inj, &facts), refused)
    };
    let (why, refused) = judge(&default, &required);
    assert!(why.expect_err("opts out").contains("refuse"));
    assert!(refused);
    assert!(judge(&canary, &required_canary).1);
    let (why, refused) = judge(&default, &required_canary);
    assert!(
        why.expect_err("another revision's")
            .contains("required) for revision \"canary\"")
    );
    assert!(!refused);
    let mut unlabelled = p.clone();
    unlabelled.metadata.labels = None;
    let json = crate::engine::view::pod_json(&unlabelled);
    let view = PodView::parse(&json).expect("view");
    let mut facts = PodFacts::new(&view, Some("shop"));
    facts.namespace_labels = Some(&required);
    assert_eq!(opt_in(&default, &facts), Ok(Entry::Required));
}

#[test]
fn excluded_namespaces_and_own_namespace_are_skipped() {
    let inj = injector();
    let p = opted_in();
    for ns in [
        "kube-system",
        "kube-public",
        "kube-node-lease",
        "sidecar-injector",
    ] {
        let d = decide_for(&inj, &p, Some(ns)).expect("decides");
        assert_eq!(d, Decision::Skip(SkipReason::ExcludedNamespace(ns.into())));
    }
}

/// A regular sidecar is named, with the reason, for a pod that runs to completion (by its
/// restart policy or its Job owner) and for no other pod; a native one never is.
#[test]
fn a_regular_sidecar_is_noted_only_in_a_pod_that_runs_to_completion() {
    let inj = Injector::from_sources(
        "auditor.yaml",
        "defaultTemplates: [auditor, native]\n",
        vec![
            (
                "auditor".into(),
                "containers: [{name: auditor, image: 'auditor:1'}]\n".into(),
            ),
            (
                "native".into(),
                "initContainers: [{name: agent, image: 'agent:1', restartPolicy: Always}]\n".into(),
            ),
        ],
        None,
    )
    .expect("config loads");
    let notes = |p: &Pod| match decide_for(&inj, p, Some("shop")).expect("decides") {
        Decision::Inject(plan) => plan.notes,
        other => panic!("not injected: {other:?}"),
    };
    let with = |policy: Option<&str>, owner: Option<(&str, &str)>| {
        let mut p = opted_in();
        p.spec.as_mut().expect("spec").restart_policy = policy.map(str::to_owned);
        if let Some((kind, name)) = owner {
            p.metadata.owner_references = Some(vec![
                serde_json::from_value(json!({
                    "apiVersion": "batch/v1", "kind": kind, "name": name, "uid": "u",
                    "controller": true
                }))
                .expect("owner"),
            ]);
        }
        p
    };
    for (p, why) in [
        (with(Some("Never"), None), "(restartPolicy: Never)"),
        (with(Some("OnFailure"), None), "(restartPolicy: OnFailure)"),
        (
            with(None, Some(("Job", "migrate"))),
            "(it belongs to Job \"migrate\")",
        ),
    ] {
        let notes = notes(&p);
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(
            notes[0].starts_with("template \"auditor\" adds \"auditor\" as a regular container")
                && notes[0].contains(why),
            "{notes:?}"
        );
    }
    for p in [
        with(None, None),
        with(Some("Always"), Some(("ReplicaSet", "web-1"))),
    ] {
        assert_eq!(notes(&p), Vec::<String>::new());
    }
    assert_eq!(
        inj.advisories
            .iter()
            .filter(|a| a.contains("regular container"))
            .count(),
        1
    );
    assert!(
        injector().advisories.is_empty(),
        "{:?}",
        injector().advisories
    );
}

#[test]
fn object_namespace_wins_over_request_namespace() {
    let mut p = opted_in();
    p.metadata.namespace = Some("kube-system".into());
    let json = crate::engine::view::pod_json(&p);
    let view = PodView::parse(&json).expect("view");
    let facts = PodFacts::new(&view, Some("default"));
    assert_eq!(facts.namespace, "kube-system");
}

#[test]
fn host_network_and_windows_are_skipped() {
    let inj = injector();
    let mut p = opted_in();
    if let Some(s) = p.spec.as_mut() {
        s.host_network = Some(true);
    }
    assert_eq!(
        decide_for(&inj, &p, Some("default")).expect("decides"),
        Decision::Skip(SkipReason::HostNetwork)
    );
    let mut p = opted_in();
    if let Some(s) = p.spec.as_mut() {
        s.node_selector = Some([("kubernetes.io/os".into(), "windows".into())].into());
    }
    assert_eq!(
        decide_for(&inj, &p, Some("default")).expect("decides"),
        Decision::Skip(SkipReason::Windows)
    );
}

#[test]
fn unknown_template_is_an_error_naming_it() {
    let inj = injector();
    let mut p = opted_in();
    p.metadata.annotations =
        Some([("sidecar-injector.io/templates".into(), "proxy, nope".into())].into());
    let err = decide_for(&inj, &p, Some("default")).expect_err("unknown");
    assert!(err.to_string().contains("\"nope\""), "{err}");
}

#[test]
fn missing_arrays_are_created_and_keys_escaped() {
    let inj = injector();
    let mut p = opted_in();
    p.metadata.annotations = None;
    let Decision::Inject(plan) = decide_for(&inj, &p, Some("default")).expect("decides") else {
        unreachable!("opted-in pod is injected")
    };
    let json = crate::engine::view::pod_json(&p);
    let view = PodView::parse(&json).expect("view");
    let patch: serde_json::Value =
        serde_json::from_slice(&to_patch(&view, &plan_edits(&inj, &view, &plan)).json())
            .expect("json");
    let paths: Vec<&str> = patch
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|op| op["path"].as_str())
        .collect();
    assert!(paths.contains(&"/spec/initContainers"), "{paths:?}");
    assert!(paths.contains(&"/spec/volumes"), "{paths:?}");
    assert!(paths.contains(&"/metadata/annotations"), "{paths:?}");
    assert!(
        paths.contains(&"/metadata/annotations/sidecar-injector.io~1status"),
        "{paths:?}"
    );
}

/// Pods that differ only in what a template does not read share its rendering; pods that
/// differ in what it reads do not.
#[test]
fn a_rendering_is_shared_by_pods_that_read_the_same() {
    let inj = crate::engine::config::Injector::embedded(None).expect("embedded");
    let pod = |hash: &str, app: &str| {
        serde_json::to_vec(&json!({
                "metadata": {"generateName": format!("web-{hash}-"), "labels": {
                    "sidecar-injector.io/inject": "true", "app": app, "pod-template-hash": hash}},
                "spec": {"containers": [{"name": "app", "image": "nginx", "ports": [{"containerPort": 8080}]}]}
            }))
            .expect("json")
    };
    let plan = |json: &[u8]| {
        let view = crate::engine::view::PodView::parse(json).expect("view");
        match crate::engine::inject::decide(
            &inj,
            &crate::engine::inject::PodFacts::new(&view, Some("shop")),
        ) {
            Ok(crate::engine::inject::Decision::Inject(plan)) => plan,
            other => panic!("not injected: {other:?}"),
        }
    };
    let (a, b, c) = (pod("aaa", "web"), pod("bbb", "web"), pod("aaa", "api"));
    let (a, b, c) = (plan(&a), plan(&b), plan(&c));
    for i in 0..2 {
        assert!(Arc::ptr_eq(
            &a.templates[i].fragment,
            &b.templates[i].fragment
        ));
    }
    // The log shipper reads the app label; the proxy does not.
    let shipper = |p: &crate::engine::inject::Plan| {
        p.templates
            .iter()
            .position(|t| t.name == "log-shipper")
            .expect("log-shipper")
    };
    let proxy = |p: &crate::engine::inject::Plan| {
        p.templates
            .iter()
            .position(|t| t.name == "proxy")
            .expect("proxy")
    };
    assert_ne!(
        a.templates[shipper(&a)].fragment.init_containers[0].args,
        c.templates[shipper(&c)].fragment.init_containers[0].args
    );
    assert!(Arc::ptr_eq(
        &a.templates[proxy(&a)].fragment,
        &c.templates[proxy(&c)].fragment
    ));
}

fn plan_of(inj: &Injector, p: &Pod) -> Plan {
    match decide_for(inj, p, Some("default")).expect("decides") {
        Decision::Inject(plan) => plan,
        other => panic!("expected an injection, got {other:?}"),
    }
}

fn sidecar<'p>(plan: &'p Plan, name: &str) -> &'p k8s_openapi::api::core::v1::Container {
    plan.templates
        .iter()
        .flat_map(|t| {
            t.fragment
                .init_containers
                .iter()
                .chain(&t.fragment.containers)
        })
        .find(|c| c.name == name)
        .expect("sidecar")
}

fn amounts(c: &k8s_openapi::api::core::v1::Container, list: &str) -> BTreeMap<String, String> {
    let r = c.resources.clone().unwrap_or_default();
    let m = if list == "requests" {
        r.requests
    } else {
        r.limits
    };
    m.unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, v.0))
        .collect()
}

fn with_resources(resources: serde_json::Value) -> Pod {
    pod(json!({
        "metadata": {"name": "web", "labels": {"sidecar-injector.io/inject": "true"}},
        "spec": {
            "initContainers": [{"name": "migrate", "image": "m:1", "resources": resources}],
            "containers": [{"name": "app", "image": "nginx:1.27", "resources": resources}]
        }
    }))
}

/// A Guaranteed pod (limits only, or requests equal to them in another form) gets sidecars
/// whose limits are their requests; a Burstable one, or a pod with no resources, gets the
/// templates' own limits. Injected again, the Guaranteed pod (sidecars and all) needs nothing.
#[test]
fn a_guaranteed_pod_keeps_its_class() {
    let inj = injector();
    for resources in [
        json!({"limits": {"cpu": "1", "memory": "1Gi"}}),
        json!({"limits": {"cpu": "1", "memory": "1Gi"}, "requests": {"cpu": "1000m", "memory": "1024Mi"}}),
    ] {
        let p = with_resources(resources.clone());
        let plan = plan_of(&inj, &p);
        for name in ["proxy", "log-shipper"] {
            let c = sidecar(&plan, name);
            assert_eq!(
                amounts(c, "requests"),
                amounts(c, "limits"),
                "{name} in {resources}"
            );
        }
        assert_eq!(amounts(sidecar(&plan, "proxy"), "limits")["cpu"], "50m");
        // The pod as injected is judged Guaranteed alike: nothing more to do.
        let json = crate::engine::view::pod_json(&p);
        let view = PodView::parse(&json).expect("view");
        let mut injected = p.clone();
        apply(&mut injected, &plan_edits(&inj, &view, &plan));
        let json = crate::engine::view::pod_json(&injected);
        let view = PodView::parse(&json).expect("view");
        let again = plan_of(&inj, &injected);
        assert!(plan_edits(&inj, &view, &again).is_empty(), "{resources}");
    }
    for p in [
        with_resources(
            json!({"limits": {"cpu": "1", "memory": "1Gi"}, "requests": {"cpu": "500m"}}),
        ),
        with_resources(json!({"limits": {"cpu": "1"}})),
        opted_in(),
    ] {
        let plan = plan_of(&inj, &p);
        assert_eq!(amounts(sidecar(&plan, "proxy"), "limits")["cpu"], "500m");
    }
    // Pod-level resources decide the class when they are set.
    let mut p = opted_in();
    p.spec.as_mut().expect("spec").resources = Some(
        serde_json::from_value(json!({"limits": {"cpu": "2", "memory": "2Gi"}}))
            .expect("resources"),
    );
    let plan = plan_of(&inj, &p);
    assert_eq!(amounts(sidecar(&plan, "proxy"), "limits")["cpu"], "50m");
}

/// A pod that already runs another mesh's proxy gets the log shipper, not our proxy, with a
/// note; asked for the proxy alone, it is skipped.
#[test]
fn another_meshs_proxy_keeps_ours_out() {
    let inj = injector();
    let mut p = opted_in();
    p.spec.as_mut().expect("spec").containers.push(
        serde_json::from_value(json!({"name": "istio-proxy", "image": "istio/proxyv2"}))
            .expect("c"),
    );
    let plan = plan_of(&inj, &p);
    let names: Vec<&str> = plan.templates.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["log-shipper"]);
    assert!(
        plan.notes
            .iter()
            .any(|n| n.contains("\"istio-proxy\"") && n.contains("\"proxy\"")),
        "{:?}",
        plan.notes
    );
    p.metadata.annotations =
        Some([("sidecar-injector.io/templates".into(), "proxy".into())].into());
    assert_eq!(
        decide_for(&inj, &p, Some("default")).expect("decides"),
        Decision::Skip(SkipReason::Conflicts("istio-proxy".into()))
    );
}

/// A sidecar port the pod's own container declares too refuses the pod, naming both; the same
/// number over UDP, or on an init container's other port, does not.
#[test]
fn a_port_the_pod_uses_refuses_the_sidecar() {
    let inj = injector();
    let with_ports = |ports: serde_json::Value| {
        let mut p = opted_in();
        p.spec.as_mut().expect("spec").containers[0].ports =
            Some(serde_json::from_value(ports).expect("ports"));
        p
    };
    let err = decide_for(
        &inj,
        &with_ports(json!([{"containerPort": 15001}])),
        Some("default"),
    )
    .expect_err("clash");
    let msg = err.to_string();
    assert!(
        msg.contains("sidecar \"proxy\" declares port 15001/TCP, which the pod's container \"app\" declares too")
            && msg.contains("sidecar-injector.io/templates"),
        "{msg}"
    );
    plan_of(
        &inj,
        &with_ports(json!([{"containerPort": 15001, "protocol": "UDP"}])),
    );
    plan_of(&inj, &with_ports(json!([{"containerPort": 8080}])));
}

/// A pod-level budget grows by what the sidecars added ask for, each amount it sets (and only
/// those); injected again, nothing grows twice. A Guaranteed budget stays Guaranteed.
#[test]
fn a_pod_level_budget_grows_by_the_sidecars() {
    let inj = injector();
    let budgeted = |resources: serde_json::Value| {
        let mut p = opted_in();
        p.spec.as_mut().expect("spec").resources =
            Some(serde_json::from_value(resources).expect("resources"));
        p
    };
    let grown = |p: &Pod| {
        let json = crate::engine::view::pod_json(p);
        let view = PodView::parse(&json).expect("view");
        let plan = plan_of(&inj, p);
        let mut injected = p.clone();
        apply(&mut injected, &plan_edits(&inj, &view, &plan));
        let r = injected
            .spec
            .as_ref()
            .and_then(|s| s.resources.clone())
            .unwrap_or_default();
        let show = |m: Option<
            BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
        >| {
            m.unwrap_or_default()
                .into_iter()
                .map(|(k, v)| format!("{k}={}", v.0))
                .collect::<Vec<_>>()
        };
        (injected, show(r.requests), show(r.limits))
    };
    let p = budgeted(
        json!({"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"cpu": "1", "memory": "1Gi"}}),
    );
    let (injected, requests, limits) = grown(&p);
    assert_eq!(requests, ["cpu=110m", "memory=160Mi"]);
    assert_eq!(limits, ["cpu=1600m", "memory=1344Mi"]);
    let json = crate::engine::view::pod_json(&injected);
    let view = PodView::parse(&json).expect("view");
    assert!(plan_edits(&inj, &view, &plan_of(&inj, &injected)).is_empty());
    // Only what the budget sets.
    let (_, requests, limits) = grown(&budgeted(json!({"limits": {"memory": "2Gi"}})));
    assert_eq!(
        (requests, limits),
        (vec![], vec!["memory=2368Mi".to_owned()])
    );
    // Guaranteed at pod level: the sidecars' limits are their requests, both grow alike.
    let (_, requests, limits) = grown(&budgeted(
        json!({"requests": {"cpu": "2", "memory": "1Gi"}, "limits": {"cpu": "2", "memory": "1Gi"}}),
    ));
    assert_eq!(requests, limits);
    assert_eq!(requests, ["cpu=2060m", "memory=1120Mi"]);
}

/// The containers annotation names who gets the templates' mounts and env: those named,
/// init containers included (placed after the sidecars before them), and no one else; a name
/// of no container is a note. Injected again, nothing more is added.
#[test]
fn the_containers_annotation_targets_mounts_and_env() {
    let inj = injector();
    let p = pod(json!({
        "metadata": {"name": "web", "labels": {"sidecar-injector.io/inject": "true"},
            "annotations": {"sidecar-injector.io/containers": "app, migrate,nope"}},
        "spec": {
            "initContainers": [{"name": "setup", "image": "s:1"}, {"name": "migrate", "image": "m:1"}],
            "containers": [{"name": "app", "image": "a:1"}, {"name": "other", "image": "o:1"}]
        }
    }));
    let plan = plan_of(&inj, &p);
    assert!(
        plan.notes
            .iter()
            .any(|n| n.contains("sidecar-injector.io/containers names \"nope\"")),
        "{:?}",
        plan.notes
    );
    let json = crate::engine::view::pod_json(&p);
    let view = PodView::parse(&json).expect("view");
    let edits = plan_edits(&inj, &view, &plan);
    let patch: serde_json::Value =
        serde_json::from_slice(&to_patch(&view, &edits).json()).expect("json");
    let paths: Vec<&str> = patch
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|op| op["path"].as_str())
        .filter(|p| p.ends_with("/volumeMounts") || p.ends_with("/env"))
        .collect();
    // Two sidecars go before the pod's init containers: "migrate" (its second) is at 3.
    assert_eq!(
        paths,
        [
            "/spec/containers/0/volumeMounts",
            "/spec/containers/0/env",
            "/spec/initContainers/3/volumeMounts",
            "/spec/initContainers/3/env",
        ]
    );
    let mut injected = p.clone();
    apply(&mut injected, &edits);
    let spec = injected.spec.as_ref().expect("spec");
    let has_env = |c: &k8s_openapi::api::core::v1::Container| {
        c.env.iter().flatten().any(|e| e.name == "APP_LOG_DIR")
    };
    let with: Vec<&str> = spec
        .init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
        .filter(|c| has_env(c))
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(with, ["migrate", "app"]);
    // The patch and the typed road agree.
    let mut patched = serde_json::to_value(&p).expect("pod");
    let ops: json_patch::Patch = serde_json::from_value(patch).expect("patch");
    json_patch::patch(&mut patched, &ops).expect("applies");
    assert_eq!(patched, serde_json::to_value(&injected).expect("pod"));
    let json = crate::engine::view::pod_json(&injected);
    let view = PodView::parse(&json).expect("view");
    assert!(plan_edits(&inj, &view, &plan_of(&inj, &injected)).is_empty());
}
