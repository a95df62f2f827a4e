"""The admission policies the chart installs: the backstop (on by default where the cluster
serves ValidatingAdmissionPolicy) and policy mode (a MutatingAdmissionPolicy, no server)."""

import os
import subprocess

import pytest
import yaml

from chart import NAMESPACE, ROOT, VAP, render, render_error
from test_binary import binary

WEBHOOK_KINDS = {"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"}
SERVER_KINDS = {"Deployment", "Service", "PodDisruptionBudget", "Secret", "ServiceAccount"}


def excluded(doc):
    """The namespaces a policy or binding never matches, from its namespaceSelector."""
    spec = doc["spec"]
    selector = spec.get("matchConstraints", spec.get("matchResources", {}))["namespaceSelector"]
    (names,) = [e for e in selector["matchExpressions"] if e["key"] == "kubernetes.io/metadata.name"]
    return names["values"]


def test_backstop_is_on_where_the_cluster_has_the_api():
    out = render(api_versions=VAP)
    policy = out.one("ValidatingAdmissionPolicy")
    bindings = out.all("ValidatingAdmissionPolicyBinding")
    assert [b["spec"]["policyName"] for b in bindings] == [policy["metadata"]["name"]] * 2
    # The release namespace replaces the shipped export's placeholder: the injector's own pods
    # are never refused, so it can start while it is down.
    for doc in [policy, *bindings]:
        assert NAMESPACE in excluded(doc)
        assert "__RELEASE_NAMESPACE__" not in yaml.safe_dump(doc)
    assert all(b["spec"]["validationActions"] == ["Deny"] for b in bindings)
    # Without the API (Kubernetes before 1.30, or helm template without a cluster) it is left out.
    assert not render().all("ValidatingAdmissionPolicy")
    assert not render("policies.backstop.enabled=false", api_versions=VAP).all("ValidatingAdmissionPolicy")


def test_another_configuration_needs_its_own_export():
    changed = ("config.values.proxy.image=example/proxy:2",)
    # auto: left out rather than refusing pods against templates it does not hold.
    assert not render(*changed, api_versions=VAP).all("ValidatingAdmissionPolicy")
    err = render_error(*changed, "policies.backstop.enabled=true", api_versions=VAP)
    assert "sidecar-injector export backstop --configmap -" in err, err
    manifest = render(api_versions=VAP).one("ValidatingAdmissionPolicy")
    own = render(*changed, values={"policies": {"backstop": {"manifest": yaml.safe_dump(manifest)}}},
                 api_versions=VAP)
    assert own.one("ValidatingAdmissionPolicy") == manifest


def test_the_shipped_backstop_matches_a_fresh_export(tmp_path):
    exe = binary()
    if exe is None:
        pytest.skip("no sidecar-injector binary built (cargo build)")
    env = dict(os.environ, SIDECAR_INJECTOR_BIN=str(exe))
    subprocess.run(["bash", str(ROOT / "charts" / "export-policies.sh"), str(tmp_path)],
                   check=True, env=env, capture_output=True)
    shipped = ROOT / "charts" / "sidecar-injector" / "files" / "policies"
    for name in ("backstop.yaml", "fingerprint"):
        assert (tmp_path / name).read_text() == (shipped / name).read_text(), (
            f"files/policies/{name} is stale: run charts/export-policies.sh")


def test_policy_mode_installs_policies_and_no_server(tmp_path):
    err = render_error("mode=policy")
    assert "needs policies.mutating.manifest" in err and "proxy" in err, err
    exe = binary()
    if exe is None:
        pytest.skip("no sidecar-injector binary built (cargo build)")
    config = ROOT / "e2e" / "policy" / "config.yaml"
    env = dict(os.environ, SIDECAR_INJECTOR_NAMESPACE=NAMESPACE)
    mutating = subprocess.run([str(exe), "export", "mutating", "--config", str(config)],
                              check=True, env=env, capture_output=True, text=True).stdout
    backstop = subprocess.run([str(exe), "export", "backstop", "--config", str(config)],
                              check=True, env=env, capture_output=True, text=True).stdout
    out = render("mode=policy", values={"policies": {
        "mutating": {"manifest": mutating}, "backstop": {"manifest": backstop}}}, api_versions=VAP)
    kinds = set(out.kinds())
    assert {"MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding",
            "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"} <= kinds, kinds
    assert not kinds & (WEBHOOK_KINDS | SERVER_KINDS), kinds
    assert out.one("MutatingAdmissionPolicy")["spec"]["reinvocationPolicy"] == "IfNeeded"


def test_mode_is_checked():
    err = render_error("mode=both")
    assert "mode" in err and "webhook" in err and "policy" in err, err
