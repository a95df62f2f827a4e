#!/usr/bin/env bash
# Pods admitted a second through a real API server, four roads in one run: no mutation, the
# MutatingAdmissionPolicy `sidecar-injector export mutating` writes, the webhook serving the
# same configuration, and the webhook with the backstop (`export backstop`) checking every pod
# it admits. The configuration is the bundled default (no --config: the log shipper and the
# proxy); the pods (e2e/examples/admission_rate.rs) have two containers and five ports, three
# distinct TCP ones, so the proxy's loops over containers and ports do real work on each road.
# Everything on 127.0.0.1: a local control plane (e2e/control-plane/up.sh), the release server
# with its development certificate, the e2e crate's admission_rate example as the client.
#   bench/admission.sh            (K8S_VERSION, default v1.37.2; ROUNDS 3; PODS 1000; CONCURRENCY 8)
# Prints one line per road and round, then the median and range of each road and the ratios
# policy / webhook and backstop / webhook, then what one stored pod of each road holds;
# bounded by ROUNDS x PODS.
set -euo pipefail
HERE=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd -- "$HERE/.." && pwd)
export K8S_VERSION="${K8S_VERSION:-v1.37.2}"
ROUNDS="${ROUNDS:-3}" PODS="${PODS:-1000}" CONCURRENCY="${CONCURRENCY:-8}"
CARGO=${CARGO:-cargo}
cd "$REPO"
unset SIDECAR_INJECTOR_CONFIG # the embedded default configuration, on every road
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
TMPDIR="$WORKDIR" SIDECAR_INJECTOR_NAMESPACE=sidecar-injector "$BIN" serve \
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
"$BIN" export mutating --api-version "$VERSION" >"$WORKDIR/policy.yaml"
road_only "$WORKDIR/policy.yaml" policy
kubectl apply -f "$WORKDIR/policy.yaml" >/dev/null
# The backstop of the same configuration (what `serve --backstop` applies), on the fourth road,
# whose pods the webhook injects too: the difference to the webhook road is what it costs.
"$BIN" export backstop >"$WORKDIR/backstop.yaml"
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
    namespaceSelector: {matchExpressions: [{key: road, operator: In, values: [webhook, backstop]}, {key: bench-probe, operator: DoesNotExist}]}
    sideEffects: None
    reinvocationPolicy: IfNeeded
    failurePolicy: Fail
    timeoutSeconds: 5
YAML
for road in none policy webhook backstop; do
  kubectl create namespace "bench-$road" >/dev/null
  kubectl label namespace "bench-$road" road="$road" >/dev/null
done
# On the backstop's road but out of the webhook's reach: an opted-in pod there is refused once
# the backstop is loaded (the backstop admits what the webhook injects, so nothing else shows it).
kubectl create namespace bench-probe >/dev/null
kubectl label namespace bench-probe road=backstop bench-probe=true >/dev/null
tries=0
until kubectl get serviceaccount default -n bench-webhook >/dev/null 2>&1 &&
  kubectl create --dry-run=server -n bench-policy -f - -o jsonpath='{.metadata.annotations}' <<<'{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","labels":{"sidecar-injector.io/inject":"true"}},"spec":{"containers":[{"name":"a","image":"x"}]}}' 2>/dev/null | grep -q status &&
  kubectl create --dry-run=server -n bench-webhook -f - -o jsonpath='{.metadata.annotations}' <<<'{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","labels":{"sidecar-injector.io/inject":"true"}},"spec":{"containers":[{"name":"a","image":"x"}]}}' 2>/dev/null | grep -q status &&
  kubectl create --dry-run=server -n bench-backstop -f - -o jsonpath='{.metadata.annotations}' <<<'{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","labels":{"sidecar-injector.io/inject":"true"}},"spec":{"containers":[{"name":"a","image":"x"}]}}' 2>/dev/null | grep -q status &&
  [[ $(kubectl create --dry-run=server -n bench-probe -f - 2>&1 <<<'{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","labels":{"sidecar-injector.io/inject":"true"}},"spec":{"containers":[{"name":"a","image":"x"}]}}') == *"lacks its sidecar"* ]]; do
  ((++tries < 120)) || { log "the roads are not ready after 60 s"; exit 1; }
  sleep 0.5
done
declare -A RATES
for round in $(seq 1 "$ROUNDS"); do
  for road in none policy webhook backstop; do
    out=$("$RATE" "bench-$road" "$PODS" "$CONCURRENCY")
    echo "round $round $road $out"
    RATES[$road]+="$(sed -n 's/.*rate=\([0-9]*\).*/\1/p' <<<"$out") "
  done
done
declare -A MEDIAN
for road in none policy webhook backstop; do
  read -r lo med hi < <(tr ' ' '\n' <<<"${RATES[$road]}" | sed '/^$/d' | sort -n |
    awk '{a[NR]=$1} END {print a[1], a[int((NR+1)/2)], a[NR]}')
  MEDIAN[$road]=$med
  echo "median $road $med pods/s (range $lo-$hi)"
done
awk -v p="${MEDIAN[policy]}" -v w="${MEDIAN[webhook]}" -v b="${MEDIAN[backstop]}" \
  'BEGIN {printf "policy/webhook %.2f backstop/webhook %.2f\n", p / w, b / w}'
# How often the API server ran the mutating policy (its count for validating policies leaves out
# what they admit, so the backstop's stays empty).
kubectl get --raw /metrics | grep -E '^apiserver_mutating_admission_policy_check_total' |
  sed 's/^/metrics /' || echo "metrics: no mutating admission policy check counts"
# What the roads did to one stored pod each: the sidecars, and the proxy's listeners (one per
# distinct TCP port the pod declares).
for road in none policy webhook backstop; do
  kubectl get --raw "/api/v1/namespaces/bench-$road/pods?limit=1" | python3 -c '
import json, sys
pod = json.load(sys.stdin)["items"][0]
spec = pod["spec"]
proxy = [c for c in spec.get("initContainers", []) if c["name"] == "proxy"]
ports = [p["containerPort"] for p in proxy[0].get("ports", [])] if proxy else []
print(sys.argv[1], "init:", ",".join(c["name"] for c in spec.get("initContainers", [])),
      "containers:", ",".join(c["name"] for c in spec["containers"]), "proxy ports:", ports)
' "$road"
done
