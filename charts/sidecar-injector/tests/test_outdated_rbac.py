"""The optional RBAC for `sidecar-injector outdated` (values `outdated.rbac.*`)."""

import pytest

from chart import RELEASE, RenderError, render, render_error

RBAC_KINDS = {"Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"}
WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection", "escalate", "bind",
               "impersonate", "*"}
FULLNAME = RELEASE
OPERATORS = {"kind": "Group", "name": "platform-operators",
             "apiGroup": "rbac.authorization.k8s.io"}


def rbac(r):
    """The RBAC objects, but the self-managed certificates' (test_certificates.py)."""
    return [d for d in r.docs if d["kind"] in RBAC_KINDS
            and not d["metadata"]["name"].endswith("-certificates")]


def rules(role):
    return sorted((tuple(r["apiGroups"]), tuple(r["resources"]), tuple(r["verbs"]),
                   tuple(r.get("resourceNames", ()))) for r in role["rules"])


def test_off_by_default(helm):
    assert rbac(render(helm=helm)) == []
    assert rbac(render("outdated.rbac.report=false", helm=helm)) == []


def test_report_is_read_only_and_exactly_what_the_report_lists(helm):
    r = render("outdated.rbac.report=true", helm=helm)
    report = r.one("ClusterRole", f"{FULLNAME}-outdated-report")
    assert rules(report) == [
        (("",), ("namespaces",), ("get", "list"), ()),
        (("",), ("pods",), ("list",), ()),
        (("apps",), ("replicasets",), ("list",), ()),
        (("batch",), ("jobs",), ("list",), ()),
    ]
    config = r.one("Role", f"{FULLNAME}-outdated-config")
    assert rules(config) == [(("",), ("configmaps",), ("get",), (r.one("ConfigMap")["metadata"]["name"],))]
    for role in rbac(r):
        for rule in role.get("rules", []):
            assert not WRITE_VERBS & set(rule["verbs"]), role["metadata"]["name"]
    # No subjects: the roles come unbound.
    assert {d["kind"] for d in rbac(r)} == {"ClusterRole", "Role"}


def test_restart_only_gets_and_patches_workloads(helm):
    r = render("outdated.rbac.report=true", "outdated.rbac.restart=true", helm=helm)
    restart = r.one("ClusterRole", f"{FULLNAME}-outdated-restart")
    assert rules(restart) == [
        (("apps",), ("deployments", "statefulsets", "daemonsets"), ("get", "patch"), ()),
    ]


def test_restart_needs_the_report():
    message = render_error("outdated.rbac.restart=true")
    assert "outdated.rbac.restart needs outdated.rbac.report" in message


def test_subjects_are_bound_to_every_role_enabled(helm):
    values = {"outdated": {"rbac": {"report": True, "restart": True, "subjects": [OPERATORS]}}}
    r = render(values=values, helm=helm)
    bindings = [b for b in rbac(r) if b["kind"] in {"ClusterRoleBinding", "RoleBinding"}]
    assert sorted((b["kind"], b["roleRef"]["kind"], b["roleRef"]["name"]) for b in bindings) == [
        ("ClusterRoleBinding", "ClusterRole", f"{FULLNAME}-outdated-report"),
        ("ClusterRoleBinding", "ClusterRole", f"{FULLNAME}-outdated-restart"),
        ("RoleBinding", "Role", f"{FULLNAME}-outdated-config"),
    ]
    for b in bindings:
        assert b["subjects"] == [OPERATORS]
        assert b["roleRef"]["apiGroup"] == "rbac.authorization.k8s.io"
    # Report only: no restart binding.
    values["outdated"]["rbac"]["restart"] = False
    kinds = [(d["kind"], d["metadata"]["name"]) for d in rbac(render(values=values, helm=helm))]
    assert not [k for k in kinds if k[1].endswith("-restart")]


def test_rbac_does_not_depend_on_the_in_cluster_server(helm):
    r = render("outdated.rbac.report=true", "webhook.url=https://127.0.0.1:8443",
               "deployment.enabled=false", "certificates.mode=existingSecret",
               "certificates.existingSecret.caBundle=eA==", helm=helm)
    assert r.one("ClusterRole", f"{FULLNAME}-outdated-report")


@pytest.mark.parametrize("subject", [{"kind": "Robot", "name": "x"}, {"kind": "User"},
                                     {"kind": "User", "name": "x", "verbs": ["*"]}])
def test_schema_refuses_bad_subjects(subject):
    with pytest.raises(RenderError):
        render(values={"outdated": {"rbac": {"report": True, "subjects": [subject]}}})
