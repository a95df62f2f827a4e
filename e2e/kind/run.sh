#!/usr/bin/env bash
# The end-to-end scenarios against a kind cluster: the chart as a user installs it (in-cluster
# Deployment, Service, certificates the server makes itself), the image built from the
# top-level Dockerfile.
# Runs against the Docker engine DOCKER_HOST names (a user's own); `make test-e2e-kind`
# (e2e/kind/run-here.sh) runs it here, inside a private engine, with a locally made node image.
#
#  1. builds the scenario suite and the sidecar-injector binary (before any cluster exists),
#  2. creates a kind cluster (e2e/kind/cluster.yaml) with its own kubeconfig in a temp dir; the
#     apiserver writes its audit log into that directory (e2e/audit-policy.yaml),
#  3. `docker build`s the image (or `docker load`s E2E_IMAGE_ARCHIVE), makes the node scenarios'
#     stand-in images from local files (e2e/node/images.sh: busybox-static, no registry), and
#     `kind load`s them into the cluster,
#  4. `helm install`s the chart (service mode, its default certificates.mode=selfManaged),
#  5. waits for the rollout and until a server-side dry-run create comes back injected,
#  6. with E2E_KIND_HOST_WEBHOOKS=1: a second injector process on the kind network's gateway
#     address (which the apiserver reaches), with a certificate from a CA of the run, for the
#     url-mode chart scenarios, and the suite's own webhooks on that address; with the pod
#     route and PROMETHEUS_BIN: a Prometheus scraping the injector's pods,
#  7. runs the same scenarios as e2e/run.sh, and the node scenarios of e2e/node/run.sh
#     (tests/node.rs), with E2E_MODE=kind: the ones that need what this run lacks (pod
#     addresses, a webhook the apiserver can call, Prometheus, the serving certificate's CA
#     key) say "SKIPPED name: reason" and count as skipped; "stopping the server" scales the
#     Deployment to 0 (e2e/node/injector-ctl.sh),
#  8. deletes the cluster (exit trap, also on failure or Ctrl-C).
#
# Prints "kube-apiserver vX.Y.Z" and ends with "N passed, M failed, K skipped"; exits non-zero
# on any failure.
#   env KIND_CLUSTER_NAME  (default sidecar-injector-e2e; must not exist yet)
#   env KIND_NODE_IMAGE    node image (default: kind's own); with no registry,
#                          `eval "$(e2e/kind/node-image.sh)"` gives it (and KIND, KIND_NODE_TAR):
#                          import it with kind_node_image_load (e2e/kind/lib.sh) first
#   env KIND               the kind binary (default: kind on PATH)
#   env KIND_CONFIG        the cluster's kind configuration (default e2e/kind/cluster.yaml)
#   env E2E_IMAGE_ARCHIVE  the image as `docker save` wrote it (local/sidecar-injector:e2e),
#                          instead of a `docker build` here
#   env E2E_KIND_POD_ROUTE=1 route the pod network into this network namespace (only where
#                          the namespace is the run's own: e2e/kind/run-here.sh)
#   env E2E_KIND_HOST_WEBHOOKS=1 serve webhooks on the kind network's gateway address (where
#                          this machine owns the engine's bridge: Linux; run-here.sh sets it)
#   env PROMETHEUS_BIN     a directory with prometheus and promtool (tools/prometheus.sh):
#                          with the pod route, n07 runs against it
#   env KEEP_CLUSTER=1     leave the cluster running (delete it with kind delete cluster --name ...)
#   env E2E_TEST_FILTER    run only scenarios whose name contains one of these words
#   env CARGO              cargo to use (default cargo)
set -euo pipefail

HERE=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
E2E=$(cd -- "$HERE/.." && pwd)
REPO=$(cd -- "$E2E/.." && pwd)
# shellcheck source=../lib.sh source-path=SCRIPTDIR
. "$E2E/lib.sh"
# shellcheck source=lib.sh source-path=SCRIPTDIR
. "$HERE/lib.sh"
CARGO=${CARGO:-cargo}
KIND=${KIND:-kind}
CLUSTER=${KIND_CLUSTER_NAME:-sidecar-injector-e2e}
IMAGE_REPOSITORY=local/sidecar-injector
IMAGE_TAG=e2e
IMAGE="$IMAGE_REPOSITORY:$IMAGE_TAG"
RELEASE=sidecar-injector
RELEASE_NAMESPACE=sidecar-injector
START=$SECONDS

log() { e2e_log "kind: $*"; }
die() { log "ERROR: $*"; exit 1; }

cd "$REPO"
# Settings of the other runners from the caller's shell must not leak in: this script sets
# what the kind run has.
unset AUDIT_LOG E2E_WEBHOOK_URL CA_CERT E2E_CA_KEY E2E_SERVICE_DNS ADMISSION_PLUGINS \
  E2E_HOST_ADDRESS E2E_INJECTOR_CERT E2E_INJECTOR_KEY E2E_PROMETHEUS_URL E2E_PROMETHEUS_RULES \
  SIDECAR_INJECTOR_CONFIG E2E_WORKDIR E2E_POD_NETWORK
WORKDIR=""
HOST_SERVER=0
CREATED=0
TOTAL=0
PASSED=0
FAILED=0
SKIPPED=0

cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  e2e_stop_scenarios
  e2e_prometheus_stop
  if ((HOST_SERVER)); then E2E_WORKDIR="$WORKDIR" "$E2E/injector.sh" stop || rc=1; fi
  if ((CREATED)); then
    if ((rc != 0)); then
      log "server logs:"
      kubectl --kubeconfig "$KUBECONFIG" -n "$RELEASE_NAMESPACE" logs "deployment/$RELEASE" \
        --tail 40 >&2 2>/dev/null || true
    fi
    if [[ "${KEEP_CLUSTER:-0}" == 1 ]]; then
      log "KEEP_CLUSTER=1: cluster $CLUSTER left running (KUBECONFIG=$KUBECONFIG)"
    else
      "$KIND" delete cluster --name "$CLUSTER" || rc=1
    fi
  fi
  if [[ -n "$WORKDIR" && "${KEEP_CLUSTER:-0}" != 1 ]]; then rm -rf "$WORKDIR"; fi
  if ((rc != 0 && FAILED == 0)); then
    FAILED=$((TOTAL > PASSED + SKIPPED ? TOTAL - PASSED - SKIPPED : 1))
  fi
  log "took $((SECONDS - START))s"
  echo "$PASSED passed, $FAILED failed, $SKIPPED skipped"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

for tool in docker "$KIND" curl python3 busybox; do
  command -v "$tool" >/dev/null || die "$tool is required (kind: https://kind.sigs.k8s.io)"
done
docker info >/dev/null 2>&1 || die "docker is installed but no Docker engine answers"

# ---------------------------------------------------------------- build
log "tools (helm, kubectl): tools/install.sh"
bash "$REPO/tools/install.sh"
# shellcheck source=../../tools/env.sh source-path=SCRIPTDIR
. "$REPO/tools/env.sh"
command -v helm >/dev/null || die "helm is missing after tools/install.sh"
command -v kubectl >/dev/null || die "kubectl is missing after tools/install.sh"
E2E_SUITE=(test -p sidecar-injector-e2e --test scenarios --test policy --test node)
TOTAL=$(e2e_count_scenarios "$CARGO") || die "cannot build the scenarios"
((TOTAL > 0)) || die "no scenario found"
# `sidecar-injector outdated` and `export` for the scenarios that run them, and the server
# outside the cluster (E2E_KIND_HOST_WEBHOOKS).
"$CARGO" build --quiet --bin sidecar-injector
E2E_INJECTOR_BIN="$(e2e_target_dir "$CARGO")/debug/sidecar-injector"
export E2E_INJECTOR_BIN

# ---------------------------------------------------------------- cluster
if "$KIND" get clusters 2>/dev/null | grep -qx -- "$CLUSTER"; then
  die "a kind cluster named $CLUSTER exists already: delete it or set KIND_CLUSTER_NAME"
fi
WORKDIR=$(mktemp -d -t sidecar-injector-kind.XXXXXX)
export KUBECONFIG="$WORKDIR/kubeconfig"
node_image=()
if [[ -n "${KIND_NODE_IMAGE:-}" ]]; then node_image=(--image "$KIND_NODE_IMAGE"); fi
# The configuration with its audit directory filled in (a KIND_CONFIG without @AUDIT_DIR@
# gives no audit log: s06 is then skipped).
KIND_CONFIG=${KIND_CONFIG:-$HERE/cluster.yaml}
kind_render_config "$KIND_CONFIG" "$WORKDIR/audit" >"$WORKDIR/cluster.yaml" ||
  die "cannot render $KIND_CONFIG"
CREATED=1 # from here on the trap deletes the cluster, also a half-created one
log "creating cluster $CLUSTER"
"$KIND" create cluster --name "$CLUSTER" --config "$WORKDIR/cluster.yaml" --kubeconfig "$KUBECONFIG" \
  --wait 180s "${node_image[@]}"
VERSION=$(kubectl get --raw /version | sed -n 's/.*"gitVersion": *"\([^"]*\)".*/\1/p')
[[ -n "$VERSION" ]] || die "cannot read the apiserver's /version"
echo "kube-apiserver $VERSION"
# E2E_KIND_POD_ROUTE=1 (e2e/kind/run-here.sh, whose network namespace this is): a route to the
# node's pod network through the node container, so the suite reaches pod addresses as on the
# local node (scenarios that need E2E_POD_NETWORK). Never on a user's own machine.
if [[ "${E2E_KIND_POD_ROUTE:-0}" == 1 ]]; then
  [[ "$(readlink /proc/self/ns/net)" != "$(readlink /proc/1/ns/net)" ]] ||
    die "E2E_KIND_POD_ROUTE=1 outside a network namespace of the run's own"
  node_ip=$(docker inspect -f '{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}' \
    "$CLUSTER-control-plane")
  pod_cidr=$(kubectl get nodes -o jsonpath='{.items[0].spec.podCIDR}')
  [[ -n "$node_ip" && -n "$pod_cidr" ]] || die "cannot read the node's address and pod CIDR"
  ip route add "$pod_cidr" via "$node_ip"
  log "pod network $pod_cidr routed through the node $node_ip"
  export E2E_POD_NETWORK=1
fi

if [[ -n "${E2E_IMAGE_ARCHIVE:-}" ]]; then
  log "docker load -i $E2E_IMAGE_ARCHIVE"
  docker load -q -i "$E2E_IMAGE_ARCHIVE" >/dev/null
  docker image inspect "$IMAGE" >/dev/null 2>&1 || die "$E2E_IMAGE_ARCHIVE does not hold $IMAGE"
else
  log "docker build -t $IMAGE ${DOCKER_BUILD_ARGS:-}"
  # DOCKER_BUILD_ARGS="--build-arg PGO=0": a plain release build instead of the image's
  # profile-guided one (the same code, built in half the time).
  # shellcheck disable=SC2086 # word-split on purpose: several arguments
  docker build ${DOCKER_BUILD_ARGS:-} -t "$IMAGE" "$REPO"
fi
"$KIND" load docker-image "$IMAGE" --name "$CLUSTER"
# The node scenarios' images, as on the local node (e2e/node/images.sh, from busybox-static).
log "stand-in images: local/busybox:1, local/pause:1, local/proxy:1, local/log-shipper:1"
bash "$E2E/node/images.sh" "$WORKDIR/images" >/dev/null
for tar in "$WORKDIR"/images/*.tar; do
  "$KIND" load image-archive "$tar" --name "$CLUSTER"
done

# ---------------------------------------------------------------- the chart (service mode)
log "helm install $RELEASE (service mode, the default selfManaged certificates)"
CHART_VALUES=(
  --set image.repository="docker.io/$IMAGE_REPOSITORY"
  --set image.tag="$IMAGE_TAG"
  --set image.pullPolicy=Never
  --set config.values.proxy.image=local/proxy:1
  --set config.values.logShipper.image=local/log-shipper:1
  --set policies.backstop.enabled=false
)
helm install "$RELEASE" "$REPO/charts/sidecar-injector" \
  --namespace "$RELEASE_NAMESPACE" --create-namespace "${CHART_VALUES[@]}" \
  --timeout 180s 2> >(grep -v 'symbolic link in path' >&2)
kubectl -n "$RELEASE_NAMESPACE" rollout status "deployment/$RELEASE" --timeout=180s

injected_on_dry_run() {
  local out
  out=$(kubectl -n default create --dry-run=server -o json -f - <<<"$E2E_PROBE_POD" 2>/dev/null) ||
    return 1
  [[ "$out" == *'sidecar-injector.io/status'* ]]
}
t0=$SECONDS
until injected_on_dry_run; do
  ((SECONDS - t0 < 60)) || die "no injection in a server-side dry-run after 60s"
  sleep 1
done
log "webhooks effective after ~$((SECONDS - t0))s"

# The chart's own test, as a user runs it (e2e_helm_test, e2e/lib.sh).
log "helm test $RELEASE (sidecar-injector check in a pod)"
mkdir -p "$WORKDIR/logs"
e2e_helm_test "$RELEASE" "$RELEASE_NAMESPACE" "$WORKDIR/logs/helm-test.log" ||
  die "helm test failed (see $WORKDIR/logs/helm-test.log)"

# ---------------------------------------------------------------- outside the cluster
mkdir -p "$WORKDIR/logs"
if [[ "${E2E_KIND_HOST_WEBHOOKS:-0}" == 1 ]]; then
  # The kind network's IPv4 gateway: this machine's address on the engine's bridge, which the
  # node containers (and so the apiserver) reach.
  HOST=$(docker network inspect kind -f '{{range .IPAM.Config}}{{println .Gateway}}{{end}}' |
    grep -m1 -E '^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+$') || die "the kind network has no IPv4 gateway"
  PKI="$WORKDIR/pki"
  e2e_ca "$PKI" "$WORKDIR/logs/openssl.log" || die "cannot make the run's CA (see $WORKDIR/logs/openssl.log)"
  e2e_serving_cert "$PKI/ca.crt" "$PKI/ca.key" "$PKI" injector "IP:$HOST" "$WORKDIR/logs/openssl.log" ||
    die "cannot make the serving certificate (see $WORKDIR/logs/openssl.log)"
  PORT=$(cp_free_port) || die "no free port"
  ADMIN_PORT=$(cp_free_port "$PORT") || die "no free port"
  e2e_standin_config "$WORKDIR/injector-config.yaml" || exit 1
  HOST_SERVER=1
  E2E_WORKDIR="$WORKDIR" E2E_INJECTOR_ADDRESS="$HOST" E2E_INJECTOR_PORT="$PORT" \
    E2E_INJECTOR_ADMIN_PORT="$ADMIN_PORT" E2E_INJECTOR_CERT="$PKI/injector.crt" \
    E2E_INJECTOR_KEY="$PKI/injector.key" SIDECAR_INJECTOR_NAMESPACE="$RELEASE_NAMESPACE" \
    SIDECAR_INJECTOR_CONFIG="$WORKDIR/injector-config.yaml" "$E2E/injector.sh" start ||
    die "the server on $HOST did not start (see $WORKDIR/logs/sidecar-injector.log)"
  export E2E_HOST_ADDRESS="$HOST" E2E_WEBHOOK_URL="https://$HOST:$PORT" CA_CERT="$PKI/ca.crt"
  export E2E_INJECTOR_CERT="$PKI/injector.crt" E2E_INJECTOR_KEY="$PKI/injector.key"
  export SIDECAR_INJECTOR_CONFIG="$WORKDIR/injector-config.yaml"
fi
if [[ "${E2E_POD_NETWORK:-0}" == 1 && -n "${PROMETHEUS_BIN:-}" ]]; then
  # Prometheus reads the pods from the apiserver as the kubeconfig's user.
  auth="$WORKDIR/prometheus-auth"
  mkdir -p "$auth"
  for field in clusters.0.cluster.certificate-authority-data:ca.crt \
    users.0.user.client-certificate-data:client.crt users.0.user.client-key-data:client.key; do
    path=${field%%:*}
    kubectl config view --raw -o "jsonpath={.${path//.0./[0].}}" | base64 -d >"$auth/${field##*:}" ||
      die "cannot read $path from the kubeconfig"
  done
  apiserver=$(kubectl config view --raw -o 'jsonpath={.clusters[0].cluster.server}')
  e2e_prometheus_start "$PROMETHEUS_BIN" "$WORKDIR/prometheus" "$WORKDIR/logs" "$apiserver" \
    "$auth/ca.crt" "$auth/client.crt" "$auth/client.key" "$RELEASE" "$RELEASE_NAMESPACE" \
    "${CHART_VALUES[@]}" || exit 1
fi

# ---------------------------------------------------------------- scenarios
export E2E_MODE=kind
export E2E_CHART="$REPO/charts/sidecar-injector"
export E2E_RELEASE_NAMESPACE="$RELEASE_NAMESPACE"
export E2E_WEBHOOK_CONFIG="$RELEASE"
export E2E_INJECTOR_CTL="$E2E/node/injector-ctl.sh"
export E2E_APP_IMAGE=local/pause:1
if grep -q '@AUDIT_DIR@' "$KIND_CONFIG"; then export AUDIT_LOG="$WORKDIR/audit/audit.log"; fi
log "running $TOTAL scenarios"
suite_rc=0
e2e_run_scenarios "$CARGO" "$TOTAL" "$WORKDIR/scenarios.log" || suite_rc=$?
PASSED=$E2E_PASSED
FAILED=$E2E_FAILED
SKIPPED=$E2E_SKIPPED
if ((suite_rc != 0 || FAILED != 0)); then
  exit 1
fi
