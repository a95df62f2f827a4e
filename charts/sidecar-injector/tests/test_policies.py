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


def env_of(deployment):
    """The server container's environment, as {name: value or valueFrom}."""
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def rules_of(out, kind, name):
    (role,) = [d for d in out.all(kind) if d["metadata"]["name"] == name]
    return role["rules"]


@pytest.mark.parametrize("sets", [
    (),
    # Any values: the server exports what it serves, so nothing differs for the chart.
    ("config.values.proxy.image=example/proxy:2", "revision=canary",
     "webhook.namespaceOptIn.enabled=false", "webhook.disabledLabel=example.com/off",
     "webhook.namespaceOptIn.required=false"),
])
def test_the_server_keeps_the_backstop_where_the_cluster_has_the_api(sets):
    out = render(*sets, api_versions=VAP)
    # Nothing of it is rendered: the server applies the export of its configuration.
    assert not out.all("ValidatingAdmissionPolicy")
    assert not out.all("ValidatingAdmissionPolicyBinding")
    deployment = out.one("Deployment")
    env = env_of(deployment)
    name = deployment["metadata"]["name"]
    assert env["SIDECAR_INJECTOR_BACKSTOP"] == "true"
    assert env["SIDECAR_INJECTOR_BACKSTOP_OWNER"] == out.one("MutatingWebhookConfiguration")["metadata"]["name"]
    assert env["SIDECAR_INJECTOR_NAMESPACE_OPT_IN"] == ("false" if sets else "true")
    assert env["SIDECAR_INJECTOR_NAMESPACE_REQUIRED"] == ("false" if sets else "true")
    assert env["SIDECAR_INJECTOR_DISABLED_LABEL"] == ("example.com/off" if sets else "sidecar-injector.io/disabled")
    assert env["SIDECAR_INJECTOR_POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert deployment["spec"]["template"]["spec"]["automountServiceAccountToken"] is True
    # Its rights: the backstop's objects by the names `export` gives them, its owner, events.
    policy = "sidecar-injector-canary-backstop" if sets else "sidecar-injector-backstop"
    rules = rules_of(out, "ClusterRole", f"{name}-backstop")
    assert rules == [
        {"apiGroups": ["admissionregistration.k8s.io"], "resources": ["validatingadmissionpolicies"],
         "resourceNames": [policy], "verbs": ["get", "create", "patch"]},
        {"apiGroups": ["admissionregistration.k8s.io"], "resources": ["validatingadmissionpolicybindings"],
         "resourceNames": [policy, f"{policy}-namespace", f"{policy}-required"], "verbs": ["get", "create", "patch", "delete"]},
        {"apiGroups": ["admissionregistration.k8s.io"], "resources": ["mutatingwebhookconfigurations"],
         "resourceNames": [env["SIDECAR_INJECTOR_BACKSTOP_OWNER"]], "verbs": ["get"]},
    ]
    assert rules_of(out, "Role", f"{name}-backstop-events") == [
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}]
    (binding,) = [b for b in out.all("ClusterRoleBinding") if b["metadata"]["name"] == f"{name}-backstop"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": out.one("ServiceAccount")["metadata"]["name"],
                                    "namespace": NAMESPACE}]


def test_no_backstop_no_token():
    for out in (render("certificates.mode=selfSigned"),
                render("policies.backstop.enabled=false", "certificates.mode=selfSigned",
                       api_versions=VAP)):
        deployment = out.one("Deployment")
        assert "SIDECAR_INJECTOR_BACKSTOP" not in env_of(deployment)
        assert deployment["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
        assert not [r for r in out.all("ClusterRole") if r["metadata"]["name"].endswith("-backstop")]
    # `true` keeps it even where the API is not announced (helm template without a cluster).
    assert env_of(render("policies.backstop.enabled=true").one("Deployment"))["SIDECAR_INJECTOR_BACKSTOP"] == "true"


def test_without_a_server_in_the_cluster_the_shipped_export_is_rendered():
    url = ("webhook.url=https://injector.example:8443", "replicaCount=0",
           "certificates.mode=existingSecret", "certificates.existingSecret.caBundle=Y2E=")
    out = render(*url, api_versions=VAP)
    policy = out.one("ValidatingAdmissionPolicy")
    bindings = out.all("ValidatingAdmissionPolicyBinding")
    assert [b["spec"]["policyName"] for b in bindings] == [policy["metadata"]["name"]] * 3
    # The release namespace replaces the shipped export's placeholder: the injector's own pods
    # are never refused, so it can start while it is down.
    for doc in [policy, *bindings]:
        assert NAMESPACE in excluded(doc)
        assert "__RELEASE_NAMESPACE__" not in yaml.safe_dump(doc)
    assert all(b["spec"]["validationActions"] == ["Deny"] for b in bindings)
    # Without the API (Kubernetes before 1.30, or helm template without a cluster) it is left out.
    assert not render(*url).all("ValidatingAdmissionPolicy")
    assert not render(*url, "policies.backstop.enabled=false", api_versions=VAP).all("ValidatingAdmissionPolicy")
    # Another configuration needs its own export: auto leaves it out, true says how.
    changed = (*url, "config.values.proxy.image=example/proxy:2")
    assert not render(*changed, api_versions=VAP).all("ValidatingAdmissionPolicy")
    err = render_error(*changed, "policies.backstop.enabled=true", api_versions=VAP)
    assert "sidecar-injector export backstop --configmap -" in err, err
    own = render(*changed, values={"policies": {"backstop": {"manifest": yaml.safe_dump(policy)}}},
                 api_versions=VAP)
    assert own.one("ValidatingAdmissionPolicy") == policy


def test_a_manifest_of_ones_own_replaces_the_servers():
    manifest = render("webhook.url=https://x:1", "replicaCount=0", "certificates.mode=existingSecret",
                      "certificates.existingSecret.caBundle=Y2E=", api_versions=VAP).one("ValidatingAdmissionPolicy")
    out = render(values={"policies": {"backstop": {"manifest": yaml.safe_dump(manifest)}}}, api_versions=VAP)
    assert out.one("ValidatingAdmissionPolicy") == manifest
    assert "SIDECAR_INJECTOR_BACKSTOP" not in env_of(out.one("Deployment"))


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


@pytest.mark.parametrize("sets", [
    (),
    # Any values: the keeper exports what it reads.
    ("config.values.proxy.image=example/proxy:2", "revision=canary", "policies.mutating.apiVersion=v1beta1"),
])
def test_policy_mode_runs_a_keeper_and_no_webhook(sets):
    out = render("mode=policy", *sets, api_versions=VAP)
    kinds = set(out.kinds())
    # Nothing exported is rendered, nothing of a webhook is installed: one pod keeps the policies.
    assert not kinds & {"MutatingAdmissionPolicy", "ValidatingAdmissionPolicy"}, kinds
    assert not kinds & (WEBHOOK_KINDS | {"Service", "PodDisruptionBudget", "Secret"}), kinds
    deployment = out.one("Deployment")
    assert deployment["spec"]["replicas"] == 1
    env = env_of(deployment)
    name = deployment["metadata"]["name"]
    assert env["SIDECAR_INJECTOR_POLICIES_ONLY"] == "true"
    assert env["SIDECAR_INJECTOR_MUTATING_POLICY"] == ("v1beta1" if sets else "auto")
    assert env["SIDECAR_INJECTOR_BACKSTOP"] == "true"
    assert env["SIDECAR_INJECTOR_BACKSTOP_OWNER"] == f"ClusterRole/{name}-backstop"
    assert not {"SIDECAR_INJECTOR_TLS_CERT_FILE", "SIDECAR_INJECTOR_LISTEN"} & set(env)
    pod = deployment["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is True
    assert [v["name"] for v in pod["volumes"]] == ["config"]
    assert [p["name"] for p in pod["containers"][0]["ports"]] == ["admin"]
    mutating = "sidecar-injector-canary" if sets else "sidecar-injector"
    rules = rules_of(out, "ClusterRole", f"{name}-backstop")
    assert rules[2:] == [
        {"apiGroups": ["admissionregistration.k8s.io"], "resources": ["mutatingadmissionpolicies"],
         "resourceNames": [mutating], "verbs": ["get", "create", "patch"]},
        {"apiGroups": ["admissionregistration.k8s.io"], "resources": ["mutatingadmissionpolicybindings"],
         "resourceNames": [mutating, f"{mutating}-namespace", f"{mutating}-required"], "verbs": ["get", "create", "patch", "delete"]},
        {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles"],
         "resourceNames": [f"{name}-backstop"], "verbs": ["get"]},
    ]
    # Without the backstop the keeper still keeps the mutating policy.
    off = render("mode=policy", "policies.backstop.enabled=false", api_versions=VAP)
    off_name = off.one("Deployment")["metadata"]["name"]
    assert "SIDECAR_INJECTOR_BACKSTOP" not in env_of(off.one("Deployment"))
    assert [r["resources"] for r in rules_of(off, "ClusterRole", f"{off_name}-backstop")] == [
        ["mutatingadmissionpolicies"], ["mutatingadmissionpolicybindings"], ["clusterroles"]]


def test_policy_mode_with_manifests_of_ones_own_runs_nothing(tmp_path):
    err = render_error("mode=policy", "deployment.enabled=false")
    assert "needs policies.mutating.manifest" in err, err
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
