#!/usr/bin/env bash
# Build what a kind cluster needs besides Kubernetes itself, from the Go module proxy, and cache
# the binaries by version outside the checkout:
#   kind      sigs.k8s.io/kind               (the CLI; its module also holds the node image's files)
#   crictl    sigs.k8s.io/cri-tools/cmd/crictl
#   coredns   github.com/coredns/coredns     (the version kubeadm of K8S_VERSION deploys)
#   local-path-provisioner  github.com/rancher/local-path-provisioner (kind's default storage)
# and, through e2e/control-plane/build.sh --with-kind, kube-apiserver, kube-controller-manager,
# kube-scheduler, kubelet, kubeadm, kube-proxy, kubectl and etcd.
#
# Usage: e2e/kind/build.sh
#   env K8S_VERSION      (default v1.35.8)
#   env KIND_VERSION     (default v0.33.0)
#   env CRICTL_VERSION   (default v1.34.0; the proxy serves v1.34.0 and v1.37.0, not v1.35/36)
#   env COREDNS_VERSION  (default: what `kubeadm config images list` names for K8S_VERSION)
#   env LOCAL_PATH_VERSION (default v0.0.30: kind v0.33.0 builds v0.0.34, not served by the proxy)
#   env SIDECAR_INJECTOR_CACHE (default $HOME/.cache/sidecar-injector)
#   env GO_BUILD_PARALLEL (default 2)
#
# Progress goes to stderr; stdout ends with two lines: KUBE_BIN=<dir> and KIND_BIN=<dir>.
set -euo pipefail

HERE=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
E2E=$(cd -- "$HERE/.." && pwd)
export K8S_VERSION="${K8S_VERSION:-v1.35.8}"
KIND_VERSION="${KIND_VERSION:-v0.33.0}"
CRICTL_VERSION="${CRICTL_VERSION:-v1.34.0}"
LOCAL_PATH_VERSION="${LOCAL_PATH_VERSION:-v0.0.30}"
GO_BUILD_PARALLEL="${GO_BUILD_PARALLEL:-2}"

log() { printf '[kind-build %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
[[ $# -eq 0 ]] || { sed -n '2,20p' "$0" >&2; exit 2; }
command -v go >/dev/null || die "go is not installed"

START=$(date +%s)
KUBE_BIN=$(BUILD_KIND=1 "$E2E/control-plane/build.sh" | tail -n1)
[[ -x "$KUBE_BIN/kubeadm" ]] || die "control-plane/build.sh --with-kind made no kubeadm in $KUBE_BIN"

if [[ -z "${COREDNS_VERSION:-}" ]]; then
  COREDNS_VERSION=$("$KUBE_BIN/kubeadm" config images list --kubernetes-version "$K8S_VERSION" 2>/dev/null |
    sed -n 's#.*/coredns:\(v[0-9.]*\)$#\1#p')
  [[ -n "$COREDNS_VERSION" ]] || die "kubeadm config images list names no coredns image"
fi

CACHE_ROOT="${SIDECAR_INJECTOR_CACHE:-$HOME/.cache/sidecar-injector}/kind"
BIN_DIR="$CACHE_ROOT/tools-kind${KIND_VERSION#v}-crictl${CRICTL_VERSION#v}-coredns${COREDNS_VERSION#v}-localpath${LOCAL_PATH_VERSION#v}/bin"
MARKER="$BIN_DIR/.complete"
present() {
  [[ -f "$MARKER" && -x "$BIN_DIR/kind" && -x "$BIN_DIR/crictl" && -x "$BIN_DIR/coredns" &&
    -x "$BIN_DIR/local-path-provisioner" ]]
}

if ! present; then
  mkdir -p "$BIN_DIR"
  exec 9>"$BIN_DIR/../.lock"
  flock 9
fi
if ! present; then
  export CGO_ENABLED=0 GOTOOLCHAIN="${GOTOOLCHAIN:-local}" GOFLAGS="${GOFLAGS:-} -buildvcs=false"
  # go install MODULE/PKG@VERSION into a scratch GOBIN, then move into place.
  install_one() { # name pkg@version ldflags
    if [[ -x "$BIN_DIR/$1" ]]; then log "keeping $1"; return; fi
    local t0 tmp
    t0=$(date +%s)
    tmp=$(mktemp -d "$BIN_DIR/../gobin.XXXXXX")
    log "go install $2"
    GOBIN="$tmp" go install -p "$GO_BUILD_PARALLEL" -trimpath -ldflags "-s -w $3" "$2" >&2
    mv -f "$tmp/$(basename "${2%@*}")" "$BIN_DIR/$1"
    rm -rf "$tmp"
    log "built $1 in $(($(date +%s) - t0))s"
  }
  install_one kind "sigs.k8s.io/kind@$KIND_VERSION" ""
  install_one crictl "sigs.k8s.io/cri-tools/cmd/crictl@$CRICTL_VERSION" \
    "-X sigs.k8s.io/cri-tools/pkg/version.Version=$CRICTL_VERSION"
  install_one coredns "github.com/coredns/coredns@$COREDNS_VERSION" ""
  install_one local-path-provisioner "github.com/rancher/local-path-provisioner@$LOCAL_PATH_VERSION" \
    "-X main.VERSION=$LOCAL_PATH_VERSION"

  got=$("$BIN_DIR/kind" version 2>&1)
  [[ "$got" == "kind $KIND_VERSION "* ]] || die "kind version says '$got'"
  # Captured whole, then cut: with pipefail, `coredns -version | head -n1` fails whenever head
  # exits before coredns writes its second line (SIGPIPE), and set -e ends the script silently.
  got=$("$BIN_DIR/coredns" -version 2>&1)
  got=${got%%$'\n'*}
  [[ "$got" == "CoreDNS-${COREDNS_VERSION#v}" ]] || die "coredns -version says '$got'"
  "$BIN_DIR/crictl" --version >&2
  {
    echo "kind=$KIND_VERSION"
    echo "crictl=$CRICTL_VERSION"
    echo "coredns=$COREDNS_VERSION"
    echo "local_path_provisioner=$LOCAL_PATH_VERSION"
    echo "go=$(go env GOVERSION)"
    echo "built_at=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  } >"$MARKER.tmp"
  mv -f "$MARKER.tmp" "$MARKER"
fi
log "done in $(($(date +%s) - START))s"
echo "KUBE_BIN=$KUBE_BIN"
echo "KIND_BIN=$BIN_DIR"
