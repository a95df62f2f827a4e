#!/usr/bin/env bash
# Creates a real kind cluster on this machine, with no registry, checks it and deletes it:
#  1. e2e/kind/node-image.sh: the kind CLI, the Kubernetes binaries and the node image (cached);
#  2. e2e/docker/dockerd.sh: a private dockerd in a network + mount namespace made here;
#  3. inside: `docker import` of the node image, `kind create cluster` with e2e/kind/cluster.yaml,
#     then the node Ready and the kube-system pods (etcd, apiserver, controller-manager,
#     scheduler, kube-proxy, coredns, kindnet) Running, a pod's DNS lookup of the API service,
#     an image `docker import`ed here, `kind load`ed, run by a pod (what e2e/kind/run.sh does),
#     and a claim of kind's default StorageClass provisioned and written by a pod;
#  4. `kind delete cluster`, the engine stopped, and a check that nothing is left.
# Ends with "N passed, M failed" (one check per line above it).
#   env K8S_VERSION (default v1.35.8), KIND_CLUSTER_NAME (default kind-check),
#   env KEEP_WORKDIR=1 keep the run's directory (engine log, kind logs on failure)
set -euo pipefail

HERE=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd -- "$HERE/../.." && pwd)
CLUSTER=${KIND_CLUSTER_NAME:-kind-check}
log() { printf '[kind-check %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

if [[ "${KIND_CHECK_INSIDE:-0}" != 1 ]]; then
  ((EUID == 0)) || die "needs root (a Docker engine in namespaces)"
  START=$SECONDS
  bash "$HERE/install.sh"
  eval "$(bash "$HERE/node-image.sh")"
  export KIND_NODE_IMAGE KIND_NODE_TAR KIND KUBE_BIN
  log "node image ready after $((SECONDS - START))s"
  WORKDIR=$(mktemp -d -t sidecar-injector-kind.XXXXXX)
  rc=0
  # shellcheck disable=SC2097,SC2098 # WORKDIR is the same value on both sides
  KIND_CHECK_INSIDE=1 WORKDIR="$WORKDIR" "$REPO/e2e/docker/dockerd.sh" bash "$0" || rc=$?
  # The node container's cgroups: docker removes them with the container.
  for d in /sys/fs/cgroup/*/docker; do
    if [[ -d "$d" ]] && find "$d" -mindepth 1 -maxdepth 1 -type d -newer "$WORKDIR" | grep -q .; then
      log "ERROR: cgroups left under $d:"
      find "$d" -mindepth 1 -maxdepth 1 -type d -newer "$WORKDIR" >&2
      rc=1
    fi
  done
  if [[ "${KEEP_WORKDIR:-0}" == 1 || $rc != 0 ]]; then
    log "WORKDIR kept: $WORKDIR"
  else
    rm -rf "$WORKDIR"
  fi
  log "took $((SECONDS - START))s"
  exit "$rc"
fi

# ------------------------------------------------------------------ inside the namespaces
: "${WORKDIR:?}" "${KIND_NODE_IMAGE:?}" "${KIND_NODE_TAR:?}" "${KIND:?}" "${KUBE_BIN:?}"
PASSED=0
FAILED=0
check() { # name command...
  local name=$1
  shift
  if "$@"; then
    PASSED=$((PASSED + 1))
    log "ok: $name"
  else
    FAILED=$((FAILED + 1))
    log "FAILED: $name"
  fi
}
export KUBECONFIG="$WORKDIR/kubeconfig"
KUBECTL=("$KUBE_BIN/kubectl" --kubeconfig "$KUBECONFIG")
CREATED=0
finish() {
  local rc=$?
  trap - EXIT
  if ((CREATED)); then
    if ((FAILED || rc)); then
      "$KIND" export logs "$WORKDIR/kind-logs" --name "$CLUSTER" >/dev/null 2>&1 || true
      log "kind logs: $WORKDIR/kind-logs"
    fi
    local t0=$SECONDS
    if "$KIND" delete cluster --name "$CLUSTER" --kubeconfig "$KUBECONFIG"; then
      PASSED=$((PASSED + 1))
      log "ok: kind delete cluster ($((SECONDS - t0))s)"
    else
      FAILED=$((FAILED + 1))
      log "FAILED: kind delete cluster"
    fi
  fi
  if ((rc != 0 && FAILED == 0)); then FAILED=1; fi
  echo "$PASSED passed, $FAILED failed"
  if ((FAILED)); then exit 1; fi
  exit "$rc"
}
trap finish EXIT

t0=$SECONDS
log "docker import $KIND_NODE_TAR as $KIND_NODE_IMAGE"
# shellcheck source=lib.sh source-path=SCRIPTDIR
. "$HERE/lib.sh"
kind_node_image_load
log "imported in $((SECONDS - t0))s"

t0=$SECONDS
kind_render_config "$HERE/cluster.yaml" "$WORKDIR/audit" >"$WORKDIR/cluster.yaml"
CREATED=1
if "$KIND" create cluster --name "$CLUSTER" --image "$KIND_NODE_IMAGE" --config "$WORKDIR/cluster.yaml" \
  --kubeconfig "$KUBECONFIG" --wait 180s --retain; then
  PASSED=$((PASSED + 1))
  log "ok: kind create cluster ($((SECONDS - t0))s)"
else
  FAILED=$((FAILED + 1))
  log "FAILED: kind create cluster after $((SECONDS - t0))s"
  exit 1
fi

node_ready() {
  "${KUBECTL[@]}" wait --for=condition=Ready node --all --timeout=60s >&2
}
pods_running() { # label-selector or component... ; every matching kube-system pod Running and ready
  local sel
  for sel in "$@"; do
    "${KUBECTL[@]}" -n kube-system wait --for=condition=Ready pod -l "$sel" --timeout=120s >&2 || return 1
  done
}
check "node Ready" node_ready
check "control plane pods Ready" pods_running component=etcd component=kube-apiserver \
  component=kube-controller-manager component=kube-scheduler
check "kube-proxy Ready" pods_running k8s-app=kube-proxy
check "kindnet Ready" pods_running app=kindnet
check "coredns Ready" pods_running k8s-app=kube-dns
"${KUBECTL[@]}" get nodes -o wide >&2
"${KUBECTL[@]}" -n kube-system get pods -o wide >&2

# Prints the phase of pod NAME once it finished (Succeeded or Failed), or the last one seen
# after SECONDS.
finished_phase() { # name seconds
  local phase="" i
  for ((i = 0; i < $2; i++)); do
    phase=$("${KUBECTL[@]}" get pod "$1" -o jsonpath='{.status.phase}')
    [[ "$phase" == Succeeded || "$phase" == Failed ]] && break
    sleep 1
  done
  echo "$phase"
}

# A pod on the pod network resolves the API server's service through CoreDNS and kube-proxy.
dns_lookup() {
  "${KUBECTL[@]}" run dns-check --image "$(
    "${KUBECTL[@]}" -n kube-system get ds kindnet -o jsonpath='{.spec.template.spec.containers[0].image}'
  )" --restart=Never --command -- getent hosts kubernetes.default.svc.cluster.local >&2 || return 1
  local phase
  phase=$(finished_phase dns-check 60)
  "${KUBECTL[@]}" logs dns-check >&2 || true
  "${KUBECTL[@]}" delete pod dns-check --wait=false >/dev/null 2>&1 || true
  [[ "$phase" == Succeeded ]]
}
check "a pod resolves kubernetes.default through CoreDNS" dns_lookup

# `kind load docker-image` (docker save | ctr import on the node) of an image made here.
kind_load() {
  local img=sidecar-injector.local/busybox:check dir="$WORKDIR/busybox-image" bb
  bb=$(command -v busybox) || { log "busybox is missing (e2e/node/install.sh)"; return 1; }
  mkdir -p "$dir/bin"
  cp "$bb" "$dir/bin/busybox"
  ln -sf busybox "$dir/bin/sh"
  tar -C "$dir" -c . | docker import - "$img" >/dev/null || return 1
  "$KIND" load docker-image "$img" --name "$CLUSTER" >&2 || return 1
  "${KUBECTL[@]}" run load-check --image "$img" --image-pull-policy=Never --restart=Never \
    --command -- /bin/sh -c 'echo loaded-image-ran' >&2 || return 1
  local phase
  phase=$(finished_phase load-check 60)
  local out
  out=$("${KUBECTL[@]}" logs load-check 2>&1 || true)
  "${KUBECTL[@]}" delete pod load-check --wait=false >/dev/null 2>&1 || true
  [[ "$phase" == Succeeded && "$out" == loaded-image-ran ]]
}
check "kind load docker-image, then a pod runs that image" kind_load

# kind's default storage: a claim of the default class is provisioned by local-path-provisioner
# (its helper pod makes the directory) once a pod uses it, and the pod writes to it.
storage() {
  "${KUBECTL[@]}" wait --for=condition=Available deployment/local-path-provisioner \
    -n local-path-storage --timeout=120s >&2 || return 1
  "${KUBECTL[@]}" apply -f - >&2 <<EOF || return 1
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: storage-check}
spec:
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 1Mi}}
---
apiVersion: v1
kind: Pod
metadata: {name: storage-check}
spec:
  restartPolicy: Never
  containers:
    - name: c
      image: sidecar-injector.local/busybox:check
      imagePullPolicy: Never
      command: [/bin/sh, -c, "echo stored >/data/f && cat /data/f"]
      volumeMounts: [{name: d, mountPath: /data}]
  volumes: [{name: d, persistentVolumeClaim: {claimName: storage-check}}]
EOF
  local phase
  phase=$(finished_phase storage-check 90)
  local out pvc
  out=$("${KUBECTL[@]}" logs storage-check 2>&1 || true)
  pvc=$("${KUBECTL[@]}" get pvc storage-check -o jsonpath='{.status.phase}')
  log "storage: pod $phase, claim $pvc, output '$out'"
  "${KUBECTL[@]}" delete pod storage-check --wait=true --timeout=60s >/dev/null 2>&1 || true
  "${KUBECTL[@]}" delete pvc storage-check --wait=false >/dev/null 2>&1 || true
  [[ "$phase" == Succeeded && "$pvc" == Bound && "$out" == stored ]]
}
check "default StorageClass: a claim is provisioned and a pod writes to it" storage
