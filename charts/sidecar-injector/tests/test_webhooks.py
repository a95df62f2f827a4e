"""The two webhook configurations: every field the chart promises, in every mode."""

import base64

import celpy
import pytest

from chart import NAMESPACE, render, render_error

SHARED = ["admissionReviewVersions", "matchPolicy", "objectSelector", "namespaceSelector",
          "sideEffects", "timeoutSeconds", "matchConditions"]


def test_both_webhooks_skip_the_same_pods(helm):
    r = render(helm=helm)
    for field in SHARED:
        assert r.mutating.get(field) == r.validating.get(field), field
    stripped = {k: v for k, v in r.mutating["clientConfig"].items() if k != "service"}
    assert stripped == {k: v for k, v in r.validating["clientConfig"].items() if k != "service"}


def test_names_are_fully_qualified(helm):
    r = render(helm=helm)
    assert r.mutating["name"] == "inject.sidecar-injector.io"
    assert r.validating["name"] == "validate.sidecar-injector.io"


def test_rules_pods_only(helm):
    r = render(helm=helm)
    assert r.mutating["rules"] == [{"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"],
                                    "operations": ["CREATE"], "scope": "Namespaced"}]
    assert r.validating["rules"] == [{"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"],
                                      "operations": ["CREATE", "UPDATE"], "scope": "Namespaced"}]


NO_REVISION = {"key": "sidecar-injector.io/rev", "operator": "DoesNotExist"}


def test_object_selector_is_the_inject_label(helm):
    r = render(helm=helm)
    for w in (r.mutating, r.validating):
        assert w["objectSelector"] == {"matchLabels": {"sidecar-injector.io/inject": "true"},
                                       "matchExpressions": [NO_REVISION]}
    r = render("config.injectLabel=example.com/sidecars", helm=helm)
    for w in (r.mutating, r.validating):
        assert w["objectSelector"]["matchLabels"] == {"example.com/sidecars": "true"}
    assert r.config["injectLabel"] == "example.com/sidecars"


def excluded(webhook):
    (by_name,) = [e for e in webhook["namespaceSelector"]["matchExpressions"]
                  if e["key"] == "kubernetes.io/metadata.name"]
    assert by_name["operator"] == "NotIn"
    return by_name["values"]


def test_namespace_selector_excludes_system_and_own_namespace(helm):
    r = render(helm=helm)
    for w in (r.mutating, r.validating):
        assert {"kube-system", "kube-public", "kube-node-lease", NAMESPACE} <= set(excluded(w))
        assert {"key": "sidecar-injector.io/disabled", "operator": "NotIn",
                "values": ["true"]} in w["namespaceSelector"]["matchExpressions"]


def test_namespace_selector_follows_the_values(helm):
    r = render(values={"config": {"excludedNamespaces": ["batch"]},
                       "webhook": {"disabledLabel": "example.com/no-sidecars"}}, helm=helm)
    for w in (r.mutating, r.validating):
        # The system namespaces stay excluded even when the list no longer names them.
        assert set(excluded(w)) == {"kube-system", "kube-public", "kube-node-lease", NAMESPACE, "batch"}
        keys = [e["key"] for e in w["namespaceSelector"]["matchExpressions"]]
        assert "example.com/no-sidecars" in keys
    assert r.config["excludedNamespaces"] == ["batch"]


def test_fixed_fields(helm):
    r = render(helm=helm)
    for w in (r.mutating, r.validating):
        assert w["matchPolicy"] == "Equivalent"
        assert w["sideEffects"] == "None"
        assert w["admissionReviewVersions"] == ["v1", "v1beta1"]
        assert w["timeoutSeconds"] <= 5
    assert r.mutating["reinvocationPolicy"] == "IfNeeded"
    assert "reinvocationPolicy" not in r.validating


def test_timeout_is_configurable(helm):
    r = render("webhook.timeoutSeconds=12", helm=helm)
    assert r.mutating["timeoutSeconds"] == r.validating["timeoutSeconds"] == 12


def test_failure_policies_explicit_with_the_documented_defaults(helm):
    r = render(helm=helm)
    assert r.mutating["failurePolicy"] == "Ignore"
    assert r.validating["failurePolicy"] == "Fail"
    r = render("webhook.mutating.failurePolicy=Fail", "webhook.validating.failurePolicy=Ignore",
               helm=helm)
    assert r.mutating["failurePolicy"] == "Fail"
    assert r.validating["failurePolicy"] == "Ignore"


# --- namespace opt-in and revisions ------------------------------------------------------------

KINDS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")


def selects(selector, labels):
    """Whether a label selector (matchLabels and matchExpressions) selects these labels."""
    for key, value in selector.get("matchLabels", {}).items():
        if labels.get(key) != value:
            return False
    for e in selector.get("matchExpressions", []):
        op, key = e["operator"], e["key"]
        if op == "In" and labels.get(key) not in e["values"]:
            return False
        if op == "NotIn" and key in labels and labels[key] in e["values"]:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def test_two_entries_with_their_own_paths(helm):
    r = render("webhook.namespaceOptIn.required=false", helm=helm)
    for kind, base, path in ((KINDS[0], "inject", "/mutate"), (KINDS[1], "validate", "/validate")):
        hooks = r.webhooks(kind)
        assert [w["name"] for w in hooks] == [f"{base}.sidecar-injector.io",
                                              f"namespace.{base}.sidecar-injector.io"]
        assert [w["clientConfig"]["service"]["path"] for w in hooks] == [path, f"{path}/namespace"]
        pod, ns = hooks
        for field in ("rules", "failurePolicy", "matchConditions", "timeoutSeconds", "sideEffects"):
            assert pod.get(field) == ns.get(field), field
    r = render("webhook.namespaceOptIn.enabled=false", "webhook.namespaceOptIn.required=false",
               helm=helm)
    for kind in KINDS:
        (only,) = r.webhooks(kind)
        assert {"key": "sidecar-injector.io/inject", "operator": "NotIn",
                "values": ["enabled"]} not in only["namespaceSelector"]["matchExpressions"]


NAMESPACES = [{}, {"sidecar-injector.io/inject": "enabled"},
              {"sidecar-injector.io/inject": "enabled", "sidecar-injector.io/rev": "canary"},
              {"sidecar-injector.io/rev": "canary"}, {"sidecar-injector.io/disabled": "true"},
              {"sidecar-injector.io/inject": "enabled", "sidecar-injector.io/disabled": "true"},
              {"sidecar-injector.io/inject": "required"},
              {"sidecar-injector.io/inject": "required", "sidecar-injector.io/rev": "canary"},
              {"sidecar-injector.io/inject": "required", "sidecar-injector.io/disabled": "true"}]
PODS = [{}, {"sidecar-injector.io/inject": "true"}, {"sidecar-injector.io/inject": "false"},
        {"sidecar-injector.io/inject": "true", "sidecar-injector.io/rev": "canary"},
        {"sidecar-injector.io/rev": "canary"}, {"sidecar-injector.io/inject": "yes"}]


def expected_entry(revision, ns, pod, required):
    """Which entry of revision `revision` should receive the pod (docs/CONFIGURATION.md), with
    webhook.namespaceOptIn.required on or off."""
    if ns.get("sidecar-injector.io/disabled") == "true":
        return None
    label = ns.get("sidecar-injector.io/inject")
    if label == "enabled" or (label == "required" and required):
        if ns.get("sidecar-injector.io/rev", "") != revision:
            return None
        if label == "required":
            # Every pod, those that opt out too: the validator judges them.
            return "required"
        return None if pod.get("sidecar-injector.io/inject") == "false" else "namespace"
    if pod.get("sidecar-injector.io/inject") != "true":
        return None
    return "pod" if pod.get("sidecar-injector.io/rev", "") == revision else None


@pytest.mark.parametrize("required", [False, True])
def test_entries_never_overlap_and_revisions_never_share_a_pod(helm, required):
    sets = ("webhook.namespaceOptIn.required=true",) if required else \
        ("webhook.namespaceOptIn.required=false",)
    installations = {rev: render(*sets, f"revision={rev}", helm=helm) if rev
                     else render(*sets, helm=helm)
                     for rev in ("", "canary", "v2")}
    for ns in NAMESPACES:
        nsl = {**ns, "kubernetes.io/metadata.name": "apps"}
        for pod in PODS:
            for kind in KINDS:
                receivers = []
                for rev, r in installations.items():
                    for w in r.webhooks(kind):
                        if selects(w["namespaceSelector"], nsl) and \
                                selects(w.get("objectSelector", {}), pod):
                            entry = w["clientConfig"]["service"]["path"].split("/")[2:] or ["pod"]
                            receivers.append((rev, entry[0]))
                wanted = [(rev, expected_entry(rev, ns, pod, required)) for rev in installations
                          if expected_entry(rev, ns, pod, required)]
                assert receivers == wanted, (ns, pod, kind)
                assert len(receivers) <= 1, (ns, pod, kind)


def test_the_required_entry(helm):
    r = r3 = render("webhook.namespaceOptIn.required=true", helm=helm)
    for kind, base, path in ((KINDS[0], "inject", "/mutate"), (KINDS[1], "validate", "/validate")):
        hooks = r.webhooks(kind)
        assert [w["name"] for w in hooks] == [f"{base}.sidecar-injector.io",
                                              f"namespace.{base}.sidecar-injector.io",
                                              f"required.{base}.sidecar-injector.io"]
        assert [w["clientConfig"]["service"]["path"] for w in hooks] == \
            [path, f"{path}/namespace", f"{path}/required"]
        pod, ns, required = hooks
        # Pods that opt out reach it: the validator refuses them unless exempt.
        assert "objectSelector" not in required
        assert {"key": "sidecar-injector.io/inject", "operator": "In",
                "values": ["required"]} in required["namespaceSelector"]["matchExpressions"]
        assert {"key": "sidecar-injector.io/inject", "operator": "NotIn",
                "values": ["enabled", "required"]} in pod["namespaceSelector"]["matchExpressions"]
        for field in ("rules", "failurePolicy", "matchConditions", "timeoutSeconds", "sideEffects"):
            assert required.get(field) == ns.get(field), field
    # Only the required entry: the pod entry leaves out required namespaces alone.
    r = render("webhook.namespaceOptIn.required=true", "webhook.namespaceOptIn.enabled=false",
               helm=helm)
    pod, required = r.webhooks(KINDS[1])
    assert required["clientConfig"]["service"]["path"] == "/validate/required"
    assert {"key": "sidecar-injector.io/inject", "operator": "NotIn",
            "values": ["required"]} in pod["namespaceSelector"]["matchExpressions"]
    # On by default (the server that keeps the backstop is told: test_policies.py), and off
    # when asked.
    assert [w["name"] for w in render(helm=helm).webhooks(KINDS[0])] == \
        [w["name"] for w in r3.webhooks(KINDS[0])]
    assert len(render("webhook.namespaceOptIn.required=false", helm=helm).webhooks(KINDS[0])) == 2


def test_required_exemptions_reach_the_configuration(helm):
    assert render(helm=helm).config["required"] == {"exempt": []}
    r = render("config.required.exempt={ci/runner,*/backup}", helm=helm)
    assert r.config["required"] == {"exempt": ["ci/runner", "*/backup"]}


def test_a_revision_names_everything(helm):
    r = render("revision=canary", helm=helm)
    for kind in KINDS:
        config = r.one(kind)
        assert config["metadata"]["name"] == "sidecar-injector-canary"
        assert config["metadata"]["labels"]["sidecar-injector.io/rev"] == "canary"
        assert all(w["name"].startswith("canary.") for w in config["webhooks"])
        assert all(w["clientConfig"]["service"]["name"] == "sidecar-injector-canary"
                   for w in config["webhooks"])
    service = r.one("Service")
    assert service["metadata"]["name"] == "sidecar-injector-canary"
    assert service["metadata"]["labels"]["sidecar-injector.io/rev"] == "canary"
    assert r.config["revision"] == "canary"
    assert render(helm=helm).config["revision"] == ""
    # A release already named for its revision is not named twice.
    r = render("revision=canary", "fullnameOverride=sidecar-injector-canary", helm=helm)
    assert r.one("Service")["metadata"]["name"] == "sidecar-injector-canary"


@pytest.mark.parametrize("revision", ["Canary", "-x", "a_b", "x" * 64])
def test_a_revision_must_be_a_dns_label(helm, revision):
    message = render_error(f"revision={revision}", helm=helm)
    assert "schema" in message and "/revision" in message, message


def test_service_mode(helm):
    r = render(helm=helm)
    for w, path in ((r.mutating, "/mutate"), (r.validating, "/validate")):
        assert "url" not in w["clientConfig"]
        assert w["clientConfig"]["service"] == {"name": "sidecar-injector", "namespace": NAMESPACE,
                                                "path": path, "port": 443}
    (https,) = [p for p in r.one("Service")["spec"]["ports"] if p["port"] == 443]
    assert https["targetPort"] == "https"
    (port,) = [p for p in r.container["ports"] if p["name"] == "https"]
    assert port["containerPort"] == 8443


URL_MODE = {"webhook": {"url": "https://127.0.0.1:9443/"}, "deployment": {"enabled": False},
            "certificates": {"mode": "existingSecret",
                             "existingSecret": {"caBundle": base64.b64encode(b"pem").decode()}}}


def test_url_mode(helm):
    r = render(values=URL_MODE, helm=helm)
    assert r.mutating["clientConfig"] == {"url": "https://127.0.0.1:9443/mutate", "caBundle": "cGVt"}
    assert r.validating["clientConfig"] == {"url": "https://127.0.0.1:9443/validate", "caBundle": "cGVt"}
    # Only the webhook configurations and the server's configuration.
    assert r.kinds() == ["ConfigMap", "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"]


def test_url_mode_with_replica_count_zero(helm):
    values = {**URL_MODE, "deployment": {"enabled": True}, "replicaCount": 0}
    assert "Deployment" not in render(values=values, helm=helm).kinds()


def test_no_server_and_no_url_is_refused(helm):
    assert "webhook.url" in render_error("replicaCount=0", helm=helm)
    assert "webhook.url" in render_error("deployment.enabled=false", helm=helm)


@pytest.mark.parametrize("url", ["http://127.0.0.1:8443", "https://host:8443/path",
                                 "https://host?x=1", "https://user@host"])
def test_url_must_be_a_bare_https_origin(helm, url):
    assert "webhook/url" in render_error(f"webhook.url={url}", helm=helm)


# --- matchConditions --------------------------------------------------------------------------

def conditions(r):
    return {c["name"]: c["expression"] for c in r.mutating.get("matchConditions", [])}


def test_match_conditions_by_default(helm):
    r = render(helm=helm)
    assert set(conditions(r)) == {"not-host-network", "not-windows-with-default-templates"}
    assert r.mutating["matchConditions"] == r.validating["matchConditions"]


def test_match_conditions_can_be_turned_off(helm):
    r = render("webhook.matchConditions.enabled=false", helm=helm)
    assert "matchConditions" not in r.mutating and "matchConditions" not in r.validating


def test_match_conditions_follow_the_skip_rules(helm):
    assert set(conditions(render("config.skip.windows=false", helm=helm))) == {"not-host-network"}
    assert set(conditions(render("config.skip.hostNetwork=false", helm=helm))) == {
        "not-windows-with-default-templates"}
    r = render("config.skip.windows=false", "config.skip.hostNetwork=false", helm=helm)
    assert "matchConditions" not in r.mutating and "matchConditions" not in r.validating


def test_windows_pods_go_to_the_server_when_a_default_template_supports_them(helm):
    windows = "supportsWindows: true\ncontainers: []\n"
    r = render(values={"extraTemplates": {"win": windows},
                       "config": {"defaultTemplates": ["log-shipper", "win"]}}, helm=helm)
    assert set(conditions(r)) == {"not-host-network"}
    # A Windows-capable template that is not a default changes nothing.
    r = render(values={"extraTemplates": {"win": windows}}, helm=helm)
    assert "not-windows-with-default-templates" in conditions(r)


def test_the_floor_is_kubernetes_1_30(helm):
    # Native sidecars, matchConditions and the backstop's ValidatingAdmissionPolicy all work
    # from 1.30; below it the chart is refused whatever the values.
    for older in ("1.29.6", "1.28.0"):
        message = render_error(helm=helm, kube_version=older)
        assert ">=1.30.0-0" in message, message
    assert conditions(render(helm=helm, kube_version="1.30.0"))
    r = render("webhook.matchConditions.enabled=false", helm=helm, kube_version="1.30.0")
    assert "matchConditions" not in r.mutating


def pod(spec=None, annotations=None):
    meta = {"name": "p", "namespace": "apps", "labels": {"sidecar-injector.io/inject": "true"}}
    if annotations:
        meta["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"containers": [{"name": "app", "image": "app"}], **(spec or {})}}


WINDOWS_SELECTOR = {"nodeSelector": {"kubernetes.io/os": "windows"}}
CASES = [
    ("plain pod", pod(), True),
    ("hostNetwork false", pod({"hostNetwork": False}), True),
    ("hostNetwork", pod({"hostNetwork": True}), False),
    ("linux node selector", pod({"nodeSelector": {"kubernetes.io/os": "linux"}}), True),
    ("windows node selector", pod(WINDOWS_SELECTOR), False),
    ("windows spec.os", pod({"os": {"name": "windows"}}), False),
    ("windows, other annotation", pod(WINDOWS_SELECTOR, {"a": "b"}), False),
    ("windows naming templates", pod(WINDOWS_SELECTOR, {"sidecar-injector.io/templates": "x"}), True),
    ("linux spec.os", pod({"os": {"name": "linux"}}), True),
]


@pytest.mark.parametrize("name,obj,sent", CASES, ids=[c[0] for c in CASES])
def test_match_conditions_send_exactly_the_pods_the_server_handles(name, obj, sent):
    env = celpy.Environment()
    activation = {"object": celpy.json_to_cel(obj)}
    r = render()
    results = [bool(env.program(env.compile(c["expression"])).evaluate(activation))
               for c in r.mutating["matchConditions"]]
    # The apiserver calls the webhook only when every condition is true.
    assert all(results) == sent


def test_match_conditions_only_look_at_the_pod():
    # Not at dryRun, the user or oldObject: the mutator and the validator (which also sees
    # UPDATE) must agree on every request.
    for expression in conditions(render()).values():
        assert "request" not in expression and "oldObject" not in expression
        assert "authorizer" not in expression and "params" not in expression


# --- certificates' effect on the webhooks ------------------------------------------------------

def test_cert_manager_injects_the_ca(helm):
    r = render("certificates.mode=certManager", helm=helm)
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        annotations = r.one(kind)["metadata"]["annotations"]
        certificate = r.one("Certificate", "sidecar-injector-serving")
        assert annotations["cert-manager.io/inject-ca-from"] == f"{NAMESPACE}/{certificate['metadata']['name']}"
        assert "caBundle" not in r.webhook(kind)["clientConfig"]


def test_other_modes_have_no_inject_annotation(helm):
    r = render(helm=helm)
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        assert "annotations" not in r.one(kind)["metadata"]


# --- the schema ---------------------------------------------------------------------------------

@pytest.mark.parametrize("setting,where", [
    ("webhook.mutating.failurePolicy=Never", "/webhook/mutating/failurePolicy"),
    ("webhook.validating.failurePolicy=fail", "/webhook/validating/failurePolicy"),
    ("certificates.mode=vault", "/certificates/mode"),
    ("config.validation.mode=deny", "/config/validation/mode"),
    ("webhook.timeoutSeconds=0", "/webhook/timeoutSeconds"),
    ("webhook.timeoutSeconds=31", "/webhook/timeoutSeconds"),
    ("webhook.failurePolicy=Fail", "/webhook"),
    ("replicaCount=-1", "/replicaCount"),
    ("config.required.exempt={ci/*}", "/config/required/exempt/0"),
    ("config.required.exempt={runner}", "/config/required/exempt/0"),
    ("webhook.namespaceOptIn.required=yes", "/webhook/namespaceOptIn/required"),
])
def test_schema_rejects_bad_values(helm, setting, where):
    message = render_error(setting, helm=helm)
    assert "schema" in message and where in message, message
