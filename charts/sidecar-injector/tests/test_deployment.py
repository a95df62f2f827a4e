"""The server's Deployment and the objects around it."""

import posixpath

from chart import contract, render


def test_pod_is_locked_down(helm):
    # No token where the server never calls the API (its default certificates do: see
    # test_certificates.py).
    r = render("certificates.mode=selfSigned", helm=helm)
    spec = r.pod_spec
    assert spec["automountServiceAccountToken"] is False
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] == 65532
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert not spec.get("hostNetwork") and not spec.get("hostPID") and not spec.get("hostIPC")
    sc = r.container["securityContext"]
    assert sc["runAsNonRoot"] is True
    assert sc["runAsUser"] == 65532
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert "add" not in sc["capabilities"]
    assert r.one("ServiceAccount")["automountServiceAccountToken"] is False


def test_no_api_access_objects():
    # The one grant by default is the self-managed certificates' (test_certificates.py).
    r = render()
    names = {d["metadata"]["name"] for d in r.docs
             if d["kind"] in {"Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"}}
    assert names == {"sidecar-injector-certificates"}
    kinds = render("certificates.mode=selfSigned").kinds()
    assert not {"Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"} & set(kinds)


def env(r):
    return {e["name"]: e for e in r.container["env"]}


def test_environment_matches_the_contract(helm):
    assert set(env(render(helm=helm))) <= contract()["env"]
    r = render("certificates.mode=selfSigned", helm=helm)
    e = env(r)
    assert e["SIDECAR_INJECTOR_NAMESPACE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert e["SIDECAR_INJECTOR_CONFIG"]["value"] == "/etc/sidecar-injector/config.yaml"
    assert e["SIDECAR_INJECTOR_TLS_CERT_FILE"]["value"] == "/etc/sidecar-injector/tls/tls.crt"
    assert e["SIDECAR_INJECTOR_TLS_KEY_FILE"]["value"] == "/etc/sidecar-injector/tls/tls.key"
    assert set(e) <= contract()["env"], set(e) - contract()["env"]


def test_command_line_matches_the_contract(helm):
    c = render(helm=helm).container
    assert c["command"] == ["/sidecar-injector"]
    assert c["args"] == ["serve", "--log-format", "json"]
    known = contract()
    assert "serve" in known["subcommands"]
    assert {a for a in c["args"] if a.startswith("--")} <= known["flags"]
    assert render("logFormat=text", helm=helm).container["args"][-1] == "text"


def test_listeners_and_probes(helm):
    r = render(helm=helm)
    c = r.container
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"https": 8443, "admin": 8080}
    assert env(r)["SIDECAR_INJECTOR_LISTEN"]["value"].endswith(":8443")
    assert env(r)["SIDECAR_INJECTOR_ADMIN_LISTEN"]["value"].endswith(":8080")
    assert c["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "admin"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "admin"}


def test_shutdown_answers_through_the_delay_within_the_grace_period(helm):
    r = render(helm=helm)
    e = env(r)
    assert e["SIDECAR_INJECTOR_SHUTDOWN_DELAY"]["value"] == "5s"
    assert e["SIDECAR_INJECTOR_SHUTDOWN_TIMEOUT"]["value"] == "20s"
    assert r.pod_spec["terminationGracePeriodSeconds"] == 30
    r = render("server.shutdownDelaySeconds=0", "server.shutdownTimeoutSeconds=40", helm=helm)
    assert env(r)["SIDECAR_INJECTOR_SHUTDOWN_DELAY"]["value"] == "0s"
    assert env(r)["SIDECAR_INJECTOR_SHUTDOWN_TIMEOUT"]["value"] == "40s"
    assert r.pod_spec["terminationGracePeriodSeconds"] == 45


def test_config_and_tls_are_whole_directory_mounts(helm):
    r = render("certificates.mode=selfSigned", helm=helm)
    mounts = {m["name"]: m for m in r.container["volumeMounts"]}
    assert all("subPath" not in m and "subPathExpr" not in m for m in mounts.values())
    assert all(m["readOnly"] for m in mounts.values())
    e = env(r)
    assert posixpath.dirname(e["SIDECAR_INJECTOR_CONFIG"]["value"]) == mounts["config"]["mountPath"]
    assert posixpath.dirname(e["SIDECAR_INJECTOR_TLS_CERT_FILE"]["value"]) == mounts["tls"]["mountPath"]
    volumes = {v["name"]: v for v in r.pod_spec["volumes"]}
    assert volumes["config"]["configMap"]["name"] == r.one("ConfigMap")["metadata"]["name"]
    assert "items" not in volumes["config"]["configMap"]
    assert volumes["tls"]["secret"]["secretName"] == r.one("Secret")["metadata"]["name"]


def test_availability(helm):
    r = render(helm=helm)
    d = r.one("Deployment")
    assert d["spec"]["replicas"] == 2
    assert d["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    assert r.one("PodDisruptionBudget")["spec"]["minAvailable"] == 1
    (spread,) = r.pod_spec["topologySpreadConstraints"]
    assert spread["topologyKey"] == "kubernetes.io/hostname"
    assert spread["labelSelector"]["matchLabels"] == d["spec"]["selector"]["matchLabels"]
    assert "priorityClassName" not in r.pod_spec
    assert set(r.container["resources"]) == {"requests", "limits"}
    assert set(r.container["resources"]["limits"]) == {"cpu", "memory"}


def test_no_pdb_with_one_replica():
    # minAvailable 1 of 1 would block every node drain.
    assert "PodDisruptionBudget" not in render("replicaCount=1").kinds()


def test_priority_class():
    r = render("priorityClassName=system-cluster-critical")
    assert r.pod_spec["priorityClassName"] == "system-cluster-critical"


def test_config_checksum_only_on_request():
    annotations = render().one("Deployment")["spec"]["template"]["metadata"].get("annotations", {})
    assert not any(k.startswith("checksum/") for k in annotations)
    r = render("restartOnConfigChange=true")
    assert "checksum/config" in r.one("Deployment")["spec"]["template"]["metadata"]["annotations"]
    # ... and it changes with the configuration.
    other = render("restartOnConfigChange=true", "config.validation.mode=warn")
    key = lambda x: x.one("Deployment")["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
    assert key(r) != key(other)


def test_image():
    assert render().container["image"] == "sidecar-injector:0.1.0"
    assert render("image.repository=r.example/si", "image.tag=v2").container["image"] == "r.example/si:v2"
    digest = "sha256:" + "a" * 64
    assert render(f"image.digest={digest}").container["image"] == f"sidecar-injector@{digest}"


def test_network_policy_admits_only_the_two_ports(helm):
    assert "NetworkPolicy" not in render(helm=helm).kinds()
    policy = render("networkPolicy.enabled=true", helm=helm).one("NetworkPolicy")
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    ports = [p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]]
    assert sorted(ports) == [8080, 8443]


def test_service_monitor(helm):
    assert "ServiceMonitor" not in render(helm=helm).kinds()
    r = render("serviceMonitor.enabled=true", helm=helm)
    monitor = r.one("ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == "admin" and endpoint["path"] == "/metrics"
    service_ports = {p["name"]: p for p in r.one("Service")["spec"]["ports"]}
    assert service_ports["admin"]["targetPort"] == "admin"
    labels = r.one("Service")["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
