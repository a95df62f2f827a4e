#!/usr/bin/env python3
"""The chart's alert rules as a Prometheus rule file, taken out of `helm template`.

files/alerts.yaml is the one source of the rules; the chart fills it in (thresholds, selector,
`for`, severity, runbook_url) and renders it as a PrometheusRule. This prints that
PrometheusRule's spec (`groups: ...`), the rule file promtool checks and tests
(charts/test.sh) and the node suite's Prometheus loads (e2e/node/run.sh), so all three use
exactly what the chart installs.

    python3 charts/prometheus-rules.py [HELM_ARGS...] > rules.yaml

HELM_ARGS go to `helm template` (e.g. `--namespace sidecar-injector --set ...`); the release
is named sidecar-injector. HELM (default `helm`) is the helm binary.
"""

import os
import subprocess
import sys
from pathlib import Path

import yaml

CHART = Path(__file__).resolve().parent / "sidecar-injector"


def rule_file(helm_args, helm=None):
    """The rule file (a dict with `groups`) of the chart rendered with HELM_ARGS."""
    helm = helm or os.environ.get("HELM", "helm")
    out = subprocess.run(
        [helm, "template", "sidecar-injector", str(CHART), "--set", "prometheusRule.enabled=true", *helm_args],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    rules = [d for d in yaml.safe_load_all(out) if d and d.get("kind") == "PrometheusRule"]
    if len(rules) != 1:
        raise SystemExit(f"expected one PrometheusRule in the rendering, found {len(rules)}")
    return rules[0]["spec"]


if __name__ == "__main__":
    yaml.safe_dump(rule_file(sys.argv[1:]), sys.stdout, sort_keys=False, width=1000)
