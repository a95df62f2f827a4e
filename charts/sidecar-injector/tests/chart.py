"""Renders the chart with helm and gives the objects back, for the tests in this folder."""

import functools
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "charts" / "sidecar-injector"
RELEASE = "sidecar-injector"
NAMESPACE = "team-injector"
KUBE_VERSION = "1.35.0"


def helm_binaries():
    """The helm binaries to render with: $HELM_BINARIES (from charts/test.sh), else those on PATH."""
    names = os.environ.get("HELM_BINARIES", "helm helm3").split()
    return [n for n in names if shutil.which(n)]


class RenderError(Exception):
    pass


class Rendered:
    def __init__(self, docs):
        self.docs = [d for d in docs if d]

    def all(self, kind):
        return [d for d in self.docs if d["kind"] == kind]

    def one(self, kind, name=None):
        found = [d for d in self.all(kind) if name is None or d["metadata"]["name"] == name]
        assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
        return found[0]

    def kinds(self):
        return sorted({d["kind"] for d in self.docs})

    def webhooks(self, kind):
        """Every entry of the configuration of this kind."""
        return self.one(kind)["webhooks"]

    def webhook(self, kind):
        """The pod-label entry (the first), the one every installation has."""
        return self.webhooks(kind)[0]

    @property
    def mutating(self):
        return self.webhook("MutatingWebhookConfiguration")

    @property
    def validating(self):
        return self.webhook("ValidatingWebhookConfiguration")

    def namespace_entry(self, kind):
        (entry,) = [w for w in self.webhooks(kind) if "namespace." in w["name"]]
        return entry

    @property
    def pod_spec(self):
        return self.one("Deployment")["spec"]["template"]["spec"]

    @property
    def container(self):
        (container,) = self.pod_spec["containers"]
        return container

    @property
    def config(self):
        return yaml.safe_load(self.one("ConfigMap")["data"]["config.yaml"])


# What a cluster with ValidatingAdmissionPolicy (1.30+) tells Helm it serves.
VAP = ("admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy",)


@functools.lru_cache(maxsize=None)
def _render(helm, values_json, sets, kube_version, namespace, api_versions=(), tests=False):
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as values:
        json.dump(json.loads(values_json), values)
        values.flush()
        cmd = [helm, "template", RELEASE, str(CHART), "--namespace", namespace,
               "--kube-version", kube_version, "--values", values.name]
        for s in sets:
            cmd += ["--set", s]
        for a in api_versions:
            cmd += ["--api-versions", a]
        if not tests:
            # What `helm install` creates; the `helm test` hooks are tested on their own.
            cmd.append("--skip-tests")
        proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RenderError(proc.stderr)
    return proc.stdout


def render(*sets, values=None, helm="helm", kube_version=KUBE_VERSION, namespace=NAMESPACE,
           api_versions=(), tests=False):
    """helm template with --set SETS and a values map; the objects, parsed. With `tests`, the
    `helm test` hooks too."""
    text = _render(helm, json.dumps(values or {}), tuple(sets), kube_version, namespace,
                   tuple(api_versions), tests)
    return Rendered(list(yaml.safe_load_all(text)))


def render_text(*sets, values=None, helm="helm", kube_version=KUBE_VERSION, namespace=NAMESPACE):
    return _render(helm, json.dumps(values or {}), tuple(sets), kube_version, namespace)


def render_error(*sets, values=None, helm="helm", kube_version=KUBE_VERSION, api_versions=()):
    """helm template that must fail; its error output."""
    try:
        _render(helm, json.dumps(values or {}), tuple(sets), kube_version, NAMESPACE,
                tuple(api_versions))
    except RenderError as e:
        return str(e)
    raise AssertionError(f"helm template {sets} {values} rendered, but should have failed")


def contract():
    """docs/CONTRACT.md: the configuration file example (parsed) and every env var it names."""
    text = (ROOT / "docs" / "CONTRACT.md").read_text()
    block = re.search(r"## Configuration file.*?```yaml\n(.*?)```", text, re.S)
    assert block, "docs/CONTRACT.md has no yaml block under '## Configuration file'"
    return {
        "config": yaml.safe_load(block.group(1)),
        "env": set(re.findall(r"`(SIDECAR_INJECTOR_[A-Z_]+)`", text)),
        "flags": set(re.findall(r"`(--[a-z-]+)", text)),
        "subcommands": set(re.findall(r"`(serve|inject|review|explain)\b", text)),
    }


def bundled_templates():
    """The repository's templates/NAME.yaml.j2, {file name: source}."""
    return {p.name: p.read_text() for p in sorted((ROOT / "templates").glob("*.yaml.j2"))}
