#!/usr/bin/env bash
# The e2e suite on a real node (`make test-e2e-node`): a whole cluster inside a network and
# mount namespace this script creates (unshare -n -m), so pod and node addresses exist only
# there and no packet leaves the machine.
#
# Outside the namespace:
#  1. e2e/node/install.sh (containerd, runc, CNI plugins, busybox-static from Debian),
#     tools/install.sh (helm, kubectl), e2e/control-plane/build.sh (now with kubelet and
#     kube-scheduler), the release binary, the debug binary and the suite;
#  2. images.sh: OCI image tars of busybox, pause, the proxy and log-shipper stand-ins; the
#     injector's image is the one `docker build` makes of the Dockerfile
#     (e2e/docker/build-image.sh, or E2E_IMAGE_ARCHIVE when the caller built it already).
# Inside (this script again, under unshare):
#  3. control plane (up.sh with CONTROL_PLANE_NODE_IP) + node (node.sh: containerd, kubelet,
#     scheduler), node Ready;
#  4. the injector installed by `helm install` of the chart in service mode: 2 replicas, PDB,
#     certificates.mode=existingSecret (a Secret made here, signed by the cluster's CA), the
#     templates' images pointed at the local stand-ins; rollout finished and a dry-run injected;
#     then `helm test` (the chart's test pod runs `sidecar-injector check`);
#  5. a second injector process on the namespace's 127.0.0.1 (for the url-mode chart scenario);
#     a Prometheus (tools/prometheus.sh) on the namespace's 127.0.0.1, discovering the injector's
#     pods through the apiserver and scraping their admin ports every second, with the chart's
#     alert rules (charts/prometheus-rules.py; SidecarInjectorDown's `for` shortened to 5s); it
#     talks to nothing but the apiserver and the pods;
#  6. the scenarios: every admission scenario (tests/scenarios.rs) against the in-cluster
#     deployment, then the node scenarios (tests/node.rs);
#  7. teardown (exit trap): node.sh down, control plane down; outside, a check that nothing of
#     the run is left.
# Ends with "N passed, M failed"; WORKDIR is kept after a failure.
#   env KEEP_WORKDIR=1  keep WORKDIR after a pass too
#   env E2E_TEST_FILTER run only scenarios whose name contains this
#   env E2E_NODES=2     (the default) a second node (node.sh up2: its own network namespace,
#                       containerd, kubelet and pod subnet) before the chart is installed, and
#                       the scenarios that need two (n09 drain, n10 node loss); 1 leaves them
#                       out (--skip, so the count says so)
#   env E2E_IMAGE_ARCHIVE the injector's image as `docker save` wrote it, tagged
#                       local/sidecar-injector:e2e (make test builds it once for every suite);
#                       default: built here by e2e/docker/build-image.sh
set -euo pipefail

HERE=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
E2E=$(cd -- "$HERE/.." && pwd)
REPO=$(cd -- "$E2E/.." && pwd)
# shellcheck source=../lib.sh source-path=SCRIPTDIR
. "$E2E/lib.sh"
CARGO=${CARGO:-cargo}
RELEASE=sidecar-injector
RELEASE_NAMESPACE=sidecar-injector
log() { e2e_log "node: $*"; }
E2E_NODES=${E2E_NODES:-2}
[[ "$E2E_NODES" == 1 || "$E2E_NODES" == 2 ]] || { e2e_log "node: ERROR: E2E_NODES must be 1 or 2"; exit 2; }
export E2E_NODES
# Left out (counted and run alike): s29, whose server of the suite's own with lifetimes of
# seconds is the local control plane's proof (e2e/run.sh; here the in-cluster server is what is
# proved), p04, whose policies are the API server's alone (n06 proves policy mode's keeper on the
# node), and in a one-node run the scenarios that need a second node.
e2e_node_count_skips() {
  E2E_TEST_SKIP="s29_self_managed_certificates p04_policy_mode"
  if [[ "$E2E_NODES" != 2 ]]; then E2E_TEST_SKIP+=" two_nodes"; fi
  export E2E_TEST_SKIP
}
die() { log "ERROR: $*"; exit 1; }
cd "$REPO"

# ======================================================================== outside
if [[ "${E2E_NODE_INSIDE:-0}" != 1 ]]; then
  START=$SECONDS
  ((EUID == 0)) || die "the node needs root (containerd, runc, network namespaces)"
  for tool in unshare openssl curl python3 setsid; do
    command -v "$tool" >/dev/null || die "$tool is required"
  done
  bash "$HERE/install.sh"
  bash "$REPO/tools/install.sh"
  log "prometheus and promtool: tools/prometheus.sh"
  PROMETHEUS_BIN=$(bash "$REPO/tools/prometheus.sh" | tail -n1)
  log "control plane and node binaries: e2e/control-plane/build.sh"
  BIN_DIR=$("$E2E/control-plane/build.sh" | tail -n1)
  log "building the debug binary and the suite"
  "$CARGO" build --bin sidecar-injector
  TARGET_DIR=$(e2e_target_dir "$CARGO") || exit 1
  E2E_SUITE=(test -p sidecar-injector-e2e --test scenarios --test policy --test node)
  e2e_node_count_skips
  TOTAL=$(e2e_count_scenarios "$CARGO") || die "cannot build the scenarios"
  if [[ -n "$E2E_TEST_SKIP" ]]; then
    # shellcheck disable=SC2086 # word-split on purpose: one filter per name
    left_out=$("$CARGO" "${E2E_SUITE[@]}" --quiet -- --list $E2E_TEST_SKIP 2>/dev/null |
      sed -n 's/: test$//p' | paste -sd ' ' -)
    log "E2E_NODES=$E2E_NODES: $(wc -w <<<"$left_out") scenarios left out (s29: the local control plane's; with one node, those that need two): $left_out"
  fi
  WORKDIR=$(mktemp -d -t sidecar-injector-node.XXXXXX)
  log "WORKDIR $WORKDIR"
  IMAGES="$WORKDIR/images"
  bash "$HERE/images.sh" "$IMAGES" >"$WORKDIR/images.txt"
  if [[ -n "${E2E_IMAGE_ARCHIVE:-}" ]]; then
    [[ -s "$E2E_IMAGE_ARCHIVE" ]] || die "E2E_IMAGE_ARCHIVE=$E2E_IMAGE_ARCHIVE is not an image archive"
    cp "$E2E_IMAGE_ARCHIVE" "$IMAGES/sidecar-injector.tar"
  else
    bash "$E2E/docker/build-image.sh" "$IMAGES/sidecar-injector.tar"
  fi
  rc=0
  E2E_NODE_INSIDE=1 WORKDIR="$WORKDIR" BIN_DIR="$BIN_DIR" TARGET_DIR="$TARGET_DIR" TOTAL="$TOTAL" \
    PROMETHEUS_BIN="$PROMETHEUS_BIN" \
    unshare --net --mount --propagation private -- bash "$HERE/run.sh" || rc=$?
  # The namespace is gone once its last process is; anything naming WORKDIR still alive is a leak.
  if ! e2e_nothing_left_of "$WORKDIR"; then
    pkill -KILL -f -- "$WORKDIR/" || true
    rc=1
  fi
  # The pods' cgroups live outside the namespaces: node.sh down removes them.
  for d in /sys/fs/cgroup/*/"sidecar-injector-e2e-$(basename "$WORKDIR")"{,-node2} \
    "/sys/fs/cgroup/sidecar-injector-e2e-$(basename "$WORKDIR")"{,-node2}; do
    if [[ -d "$d" ]]; then
      log "ERROR: cgroup left behind: $d"
      rc=1
    fi
  done
  e2e_remove_or_keep_workdir "$rc" "$WORKDIR"
  log "took $((SECONDS - START))s"
  exit "$rc"
fi

# ======================================================================== inside
: "${WORKDIR:?}" "${BIN_DIR:?}" "${TARGET_DIR:?}" "${TOTAL:?}" "${PROMETHEUS_BIN:?}"
E2E_SUITE=(test -p sidecar-injector-e2e --test scenarios --test policy --test node)
e2e_node_count_skips
PASSED=0
FAILED=0
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  e2e_stop_scenarios
  e2e_prometheus_stop
  E2E_WORKDIR="$WORKDIR" "$E2E/injector.sh" stop || rc=1
  bash "$HERE/node.sh" down "$WORKDIR" || rc=1
  "$E2E/control-plane/down.sh" "$WORKDIR" >/dev/null || rc=1
  e2e_report "$rc"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

bash "$HERE/node.sh" setup "$WORKDIR"
CONTROL_PLANE_NODE_IP=192.168.77.2 CONTROL_PLANE_BIN_DIR="$BIN_DIR" \
  "$E2E/control-plane/up.sh" "$WORKDIR" >/dev/null
# shellcheck source=/dev/null
. "$WORKDIR/env"
# shellcheck disable=SC2153 # ADMIN_CERT comes from WORKDIR/env
ADMIN_CURL=(curl --silent --show-error --fail --noproxy '*' --max-time 10
  --cacert "$CA_CERT" --cert "$ADMIN_CERT" --key "$ADMIN_KEY")
VERSION=$("${ADMIN_CURL[@]}" "$APISERVER_URL/version" |
  sed -n 's/.*"gitVersion": *"\([^"]*\)".*/\1/p')
echo "kube-apiserver $VERSION"
CONTROL_PLANE_BIN_DIR="$BIN_DIR" bash "$HERE/node.sh" up "$WORKDIR" "$WORKDIR/images"
if [[ "$E2E_NODES" == 2 ]]; then
  t0=$SECONDS
  CONTROL_PLANE_BIN_DIR="$BIN_DIR" bash "$HERE/node.sh" up2 "$WORKDIR" "$WORKDIR/images"
  log "second node Ready in $((SECONDS - t0))s"
fi
# shellcheck source=/dev/null
. "$WORKDIR/env"
# shellcheck source=../../tools/env.sh source-path=SCRIPTDIR
. "$REPO/tools/env.sh"
KUBECTL=(kubectl --kubeconfig "$KUBECONFIG")

# ---------------------------------------------------------------- the injector, by its chart
PKI="$WORKDIR/pki"
SERVICE_DNS="$RELEASE.$RELEASE_NAMESPACE.svc"
serving_cert() { # name SANs
  e2e_serving_cert "$CA_CERT" "$CA_KEY" "$PKI" "$1" "$2" "$WORKDIR/logs/openssl.log"
}
serving_cert in-cluster "DNS:$SERVICE_DNS,DNS:$RELEASE.$RELEASE_NAMESPACE.svc.cluster.local"
"${KUBECTL[@]}" create namespace "$RELEASE_NAMESPACE" >/dev/null
# The injector's own pods (the Deployment's, helm test's) comply with Pod Security's restricted
# profile: its namespace enforces it, so the install below fails if one does not.
"${KUBECTL[@]}" label namespace "$RELEASE_NAMESPACE" pod-security.kubernetes.io/enforce=restricted \
  pod-security.kubernetes.io/enforce-version=latest >/dev/null
"${KUBECTL[@]}" -n "$RELEASE_NAMESPACE" create secret tls "$RELEASE-tls" \
  --cert "$PKI/in-cluster.crt" --key "$PKI/in-cluster.key" >/dev/null
log "helm install $RELEASE (service mode, image docker.io/local/sidecar-injector:e2e)"
helm install "$RELEASE" "$REPO/charts/sidecar-injector" \
  --kubeconfig "$KUBECONFIG" --namespace "$RELEASE_NAMESPACE" \
  --values "$HERE/values.yaml" \
  --set certificates.existingSecret.name="$RELEASE-tls" \
  --set-file certificates.existingSecret.caBundle="$CA_CERT" \
  --wait --timeout 120s >"$WORKDIR/logs/helm-install.log" 2> >(grep -v 'symbolic link in path' >&2) ||
  die "helm install failed (see $WORKDIR/logs/helm-install.log)"
"${KUBECTL[@]}" -n "$RELEASE_NAMESPACE" rollout status "deployment/$RELEASE" --timeout=120s >&2
e2e_wait_for_injection 60 "${ADMIN_CURL[@]}" "$APISERVER_URL" || die "the webhooks do not inject"
log "helm test $RELEASE (sidecar-injector check in a pod)"
e2e_helm_test "$RELEASE" "$RELEASE_NAMESPACE" "$WORKDIR/logs/helm-test.log" "$KUBECONFIG" ||
  die "helm test failed (see $WORKDIR/logs/helm-test.log)"

# ---------------------------------------------------------------- a loopback injector (url mode)
PORT=$(cp_free_port) || die "no free loopback port"
ADMIN_PORT=$(cp_free_port "$PORT") || die "no free loopback port"
serving_cert injector "IP:127.0.0.1"
export E2E_WORKDIR="$WORKDIR"
export E2E_INJECTOR_BIN="$TARGET_DIR/debug/sidecar-injector"
export E2E_INJECTOR_PORT="$PORT"
export E2E_INJECTOR_ADMIN_PORT="$ADMIN_PORT"
export E2E_INJECTOR_CERT="$PKI/injector.crt"
export E2E_INJECTOR_KEY="$PKI/injector.key"
export SIDECAR_INJECTOR_NAMESPACE="$RELEASE_NAMESPACE"
# The embedded configuration with the stand-in images, as values.yaml gives the chart.
e2e_standin_config "$WORKDIR/injector-config.yaml" || exit 1
export SIDECAR_INJECTOR_CONFIG="$WORKDIR/injector-config.yaml"
"$E2E/injector.sh" start

# ---------------------------------------------------------------- Prometheus
e2e_prometheus_start "$PROMETHEUS_BIN" "$WORKDIR/prometheus" "$WORKDIR/logs" "$APISERVER_URL" \
  "$CA_CERT" "$ADMIN_CERT" "$ADMIN_KEY" "$RELEASE" "$RELEASE_NAMESPACE" \
  --values "$HERE/values.yaml" --set certificates.existingSecret.name="$RELEASE-tls" \
  --set-file certificates.existingSecret.caBundle="$CA_CERT" || exit 1

# ---------------------------------------------------------------- scenarios
export E2E_MODE=node
export E2E_INJECTOR_CTL="$HERE/injector-ctl.sh"
export E2E_WEBHOOK_URL="https://127.0.0.1:$PORT"
export E2E_CHART="$REPO/charts/sidecar-injector"
export E2E_RELEASE_NAMESPACE="$RELEASE_NAMESPACE"
export E2E_WEBHOOK_CONFIG="$RELEASE"
export E2E_NODE_NAME="$NODE_NAME"
# n10 fails and revives the second node through node.sh (fail2, revive2).
export E2E_NODE_CTL="$HERE/node.sh"
export CONTROL_PLANE_BIN_DIR="$BIN_DIR"
export E2E_CA_KEY="$CA_KEY"
export E2E_SERVICE_DNS="$SERVICE_DNS"
export E2E_APP_IMAGE=local/pause:1
export KUBECONFIG AUDIT_LOG CA_CERT ADMISSION_PLUGINS
log "running $TOTAL scenarios"
e2e_run_scenarios_none_skipped "$CARGO" "$TOTAL" "$WORKDIR/logs/scenarios.log" || exit 1
