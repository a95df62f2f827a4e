"""The chart's ConfigMap read by the real sidecar-injector binary.

Uses $SIDECAR_INJECTOR_BIN, else the newest sidecar-injector under $CARGO_TARGET_DIR or
target/ (debug or release); skipped when there is none (the chart checks never build Rust).
"""

import json
import os
import subprocess
from pathlib import Path

import celpy
import pytest

from chart import ROOT, render
from test_webhooks import CASES


def binary():
    if os.environ.get("SIDECAR_INJECTOR_BIN"):
        return Path(os.environ["SIDECAR_INJECTOR_BIN"])
    dirs = [Path(os.environ["CARGO_TARGET_DIR"])] if os.environ.get("CARGO_TARGET_DIR") else []
    dirs.append(ROOT / "target")
    found = [d / p / "sidecar-injector" for d in dirs for p in ("debug", "release")]
    found = [f for f in found if f.is_file() and os.access(f, os.X_OK)]
    return max(found, key=lambda f: f.stat().st_mtime) if found else None


@pytest.fixture(scope="module")
def server_config(tmp_path_factory):
    """The default install's ConfigMap, written out the way the kubelet mounts it."""
    exe = binary()
    if exe is None:
        pytest.skip("no sidecar-injector binary built (cargo build)")
    directory = tmp_path_factory.mktemp("config")
    for key, value in render().one("ConfigMap")["data"].items():
        (directory / key).write_text(value)
    return exe, directory / "config.yaml"


def run(exe, *args, stdin):
    return subprocess.run([str(exe), *args], input=stdin, capture_output=True, text=True)


def test_the_binary_loads_the_chart_config(server_config):
    exe, config = server_config
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "web", "namespace": "apps",
                        "labels": {"sidecar-injector.io/inject": "true"}},
           "spec": {"containers": [{"name": "app", "image": "app"}]}}
    proc = run(exe, "explain", "--config", str(config), "-f", "-", stdin=json.dumps(pod))
    assert proc.returncode == 0, proc.stderr
    assert "injected with [log-shipper, proxy]" in proc.stdout, proc.stdout


def review(pod, operation="CREATE"):
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "chart-test", "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "name": pod["metadata"]["name"], "namespace": pod["metadata"]["namespace"],
        "operation": operation, "userInfo": {}, "object": pod, "dryRun": False,
        **({"oldObject": pod} if operation == "UPDATE" else {})}})


def test_pods_kept_away_by_match_conditions_are_pods_the_server_skips(server_config):
    """matchConditions may only hold back what the server would skip anyway: for every sample
    pod the conditions hold back, the injector leaves it alone and the validator admits it."""
    exe, config = server_config
    env = celpy.Environment()
    programs = [env.program(env.compile(c["expression"])) for c in render().mutating["matchConditions"]]
    held_back = 0
    for name, obj, _ in CASES:
        activation = {"object": celpy.json_to_cel(obj)}
        if all(bool(p.evaluate(activation)) for p in programs):
            continue  # sent to the server: it decides
        held_back += 1
        mutate = run(exe, "review", "--config", str(config), "--request", "-", stdin=review(obj))
        assert mutate.returncode == 0, mutate.stderr
        response = json.loads(mutate.stdout)["response"]
        assert response["allowed"] is True and "patch" not in response, (name, response)
        for operation in ("CREATE", "UPDATE"):
            validate = run(exe, "review", "--config", str(config), "--request", "-", "--validate",
                           stdin=review(obj, operation))
            assert validate.returncode == 0, validate.stderr
            assert json.loads(validate.stdout)["response"]["allowed"] is True, (name, validate.stdout)
    assert held_back, "no sample pod is held back: the samples no longer cover matchConditions"


def test_the_binary_serves_a_revision_as_the_chart_configures_it(server_config, tmp_path):
    """A revision's ConfigMap: the binary injects the pods naming that revision, and no other."""
    exe, _ = server_config
    for key, value in render("revision=canary").one("ConfigMap")["data"].items():
        (tmp_path / key).write_text(value)
    config = tmp_path / "config.yaml"

    def explain(labels):
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": "web", "namespace": "apps", "labels": labels},
               "spec": {"containers": [{"name": "app", "image": "app"}]}}
        proc = run(exe, "explain", "--config", str(config), "-f", "-", stdin=json.dumps(pod))
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    inject = {"sidecar-injector.io/inject": "true"}
    assert "injected with [log-shipper, proxy]" in explain({**inject, "sidecar-injector.io/rev": "canary"})
    out = explain(inject)
    assert "not injected: it asks for the default revision" in out, out
    status = run(exe, "inject", "--config", str(config), "-f", "-", stdin=json.dumps(
        {"apiVersion": "v1", "kind": "Pod",
         "metadata": {"name": "web", "namespace": "apps",
                      "labels": {**inject, "sidecar-injector.io/rev": "canary"}},
         "spec": {"containers": [{"name": "app", "image": "app"}]}}))
    assert status.returncode == 0, status.stderr
    assert '\\"revision\\":\\"canary\\"' in status.stdout, status.stdout


def test_the_backstop_judges_an_opt_out_in_a_required_namespace_as_the_validator_does(
        server_config, tmp_path):
    """In a namespace labelled `required`, the backstop's first validation (evaluated here with
    celpy) refuses exactly the opt-outs the validating webhook refuses, with its very words;
    the exempt service accounts come from the chart's config.required.exempt."""
    import yaml
    exe, _ = server_config
    sets = ("config.required.exempt={shop/backup,*/ci-runner}",)
    for key, value in render(*sets).one("ConfigMap")["data"].items():
        (tmp_path / key).write_text(value)
    config = tmp_path / "config.yaml"
    proc = subprocess.run([str(exe), "export", "backstop", "--config", str(config),
                           "--namespace-required=true"], capture_output=True, text=True,
                          env={**os.environ, "SIDECAR_INJECTOR_NAMESPACE": "sidecar-injector"})
    assert proc.returncode == 0, proc.stderr
    docs = list(yaml.safe_load_all(proc.stdout))
    by_name = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    binding = by_name["ValidatingAdmissionPolicyBinding", "sidecar-injector-backstop-required"]
    assert "objectSelector" not in binding["spec"]["matchResources"], binding
    policy = by_name["ValidatingAdmissionPolicy", "sidecar-injector-backstop"]["spec"]
    expressions = {v["name"]: v["expression"] for v in policy["variables"]}
    (check,) = [v for v in policy["validations"] if "variables.optedOut" in v["expression"]]
    env = celpy.Environment()

    def evaluate(expression, activation):
        return env.program(env.compile(expression)).evaluate(activation)

    refused_seen = 0
    for ns, account, label in [("shop", "reports", "false"), ("shop", "backup", "false"),
                               ("other", "ci-runner", "false"), ("other", "backup", "false"),
                               ("shop", None, "false"), ("shop", "reports", None)]:
        spec = {"containers": [{"name": "app", "image": "app"}]}
        if account:
            spec["serviceAccountName"] = account
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": "web", "namespace": ns,
                            "labels": {"sidecar-injector.io/inject": label} if label else {}},
               "spec": spec}
        activation = {
            "object": celpy.json_to_cel(pod),
            "request": celpy.json_to_cel({"namespace": ns}),
            "namespaceObject": celpy.json_to_cel(
                {"metadata": {"name": ns, "labels": {"sidecar-injector.io/inject": "required"}}}),
        }
        # The templates the pod asks for are not evaluated here (celpy lacks Kubernetes'
        # strings library): the pod asks for the defaults, and gets them.
        values = {"injected": ["log-shipper", "proxy"]}
        for name in ("required", "optedOut", "serviceAccount", "exempt", "exemptHere"):
            activation["variables"] = celpy.json_to_cel(values)
            result = evaluate(expressions[name], activation)
            values[name] = bool(result) if isinstance(result, celpy.celtypes.BoolType) else str(result)
        activation["variables"] = celpy.json_to_cel(values)
        admitted = bool(evaluate(check["expression"], activation))
        validate = run(exe, "review", "--config", str(config), "--request", "-",
                       "--path", "/validate/required", stdin=review(pod))
        assert validate.returncode == 0, validate.stderr
        response = json.loads(validate.stdout)["response"]
        if label is None:
            # Not an opt-out: the backstop's required check has nothing to say; the validator
            # holds the pod to its sidecars, as the backstop's other validations do.
            assert admitted, (ns, account)
            continue
        assert admitted == response["allowed"], (ns, account, response)
        if not admitted:
            refused_seen += 1
            assert str(evaluate(check["messageExpression"], activation)) == \
                response["status"]["message"]
    assert refused_seen == 3
