"""The chart against a real kube-apiserver on 127.0.0.1 (e2e/control-plane/up.sh).

Runs when the control-plane binaries are already built (e2e/control-plane/build.sh caches
them under $SIDECAR_INJECTOR_CACHE/control-plane/); skipped otherwise, so the chart checks
never build Kubernetes. Set CHART_TEST_APISERVER=0 to skip, =1 to fail when unavailable.

No server answers the webhooks here (they point at https://127.0.0.1:1), which is exactly the
outage the failure policies are for: these tests show which pods the apiserver still admits.
"""

import base64
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from chart import CHART, ROOT, render_text

CACHE = Path(os.environ.get("SIDECAR_INJECTOR_CACHE", Path.home() / ".cache" / "sidecar-injector"))
UP = ROOT / "e2e" / "control-plane" / "up.sh"
DOWN = ROOT / "e2e" / "control-plane" / "down.sh"
CRD_KINDS = {"Certificate", "Issuer", "ServiceMonitor", "PrometheusRule"}  # no cert-manager or Prometheus Operator here
UNREACHABLE = "https://127.0.0.1:1"
INJECT = {"sidecar-injector.io/inject": "true"}
NS = "sidecar-injector"


def control_plane_bin():
    for bindir in sorted(CACHE.glob("control-plane/*/bin"), reverse=True):
        if all((bindir / b).is_file() for b in ("etcd", "kube-apiserver", "kube-controller-manager")):
            return bindir
    return None


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    wanted = os.environ.get("CHART_TEST_APISERVER", "auto")
    bindir = control_plane_bin()
    if wanted == "0":
        pytest.skip("CHART_TEST_APISERVER=0")
    if not (bindir and UP.is_file() and shutil.which("kubectl")):
        if wanted == "1":
            pytest.fail("no control-plane binaries (run e2e/control-plane/build.sh) or kubectl")
        pytest.skip("control-plane binaries not built (e2e/control-plane/build.sh)")
    workdir = tmp_path_factory.mktemp("control-plane")
    env = {**os.environ, "CONTROL_PLANE_BIN_DIR": str(bindir)}
    up = subprocess.run(["bash", str(UP), str(workdir)], env=env, capture_output=True, text=True)
    try:
        if up.returncode != 0:
            pytest.fail("control plane did not start:\n" + up.stderr[-3000:])
        kube_env = {**os.environ, "KUBECONFIG": str(workdir / "kubeconfig")}
        yield Cluster(kube_env, workdir)
    finally:
        subprocess.run(["bash", str(DOWN), str(workdir)], capture_output=True)


class Cluster:
    def __init__(self, env, workdir):
        self.env, self.workdir = env, workdir
        self.ca = base64.b64encode((workdir / "pki" / "ca.crt").read_bytes()).decode()

    def run(self, *cmd, stdin=None, check=True):
        proc = subprocess.run(cmd, input=stdin, env=self.env, capture_output=True, text=True)
        if check and proc.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)}:\n{proc.stdout}{proc.stderr}")
        return proc

    def kubectl(self, *args, stdin=None, check=True):
        return self.run("kubectl", *args, stdin=stdin, check=check)

    def namespace(self, name, labels=None):
        if self.kubectl("get", "namespace", name, check=False).returncode != 0:
            self.kubectl("create", "namespace", name)
        for k, v in (labels or {}).items():
            self.kubectl("label", "--overwrite", "namespace", name, f"{k}={v}")

    def apply(self, manifest, *args):
        docs = [d for d in yaml.safe_load_all(manifest) if d and d["kind"] not in CRD_KINDS]
        return self.kubectl("apply", "-n", NS, *args, "-f", "-", stdin=yaml.safe_dump_all(docs))

    def create_pod(self, name, namespace="apps", labels=None, annotations=None, spec=None,
                   dry_run=False):
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "namespace": namespace, "labels": labels or {},
                            "annotations": annotations or {}},
               "spec": {"containers": [{"name": "app", "image": "app"}], **(spec or {})}}
        args = ["create", "-f", "-"] + (["--dry-run=server"] if dry_run else [])
        return self.kubectl(*args, stdin=json.dumps(pod), check=False)


def url_mode(cluster, *sets):
    return render_text("webhook.url=" + UNREACHABLE, "deployment.enabled=false",
                       "certificates.mode=existingSecret",
                       "certificates.existingSecret.caBundle=" + cluster.ca, *sets, namespace=NS)


@pytest.fixture(scope="module")
def outage(cluster):
    """The url-mode webhooks installed, pointing at a port where nothing answers."""
    cluster.namespace(NS)
    cluster.namespace("apps")
    cluster.namespace("opted-out", {"sidecar-injector.io/disabled": "true"})
    cluster.apply(url_mode(cluster))
    yield cluster
    cluster.kubectl("delete", "mutatingwebhookconfiguration,validatingwebhookconfiguration",
                    "sidecar-injector", check=False)


@pytest.mark.parametrize("case", sorted(p.stem for p in (CHART / "tests" / "cases").glob("*.yaml")))
def test_apiserver_accepts_every_object(cluster, case):
    cluster.namespace(NS)
    text = subprocess.run(
        ["helm", "template", "sidecar-injector", str(CHART), "--namespace", NS, "--skip-tests",
         "--values", str(CHART / "tests" / "cases" / f"{case}.yaml")],
        capture_output=True, text=True, check=True).stdout
    cluster.apply(text, "--dry-run=server")


ADMITTED = [
    ("not-opted-in", {}, {}, {}, "apps"),
    ("label-false", {"sidecar-injector.io/inject": "false"}, {}, {}, "apps"),
    ("host-network", INJECT, {}, {"hostNetwork": True}, "apps"),
    ("windows", INJECT, {}, {"nodeSelector": {"kubernetes.io/os": "windows"}}, "apps"),
    ("windows-os", INJECT, {}, {"os": {"name": "windows"}}, "apps"),
    ("opted-out-namespace", INJECT, {}, {}, "opted-out"),
    ("own-namespace", INJECT, {}, {}, NS),
    ("kube-system", INJECT, {}, {}, "kube-system"),
]


@pytest.mark.parametrize("name,labels,annotations,spec,namespace", ADMITTED, ids=[a[0] for a in ADMITTED])
def test_outage_admits_pods_the_injector_does_not_handle(outage, name, labels, annotations, spec, namespace):
    proc = outage.create_pod(name, namespace, labels, annotations, spec)
    assert proc.returncode == 0, proc.stderr


REFUSED = [
    ("opted-in", INJECT, {}, {}),
    ("windows-naming-templates", INJECT, {"sidecar-injector.io/templates": "proxy"},
     {"nodeSelector": {"kubernetes.io/os": "windows"}}),
]


@pytest.mark.parametrize("name,labels,annotations,spec", REFUSED, ids=[r[0] for r in REFUSED])
def test_outage_refuses_opted_in_pods(outage, name, labels, annotations, spec):
    proc = outage.create_pod(name, "apps", labels, annotations, spec)
    assert proc.returncode != 0
    # Refused by the validating webhook (Fail); the mutating one (Ignore) let it through.
    assert 'failed calling webhook "validate.sidecar-injector.io"' in proc.stderr, proc.stderr


def test_outage_dry_run_reaches_the_webhooks(outage):
    proc = outage.create_pod("dry", "apps", INJECT, dry_run=True)
    assert 'failed calling webhook "validate.sidecar-injector.io"' in proc.stderr, proc.stderr


def test_outage_with_validating_ignore_admits(outage):
    outage.apply(url_mode(outage, "webhook.validating.failurePolicy=Ignore"))
    try:
        proc = outage.create_pod("ignored", "apps", INJECT)
        assert proc.returncode == 0, proc.stderr
    finally:
        outage.apply(url_mode(outage))


def test_self_signed_ca_survives_upgrades(cluster, helm):
    release = f"ca-{helm}"
    ns = f"ca-{helm}"
    name = f"{release}-sidecar-injector"
    base = [helm, "--namespace", ns]
    ca = lambda kind: cluster.kubectl("get", kind, name, "-o",
                                      "jsonpath={.webhooks[0].clientConfig.caBundle}").stdout
    try:
        cluster.run(*base, "install", release, str(CHART), "--create-namespace",
                    "--set", "webhook.url=" + UNREACHABLE, "--set", "certificates.mode=selfSigned")
        first = ca("mutatingwebhookconfiguration")
        secret = cluster.kubectl("-n", ns, "get", "secret", f"{name}-tls", "-o",
                                 "jsonpath={.data.ca\\.crt}").stdout
        assert first and first == secret
        cluster.run(*base, "upgrade", release, str(CHART), "--set", "webhook.url=" + UNREACHABLE,
                    "--set", "certificates.mode=selfSigned", "--set", "config.validation.mode=warn")
        assert ca("mutatingwebhookconfiguration") == first
        assert ca("validatingwebhookconfiguration") == first
    finally:
        cluster.run(*base, "uninstall", release, check=False)


def test_an_upgrade_keeps_the_ca_bundle_the_server_set(cluster, helm):
    """certificates.mode=selfManaged: the server owns caBundle (server-side apply under its own
    field manager, as src/server/certs.rs writes it); `helm upgrade` with the chart's
    rendering, which has none, leaves it, with Helm 3's three-way merge and Helm 4 alike."""
    release = f"sm-{helm}"
    ns = f"sm-{helm}"
    name = f"{release}-sidecar-injector"
    base = [helm, "--namespace", ns]
    bundle = cluster.ca  # base64 of the run's CA, as a caBundle holds it

    def bundles():
        out = {}
        for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
            got = json.loads(cluster.kubectl("get", kind, name, "-o", "json").stdout)
            out[kind] = [w["clientConfig"].get("caBundle") for w in got["webhooks"]]
        return out

    try:
        cluster.run(*base, "install", release, str(CHART), "--create-namespace",
                    "--set", "webhook.url=" + UNREACHABLE)
        assert all(b == [None] * len(b) for b in bundles().values()), bundles()
        for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
            got = json.loads(cluster.kubectl("get", kind.lower(), name, "-o", "json").stdout)
            patch = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": kind,
                     "metadata": {"name": name},
                     "webhooks": [{"name": w["name"], "clientConfig": {"caBundle": bundle}}
                                  for w in got["webhooks"]]}
            cluster.kubectl("apply", "--server-side", "--force-conflicts",
                            "--field-manager", "sidecar-injector-certificates", "-f", "-",
                            stdin=json.dumps(patch))
        set_by_server = bundles()
        assert all(b and all(x == bundle for x in b) for b in set_by_server.values()), set_by_server
        cluster.run(*base, "upgrade", release, str(CHART), "--set", "webhook.url=" + UNREACHABLE,
                    "--set", "config.validation.mode=warn")
        assert bundles() == set_by_server
    finally:
        cluster.run(*base, "uninstall", release, check=False)


def kubeconfig_as(cluster, user, path):
    """The admin kubeconfig acting as `user` (impersonation; the admin may impersonate)."""
    config = yaml.safe_load((cluster.workdir / "kubeconfig").read_text())
    for entry in config["users"]:
        entry["user"]["as"] = user
    path.write_text(yaml.safe_dump(config))
    return path


def test_outdated_rbac_is_enough_for_the_report_and_the_restart(cluster, tmp_path):
    """`sidecar-injector outdated` as a user bound by the chart's optional RBAC: the report
    role reads everything the report needs and cannot restart; the restart role can."""
    from test_binary import binary

    exe = binary()
    if exe is None:
        pytest.skip("no sidecar-injector binary built (cargo build)")
    rbac_kinds = {"ClusterRole", "Role", "ClusterRoleBinding", "RoleBinding", "ConfigMap"}
    text = url_mode(cluster, "outdated.rbac.report=true", "outdated.rbac.restart=true",
                    "outdated.rbac.subjects[0].kind=User", "outdated.rbac.subjects[0].name=operator")
    docs = [d for d in yaml.safe_load_all(text) if d and d["kind"] in rbac_kinds]
    cluster.namespace(NS)
    cluster.namespace("stale")
    cluster.apply(yaml.safe_dump_all(docs))
    # The auditor gets the read-only roles only.
    cluster.kubectl("create", "clusterrolebinding", "auditor-outdated-report",
                    "--clusterrole=sidecar-injector-outdated-report", "--user=auditor")
    cluster.kubectl("-n", NS, "create", "rolebinding", "auditor-outdated-config",
                    "--role=sidecar-injector-outdated-config", "--user=auditor")
    # A Deployment whose pods carry an injection status but no longer opt in: outdated.
    status = json.dumps({"templates": ["proxy"], "hash": "0000000000000000"})
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "stale"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web"},
                                           "annotations": {"sidecar-injector.io/status": status}},
                              "spec": {"containers": [{"name": "app", "image": "app"}]}}}}
    try:
        cluster.kubectl("apply", "-f", "-", stdin=json.dumps(deployment))
        for _ in range(100):
            if cluster.kubectl("-n", "stale", "get", "pods", "-o", "name").stdout.strip():
                break
            time.sleep(0.3)
        else:
            raise AssertionError("the Deployment's pod was not created")

        def outdated(user, *args):
            config = kubeconfig_as(cluster, user, tmp_path / f"{user}.kubeconfig")
            env = {**cluster.env, "KUBECONFIG": str(config)}
            env.pop("SIDECAR_INJECTOR_CONFIG", None)
            proc = subprocess.run(
                [str(exe), "outdated", "-n", "stale", "-o", "json",
                 "--from-configmap", f"{NS}/sidecar-injector", *args],
                env=env, capture_output=True, text=True, timeout=60)
            report = json.loads(proc.stdout) if proc.stdout.strip() else None
            return proc.returncode, report, proc.stderr

        code, _, err = outdated("nobody")
        assert code == 1 and "forbidden" in err.lower(), err

        code, report, err = outdated("auditor")
        assert code == 3, err
        assert [(w["kind"], w["name"], w["state"]) for w in report["workloads"]] == [
            ("Deployment", "web", "outdated")]
        code, report, err = outdated("auditor", "--restart", "--dry-run")
        assert code == 1, err
        (record,) = report["restarts"]
        assert record["action"] == "failed" and "forbidden" in record["detail"].lower(), record

        code, report, err = outdated("operator", "--restart", "--dry-run")
        assert code == 3, err
        assert [r["action"] for r in report["restarts"]] == ["wouldRestart"]
        code, report, err = outdated("operator", "--restart", "--no-wait")
        assert code == 0, err
        assert [r["action"] for r in report["restarts"]] == ["restarted"]
        annotations = json.loads(cluster.kubectl(
            "-n", "stale", "get", "deployment", "web", "-o", "json").stdout
        )["spec"]["template"]["metadata"]["annotations"]
        assert "kubectl.kubernetes.io/restartedAt" in annotations
    finally:
        cluster.kubectl("delete", "namespace", "stale", "--wait=false", check=False)
        cluster.kubectl("delete", "clusterrolebinding", "auditor-outdated-report",
                        "sidecar-injector-outdated-report", "sidecar-injector-outdated-restart",
                        check=False)
        cluster.kubectl("delete", "clusterrole", "sidecar-injector-outdated-report",
                        "sidecar-injector-outdated-restart", check=False)
