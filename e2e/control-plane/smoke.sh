#!/usr/bin/env bash
# Smoke test of the local control plane: build (cached), up, then check that
#  - /version reports the pinned Kubernetes version,
#  - a Deployment gets a ReplicaSet and a Pod with generateName (controller-manager),
#  - server-side dry-run create works and the default admission chain plus
#    AlwaysPullImages run,
#  - a mutating webhook at https://127.0.0.1:PORT is called (stub in Python),
#    its patch shows up, the audit log has the mutation/patch annotations,
#  - /metrics has apiserver_admission_webhook_* metrics,
# then down, and that no process of WORKDIR is left.
#
# Usage: e2e/control-plane/smoke.sh [WORKDIR]
#   (default: a new temp dir, removed after a pass and kept after a failure)
#   env KUBECTL   kubectl to use (default: BIN_DIR/kubectl if built, else kubectl on PATH)
set -euo pipefail

HERE=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh source-path=SCRIPTDIR
. "$HERE/lib.sh"

TEMP_WORKDIR=0
if [[ $# -ge 1 ]]; then
  WORKDIR=$(cp_abspath "$1")
else
  WORKDIR=$(mktemp -d -t cp-smoke.XXXXXX)
  TEMP_WORKDIR=1
fi
mkdir -p "$WORKDIR"
log() { cp_log "smoke: $*"; }
fail() { log "FAIL: $*"; exit 1; }

BIN_DIR=$("$HERE/build.sh" | tail -n1)
K8S_VERSION=$(sed -n 's/^k8s=//p' "$BIN_DIR/.complete")

STUB_PID=""
cleanup() {
  local rc=$?
  if [[ -n "$STUB_PID" ]]; then
    kill "$STUB_PID" 2>/dev/null || true
    wait "$STUB_PID" 2>/dev/null || true
  fi
  "$HERE/down.sh" "$WORKDIR" || rc=1
  if pgrep -f -- "$WORKDIR/" >/dev/null; then
    log "FAIL: processes left behind:"; pgrep -af -- "$WORKDIR/" >&2 || true
    rc=1
  fi
  if ((rc == 0)); then
    log "PASS (no process of $WORKDIR left)"
    if ((TEMP_WORKDIR)); then rm -rf "$WORKDIR"; fi
  else
    log "FAILED (exit $rc); logs in $WORKDIR/logs"
  fi
  exit "$rc"
}
trap cleanup EXIT

CONTROL_PLANE_BIN_DIR="$BIN_DIR" "$HERE/up.sh" "$WORKDIR" >/dev/null
# shellcheck source=/dev/null
. "$WORKDIR/env"

if [[ -z "${KUBECTL:-}" ]]; then
  if [[ -x "$BIN_DIR/kubectl" ]]; then KUBECTL="$BIN_DIR/kubectl"; else KUBECTL=kubectl; fi
fi
k() { "$KUBECTL" --request-timeout=20s "$@"; }
CURL=(curl --silent --show-error --fail --noproxy '*' --max-time 10
  --cacert "$CA_CERT" --cert "$ADMIN_CERT" --key "$ADMIN_KEY")
poll() { # seconds description command...
  local secs=$1 what=$2; shift 2
  local end=$((SECONDS + secs))
  until "$@"; do
    ((SECONDS < end)) || fail "timed out after ${secs}s: $what"
    sleep 1
  done
}

# /version
version=$("${CURL[@]}" "$APISERVER_URL/version")
grep -q "\"gitVersion\": \"$K8S_VERSION\"" <<<"$version" || fail "/version: $version"
log "/version reports $K8S_VERSION"
kv=$("$KUBECTL" version --client 2>/dev/null || true)
log "kubectl: ${kv%%$'\n'*}"

# Deployment -> ReplicaSet -> Pod (generateName), stays Pending without kubelet
NS=smoke
k create namespace "$NS" >/dev/null
poll 60 "ServiceAccount $NS/default" k -n "$NS" get serviceaccount default -o name >/dev/null 2>&1
k -n "$NS" create deployment web --image=registry.invalid/pause:1 --replicas=1 >/dev/null
pod_with_generate_name() {
  local gn
  gn=$(k -n "$NS" get pods -l app=web -o jsonpath='{.items[0].metadata.generateName}' 2>/dev/null) || return 1
  [[ "$gn" == web-*- ]]
}
poll 90 "a Pod of Deployment web" pod_with_generate_name
pod=$(k -n "$NS" get pods -l app=web -o jsonpath='{.items[0].metadata.name} {.items[0].metadata.generateName} {.items[0].status.phase} {.items[0].spec.containers[0].imagePullPolicy}')
log "controller-manager created pod: $pod"
[[ "$pod" == *" Pending Always" ]] || fail "expected a Pending pod with imagePullPolicy Always (AlwaysPullImages), got: $pod"

# Server-side dry-run create
pod_manifest() { # name
  cat <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: $1
  namespace: $NS
spec:
  containers:
  - name: app
    image: registry.invalid/app:1
    imagePullPolicy: IfNotPresent
EOF
}
dry=$(pod_manifest dry | k create --dry-run=server -o json -f -)
grep -q '"imagePullPolicy": "Always"' <<<"$dry" || fail "dry-run: AlwaysPullImages did not run"
grep -q '"serviceAccountName": "default"' <<<"$dry" || fail "dry-run: ServiceAccount admission did not run"
if k -n "$NS" get pod dry >/dev/null 2>&1; then fail "dry-run pod was persisted"; fi
log "server-side dry-run create works (ServiceAccount + AlwaysPullImages admission ran, nothing stored)"

# A mutating webhook on 127.0.0.1
PKI="$WORKDIR/pki"
openssl req -new -newkey rsa:2048 -nodes -keyout "$PKI/stub.key" -out "$PKI/stub.csr" \
  -subj "/CN=webhook-stub" 2>/dev/null
printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n' >"$PKI/stub.ext"
openssl x509 -req -in "$PKI/stub.csr" -CA "$CA_CERT" -CAkey "$CA_KEY" -CAcreateserial -days 2 \
  -sha256 -extfile "$PKI/stub.ext" -out "$PKI/stub.crt" 2>/dev/null
STUB_PORT=$(cp_free_port) || fail "no free loopback port"
python3 "$HERE/webhook_stub.py" "$STUB_PORT" "$PKI/stub.crt" "$PKI/stub.key" \
  >>"$WORKDIR/logs/webhook-stub.log" 2>&1 </dev/null &
STUB_PID=$!
k apply -f - >/dev/null <<EOF
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata:
  name: smoke-stub
webhooks:
- name: stub.smoke.sidecar-injector.io
  admissionReviewVersions: ["v1"]
  sideEffects: None
  failurePolicy: Fail
  timeoutSeconds: 5
  namespaceSelector:
    matchLabels:
      kubernetes.io/metadata.name: $NS
  rules:
  - apiGroups: [""]
    apiVersions: ["v1"]
    operations: ["CREATE"]
    resources: ["pods"]
  clientConfig:
    url: https://127.0.0.1:$STUB_PORT/mutate
    caBundle: $(base64 -w0 <"$CA_CERT")
EOF
mutated_on_dry_run() {
  local out
  out=$(pod_manifest probe | k create --dry-run=server -o json -f - 2>/dev/null) || return 1
  grep -q '"smoke.sidecar-injector.io/mutated": "true"' <<<"$out"
}
t0=$SECONDS
poll 60 "webhook mutation visible in a server-side dry-run" mutated_on_dry_run
log "webhook configuration effective after ~$((SECONDS - t0))s"
pod_manifest mutated | k create -f - >/dev/null
[[ "$(k -n "$NS" get pod mutated -o jsonpath='{.metadata.labels.smoke\.sidecar-injector\.io/mutated}')" == true ]] \
  || fail "stored pod is not mutated"
# No `grep | grep -q`: with pipefail an early exit of grep -q can fail it (SIGPIPE).
audit_has() { grep '"name":"mutated"' "$AUDIT_LOG" | grep -c -- "$1" >/dev/null; }
poll 20 "audit mutation annotation" audit_has '"mutation.webhook.admission.k8s.io/round_0_index_0"'
audit_has '"patch.webhook.admission.k8s.io/round_0_index_0"' || fail "no patch annotation in $AUDIT_LOG"
log "audit log has mutation.webhook.admission.k8s.io/round_0_index_0 and patch annotations"

# /metrics
names=$("${CURL[@]}" "$APISERVER_URL/metrics" | sed -n 's/^\(apiserver_admission_webhook_[a-z_]*\).*/\1/p' | sort -u)
[[ -n "$names" ]] || fail "no apiserver_admission_webhook_* metric in /metrics"
log "webhook metrics: $(echo "$names" | tr '\n' ' ')"
