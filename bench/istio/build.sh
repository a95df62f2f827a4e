#!/usr/bin/env bash
# Builds the bench's peer, `istio-peer` (bench/istio/main.go: Istio's sidecar injection webhook
# from the module istio.io/istio, pinned in bench/istio/go.mod), from the Go module proxy, and
# caches the binary outside the checkout, keyed by the harness's sources and the Go version.
# Only `make bench` (bench/run.sh) calls this; `make test` never needs it.
#
#   env SIDECAR_INJECTOR_CACHE (default $HOME/.cache/sidecar-injector)
#
# Progress goes to stderr; the last stdout line is the binary's path.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"

log() { printf '[istio-peer %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

command -v go >/dev/null || die "go is not installed (the peer row needs a Go toolchain)"
export CGO_ENABLED=0 GOTOOLCHAIN="${GOTOOLCHAIN:-local}" GOFLAGS="-mod=mod -buildvcs=false"

key=$( (cat "$here/go.mod" "$here/go.sum" "$here/main.go" "$here/build.sh"; go version) \
  | sha256sum | cut -c1-16)
cache="${SIDECAR_INJECTOR_CACHE:-$HOME/.cache/sidecar-injector}/bench/istio"
bin="$cache/$key/istio-peer"
if [[ -x "$bin" ]]; then
  log "cached: $bin"
  echo "$bin"
  exit 0
fi

mkdir -p "$cache"
# One build at a time; a second caller waits and then finds the binary.
exec 9>"$cache/.lock"
flock 9
if [[ -x "$bin" ]]; then
  log "cached (built by a concurrent run): $bin"
  echo "$bin"
  exit 0
fi

cd "$here"
module=$(awk '$1 == "istio.io/istio" {print $1 "@" $2; exit}' go.mod)
[[ -n "$module" ]] || die "go.mod does not require istio.io/istio"
# The harness renders Istio's charts from the module's manifests/ directory at start-up.
dir=$(go mod download -json "$module" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
[[ -d "$dir/manifests" ]] || die "no manifests/ in $module (module directory: '${dir}')"
log "building against $module (the first build downloads its dependencies: a minute or more)"
start=$(date +%s)
mkdir -p "$cache/$key"
go build -trimpath -ldflags "-s -w -X main.manifestsDir=$dir/manifests" -o "$bin.tmp" .
mv "$bin.tmp" "$bin"
log "built in $(($(date +%s) - start)) s: $bin ($(du -h "$bin" | cut -f1))"
echo "$bin"
