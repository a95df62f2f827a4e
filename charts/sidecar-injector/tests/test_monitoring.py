"""What operators watch: the PrometheusRule, the Grafana dashboard, the HorizontalPodAutoscaler.

The rules themselves are tested by promtool (tests/alerts/, run by charts/test.sh); the node
suite checks every query here against a real Prometheus scraping the deployed injector.
"""

import json
import re

import pytest

from chart import CHART, NAMESPACE, RELEASE, ROOT, render, render_error

ALERTS = [
    "SidecarInjectorDown",
    "SidecarInjectorTargetDown",
    "SidecarInjectorReviewErrors",
    "SidecarInjectorDenials",
    "SidecarInjectorSlowReviews",
    "SidecarInjectorCertificateExpiring",
    "SidecarInjectorReloadFailing",
    "SidecarInjectorBackstopStale",
    "SidecarInjectorCertificateStepsFailing",
]
# Metrics the dashboard and the alerts may name that the injector does not export: Prometheus'
# own per-target series.
EXTERNAL = {"up"}


def exported_metrics():
    """Every series name the server exports, from the registrations in src/server/metrics.rs
    (the prefix, the name, and the suffixes of its type)."""
    source = (ROOT / "src" / "server" / "metrics.rs").read_text()
    names = set()
    for name in re.findall(r'register\(\s*"([a-z_]+)"', source):
        base = f"sidecar_injector_{name}"
        names |= {base, f"{base}_total", f"{base}_bucket", f"{base}_count", f"{base}_sum"}
    assert "sidecar_injector_reviews_total" in names, names
    return names


def metric_names(expr):
    """The metric names an expression selects: every name followed by a `{` selector (the
    dashboard and the rules write every selector with braces)."""
    return set(re.findall(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{", expr))


def rules(r):
    return [rule for g in r.one("PrometheusRule")["spec"]["groups"] for rule in g["rules"]]


def dashboard(r):
    cm = r.one("ConfigMap", f"{RELEASE}-dashboard")
    return json.loads(cm["data"]["sidecar-injector.json"])


def test_nothing_to_watch_by_default():
    r = render()
    assert not {"PrometheusRule", "HorizontalPodAutoscaler"} & set(r.kinds())
    assert [c["metadata"]["name"] for c in r.all("ConfigMap")] == [RELEASE]
    assert r.one("Deployment")["spec"]["replicas"] == 2


def test_every_alert_has_summary_description_and_runbook(helm):
    r = render("prometheusRule.enabled=true", helm=helm)
    got = rules(r)
    assert [rule["alert"] for rule in got] == ALERTS
    readme = (CHART / "README.md").read_text()
    for rule in got:
        a = rule["annotations"]
        assert a["summary"] and a["description"], rule
        assert a["runbook_url"] == f"README.md#{rule['alert'].lower()}", rule
        # The anchor is a heading of the chart README's "Operating it" section.
        assert re.search(rf"^#+ {rule['alert']}$", readme, re.M), f"no runbook heading for {rule['alert']}"
        assert rule["labels"]["severity"] in {"critical", "warning"}
        assert re.fullmatch(r"[0-9]+[smh]", rule["for"]), rule
        assert "__" not in rule["expr"], rule["expr"]
        assert metric_names(rule["expr"]) <= exported_metrics() | EXTERNAL, rule["expr"]
        # Every selector is the injector's own.
        for selector in re.findall(r"\{([^}]*)\}", rule["expr"]):
            assert f'job="{RELEASE}",namespace="{NAMESPACE}"' in selector, rule["expr"]


def test_latency_threshold_follows_the_webhook_timeout():
    r = render("prometheusRule.enabled=true", "webhook.timeoutSeconds=10",
               values={"prometheusRule": {"latencyTimeoutFraction": 0.8}})
    (slow,) = [x for x in rules(r) if x["alert"] == "SidecarInjectorSlowReviews"]
    assert slow["expr"].rstrip().endswith("> 8"), slow["expr"]
    assert r.one("ValidatingWebhookConfiguration")["webhooks"][0]["timeoutSeconds"] == 10


def test_rule_knobs():
    r = render("prometheusRule.enabled=true", "prometheusRule.selector=job=\"injector\"",
               "prometheusRule.alerts.SidecarInjectorDown.for=30s",
               "prometheusRule.alerts.SidecarInjectorDown.severity=page",
               "prometheusRule.alertLabels.team=platform",
               "prometheusRule.runbookBaseUrl=https://example.org/chart",
               "prometheusRule.certificateExpiryDays=2",
               "prometheusRule.labels.release=kube-prometheus-stack")
    assert r.one("PrometheusRule")["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    by_name = {x["alert"]: x for x in rules(r)}
    down = by_name["SidecarInjectorDown"]
    assert down["expr"] == 'absent(up{job="injector"} == 1)'
    assert down["for"] == "30s"
    assert down["labels"] == {"severity": "page", "team": "platform"}
    assert down["annotations"]["runbook_url"] == "https://example.org/chart#sidecarinjectordown"
    assert by_name["SidecarInjectorCertificateExpiring"]["expr"].endswith("< 172800")


def test_rules_and_dashboard_without_the_in_cluster_server():
    # A server outside the cluster is still watched, if it is scraped.
    r = render("prometheusRule.enabled=true", "dashboard.enabled=true", "replicaCount=0",
               "webhook.url=https://injector.example:8443")
    assert "Deployment" not in r.kinds()
    assert len(rules(r)) == len(ALERTS)
    dashboard(r)


def test_dashboard_is_json_with_the_sidecar_label(helm):
    r = render("dashboard.enabled=true", "webhook.timeoutSeconds=7", helm=helm)
    cm = r.one("ConfigMap", f"{RELEASE}-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    d = dashboard(r)
    assert d["uid"] == "sidecar-injector"
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["timeout"]["query"] == "7"
    assert set(variables) == {"datasource", "namespace", "job", "timeout"}
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))


def test_dashboard_label_is_configurable():
    r = render("dashboard.enabled=true", values={"dashboard": {"labels": {"my_dashboards": "yes"},
                                                               "annotations": {"grafana_folder": "Platform"}}})
    meta = r.one("ConfigMap", f"{RELEASE}-dashboard")["metadata"]
    assert meta["labels"]["my_dashboards"] == "yes"
    assert meta["annotations"] == {"grafana_folder": "Platform"}


def test_dashboard_panels_query_only_exported_metrics():
    d = json.loads((CHART / "files" / "dashboard.json").read_text())
    titles = set()
    wanted = {"reviews per second by outcome", "review latency against the webhook timeout",
              "injections by template hash", "answers from memory", "reloads",
              "certificate expires in", "replicas"}
    for panel in d["panels"]:
        titles.add(panel["title"].lower())
        assert panel["targets"], panel["title"]
        for t in panel["targets"]:
            names = metric_names(t["expr"])
            assert names <= exported_metrics() | EXTERNAL, (panel["title"], t["expr"])
            # Every selector names the dashboard's namespace and job.
            for selector in re.findall(r"\{([^}]*)\}", t["expr"]):
                assert selector == 'namespace="$namespace",job="$job"', (panel["title"], t["expr"])
    assert wanted <= titles, wanted - titles


def test_autoscaling_leaves_the_replicas_to_the_hpa(helm):
    r = render("autoscaling.enabled=true", "autoscaling.maxReplicas=5", helm=helm)
    hpa = r.one("HorizontalPodAutoscaler")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                             "name": RELEASE}
    assert hpa["spec"]["minReplicas"] == 2 and hpa["spec"]["maxReplicas"] == 5
    (metric,) = hpa["spec"]["metrics"]
    assert metric["resource"] == {"name": "cpu", "target": {"type": "Utilization",
                                                            "averageUtilization": 70}}
    assert "replicas" not in r.one("Deployment")["spec"]
    # The PDB and the spread stay: at least 2 servers, one may be evicted at a time.
    assert r.one("PodDisruptionBudget")["spec"]["minAvailable"] == 1
    assert r.pod_spec["topologySpreadConstraints"][0]["maxSkew"] == 1
    # replicaCount no longer decides whether the PDB is rendered.
    assert "PodDisruptionBudget" in render("autoscaling.enabled=true", "replicaCount=1").kinds()


@pytest.mark.parametrize("sets, message", [
    (["autoscaling.minReplicas=1"], "minReplicas"),
    (["autoscaling.minReplicas=4", "autoscaling.maxReplicas=3"], "below autoscaling.minReplicas"),
    (["autoscaling.minReplicas=2", "podDisruptionBudget.minAvailable=2"], "must be below autoscaling.minReplicas"),
])
def test_autoscaling_refuses_inconsistent_values(sets, message):
    assert message in render_error("autoscaling.enabled=true", *sets)
