#!/usr/bin/env bash
# The kind e2e suite (e2e/kind/run.sh) on this machine, with no registry (`make test-e2e-kind`):
#  1. outside: kind/install.sh and tools/install.sh (Debian packages, helm, kubectl), the node
#     image and the kind CLI (kind/node-image.sh, cached), prometheus (tools/prometheus.sh,
#     cached), the injector's image (E2E_IMAGE_ARCHIVE, or e2e/docker/build-image.sh), and the
#     suite compiled, so that nothing inside needs a network;
#  2. inside a private Docker engine in its own network and mount namespace (e2e/docker/dockerd.sh):
#     the node image imported (kind/lib.sh), then kind/run.sh with KIND, KIND_NODE_IMAGE,
#     E2E_IMAGE_ARCHIVE and PROMETHEUS_BIN, the pod route and the webhooks on the kind
#     network's gateway (the namespace is the run's own): the cluster, the chart, the
#     scenarios, the cluster deleted.
# Ends with kind/run.sh's "N passed, M failed, K skipped".
#   env K8S_VERSION (default v1.35.8), E2E_IMAGE_ARCHIVE, KEEP_CLUSTER
#   env E2E_TEST_FILTER (default: the scenarios kind proves more of, KIND_SCENARIOS below)
set -euo pipefail

HERE=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
E2E=$(cd -- "$HERE/.." && pwd)
REPO=$(cd -- "$E2E/.." && pwd)
# shellcheck source=../lib.sh source-path=SCRIPTDIR
. "$E2E/lib.sh"
CARGO=${CARGO:-cargo}
log() { e2e_log "kind-here: $*"; }
die() { log "ERROR: $*"; exit 1; }

if [[ "${1:-}" == --inside ]]; then
  # shellcheck source=lib.sh source-path=SCRIPTDIR
  . "$HERE/lib.sh"
  log "docker import of the node image $KIND_NODE_IMAGE (when not in the engine already)"
  kind_node_image_load || die "cannot import $KIND_NODE_TAR"
  E2E_KIND_POD_ROUTE=1 E2E_KIND_HOST_WEBHOOKS=1 exec bash "$HERE/run.sh"
fi

# What kind proves that the node suite, on the same version, does not: the user's install path
# (the chart with its default selfManaged certificates, `kind load`, `helm test`, in kind/run.sh), kind's own
# networking (the apiserver dials the Service through kube-proxy: s01, s04, s10, n04; the
# gateway webhooks: s11), pods that run on its node (n01-n03, n12) and Prometheus through the
# pod route (n07), and `check` against it (s24). The other scenarios run on the node suite;
# E2E_TEST_FILTER=" " (a space) runs them all here too, as e2e/kind/run.sh does by default.
KIND_SCENARIOS="s00_ s01_ s04_ s10_ s11_ s24_ n01_ n02_ n03_ n04_ n07_ n12_"
export E2E_TEST_FILTER="${E2E_TEST_FILTER:-$KIND_SCENARIOS}"

((EUID == 0)) || die "needs root (a Docker engine in namespaces)"
START=$SECONDS
cd "$REPO"
IMAGE_DIR=""
KIND_CONFIG=$(mktemp --suffix=.yaml -t sidecar-injector-kind-config.XXXXXX)
trap 'rm -f "$KIND_CONFIG"; [[ -z "$IMAGE_DIR" ]] || rm -rf "$IMAGE_DIR"' EXIT
bash "$HERE/install.sh"
bash "$REPO/tools/install.sh"
eval "$(bash "$HERE/node-image.sh")"
export KIND_NODE_IMAGE KIND_NODE_TAR KIND
PROMETHEUS_BIN=$(bash "$REPO/tools/prometheus.sh" | tail -n1)
export PROMETHEUS_BIN
if [[ -z "${E2E_IMAGE_ARCHIVE:-}" ]]; then
  IMAGE_DIR=$(mktemp -d -t sidecar-injector-kind-image.XXXXXX)
  E2E_IMAGE_ARCHIVE=$IMAGE_DIR/sidecar-injector.tar
  bash "$E2E/docker/build-image.sh" "$E2E_IMAGE_ARCHIVE"
fi
export E2E_IMAGE_ARCHIVE
# The suite, built here (run.sh builds it again: then nothing is left to compile).
E2E_SUITE=(test -p sidecar-injector-e2e --test scenarios --test policy --test node)
e2e_count_scenarios "$CARGO" >/dev/null || die "cannot build the scenarios"
"$CARGO" build --quiet --bin sidecar-injector
# On 1.34 and 1.35 MutatingAdmissionPolicy is beta and off (n06 and p01 need it), as
# control-plane/up.sh turns it on for the other suites; from 1.36 it is GA.
cp "$HERE/cluster.yaml" "$KIND_CONFIG"
minor=$(sed -n 's/^v1\.\([0-9]*\)\..*/\1/p' <<<"${K8S_VERSION:-v1.35.8}")
if ((minor == 34 || minor == 35)); then
  printf '%s\n' 'featureGates:' '  MutatingAdmissionPolicy: true' 'runtimeConfig:' \
    '  admissionregistration.k8s.io/v1beta1: "true"' >>"$KIND_CONFIG"
fi
export KIND_CONFIG
rc=0
"$E2E/docker/dockerd.sh" bash "$0" --inside || rc=$?
log "took $((SECONDS - START))s"
exit "$rc"
