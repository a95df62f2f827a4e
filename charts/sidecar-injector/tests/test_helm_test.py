"""`helm test`: a Pod running `sidecar-injector check` from the release's image, and the RBAC it
needs (values `tests.check.*`)."""

from chart import NAMESPACE, RELEASE, render

NAME = f"{RELEASE}-test-check"
WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection", "escalate", "bind",
               "impersonate", "*"}


def hooks(r):
    return [d for d in r.docs if d["metadata"].get("annotations", {}).get("helm.sh/hook") == "test"]


def rules(role):
    return sorted((tuple(r["apiGroups"]), tuple(r["resources"]), tuple(r["verbs"]),
                   tuple(r.get("resourceNames", ()))) for r in role["rules"])


def test_only_helm_test_creates_it(helm):
    r = render(helm=helm, tests=True)
    test_objects = hooks(r)
    assert sorted((d["kind"], d["metadata"]["name"]) for d in test_objects) == sorted([
        ("ServiceAccount", NAME), ("ClusterRole", NAME), ("ClusterRoleBinding", NAME),
        ("Role", NAME), ("RoleBinding", NAME),
        ("Role", f"{NAME}-dry-run"), ("RoleBinding", f"{NAME}-dry-run"), ("Pod", NAME),
    ])
    # The RBAC before the Pod; every object replaced on the next run.
    for d in test_objects:
        annotations = d["metadata"]["annotations"]
        assert annotations["helm.sh/hook-delete-policy"] == "before-hook-creation"
        if d["kind"] != "Pod":
            assert annotations["helm.sh/hook-weight"] == "-1"
    # Not part of what `helm install` creates.
    assert not hooks(render(helm=helm))


def test_the_pod_runs_check_for_this_release(helm):
    r = render(helm=helm, tests=True)
    pod = r.one("Pod", NAME)
    (container,) = pod["spec"]["containers"]
    assert container["image"] == r.container["image"]
    assert container["command"] == ["/sidecar-injector"]
    assert container["args"] == ["check", f"--namespace={NAMESPACE}", f"--release={RELEASE}",
                                 "--pod-namespace=default"]
    assert pod["spec"]["serviceAccountName"] == NAME
    assert pod["spec"]["restartPolicy"] == "Never"
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    # Never the server's selector: its ReplicaSet would adopt it, its Service route to it.
    selector = r.one("Deployment")["spec"]["selector"]["matchLabels"]
    assert not selector.items() <= pod["metadata"]["labels"].items()


def test_rbac_reads_by_name_and_creates_pods_only_where_the_dry_run_goes(helm):
    r = render("tests.check.podNamespace=apps", helm=helm, tests=True)
    cluster = r.one("ClusterRole", NAME)
    assert rules(cluster) == [
        # Namespaces labelled required (whether the required entries select them).
        (("",), ("namespaces",), ("list",), ()),
        (("admissionregistration.k8s.io",), ("mutatingwebhookconfigurations",), ("list",), ()),
        (("admissionregistration.k8s.io",),
         ("mutatingwebhookconfigurations", "validatingwebhookconfigurations"), ("get",), (RELEASE,)),
        (("admissionregistration.k8s.io",), ("validatingadmissionpolicies",), ("get",),
         ("sidecar-injector-backstop",)),
        # Its binding, and the binding of required namespaces.
        (("admissionregistration.k8s.io",), ("validatingadmissionpolicybindings",), ("get",),
         ("sidecar-injector-backstop", "sidecar-injector-backstop-required")),
    ]
    role = r.one("Role", NAME)
    assert rules(role) == [
        (("",), ("configmaps",), ("get",), (RELEASE,)),
        (("",), ("secrets",), ("get",), (f"{RELEASE}-certificates",)),
        (("apps",), ("deployments",), ("get",), (RELEASE,)),
        (("discovery.k8s.io",), ("endpointslices",), ("list",), ()),
    ]
    for read_only in (cluster, role):
        for rule in read_only["rules"]:
            assert not WRITE_VERBS & set(rule["verbs"])
    dry_run = r.one("Role", f"{NAME}-dry-run")
    assert dry_run["metadata"]["namespace"] == "apps"
    assert rules(dry_run) == [(("",), ("pods",), ("create",), ())]
    for binding in (r.one("ClusterRoleBinding", NAME), r.one("RoleBinding", NAME),
                    r.one("RoleBinding", f"{NAME}-dry-run")):
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": NAME,
                                        "namespace": NAMESPACE}]
    assert r.one("Pod", NAME)["spec"]["containers"][0]["args"][-1] == "--pod-namespace=apps"


def test_a_revision_checks_its_own_objects(helm):
    r = render("revision=canary", helm=helm, tests=True)
    (container,) = r.one("Pod", f"{RELEASE}-canary-test-check")["spec"]["containers"]
    assert f"--release={RELEASE}-canary" in container["args"]
    cluster = r.one("ClusterRole", f"{RELEASE}-canary-test-check")
    names = {n for rule in cluster["rules"] for n in rule.get("resourceNames", [])}
    assert names == {f"{RELEASE}-canary", "sidecar-injector-canary-backstop",
                     "sidecar-injector-canary-backstop-required"}


def test_url_mode_reads_no_secret(helm):
    r = render("webhook.url=https://127.0.0.1:9443", "deployment.enabled=false",
               "certificates.mode=existingSecret", "certificates.existingSecret.caBundle=cGVt",
               helm=helm, tests=True)
    role = r.one("Role", NAME)
    assert [rule["resources"] for rule in role["rules"]] == [["configmaps"], ["endpointslices"]]


def test_it_can_be_turned_off(helm):
    assert not hooks(render("tests.check.enabled=false", helm=helm, tests=True))


def test_policy_mode_checks_the_mutating_policy_and_its_keeper(helm):
    r = render("mode=policy", "revision=canary", helm=helm, tests=True)
    name = f"{RELEASE}-canary-test-check"
    (container,) = r.one("Pod", name)["spec"]["containers"]
    assert f"--release={RELEASE}-canary" in container["args"]
    assert rules(r.one("ClusterRole", name)) == [
        (("",), ("namespaces",), ("list",), ()),
        (("admissionregistration.k8s.io",), ("mutatingadmissionpolicies",), ("get",),
         ("sidecar-injector-canary",)),
        # Its binding, and the binding of required namespaces.
        (("admissionregistration.k8s.io",), ("mutatingadmissionpolicybindings",), ("get",),
         ("sidecar-injector-canary", "sidecar-injector-canary-required")),
        (("admissionregistration.k8s.io",), ("mutatingwebhookconfigurations",), ("list",), ()),
        (("admissionregistration.k8s.io",),
         ("mutatingwebhookconfigurations", "validatingwebhookconfigurations"), ("get",),
         (f"{RELEASE}-canary",)),
        (("admissionregistration.k8s.io",), ("validatingadmissionpolicies",), ("get",),
         ("sidecar-injector-canary-backstop",)),
        (("admissionregistration.k8s.io",), ("validatingadmissionpolicybindings",), ("get",),
         ("sidecar-injector-canary-backstop", "sidecar-injector-canary-backstop-required")),
    ]
    # The keeper's Deployment (whether it is ready); no Service, no certificate to read.
    assert rules(r.one("Role", name)) == [
        (("",), ("configmaps",), ("get",), (f"{RELEASE}-canary",)),
        (("apps",), ("deployments",), ("get",), (f"{RELEASE}-canary",)),
    ]


def test_policy_mode_from_a_manifest_has_no_keeper_to_read(helm):
    r = render("mode=policy", "deployment.enabled=false", helm=helm, tests=True,
               values={"policies": {"mutating": {"manifest": "apiVersion: v1\nkind: List\nitems: []\n"}}})
    assert [rule["resources"] for rule in r.one("Role", NAME)["rules"]] == [["configmaps"]]
