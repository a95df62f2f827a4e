"""The four ways to get a serving certificate."""

import base64
import shutil
import subprocess

import pytest

from chart import KUBE_VERSION, NAMESPACE, _render, render, render_error

SERVICE_DNS = f"sidecar-injector.{NAMESPACE}.svc"


def env(r):
    return {e["name"]: e.get("value") for e in r.container["env"]}


def test_self_managed_is_the_default_and_renders_no_key(helm):
    r = render(helm=helm)
    secret = r.one("Secret")
    # The chart makes the Secret empty; the server fills it.
    assert secret["metadata"]["name"] == "sidecar-injector-certificates"
    assert "data" not in secret and "stringData" not in secret
    for hook in (r.mutating, r.validating):
        assert "caBundle" not in hook["clientConfig"]
    e = env(r)
    assert e["SIDECAR_INJECTOR_CERTIFICATES_SECRET"] == "sidecar-injector-certificates"
    assert SERVICE_DNS in e["SIDECAR_INJECTOR_CERTIFICATE_NAMES"].split(",")
    assert e["SIDECAR_INJECTOR_CA_BUNDLE_OF"] == \
        "mutating/sidecar-injector,validating/sidecar-injector"
    assert (e["SIDECAR_INJECTOR_CA_LIFETIME"], e["SIDECAR_INJECTOR_SERVING_CERTIFICATE_LIFETIME"],
            e["SIDECAR_INJECTOR_CERTIFICATE_RELOAD_GRACE"]) == ("365d", "60d", "5m")
    assert "SIDECAR_INJECTOR_TLS_CERT_FILE" not in e
    # It calls the API server, with backstop or without (kind's run has none).
    for sets in ((), ("policies.backstop.enabled=false",)):
        assert render(*sets, helm=helm).pod_spec["automountServiceAccountToken"] is True
    assert "tls" not in {v["name"] for v in r.pod_spec["volumes"]}
    assert not {"Certificate", "Issuer"} & set(r.kinds())


def test_self_managed_renders_the_same_every_time(helm):
    # What a GitOps tool renders and commits: no generated key, certificate or random value.
    # _render keeps its outputs: each run here is a helm process of its own.
    first = _render.__wrapped__(helm, "{}", (), KUBE_VERSION, NAMESPACE)
    assert first == _render.__wrapped__(helm, "{}", (), KUBE_VERSION, NAMESPACE)
    assert "PRIVATE KEY" not in first and "tls.key" not in first and "BEGIN CERTIFICATE" not in first
    # The test can fail: the Helm-made mode renders both.
    selfsigned = _render.__wrapped__(helm, "{}", ("certificates.mode=selfSigned",), KUBE_VERSION,
                                     NAMESPACE)
    assert "PRIVATE KEY" in selfsigned or "tls.key" in selfsigned
    assert selfsigned != _render.__wrapped__(helm, "{}", ("certificates.mode=selfSigned",),
                                             KUBE_VERSION, NAMESPACE)


def test_self_managed_rights_name_only_its_own_objects():
    r = render()
    role = r.one("Role", "sidecar-injector-certificates")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["secrets"],
                              "resourceNames": ["sidecar-injector-certificates"], "verbs": ["get", "update"]}]
    cluster = r.one("ClusterRole", "sidecar-injector-certificates")
    assert cluster["rules"] == [{
        "apiGroups": ["admissionregistration.k8s.io"],
        "resources": ["mutatingwebhookconfigurations", "validatingwebhookconfigurations"],
        "resourceNames": ["sidecar-injector"], "verbs": ["get", "patch"]}]
    for kind in ("RoleBinding", "ClusterRoleBinding"):
        binding = r.one(kind, "sidecar-injector-certificates")
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "sidecar-injector",
                                        "namespace": NAMESPACE}]
    # Other modes have none of it; out of the cluster (url mode) the server brings its own.
    for sets in (["certificates.mode=selfSigned"],
                 ["webhook.url=https://127.0.0.1:9443", "deployment.enabled=false"]):
        other = render(*sets)
        assert not [d for d in other.docs if d["metadata"]["name"].endswith("-certificates")]


def test_self_managed_lifetimes_are_checked():
    assert "caLifetime" in render_error("certificates.selfManaged.caLifetime=a year")


def test_recheck_interval_reaches_the_server(helm):
    # How soon a reset caBundle is mended, a Secret's new certificate served: every mode.
    assert env(render(helm=helm))["SIDECAR_INJECTOR_RELOAD_INTERVAL"] == "30s"
    for sets in (("server.recheckInterval=2s",),
                 ("server.recheckInterval=2s", "certificates.mode=selfSigned")):
        assert env(render(*sets, helm=helm))["SIDECAR_INJECTOR_RELOAD_INTERVAL"] == "2s"
    assert "recheckInterval" in render_error("server.recheckInterval=2 days")


def test_self_signed(helm):
    r = render("certificates.mode=selfSigned", helm=helm)
    secret = r.one("Secret")
    assert secret["type"] == "kubernetes.io/tls"
    assert set(secret["data"]) == {"ca.crt", "tls.crt", "tls.key"}
    # One CA for the Secret and both webhooks, made once per render.
    assert r.mutating["clientConfig"]["caBundle"] == secret["data"]["ca.crt"]
    assert r.validating["clientConfig"]["caBundle"] == secret["data"]["ca.crt"]
    assert not {"Certificate", "Issuer"} & set(r.kinds())


def openssl(*args, stdin=None):
    return subprocess.run(["openssl", *args], input=stdin, capture_output=True, text=True,
                          check=True).stdout


@pytest.mark.skipif(not shutil.which("openssl"), reason="no openssl")
def test_self_signed_certificate_is_valid_for_the_service(tmp_path):
    r = render("webhook.url=https://127.0.0.1:9443", "certificates.mode=selfSigned")
    data = {k: base64.b64decode(v).decode() for k, v in r.one("Secret")["data"].items()}
    (tmp_path / "ca.crt").write_text(data["ca.crt"])
    (tmp_path / "tls.crt").write_text(data["tls.crt"])
    assert ": OK" in openssl("verify", "-CAfile", str(tmp_path / "ca.crt"), str(tmp_path / "tls.crt"))
    sans = openssl("x509", "-noout", "-ext", "subjectAltName", "-in", str(tmp_path / "tls.crt"))
    assert f"DNS:{SERVICE_DNS}" in sans
    assert "IP Address:127.0.0.1" in sans  # the webhook.url host
    # The key belongs to the certificate.
    key_pub = openssl("pkey", "-pubout", stdin=data["tls.key"])
    cert_pub = openssl("x509", "-noout", "-pubkey", "-in", str(tmp_path / "tls.crt"))
    assert key_pub == cert_pub


def test_cert_manager(helm):
    r = render("certificates.mode=certManager", helm=helm)
    assert "Secret" not in r.kinds()
    issuers = {i["metadata"]["name"]: i["spec"] for i in r.all("Issuer")}
    assert issuers["sidecar-injector-selfsigned"] == {"selfSigned": {}}
    assert issuers["sidecar-injector-ca"] == {"ca": {"secretName": "sidecar-injector-ca"}}
    ca = r.one("Certificate", "sidecar-injector-ca")["spec"]
    assert ca["isCA"] is True and ca["issuerRef"]["name"] == "sidecar-injector-selfsigned"
    serving = r.one("Certificate", "sidecar-injector-serving")["spec"]
    assert serving["issuerRef"]["name"] == "sidecar-injector-ca"
    assert SERVICE_DNS in serving["dnsNames"]
    volumes = {v["name"]: v for v in r.pod_spec["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == serving["secretName"]


def test_cert_manager_with_own_issuer():
    r = render(values={"certificates": {"mode": "certManager", "certManager": {
        "issuerRef": {"name": "corp-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}}}})
    assert "Issuer" not in r.kinds()
    (certificate,) = r.all("Certificate")
    assert certificate["spec"]["issuerRef"] == {"name": "corp-ca", "kind": "ClusterIssuer",
                                                "group": "cert-manager.io"}


PEM = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


def test_existing_secret(helm):
    r = render(values={"certificates": {"mode": "existingSecret",
                                        "existingSecret": {"name": "mine", "caBundle": PEM}}}, helm=helm)
    assert not {"Secret", "Certificate", "Issuer"} & set(r.kinds())
    volumes = {v["name"]: v for v in r.pod_spec["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == "mine"
    # PEM is accepted and encoded; base64 is passed through.
    assert base64.b64decode(r.mutating["clientConfig"]["caBundle"]).decode() == PEM
    encoded = base64.b64encode(PEM.encode()).decode()
    r = render(values={"certificates": {"mode": "existingSecret",
                                        "existingSecret": {"name": "mine", "caBundle": encoded}}}, helm=helm)
    assert r.validating["clientConfig"]["caBundle"] == encoded


def test_existing_secret_needs_name_and_ca(helm):
    assert "existingSecret.name" in render_error(
        "certificates.mode=existingSecret", "certificates.existingSecret.caBundle=eA==", helm=helm)
    assert "existingSecret.caBundle" in render_error(
        "certificates.mode=existingSecret", "certificates.existingSecret.name=x", helm=helm)


def test_url_with_a_public_certificate_needs_no_ca_bundle():
    r = render("certificates.mode=existingSecret", "webhook.url=https://injector.example.com",
               "deployment.enabled=false")
    assert r.mutating["clientConfig"] == {"url": "https://injector.example.com/mutate"}


@pytest.mark.skipif(not shutil.which("openssl"), reason="no openssl")
@pytest.mark.parametrize("url,san", [("https://[::1]:9443", "IP Address:0:0:0:0:0:0:0:1"),
                                     ("https://injector.example.com", "DNS:injector.example.com")])
def test_self_signed_certificate_covers_the_url_host(url, san):
    pem = base64.b64decode(render(f"webhook.url={url}", "certificates.mode=selfSigned")
                           .one("Secret")["data"]["tls.crt"]).decode()
    assert san in openssl("x509", "-noout", "-ext", "subjectAltName", stdin=pem)
