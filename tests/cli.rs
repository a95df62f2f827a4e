//! The built binary, run as a person or a pipeline runs it: `inject`, `review`, `explain`, and
//! how it fails.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::Value;
use sidecar_injector::config::Injector;
use sidecar_injector::review::{Webhook, answer};

const OWN_NAMESPACE: &str = "sidecar-injector";

/// The text of each document of a YAML stream (after its `---`).
fn documents(text: &str) -> Vec<&str> {
    sidecar_injector::manifest::split_documents(text)
        .into_iter()
        .map(|d| d.text)
        .collect()
}

fn input(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/inputs")
        .join(path)
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).expect("input is readable")
}

/// The binary with a clean environment: no configuration or namespace from the caller.
fn binary() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sidecar-injector"));
    cmd.env_remove("SIDECAR_INJECTOR_CONFIG")
        .env("SIDECAR_INJECTOR_NAMESPACE", OWN_NAMESPACE)
        .stdin(Stdio::null());
    cmd
}

fn run(args: &[&str]) -> Output {
    binary().args(args).output().expect("the binary runs")
}

fn run_with_stdin(args: &[&str], stdin: &[u8]) -> Output {
    let mut child = binary()
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary runs");
    // A binary that exits before reading all of its input is judged by its exit status and
    // output (the callers assert on them), not by a broken pipe here.
    match child.stdin.take().expect("stdin is piped").write_all(stdin) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
        written => written.expect("stdin is written"),
    }
    child.wait_with_output().expect("the binary exits")
}

fn stdout(out: &Output) -> String {
    String::from_utf8(out.stdout.clone()).expect("stdout is UTF-8")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Exit 0, nothing on stderr.
fn succeeds(out: &Output) -> &Output {
    assert!(
        out.status.success() && out.stderr.is_empty(),
        "status {}\nstderr: {}",
        out.status,
        stderr(out)
    );
    out
}

/// Exit 0, and on stderr one `note:` line for each opted-in pod or pod template the command
/// left as it is, in order: each starts with its `left_alone` (`Kind/name: ...`).
fn succeeds_noting<'a>(out: &'a Output, left_alone: &[&str]) -> &'a Output {
    let err = stderr(out);
    assert!(out.status.success(), "status {}\nstderr: {err}", out.status);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), left_alone.len(), "stderr: {err}");
    for (line, expected) in lines.iter().zip(left_alone) {
        assert!(
            line.strip_prefix("note: ")
                .is_some_and(|l| l.starts_with(expected)),
            "{expected:?} is not the start of: {line}"
        );
    }
    out
}

/// What `inject` says of manifests/workloads.yaml: its one opted-in template left alone.
const WORKLOADS_LEFT_ALONE: &str = "Deployment/dns-helper: not injected: opted in, but namespace \"kube-system\" is excluded from injection";

/// Exit non-zero, nothing on stdout, and an `error:` on stderr that says `mentions`.
fn fails_saying(out: &Output, mentions: &[&str]) {
    let err = stderr(out);
    assert!(!out.status.success(), "exit 0; stdout: {}", stdout(out));
    assert!(out.stdout.is_empty(), "stdout: {}", stdout(out));
    assert!(err.starts_with("error: "), "{err}");
    for m in mentions {
        assert!(err.contains(m), "{m:?} not in: {err}");
    }
}

/// Exit non-zero and an `error:` line on stderr for each document that `mentions` name, while
/// `inject` still wrote every document (`written`: exactly these bytes, when given).
fn fails_per_document(out: &Output, mentions: &[&str], written: Option<&str>) {
    let err = stderr(out);
    assert!(!out.status.success(), "exit 0; stdout: {}", stdout(out));
    assert!(
        err.lines().any(|l| l.starts_with("error: document ")),
        "{err}"
    );
    for m in mentions {
        assert!(err.contains(m), "{m:?} not in: {err}");
    }
    assert!(!out.stdout.is_empty(), "nothing written; stderr: {err}");
    if let Some(written) = written {
        assert_eq!(stdout(out), written);
    }
}

fn injector() -> Injector {
    Injector::embedded(Some(OWN_NAMESPACE.into())).expect("embedded configuration loads")
}

fn yaml(doc: &str) -> Value {
    serde_saphyr::from_str(doc).expect("output documents are YAML")
}

fn template_of(doc: &Value) -> &Value {
    let path = match doc["kind"].as_str() {
        Some("Pod") => "",
        Some("CronJob") => "/spec/jobTemplate/spec/template",
        _ => "/spec/template",
    };
    doc.pointer(path).expect("a pod template")
}

fn without_template(mut doc: Value) -> Value {
    let path = if doc["kind"] == "CronJob" {
        "/spec/jobTemplate/spec/template"
    } else {
        "/spec/template"
    };
    if let Some(t) = doc.pointer_mut(path) {
        *t = Value::Null;
    }
    doc
}

fn names(template: &Value, list: &str) -> Vec<String> {
    template["spec"][list]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["name"].as_str().map(str::to_owned))
        .collect()
}

// === inject ===

#[test]
fn inject_every_workload_kind_and_pass_the_rest_through() {
    let path = input("manifests/workloads.yaml");
    let text = read(&path);
    let out = run(&["inject", "-f", path.to_str().expect("UTF-8 path")]);
    let injected = stdout(succeeds_noting(&out, &[WORKLOADS_LEFT_ALONE]));

    // The same bytes as the library writes.
    let library = sidecar_injector::manifest::inject(&injector(), &text, None).expect("injects");
    assert_eq!(injected, library.yaml);
    assert_eq!(
        stderr(&out),
        format!("note: {}\n", library.left_alone.join("\nnote: "))
    );

    let before = documents(&text);
    let after = documents(&injected);
    assert_eq!(before.len(), after.len(), "{injected}");
    for (i, (old, new)) in before.iter().zip(&after).enumerate() {
        let doc = yaml(new);
        let kind = doc["kind"].as_str().unwrap_or("").to_owned();
        let namespace = doc["metadata"]["namespace"].as_str().unwrap_or("");
        let untouched =
            matches!(kind.as_str(), "Service" | "ConfigMap") || namespace == "kube-system";
        if untouched {
            // Byte for byte, comments and quoting included (the leading newline after `---`
            // is the separator's).
            assert_eq!(
                old.trim_start_matches('\n'),
                new.trim_start_matches('\n'),
                "document {i}"
            );
            continue;
        }
        let template = template_of(&doc);
        let containers = names(template, "containers");
        let init = names(template, "initContainers");
        assert!(
            !containers.iter().any(|n| n == "log-shipper"),
            "{kind}: {containers:?}"
        );
        assert_eq!(
            init.first().map(String::as_str),
            Some("log-shipper"),
            "{kind}: {init:?}"
        );
        let status = template["metadata"]["annotations"]["sidecar-injector.io/status"]
            .as_str()
            .unwrap_or_else(|| panic!("{kind}: no status annotation"));
        if kind == "ReplicaSet" {
            // It asks for the log shipper only.
            assert!(!init.iter().any(|n| n == "proxy"), "{kind}: {init:?}");
            assert!(
                status.contains(r#""templates":["log-shipper"]"#),
                "{status}"
            );
        } else {
            assert_eq!(
                init.get(1).map(String::as_str),
                Some("proxy"),
                "{kind}: {init:?}"
            );
        }
        // Everything outside the pod template is kept.
        if kind != "Pod" {
            assert_eq!(
                without_template(doc.clone()),
                without_template(yaml(old)),
                "{kind}"
            );
        }
    }
    insta::assert_snapshot!(injected);
}

#[test]
fn injecting_the_output_again_changes_nothing() {
    let path = input("manifests/workloads.yaml");
    let once = stdout(succeeds_noting(
        &run(&["inject", "-f", path.to_str().expect("UTF-8 path")]),
        &[WORKLOADS_LEFT_ALONE],
    ));
    let dir = tempfile::tempdir().expect("tempdir");
    let again = dir.path().join("once.yaml");
    std::fs::write(&again, &once).expect("write");
    // Every opted-in template is now left alone, and says so.
    let twice = stdout(succeeds_noting(
        &run(&["inject", "-f", again.to_str().expect("UTF-8 path")]),
        &[
            "Pod/web-debug: already injected with [log-shipper, proxy]: nothing to add",
            "Deployment/web: already injected",
            "StatefulSet/db: already injected",
            "DaemonSet/node-agent: already injected",
            "ReplicaSet/worker: already injected with [log-shipper]: nothing to add",
            "ReplicationController/legacy: already injected",
            "Job/migrate: already injected",
            "CronJob/report: already injected",
            WORKLOADS_LEFT_ALONE,
        ],
    ));
    assert_eq!(once, twice);
}

#[test]
fn inject_reads_standard_input() {
    let path = input("manifests/workloads.yaml");
    let from_file = run(&["inject", "-f", path.to_str().expect("UTF-8 path")]);
    let from_stdin = run_with_stdin(&["inject", "-f", "-"], read(&path).as_bytes());
    assert_eq!(
        stdout(succeeds_noting(&from_stdin, &[WORKLOADS_LEFT_ALONE])),
        stdout(succeeds_noting(&from_file, &[WORKLOADS_LEFT_ALONE]))
    );
}

/// `kubectl get ... -o yaml|json | sidecar-injector inject -f -`: the items of the List kubectl
/// prints are injected in place, and the opted-in one left alone is named on stderr.
#[test]
fn inject_reads_what_kubectl_get_prints() {
    let mut outputs = Vec::new();
    for file in [
        "kubectl/get-deploy-sts-all-namespaces.yaml",
        "kubectl/get-deploy-sts-all-namespaces.json",
    ] {
        let out = run_with_stdin(&["inject", "-f", "-"], read(&input(file)).as_bytes());
        let injected = stdout(succeeds_noting(
            &out,
            &[
                "Deployment/metrics-server: not injected: opted in, but namespace \"kube-system\" is excluded from injection",
            ],
        ));
        let list = yaml(&injected);
        assert_eq!(list["kind"], "List", "{file}: {injected}");
        let items = list["items"].as_array().expect("items");
        let by_name = |name: &str| {
            items
                .iter()
                .find(|i| i["metadata"]["name"] == name)
                .unwrap_or_else(|| panic!("{file}: no {name}"))
        };
        for name in ["web", "db"] {
            let template = template_of(by_name(name));
            assert!(
                !names(template, "containers").contains(&"log-shipper".to_owned()),
                "{file}: {name}"
            );
            assert_eq!(
                names(template, "initContainers"),
                ["log-shipper", "proxy"],
                "{file}: {name}"
            );
        }
        for name in ["coredns", "metrics-server"] {
            assert!(
                names(template_of(by_name(name)), "initContainers").is_empty(),
                "{file}: {name}"
            );
        }
        outputs.push(injected);
    }
    // The JSON List is read as YAML, and what is injected is written as JSON again: the same
    // objects.
    assert!(outputs[1].starts_with('{'), "{}", outputs[1]);
    assert_eq!(yaml(&outputs[0]), yaml(&outputs[1]));
}

/// Kinds the injector does not know, with a pod template at `spec.template`, are injected;
/// one whose `spec.template` is opted in but holds no containers is named and left alone.
#[test]
fn inject_reads_any_kind_with_a_pod_template() {
    let path = input("kubectl/get-dc-rollout-vm.yaml");
    let out = run(&["inject", "-f", path.to_str().expect("UTF-8 path")]);
    let injected = stdout(succeeds_noting(
        &out,
        &[
            "VirtualMachine/legacy-erp: not injected: its spec.template carries sidecar-injector.io/inject=\"true\", but it is not a pod template",
        ],
    ));
    let before = yaml(&read(&path));
    let after = yaml(&injected);
    for (i, kind) in ["DeploymentConfig", "Rollout"].into_iter().enumerate() {
        let item = &after["items"][i];
        assert_eq!(item["kind"], kind);
        assert_eq!(
            names(template_of(item), "initContainers"),
            ["log-shipper", "proxy"],
            "{kind}"
        );
        assert_eq!(
            template_of(item)["metadata"]["annotations"]["sidecar-injector.io/status"]
                .as_str()
                .map(|s| s.contains("\"templates\":[\"log-shipper\",\"proxy\"]")),
            Some(true),
            "{kind}"
        );
    }
    assert_eq!(
        after["items"][2], before["items"][2],
        "the VirtualMachine is kept"
    );

    let report = stdout(succeeds(&run(&[
        "explain",
        "-f",
        path.to_str().expect("UTF-8 path"),
    ])));
    for expected in [
        "DeploymentConfig/orders: injected with [log-shipper, proxy]",
        "Rollout/checkout: injected with [log-shipper, proxy]",
        "VirtualMachine/legacy-erp: not injected: its spec.template carries",
    ] {
        assert!(report.contains(expected), "{expected:?} not in:\n{report}");
    }
}

// === review ===

/// Every captured review of the golden inputs, answered by both webhooks.
fn captured_reviews() -> Vec<PathBuf> {
    let mut files = Vec::new();
    for dir in ["inject", "skip", "deny"] {
        for entry in std::fs::read_dir(input(dir)).expect("inputs") {
            let path = entry.expect("entry").path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            // warn-mode and tilde inputs need another configuration than the embedded one.
            if path.extension().is_some_and(|e| e == "json")
                && !name.starts_with("warn-mode-")
                && !name.starts_with("tilde-")
            {
                files.push(path);
            }
        }
    }
    files.sort();
    assert!(files.len() >= 10, "{files:?}");
    files
}

#[test]
fn review_prints_exactly_what_the_server_answers() {
    let inj = injector();
    for path in captured_reviews() {
        let body = std::fs::read(&path).expect("readable");
        for (webhook, flags) in [
            (Webhook::Mutate, &[][..]),
            (Webhook::Validate, &["--validate"][..]),
        ] {
            let expected = answer(&inj, webhook, &body).expect("answered").body;
            let mut args = vec!["review", "--request", path.to_str().expect("UTF-8 path")];
            args.extend(flags);
            let out = run(&args);
            // No newline added when stdout is not a terminal: the bytes are the server's.
            assert_eq!(
                stdout(succeeds(&out)).as_bytes(),
                expected.as_slice(),
                "{} {flags:?}",
                path.display()
            );
        }
    }
}

#[test]
fn review_reads_standard_input() {
    let path = input("inject/pod-v1.json");
    let body = std::fs::read(&path).expect("readable");
    let out = run_with_stdin(&["review", "--request", "-"], &body);
    let expected = answer(&injector(), Webhook::Mutate, &body)
        .expect("answered")
        .body;
    assert_eq!(stdout(succeeds(&out)).as_bytes(), expected.as_slice());
}

#[test]
fn review_validate_denies_a_pod_without_its_sidecar() {
    let path = input("deny/missing-sidecar.json");
    // A denial is an answer, not a failure of the command.
    let out = run(&[
        "review",
        "--validate",
        "--request",
        path.to_str().expect("UTF-8 path"),
    ]);
    let answer: Value = serde_json::from_str(&stdout(succeeds(&out))).expect("JSON");
    assert_eq!(answer["response"]["allowed"], false, "{answer}");
    assert_eq!(answer["response"]["status"]["code"], 403, "{answer}");
    let message = answer["response"]["status"]["message"]
        .as_str()
        .unwrap_or("");
    assert!(
        message.contains("\"log-shipper\"") && message.contains("missing"),
        "{message}"
    );

    // The mutator, asked about the same pod, has nothing to refuse.
    let out = run(&["review", "--request", path.to_str().expect("UTF-8 path")]);
    let answer: Value = serde_json::from_str(&stdout(succeeds(&out))).expect("JSON");
    assert_eq!(answer["response"]["allowed"], true, "{answer}");
}

// === explain ===

#[test]
fn explain_gives_every_reason() {
    let reasons = read(&input("manifests/reasons.yaml"));
    // One more document: a pod the injector already injected.
    let fresh = "apiVersion: v1\nkind: Pod\nmetadata: {name: done, namespace: shop, labels: {sidecar-injector.io/inject: \"true\"}}\nspec: {containers: [{name: app, image: nginx:1.27}]}\n";
    let done = sidecar_injector::manifest::inject(&injector(), fresh, None)
        .expect("injects")
        .yaml;
    let text = format!("{reasons}---\n{done}");
    let out = run_with_stdin(&["explain", "-f", "-"], text.as_bytes());
    let report = stdout(succeeds(&out));
    for expected in [
        "Pod/not-opted-in: not injected: it does not carry the label sidecar-injector.io/inject=\"true\"",
        "Pod/system: not injected: opted in, but namespace \"kube-system\" is excluded",
        "Pod/host: not injected: opted in, but hostNetwork pods are skipped",
        "Pod/windows: not injected: opted in, but Windows pods are skipped",
        "Pod/typo: cannot be injected: annotation sidecar-injector.io/templates asks for template \"tracing\", which does not exist",
        "Pod/fresh: injected with [log-shipper, proxy] (opted in by the pod's label sidecar-injector.io/inject=\"true\"); it would get:",
        "  + init container log-shipper (cr.fluentbit.io/fluent/fluent-bit:3.2.4) as a native sidecar",
        "  + init container proxy (docker.io/envoyproxy/envoy:v1.32.3) as a native sidecar",
        "  + volume sidecar-logs",
        "  + env APP_LOG_DIR in container #0",
        "  + annotation sidecar-injector.io/status=",
        "Pod/done: already injected with [log-shipper, proxy]: nothing to add",
        "1 other document(s) are not pods or pod templates and pass through unchanged",
    ] {
        assert!(report.contains(expected), "{expected:?} not in:\n{report}");
    }
}

/// Namespace opt-in and revisions offline: namespace labels from a Namespace document in the
/// input or from --namespace-label, and `explain` names the rule that applied.
#[test]
fn explain_and_inject_know_namespace_opt_in() {
    let pods = "apiVersion: v1\nkind: Pod\nmetadata: {name: plain, namespace: team-a}\nspec: {containers: [{name: app, image: nginx:1.27}]}\n---\napiVersion: v1\nkind: Pod\nmetadata: {name: out, namespace: team-a, labels: {sidecar-injector.io/inject: \"false\"}}\nspec: {containers: [{name: app, image: nginx:1.27}]}\n";
    let namespace = "apiVersion: v1\nkind: Namespace\nmetadata: {name: team-a, labels: {sidecar-injector.io/inject: enabled}}\n---\n";

    let report = stdout(succeeds(&run_with_stdin(
        &["explain", "-f", "-"],
        pods.as_bytes(),
    )))
    .to_owned();
    assert!(
        report.contains("Pod/plain: not injected: it does not carry the label sidecar-injector.io/inject=\"true\"\n"),
        "{report}"
    );
    let with_doc = format!("{namespace}{pods}");
    for (args, input) in [
        (&["explain", "-f", "-"][..], with_doc.as_str()),
        (
            &[
                "explain",
                "-f",
                "-",
                "--namespace-label",
                "sidecar-injector.io/inject=enabled",
            ][..],
            pods,
        ),
    ] {
        let report = stdout(succeeds(&run_with_stdin(args, input.as_bytes())));
        for expected in [
            "Pod/plain: injected with [log-shipper, proxy] (opted in by its namespace's label sidecar-injector.io/inject=enabled); it would get:",
            "Pod/out: not injected: its namespace opts it in, but the pod opts out with sidecar-injector.io/inject=\"false\"",
        ] {
            assert!(
                report.contains(expected),
                "{args:?}: {expected:?} not in:\n{report}"
            );
        }
    }
    let out = stdout(succeeds(&run_with_stdin(
        &["inject", "-f", "-"],
        with_doc.as_bytes(),
    )));
    let docs: Vec<Value> = documents(&out).into_iter().map(yaml).collect();
    assert_eq!(names(&docs[1], "initContainers"), ["log-shipper", "proxy"]);
    assert!(docs[2]["spec"].get("initContainers").is_none(), "{out}");

    // A namespace that requires sidecars: the same injection, and an opt-out is refused
    // unless its service account is exempt, which `explain` says, naming the entry.
    let required = [
        "explain",
        "-f",
        "-",
        "--namespace-label",
        "sidecar-injector.io/inject=required",
    ];
    let report = stdout(succeeds(&run_with_stdin(&required, pods.as_bytes()))).to_owned();
    for expected in [
        "Pod/plain: injected with [log-shipper, proxy] (opted in by its namespace's label sidecar-injector.io/inject=required); it would get:",
        "Pod/out: not injected: its namespace requires sidecars (sidecar-injector.io/inject=required), and the pod opts out with sidecar-injector.io/inject=\"false\", which the validating webhook and the backstop refuse: its service account \"default\" is not exempt (required.exempt)",
    ] {
        assert!(report.contains(expected), "{expected:?} not in:\n{report}");
    }
    // `inject` leaves the refused pod as it is, and says why on standard error.
    let inject = run_with_stdin(
        &[
            "inject",
            "-f",
            "-",
            "--namespace-label",
            "sidecar-injector.io/inject=required",
        ],
        pods.as_bytes(),
    );
    assert!(inject.status.success(), "{}", stderr(&inject));
    let said = stderr(&inject);
    assert!(
        said.contains("Pod/out: not injected: its namespace requires sidecars"),
        "{said}"
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("config.yaml");
    let text = format!(
        "{}required:\n  exempt: [\"*/default\"]\n",
        sidecar_injector::config::DEFAULT_CONFIG
    );
    std::fs::write(&config, text).expect("written");
    let config = config.to_str().expect("utf-8");
    let mut exempt = required.to_vec();
    exempt.extend(["--config", config]);
    let report = stdout(succeeds(&run_with_stdin(&exempt, pods.as_bytes()))).to_owned();
    assert!(
        report.contains("which it may: its service account \"default\" is exempt (required.exempt: \"*/default\")"),
        "{report}"
    );

    // A namespace enabled for another revision is that revision's.
    let report = stdout(succeeds(&run_with_stdin(
        &[
            "explain",
            "-f",
            "-",
            "--namespace-label",
            "sidecar-injector.io/inject=enabled",
            "--namespace-label",
            "sidecar-injector.io/rev=canary",
        ],
        pods.as_bytes(),
    )));
    assert!(
        report.contains("for revision \"canary\", and this injector is the default revision"),
        "{report}"
    );
    fails_saying(
        &run_with_stdin(
            &["explain", "-f", "-", "--namespace-label", "novalue"],
            pods.as_bytes(),
        ),
        &["\"novalue\" is not KEY=VALUE"],
    );
}

/// `review --path` answers as the server answers that path; an unknown path is refused.
#[test]
fn review_answers_for_a_path() {
    let pod = "{\"apiVersion\":\"admission.k8s.io/v1\",\"kind\":\"AdmissionReview\",\"request\":{\"uid\":\"3a2b1c0d-9e8f-4a7b-8c6d-5e4f3a2b1c0d\",\"kind\":{\"group\":\"\",\"version\":\"v1\",\"kind\":\"Pod\"},\"resource\":{\"group\":\"\",\"version\":\"v1\",\"resource\":\"pods\"},\"namespace\":\"team-a\",\"operation\":\"CREATE\",\"userInfo\":{},\"object\":{\"metadata\":{\"name\":\"plain\"},\"spec\":{\"containers\":[{\"name\":\"app\",\"image\":\"nginx\"}]}}}}";
    let patched = |args: &[&str]| {
        let answer: Value =
            serde_json::from_str(&stdout(succeeds(&run_with_stdin(args, pod.as_bytes()))))
                .expect("JSON");
        answer["response"].get("patch").is_some()
    };
    assert!(!patched(&["review", "--request", "-"]));
    assert!(!patched(&["review", "--request", "-", "--path", "/mutate"]));
    assert!(patched(&[
        "review",
        "--request",
        "-",
        "--path",
        "/mutate/namespace"
    ]));
    let answer: Value = serde_json::from_str(&stdout(succeeds(&run_with_stdin(
        &["review", "--request", "-", "--path", "/validate/namespace"],
        pod.as_bytes(),
    ))))
    .expect("JSON");
    assert_eq!(answer["response"]["allowed"], false, "{answer}");
    fails_saying(
        &run_with_stdin(
            &["review", "--request", "-", "--path", "/inject"],
            pod.as_bytes(),
        ),
        &["no such path \"/inject\"", "/mutate/namespace"],
    );
}

// === Failures ===

#[test]
fn invalid_yaml_is_refused() {
    let bad = "apiVersion: v1\nkind: ConfigMap\n---\nkind: Pod\nmetadata: {name: [unclosed\n";
    // Every document is still written (or explained), the one that cannot be read as it came.
    let out = run_with_stdin(&["inject", "-f", "-"], bad.as_bytes());
    fails_per_document(&out, &["document 2: invalid YAML"], Some(bad));
    let out = run_with_stdin(&["explain", "-f", "-"], bad.as_bytes());
    fails_per_document(&out, &["document 2: invalid YAML"], None);
    assert!(
        stdout(&out).contains("document 2: invalid YAML"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn a_missing_file_is_refused() {
    for args in [
        &["inject", "-f", "/nonexistent/pods.yaml"][..],
        &["explain", "-f", "/nonexistent/pods.yaml"][..],
        &["review", "--request", "/nonexistent/pods.yaml"][..],
    ] {
        fails_saying(&run(args), &["cannot read /nonexistent/pods.yaml"]);
    }
}

#[test]
fn an_unknown_template_is_refused_by_inject() {
    let path = input("manifests/reasons.yaml");
    let out = run(&["inject", "-f", path.to_str().expect("UTF-8 path")]);
    fails_per_document(
        &out,
        &[
            "Pod/typo",
            "\"tracing\"",
            "does not exist",
            "known templates: log-shipper, proxy",
        ],
        None,
    );
    // The document is written back as it came; the others as they would be alone.
    let text = read(&path);
    let typo = documents(&text)
        .into_iter()
        .find(|d| d.contains("name: typo"))
        .expect("the typo document");
    assert!(stdout(&out).contains(typo), "{}", stdout(&out));
}

#[test]
fn a_broken_config_is_refused_naming_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let manifest = input("manifests/workloads.yaml");
    let manifest = manifest.to_str().expect("UTF-8 path");

    let typo = dir.path().join("typo.yaml");
    std::fs::write(&typo, "injectLable: team.example.com/inject\n").expect("write");
    let typo = typo.to_str().expect("UTF-8 path");
    fails_saying(
        &run(&["inject", "-f", manifest, "--config", typo]),
        &[typo, "invalid configuration", "injectLable"],
    );

    let templated = dir.path().join("config.yaml");
    std::fs::write(&templated, "templatesDir: .\ndefaultTemplates: [agent]\n").expect("write");
    std::fs::write(
        dir.path().join("agent.yaml.j2"),
        "containers:\n  - name: agent\n    image: {{ values.agent.image }\n",
    )
    .expect("write");
    let templated = templated.to_str().expect("UTF-8 path");
    fails_saying(
        &run(&["inject", "-f", manifest, "--config", templated]),
        &["agent.yaml.j2", "line 3"],
    );

    // The same through the environment, for review and explain too.
    for args in [
        &["review", "--request", "-"][..],
        &["explain", "-f", manifest][..],
    ] {
        let out = binary()
            .args(args)
            .env("SIDECAR_INJECTOR_CONFIG", typo)
            .output()
            .expect("runs");
        fails_saying(&out, &[typo, "injectLable"]);
    }

    fails_saying(
        &run(&[
            "inject",
            "-f",
            manifest,
            "--config",
            "/nonexistent/config.yaml",
        ]),
        &["/nonexistent/config.yaml: cannot read"],
    );
}

#[test]
fn an_unreadable_review_is_refused() {
    for body in [
        &b"not json"[..],
        b"{\"apiVersion\":\"admission.k8s.io/v1\",\"kind\":\"AdmissionReview\"}",
    ] {
        let out = run_with_stdin(&["review", "--request", "-"], body);
        fails_saying(&out, &["AdmissionReview"]);
    }
}

/// A config that works, through --config: values reach the templates.
#[test]
fn a_config_file_is_used() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("config.yaml");
    std::fs::write(
        &config,
        sidecar_injector::config::DEFAULT_CONFIG.replace("fluent-bit:3.2.4", "fluent-bit:9.9.9"),
    )
    .expect("write");
    let manifest = input("manifests/workloads.yaml");
    let out = run(&[
        "inject",
        "-f",
        manifest.to_str().expect("UTF-8 path"),
        "--config",
        config.to_str().expect("UTF-8 path"),
    ]);
    let injected = stdout(succeeds_noting(&out, &[WORKLOADS_LEFT_ALONE]));
    assert!(injected.contains("fluent-bit:9.9.9"), "{injected}");
    assert!(!injected.contains("fluent-bit:3.2.4"), "{injected}");
}

// === Offline and online agree ===

/// The pod a controller creates from a workload's template, as the webhooks receive it.
fn pod_from(doc: &Value, namespace: &str) -> Value {
    let template = template_of(doc);
    let mut metadata = template["metadata"].clone();
    if doc["kind"] != "Pod" {
        let name = doc["metadata"]["name"].as_str().unwrap_or("pod");
        metadata["generateName"] = format!("{name}-7d9c8b6f5-").into();
    }
    metadata["namespace"] = namespace.into();
    serde_json::json!({"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": template["spec"]})
}

fn create_review(namespace: &str, pod: &Value) -> Vec<u8> {
    let body = serde_json::json!({
        "kind": "AdmissionReview",
        "apiVersion": "admission.k8s.io/v1",
        "request": {
            "uid": "3f2e1d0c-9b8a-4765-8432-10fedcba9876",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": namespace,
            "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller"},
            "object": pod
        }
    });
    serde_json::to_vec(&body).expect("JSON")
}

/// What the webhooks make of a pod created from an offline-injected template: (patch, verdict).
fn webhooks(namespace: &str, pod: &Value) -> (Option<Value>, Value) {
    let inj = injector();
    let body = create_review(namespace, pod);
    let mutated: Value =
        serde_json::from_slice(&answer(&inj, Webhook::Mutate, &body).expect("answered").body)
            .expect("JSON");
    let verdict: Value = serde_json::from_slice(
        &answer(&inj, Webhook::Validate, &body)
            .expect("answered")
            .body,
    )
    .expect("JSON");
    (
        mutated["response"].get("patch").cloned(),
        verdict["response"].clone(),
    )
}

/// `inject -f` and the webhooks decide the same: the pods of an injected manifest get no
/// patch from the mutator and pass the validator, in the namespace the manifest names.
#[test]
fn offline_injected_pods_pass_the_webhooks() {
    let path = input("manifests/workloads.yaml");
    let injected = stdout(succeeds_noting(
        &run(&["inject", "-f", path.to_str().expect("UTF-8 path")]),
        &[WORKLOADS_LEFT_ALONE],
    ));
    let mut checked = 0;
    for doc in documents(&injected).into_iter().map(yaml) {
        let namespace = doc["metadata"]["namespace"].as_str().unwrap_or("default");
        let kind = doc["kind"].as_str().unwrap_or("");
        if matches!(kind, "Service" | "ConfigMap") || namespace == "kube-system" {
            continue;
        }
        let (patch, verdict) = webhooks(namespace, &pod_from(&doc, namespace));
        assert_eq!(patch, None, "{kind}: the mutator changes an injected pod");
        assert_eq!(verdict["allowed"], true, "{kind}: {verdict}");
        checked += 1;
    }
    assert_eq!(checked, 8);
}

/// A manifest without a namespace is injected for "default", then applied elsewhere
/// (`kubectl apply -n shop -f -`). The sidecars were rendered for the wrong namespace; the
/// mutator keeps them and the validator refuses every pod the controller creates, with advice
/// ("let the controller recreate it") that cannot help. Either `inject` must not guess the
/// namespace, or the webhooks must accept what it wrote.
#[test]
fn a_manifest_without_namespace_injected_offline_is_admitted_where_it_is_applied() {
    let manifest = "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web\nspec:\n  selector:\n    matchLabels: {app: web}\n  template:\n    metadata:\n      labels: {app: web, sidecar-injector.io/inject: \"true\"}\n    spec:\n      containers:\n        - name: web\n          image: nginx:1.27\n";
    let out = run_with_stdin(&["inject", "-f", "-"], manifest.as_bytes());
    if !out.status.success() {
        // Refusing to guess the namespace is an answer too: the document is left as it was.
        fails_per_document(&out, &["namespace"], Some(manifest));
        return;
    }
    let doc = yaml(&stdout(&out));
    let (_, verdict) = webhooks("shop", &pod_from(&doc, "shop"));
    assert_eq!(verdict["allowed"], true, "{verdict:#}");
}

/// `outdated` refuses bad flags and configurations before it talks to any cluster, and says
/// what to do when there is no cluster to talk to (KUBECONFIG names a missing file here, so
/// nothing is dialled).
#[test]
fn outdated_fails_clearly_without_a_cluster() {
    let outdated = |args: &[&str]| {
        binary()
            .arg("outdated")
            .args(args)
            .env("KUBECONFIG", "/nonexistent/kubeconfig")
            .env_remove("KUBERNETES_SERVICE_HOST")
            .output()
            .expect("the binary runs")
    };
    let out = outdated(&["--dry-run"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("--restart"), "{}", stderr(&out));

    let out = outdated(&["--from-configmap", "just-a-name"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("--from-configmap wants NAMESPACE/NAME"),
        "{}",
        stderr(&out)
    );

    let out = outdated(&["--config", "/nonexistent/config.yaml"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("/nonexistent/config.yaml: cannot read"),
        "{}",
        stderr(&out)
    );

    let out = outdated(&[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("cannot reach a cluster"),
        "{}",
        stderr(&out)
    );
    assert!(out.stdout.is_empty());
}

// === export ===

/// The e2e suite's policy configuration: templates that can be written as CEL.
fn policy_config() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("e2e/policy/config.yaml")
        .display()
        .to_string()
}

fn yaml_documents(text: &str) -> Vec<Value> {
    documents(text)
        .into_iter()
        .map(|d| serde_saphyr::from_str::<Value>(d).expect("a YAML document"))
        .collect()
}

fn kinds(docs: &[Value]) -> Vec<String> {
    docs.iter()
        .map(|d| {
            format!(
                "{} {}",
                d["kind"].as_str().unwrap_or(""),
                d["metadata"]["name"].as_str().unwrap_or("")
            )
        })
        .collect()
}

#[test]
fn export_mutating_writes_one_policy_and_a_binding_per_opt_in_rule() {
    let out = run(&["export", "mutating", "--config", &policy_config()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let docs = yaml_documents(&stdout(&out));
    assert_eq!(
        kinds(&docs),
        [
            "MutatingAdmissionPolicy sidecar-injector",
            "MutatingAdmissionPolicyBinding sidecar-injector",
            "MutatingAdmissionPolicyBinding sidecar-injector-namespace",
            "MutatingAdmissionPolicyBinding sidecar-injector-required",
        ]
    );
    for d in &docs {
        assert_eq!(d["apiVersion"], "admissionregistration.k8s.io/v1");
    }
    assert_eq!(docs[0]["spec"]["reinvocationPolicy"], "IfNeeded");
    // Every byte of the export is reviewed as a diff when it changes.
    insta::assert_snapshot!("export_mutating_policy_config", stdout(&out));
    let beta = run(&[
        "export",
        "mutating",
        "--api-version",
        "v1beta1",
        "--config",
        &policy_config(),
    ]);
    assert!(beta.status.success(), "{}", stderr(&beta));
    for d in yaml_documents(&stdout(&beta)) {
        assert_eq!(d["apiVersion"], "admissionregistration.k8s.io/v1beta1");
    }
}

#[test]
fn export_backstop_writes_a_validating_policy_for_the_bundled_templates() {
    let out = run(&["export", "backstop"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let docs = yaml_documents(&stdout(&out));
    assert_eq!(
        kinds(&docs),
        [
            "ValidatingAdmissionPolicy sidecar-injector-backstop",
            "ValidatingAdmissionPolicyBinding sidecar-injector-backstop",
            "ValidatingAdmissionPolicyBinding sidecar-injector-backstop-namespace",
            "ValidatingAdmissionPolicyBinding sidecar-injector-backstop-required",
        ]
    );
    // The injector's own namespace is never matched, so its pods start while it is down.
    let excluded =
        &docs[0]["spec"]["matchConstraints"]["namespaceSelector"]["matchExpressions"][0]["values"];
    assert!(
        excluded
            .as_array()
            .is_some_and(|v| v.iter().any(|n| n == OWN_NAMESPACE)),
        "{excluded}"
    );
    assert_eq!(docs[1]["spec"]["validationActions"][0], "Deny");
    insta::assert_snapshot!("export_backstop_bundled", stdout(&out));
    // Images are held by default (only for pods injected under this configuration), and
    // left out when asked.
    let image = "cr.fluentbit.io/fluent/fluent-bit:3.2.4";
    assert!(stdout(&out).contains(&format!("must run image {image}")));
    let loose = run(&["export", "backstop", "--check-images=false"]);
    assert!(loose.status.success(), "{}", stderr(&loose));
    assert!(!stdout(&loose).contains(image));
    // Every object names the configuration it was exported from, and the policy holds a pod
    // to its contract only under that same configuration.
    let digest = docs[0]["metadata"]["annotations"]["sidecar-injector.io/config"]
        .as_str()
        .expect("the export names its configuration")
        .to_owned();
    assert_eq!(digest.len(), 16, "{digest}");
    for d in &docs {
        assert_eq!(
            d["metadata"]["annotations"]["sidecar-injector.io/config"],
            digest.as_str()
        );
    }
    let current = docs[0]["spec"]["variables"]
        .as_array()
        .and_then(|v| v.iter().find(|v| v["name"] == "current"))
        .expect("a variable named current");
    assert!(
        current["expression"]
            .as_str()
            .is_some_and(|e| e.contains(&format!(r#"\"config\":\"{digest}\""#))),
        "the policy compares the pod's status with {digest}: {current}"
    );
}

/// By default (`--namespace-required`, as the chart's `webhook.namespaceOptIn.required`), both
/// policies get a binding for namespaces labelled `required`: the backstop's selects the pods
/// that opt out too (its first validation judges them: the chart's tests evaluate it against
/// the validator), the mutating policy's leaves them out. With `--namespace-required=false`
/// neither has it, and the backstop judges no opt-out.
#[test]
fn export_binds_required_namespaces_unless_told_not_to() {
    let off = run(&["export", "backstop", "--namespace-required=false"]);
    assert!(off.status.success(), "{}", stderr(&off));
    let text = stdout(&off);
    assert!(
        !text.contains("-required") && !text.contains("optedOut"),
        "{text}"
    );
    let off = run(&["export", "mutating", "--namespace-required=false"]);
    assert!(off.status.success(), "{}", stderr(&off));
    assert!(!stdout(&off).contains("sidecar-injector-required"));
    let out = run(&["export", "backstop"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let docs = yaml_documents(&stdout(&out));
    assert_eq!(
        kinds(&docs)[3],
        "ValidatingAdmissionPolicyBinding sidecar-injector-backstop-required"
    );
    let selects = &docs[3]["spec"]["matchResources"];
    assert!(selects.get("objectSelector").is_none(), "{selects}");
    assert!(
        selects.to_string().contains(
            r#"{"key":"sidecar-injector.io/inject","operator":"In","values":["required"]}"#
        ),
        "{selects}"
    );
    let pod_binding = docs[1]["spec"]["matchResources"].to_string();
    assert!(
        pod_binding.contains(r#""values":["enabled","required"]"#),
        "{pod_binding}"
    );
    let first = &docs[0]["spec"]["validations"][0];
    assert_eq!(
        first["expression"],
        "!variables.optedOut || variables.exempt || variables.injected.size() == 0"
    );
    let out = run(&["export", "mutating"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let docs = yaml_documents(&stdout(&out));
    let required = docs
        .iter()
        .find(|d| d["metadata"]["name"] == "sidecar-injector-required")
        .expect("a binding for required namespaces");
    assert_eq!(
        required["spec"]["matchResources"]["objectSelector"]["matchExpressions"][0]["values"][0],
        "false"
    );
}

#[test]
fn export_mutating_writes_the_bundled_proxy_and_log_shipper() {
    for version in ["v1", "v1beta1"] {
        let out = run(&["export", "mutating", "--api-version", version]);
        assert!(out.status.success(), "{version}: {}", stderr(&out));
        let docs = yaml_documents(&stdout(&out));
        assert_eq!(
            docs[0]["apiVersion"],
            format!("admissionregistration.k8s.io/{version}")
        );
        let policy = &docs[0]["spec"];
        // The pod's TCP ports, collected once per pod, read by the proxy's three loops.
        let list = policy["variables"]
            .as_array()
            .and_then(|v| v.iter().find(|v| v["name"] == "list0"))
            .expect("the proxy's list of ports");
        assert!(
            list["expression"]
                .as_str()
                .is_some_and(|e| e.ends_with(".distinct()") && e.contains("a1.containerPort")),
            "{list}"
        );
        // A pod whose override the proxy does not allow is left to the backstop.
        let conditions = policy["matchConditions"].as_array().expect("conditions");
        assert!(
            conditions.iter().any(|c| c["name"] == "overrides-allowed"),
            "{conditions:?}"
        );
        if version == "v1" {
            // Every byte of the export is reviewed as a diff when it changes.
            insta::assert_snapshot!("export_mutating_bundled", stdout(&out));
        }
    }
}

#[test]
fn export_refuses_what_cel_cannot_write_with_its_lines_and_writes_nothing() {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::create_dir(dir.path().join("templates")).expect("templates dir");
    // A condition on the pod outside a loop, and a loop inside a loop over its containers.
    std::fs::write(
        dir.path().join("templates/agent.yaml.j2"),
        "containers:\n  - name: agent\n    image: x:1\n    args:\n{%- if pod.labels.debug is defined %}\n      - --debug\n{%- endif %}\n{%- for c in pod.spec.containers %}{% for f in [\"a\", \"b\"] %}\n      - {{ c.name ~ f | tojson }}\n{%- endfor %}{% endfor %}\n",
    )
    .expect("template");
    let config = dir.path().join("config.yaml");
    std::fs::write(
        &config,
        "templatesDir: templates\ndefaultTemplates: [agent]\n",
    )
    .expect("config");
    let out = run(&[
        "export",
        "mutating",
        "--config",
        &config.display().to_string(),
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(
        out.stdout.is_empty(),
        "nothing is written: {}",
        stdout(&out)
    );
    let err = stderr(&out);
    for needle in [
        "agent.yaml.j2: line 5: `pod.labels.debug is defined`: a condition on a value read from the pod",
        "agent.yaml.j2: line 8: `[\"a\", \"b\"]`: a loop inside a loop over a list of the pod",
    ] {
        assert!(err.contains(needle), "{needle:?} in {err}");
    }
}

#[test]
fn export_refuses_another_revision_and_an_empty_configuration() {
    let out = run(&["export", "backstop", "--revision", "canary"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    assert!(
        stderr(&out).contains("not revision \"canary\""),
        "{}",
        stderr(&out)
    );

    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::create_dir(dir.path().join("none")).expect("templates dir");
    let config = dir.path().join("config.yaml");
    std::fs::write(&config, "templatesDir: none\n").expect("config");
    for kind in ["backstop", "mutating"] {
        let out = run(&["export", kind, "--config", &config.display().to_string()]);
        assert_eq!(out.status.code(), Some(1), "{kind}");
        assert!(out.stdout.is_empty());
        assert!(stderr(&out).contains("no templates"), "{}", stderr(&out));
    }
}

// === malformed pods ===

/// A pod the API server will refuse (no containers) is left as it is by every command, each
/// saying why: `review` admits it without a patch and warns, `inject` writes it back unchanged,
/// `explain` gives the same reason.
#[test]
fn the_commands_agree_on_a_pod_the_api_server_refuses() {
    let reason = "the pod has no spec.containers";
    let manifest = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: x\n  namespace: shop\n  labels: {sidecar-injector.io/inject: \"true\"}\nspec: {}\n";
    let out = run_with_stdin(&["inject", "-f", "-"], manifest.as_bytes());
    assert_eq!(
        stdout(succeeds_noting(
            &out,
            &["Pod/x: not injected: opted in, but the pod has no spec.containers"]
        )),
        manifest,
        "written back byte for byte"
    );
    let out = run_with_stdin(&["explain", "-f", "-"], manifest.as_bytes());
    let text = stdout(succeeds(&out));
    assert!(text.contains(reason), "{text}");
    let review = serde_json::json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "u1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "shop", "operation": "CREATE", "userInfo": {},
            "object": serde_saphyr::from_str::<Value>(manifest).expect("YAML"),
        }
    });
    let out = run_with_stdin(&["review", "--request", "-"], review.to_string().as_bytes());
    let answer: Value = serde_json::from_str(&stdout(succeeds(&out))).expect("JSON");
    assert_eq!(answer["response"]["allowed"], true, "{answer}");
    assert!(answer["response"].get("patch").is_none(), "{answer}");
    assert!(
        answer["response"]["warnings"][0]
            .as_str()
            .is_some_and(|w| w.contains(reason)),
        "{answer}"
    );
}

/// A Job with the bundled templates gets both sidecars as native sidecars and no warning; a
/// template of one's own that adds a regular container is named once when the configuration
/// loads, and again, with the reason, for each pod that runs to completion it is injected into
/// (a Job's, a CronJob's, a bare pod with `restartPolicy: OnFailure`), never for a Deployment's.
#[test]
fn a_regular_sidecar_in_a_pod_that_runs_to_completion_is_named() {
    let jobs = r#"apiVersion: batch/v1
kind: Job
metadata: {name: migrate, namespace: shop}
spec:
  template:
    metadata:
      labels: {sidecar-injector.io/inject: "true"}
    spec:
      restartPolicy: Never
      containers: [{name: app, image: migrate:1}]
---
apiVersion: batch/v1
kind: CronJob
metadata: {name: nightly, namespace: shop}
spec:
  schedule: "0 3 * * *"
  jobTemplate:
    spec:
      template:
        metadata:
          labels: {sidecar-injector.io/inject: "true"}
        spec:
          containers: [{name: app, image: report:1}]
---
apiVersion: v1
kind: Pod
metadata: {name: once, namespace: shop, labels: {sidecar-injector.io/inject: "true"}}
spec:
  restartPolicy: OnFailure
  containers: [{name: app, image: once:1}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: shop}
spec:
  selector: {matchLabels: {app: web}}
  template:
    metadata:
      labels: {app: web, sidecar-injector.io/inject: "true"}
    spec:
      containers: [{name: app, image: web:1}]
"#;
    let out = run_with_stdin(&["inject", "-f", "-"], jobs.as_bytes());
    let bundled = stdout(succeeds(&out));
    for doc in documents(&bundled).into_iter().map(yaml) {
        let template = if doc["kind"] == "Pod" {
            &doc
        } else {
            template_of(&doc)
        };
        assert_eq!(names(template, "initContainers"), ["log-shipper", "proxy"]);
        assert_eq!(names(template, "containers"), ["app"]);
    }

    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("config.yaml"),
        "defaultTemplates: [auditor]\ntemplatesDir: .\n",
    )
    .expect("config");
    std::fs::write(
        dir.path().join("auditor.yaml.j2"),
        "containers:\n  - name: auditor\n    image: auditor:1\n",
    )
    .expect("template");
    let config = dir.path().join("config.yaml");
    let config = config.to_str().expect("UTF-8 path");
    let out = run_with_stdin(&["inject", "--config", config, "-f", "-"], jobs.as_bytes());
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    let err = stderr(&out);
    let lines: Vec<&str> = err.lines().collect();
    let why = |id: &str, reason: &str| {
        format!(
            "warning: {id}: template \"auditor\" adds \"auditor\" as a regular container to a pod that runs to completion ({reason}): the pod does not finish while \"auditor\" runs"
        )
    };
    let expected = [
        "warning: template \"auditor\" adds \"auditor\" as a regular container: a pod that runs to completion".to_owned(),
        "warning: template \"auditor\": container \"auditor\" is refused in namespaces that enforce Pod Security \"restricted\" (pod-security.kubernetes.io/enforce): allowPrivilegeEscalation is not false; capabilities.drop does not include ALL; runAsNonRoot is not set".to_owned(),
        why("Job/migrate", "restartPolicy: Never"),
        why("CronJob/nightly", "it belongs to CronJob \"nightly\""),
        why("Pod/once", "restartPolicy: OnFailure"),
    ];
    assert_eq!(lines.len(), expected.len(), "stderr: {err}");
    for (line, expected) in lines.iter().zip(&expected) {
        assert!(
            line.starts_with(expected.as_str()),
            "{expected:?} does not start: {line}"
        );
    }

    let report = stdout(&run_with_stdin(
        &["explain", "--config", config, "-f", "-"],
        jobs.as_bytes(),
    ));
    assert!(
        report.contains("  ! template \"auditor\" adds \"auditor\" as a regular container to a pod that runs to completion (restartPolicy: Never)"),
        "{report}"
    );
    assert_eq!(report.matches("  ! ").count(), 3, "{report}");
}

// === uninject ===

/// `inject` then `uninject` through the binary: every document reads back as the input's,
/// the documents `inject` left alone are written back byte for byte, and standard error says
/// what was removed from which document and why the others were left as they are.
#[test]
fn uninject_takes_out_what_inject_added() {
    let path = input("manifests/workloads.yaml");
    let text = read(&path);
    let injected = stdout(&run(&["inject", "-f", path.to_str().expect("UTF-8 path")]));
    let out = run_with_stdin(&["uninject", "-f", "-"], injected.as_bytes());
    let err = stderr(&out);
    assert!(out.status.success(), "status {}\nstderr: {err}", out.status);
    let undone = stdout(&out);

    let (before, middle, after) = (documents(&text), documents(&injected), documents(&undone));
    assert_eq!(before.len(), after.len(), "{undone}");
    for (i, ((old, mid), new)) in before.iter().zip(&middle).zip(&after).enumerate() {
        assert_eq!(yaml(new), yaml(old), "document {}", i + 1);
        if old == mid {
            // Not injected: not rewritten either.
            assert_eq!(new, old, "document {}", i + 1);
        }
    }
    for line in [
        "note: document 1 (Service/web): left as it is: not a pod and has no pod template\n",
        "note: document 2 (ConfigMap/web-config): left as it is: not a pod and has no pod template\n",
        "note: document 3 (Pod/web-debug): removed log-shipper, proxy\n",
        "note: document 4 (Deployment/web): removed log-shipper, proxy\n",
    ] {
        assert!(err.contains(line), "{line:?} not in:\n{err}");
    }
    assert!(
        err.contains(
            "(Deployment/dns-helper): left as it is: no sidecar-injector.io/status annotation"
        ),
        "{err}"
    );
    assert!(!err.contains("error:"), "{err}");
    // Every object has its line.
    let objects = after.iter().filter(|d| !yaml(d).is_null()).count();
    assert_eq!(err.lines().count(), objects, "{err}");

    // Uninjecting again changes nothing.
    let again = run_with_stdin(&["uninject", "-f", "-"], undone.as_bytes());
    assert!(again.status.success(), "{}", stderr(&again));
    assert_eq!(stdout(&again), undone);
}

/// A document that cannot be read, or whose status annotation does not parse, or that another
/// configuration injected, is named in an `error:` line and written back as it came; the
/// others are still uninjected, and the exit status is 1.
#[test]
fn uninject_writes_back_what_it_cannot_read_and_exits_1() {
    let deployment = "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web\n  namespace: shop\nspec:\n  template:\n    metadata:\n      labels:\n        sidecar-injector.io/inject: \"true\"\n    spec:\n      containers:\n        - name: app\n          image: nginx:1.27\n";
    let injected = sidecar_injector::manifest::inject(&injector(), deployment, None)
        .expect("injects")
        .yaml;
    let bogus = injected
        .replace("name: web\n", "name: bogus\n")
        .replace(r#"\"templates\":"#, r#"\"templates\" "#);
    let other = injected
        .replace("name: web\n", "name: other\n")
        .replace(r#"\"hash\":\""#, r#"\"hash\":\"ff"#);
    let text = format!("b: [\n---\n{injected}---\n{bogus}---\n{other}");
    let out = run_with_stdin(&["uninject", "-f", "-"], text.as_bytes());
    fails_per_document(
        &out,
        &[
            "error: document 1: invalid YAML",
            "error: document 3 (Deployment/bogus): cannot be uninjected: its status annotation sidecar-injector.io/status does not parse",
            "error: document 4 (Deployment/other): cannot be uninjected: its templates [log-shipper, proxy] no longer render what was injected",
            "note: document 2 (Deployment/web): removed log-shipper, proxy",
        ],
        None,
    );
    let written = stdout(&out);
    let (before, after) = (documents(&text), documents(&written));
    assert_eq!(before.len(), after.len());
    assert_eq!(after[0], before[0]);
    assert_eq!(after[2], before[2]);
    assert_eq!(after[3], before[3]);
    assert_eq!(yaml(after[1]), yaml(deployment));
}

/// A container of the pod's own named like a sidecar, which the status records as kept,
/// stays; the sidecars injection added go.
#[test]
fn uninject_keeps_a_container_the_status_records_as_kept() {
    let pod = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\n  namespace: shop\n  labels:\n    sidecar-injector.io/inject: \"true\"\nspec:\n  containers:\n    - name: app\n      image: nginx:1.27\n    - name: log-shipper\n      image: my/own-shipper:1\n";
    let injected = sidecar_injector::manifest::inject(&injector(), pod, None)
        .expect("injects")
        .yaml;
    assert!(
        injected.contains(r#"\"kept\":[\"log-shipper\"]"#),
        "{injected}"
    );
    let out = run_with_stdin(&["uninject", "-f", "-"], injected.as_bytes());
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(yaml(&stdout(&out)), yaml(pod));
}
