#!/usr/bin/env bash
# End-to-end run against a real kube-apiserver and etcd on 127.0.0.1 (`make test-e2e`).
#
#  1. builds the injector (debug profile, shared with `cargo test`) and the scenario suite,
#     and the control plane (e2e/control-plane/build.sh; cached after the first build),
#  2. starts etcd + kube-apiserver + kube-controller-manager in a temp WORKDIR (up.sh),
#  3. starts `sidecar-injector serve` on 127.0.0.1 with a certificate signed by WORKDIR's CA,
#  4. registers the webhooks by installing the Helm chart in url mode
#     (clientConfig.url https://127.0.0.1:PORT/mutate and /validate, caBundle = WORKDIR's CA),
#  5. waits until a server-side dry-run create comes back injected,
#  6. runs the scenarios (e2e/tests/scenarios.rs, one at a time),
#  7. stops everything (exit trap, also on failure or Ctrl-C) and checks nothing is left.
#
# Prints "kube-apiserver vX.Y.Z" and ends with "N passed, M failed"; exits non-zero on any
# failure. WORKDIR (logs, audit log) is removed after a pass and kept after a failure.
#   env KEEP_WORKDIR=1     keep WORKDIR after a pass too
#   env E2E_TEST_FILTER    run only scenarios whose name contains this
#   env CARGO              cargo to use (default cargo)
set -euo pipefail

HERE=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd -- "$HERE/.." && pwd)
# shellcheck source=lib.sh source-path=SCRIPTDIR
. "$HERE/lib.sh"
CARGO=${CARGO:-cargo}
RELEASE=sidecar-injector
RELEASE_NAMESPACE=sidecar-injector
START=$SECONDS

log() { e2e_log "$@"; }
die() { log "ERROR: $*"; exit 1; }

cd "$REPO"
WORKDIR=""
TOTAL=0
PASSED=0
FAILED=0

cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  e2e_stop_scenarios
  if [[ -n "$WORKDIR" ]]; then
    E2E_WORKDIR="$WORKDIR" "$HERE/injector.sh" stop || rc=1
    "$HERE/control-plane/down.sh" "$WORKDIR" >/dev/null || rc=1
    e2e_nothing_left_of "$WORKDIR" || rc=1
  fi
  if [[ -n "$WORKDIR" ]]; then e2e_remove_or_keep_workdir "$rc" "$WORKDIR"; fi
  log "took $((SECONDS - START))s"
  e2e_report "$rc"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

for tool in openssl curl ss setsid base64 pgrep; do
  command -v "$tool" >/dev/null || die "$tool is required"
done

# ---------------------------------------------------------------- build
log "tools (helm): tools/install.sh"
bash "$REPO/tools/install.sh"
# shellcheck source=../tools/env.sh source-path=SCRIPTDIR
. "$REPO/tools/env.sh"
command -v helm >/dev/null || die "helm is missing after tools/install.sh"

log "building the injector and the scenarios (debug profile)"
"$CARGO" build --bin sidecar-injector
TARGET_DIR=$(e2e_target_dir "$CARGO") || exit 1
INJECTOR_BIN="$TARGET_DIR/debug/sidecar-injector"
[[ -x "$INJECTOR_BIN" ]] || die "$INJECTOR_BIN was not built"
"$CARGO" test -p sidecar-injector-e2e --lib --quiet >/dev/null ||
  die "the suite's own unit tests failed: cargo test -p sidecar-injector-e2e --lib"
# Before 1.34 no MutatingAdmissionPolicy exists (beta from 1.34, GA from 1.36): on the floor
# (make test-e2e-floor) the two scenarios of policy mode (p01, p04) are left out, counted and named.
K8S_MINOR=$(sed -n 's/^v1\.\([0-9]*\)\..*/\1/p' <<<"${K8S_VERSION:-v1.35.8}")
E2E_TEST_SKIP=""
if [[ -n "$K8S_MINOR" ]] && ((K8S_MINOR < 34)); then E2E_TEST_SKIP="p01_policies_inject p04_policy_mode"; fi
export E2E_TEST_SKIP
TOTAL=$(e2e_count_scenarios "$CARGO") || die "cannot build the scenarios"
((TOTAL > 0)) || die "no scenario found"
if [[ -n "$E2E_TEST_SKIP" ]]; then
  log "Kubernetes ${K8S_VERSION}: p01 and p04 left out (policy mode needs a MutatingAdmissionPolicy, 1.34+)"
fi

log "control plane: e2e/control-plane/build.sh"
BIN_DIR=$("$HERE/control-plane/build.sh" | tail -n1)

# ---------------------------------------------------------------- control plane
WORKDIR=$(mktemp -d -t sidecar-injector-e2e.XXXXXX)
log "WORKDIR $WORKDIR"
CONTROL_PLANE_BIN_DIR="$BIN_DIR" "$HERE/control-plane/up.sh" "$WORKDIR" >/dev/null
# shellcheck source=/dev/null
. "$WORKDIR/env"
# shellcheck disable=SC2153 # ADMIN_CERT comes from WORKDIR/env
ADMIN_CURL=(curl --silent --show-error --fail --noproxy '*' --max-time 10
  --cacert "$CA_CERT" --cert "$ADMIN_CERT" --key "$ADMIN_KEY")
VERSION=$("${ADMIN_CURL[@]}" "$APISERVER_URL/version" |
  sed -n 's/.*"gitVersion": *"\([^"]*\)".*/\1/p')
[[ -n "$VERSION" ]] || die "cannot read the apiserver's /version"
echo "kube-apiserver $VERSION"

# ---------------------------------------------------------------- the server
PORT=$(cp_free_port) || die "no free loopback port"
ADMIN_PORT=$(cp_free_port "$PORT") || die "no free loopback port"

PKI="$WORKDIR/pki"
e2e_serving_cert "$CA_CERT" "$CA_KEY" "$PKI" injector "IP:127.0.0.1" "$WORKDIR/logs/openssl.log" ||
  die "cannot make the serving certificate (see $WORKDIR/logs/openssl.log)"

export E2E_WORKDIR="$WORKDIR"
export E2E_INJECTOR_BIN="$INJECTOR_BIN"
export E2E_INJECTOR_PORT="$PORT"
export E2E_INJECTOR_ADMIN_PORT="$ADMIN_PORT"
export E2E_INJECTOR_CERT="$PKI/injector.crt"
export E2E_INJECTOR_KEY="$PKI/injector.key"
export SIDECAR_INJECTOR_NAMESPACE="$RELEASE_NAMESPACE"
"$HERE/injector.sh" start

# ---------------------------------------------------------------- webhooks (the chart)
WEBHOOK_URL="https://127.0.0.1:$PORT"
log "helm install $RELEASE (url mode: $WEBHOOK_URL)"
helm install "$RELEASE" "$REPO/charts/sidecar-injector" \
  --kubeconfig "$KUBECONFIG" --namespace "$RELEASE_NAMESPACE" --create-namespace \
  --set webhook.url="$WEBHOOK_URL" \
  --set deployment.enabled=false \
  --set certificates.mode=existingSecret \
  --set-file certificates.existingSecret.caBundle="$CA_CERT" \
  --timeout 60s >"$WORKDIR/logs/helm-install.log" 2> >(grep -v 'symbolic link in path' >&2) ||
  die "helm install failed (see $WORKDIR/logs/helm-install.log)"

e2e_wait_for_injection 30 "${ADMIN_CURL[@]}" "$APISERVER_URL" || die "the webhooks do not inject (logs: $WORKDIR/logs)"

# ---------------------------------------------------------------- scenarios
export E2E_MODE=local
export E2E_INJECTOR_CTL="$HERE/injector.sh"
export E2E_WEBHOOK_URL="$WEBHOOK_URL"
export E2E_CHART="$REPO/charts/sidecar-injector"
export E2E_RELEASE_NAMESPACE="$RELEASE_NAMESPACE"
export E2E_WEBHOOK_CONFIG="$RELEASE"
export KUBECONFIG AUDIT_LOG CA_CERT
log "running $TOTAL scenarios"
e2e_run_scenarios_none_skipped "$CARGO" "$TOTAL" "$WORKDIR/logs/scenarios.log" || exit 1
