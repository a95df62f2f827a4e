#!/usr/bin/env bash
# Pods admitted a second through a real API server, four roads in one run: no mutation, the
# MutatingAdmissionPolicy `sidecar-injector export mutating` writes, the webhook serving the
# same configuration (e2e/policy/config.yaml: the log shipper and a native sidecar), and the
# webhook with the backstop (`export backstop`) checking every pod it admits.
# Everything on 127.0.0.1: a local control plane (e2e/control-plane/up.sh), the release server
# with its development certificate, the e2e crate's admission_rate example as the client.
#   bench/admission.sh            (K8S_VERSION, default v1.37.2; ROUNDS 3; PODS 1000; CONCURRENCY 8)
# Prints one line per road and round, then the median of each road; bounded by ROUNDS x PODS.
set -euo pipefail
HERE=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd -- "$HERE/.." && pwd)
export K8S_VERSION="${K8S_VERSION:-v1.37.2}"
ROUNDS="${ROUNDS:-3}" PODS="${PODS:-1000}" CONCURRENCY="${CONCURRENCY:-8}"
CARGO=${CARGO:-cargo}
cd "$REPO"
log() { printf '[admission %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }

BIN_DIR=$(e2e/control-plane/build.sh | tail -n1)
"$CARGO" build --quiet --release --bin sidecar-injector
"$CARGO" build --quiet --release -p sidecar-injector-e2e --example admission_rate
TARGET=$("$CARGO" metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
BIN="$TARGET/release/sidecar-injector" RATE="$TARGET/release/examples/admission_rate"

WORKDIR=$(mktemp -d -t sidecar-injector-admission.XXXXXX)
SERVER_PID=""
cleanup() {
  [[ -n "$SERVER_PID" ]] && kill "$SERVER_PID" 2>/dev/null || true
  e2e/control-plane/down.sh "$WORKDIR" >/dev/null 2>&1 || true
  rm -rf "$WORKDIR"
}
trap cleanup EXIT
CONTROL_PLANE_BIN_DIR="$BIN_DIR" CONTROL_PLANE_ADMISSION_PLUGINS= e2e/control-plane/up.sh "$WORKDIR" >/dev/null
# shellcheck source=/dev/null
. "$WORKDIR/env"
export KUBECONFIG
# shellcheck source=../tools/env.sh
. tools/env.sh
log "kube-apiserver $("$BIN_DIR/kube-apiserver" --version)"

# shellcheck source=../e2e/control-plane/lib.sh
. e2e/control-plane/lib.sh
PORT=$(cp_free_port)
ADMIN=$(cp_free_port "$PORT")
TMPDIR="$WORKDIR" SIDECAR_INJECTOR_NAMESPACE=sidecar-injector "$BIN" serve --config e2e/policy/config.yaml \
  --listen "127.0.0.1:$PORT" --admin-listen "127.0.0.1:$ADMIN" --log-format text >"$WORKDIR/server.log" 2>&1 &
SERVER_PID=$!
for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$ADMIN/readyz" >/dev/null && break; sleep 0.1; done
CA=$(base64 -w0 "$WORKDIR/sidecar-injector-dev-ca.pem")

# Narrows every binding of an exported policy (FILE) to the namespaces of one road.
road_only() { # file road
  python3 - "$1" "$2" <<'PY'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
for d in docs:
    if d["kind"].endswith("Binding"):
        d["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"].append(
            {"key": "road", "operator": "In", "values": [sys.argv[2]]})
yaml.safe_dump_all(docs, open(sys.argv[1], "w"))
PY
}

VERSION=v1beta1
if kubectl get --raw /apis/admissionregistration.k8s.io/v1 | grep -q '"mutatingadmissionpolicies"'; then VERSION=v1; fi
"$BIN" export mutating --config e2e/policy/config.yaml --api-version "$VERSION" >"$WORKDIR/policy.yaml"
road_only "$WORKDIR/policy.yaml" policy
kubectl apply -f "$WORKDIR/policy.yaml" >/dev/null
# The backstop of the same configuration (what `serve --backstop` applies), on the fourth road,
# whose pods the webhook injects too: the difference to the webhook road is what it costs.
"$BIN" export backstop --config e2e/policy/config.yaml >"$WORKDIR/backstop.yaml"
road_only "$WORKDIR/backstop.yaml" backstop
kubectl apply -f "$WORKDIR/backstop.yaml" >/dev/null
kubectl apply -f - >/dev/null <<YAML
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata: {name: admission-bench}
webhooks:
  - name: inject.admission-bench.sidecar-injector.io
    admissionReviewVersions: [v1]
    clientConfig: {url: "https://127.0.0.1:$PORT/mutate", caBundle: "$CA"}
    rules: [{apiGroups: [""], apiVersions: [v1], operations: [CREATE], resources: [pods]}]
    objectSelector: {matchLabels: {sidecar-injector.io/inject: "true"}}
    namespaceSelector: {matchExpressions: [{key: road, operator: In, values: [webhook, backstop]}]}
    sideEffects: None
    reinvocationPolicy: IfNeeded
    failurePolicy: Fail
    timeoutSeconds: 5
YAML
for road in none policy webhook backstop; do
  kubectl create namespace "bench-$road" >/dev/null
  kubectl label namespace "bench-$road" road="$road" >/dev/null
done
until kubectl get serviceaccount default -n bench-webhook >/dev/null 2>&1 &&
  kubectl create --dry-run=server -n bench-policy -f - -o jsonpath='{.metadata.annotations}' <<<'{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","labels":{"sidecar-injector.io/inject":"true"}},"spec":{"containers":[{"name":"a","image":"x"}]}}' 2>/dev/null | grep -q status &&
  kubectl create --dry-run=server -n bench-webhook -f - -o jsonpath='{.metadata.annotations}' <<<'{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","labels":{"sidecar-injector.io/inject":"true"}},"spec":{"containers":[{"name":"a","image":"x"}]}}' 2>/dev/null | grep -q status &&
  kubectl create --dry-run=server -n bench-backstop -f - -o jsonpath='{.metadata.annotations}' <<<'{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","labels":{"sidecar-injector.io/inject":"true"}},"spec":{"containers":[{"name":"a","image":"x"}]}}' 2>/dev/null | grep -q status; do
  sleep 0.5
done
# The backstop admits what the webhook injects, so no probe tells it loaded: the API server
# loads a new policy within a second or two.
sleep 3
declare -A RATES
for round in $(seq 1 "$ROUNDS"); do
  for road in none policy webhook backstop; do
    out=$("$RATE" "bench-$road" "$PODS" "$CONCURRENCY")
    echo "round $round $road $out"
    RATES[$road]+="$(sed -n 's/.*rate=\([0-9]*\).*/\1/p' <<<"$out") "
  done
done
for road in none policy webhook backstop; do
  echo "median $road $(tr ' ' '\n' <<<"${RATES[$road]}" | sed '/^$/d' | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}') pods/s"
done
