#!/usr/bin/env bash
# Builds, in the background, what the later steps of `make test` need and nothing before them
# does, so that the builds overlap the steps that leave the CPU idle (the suites wait on
# apiservers and kubelets, downloads wait on the network). In order of need: the Debian packages
# of the image and kind steps, the base images' stand-ins (`make image`), prometheus (n07 on a
# node and in kind), the kind CLI and tools, kubeadm/kube-proxy/kubectl and the kind node image,
# then the control plane of the oldest supported Kubernetes (`make test-e2e-floor`, the last step).
# Each of those scripts takes its own lock and caches what it makes: the step that needs it
# waits for the lock and finds it made. If a build here fails, the step builds it again itself
# and fails there with the error in its own output; this job never fails a run. On a machine
# whose caches are warm it ends in seconds.
#
#   tools/prefetch.sh start   start it in its own session (log: CACHE/prefetch.log)
#   tools/prefetch.sh stop    end it and everything it started, if it still runs
#   env KIND_K8S_VERSION      the kind suite's Kubernetes version (default v1.35.8)
#   env FLOOR_K8S_VERSION     the oldest supported Kubernetes (default v1.30.14)
set -euo pipefail
REPO=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
CACHE="${SIDECAR_INJECTOR_CACHE:-$HOME/.cache/sidecar-injector}"
PID_FILE="$CACHE/prefetch.pid"
LOG="$CACHE/prefetch.log"
log() { printf '[prefetch %s] %s\n' "$(date -u +%H:%M:%S)" "$*"; }

run() {
  local t0=$SECONDS step
  log "start (KIND_K8S_VERSION=${KIND_K8S_VERSION:-v1.35.8}, FLOOR_K8S_VERSION=${FLOOR_K8S_VERSION:-v1.30.14})"
  for step in "e2e/docker/install.sh" "e2e/kind/install.sh" "e2e/docker/base-images.sh prepare" \
    "tools/prometheus.sh" "e2e/kind/node-image.sh"; do
    local s0=$SECONDS
    # shellcheck disable=SC2086 # a script and its arguments
    if K8S_VERSION="${KIND_K8S_VERSION:-v1.35.8}" bash "$REPO"/$step >/dev/null; then
      log "$step: done in $((SECONDS - s0))s"
    else
      log "$step: failed after $((SECONDS - s0))s (the step that needs it builds it again)"
    fi
  done
  local s0=$SECONDS
  if K8S_VERSION="${FLOOR_K8S_VERSION:-v1.30.14}" bash "$REPO"/e2e/control-plane/build.sh >/dev/null 2>&1; then
    log "e2e/control-plane/build.sh (${FLOOR_K8S_VERSION:-v1.30.14}): done in $((SECONDS - s0))s"
  else
    log "e2e/control-plane/build.sh (${FLOOR_K8S_VERSION:-v1.30.14}): failed after $((SECONDS - s0))s (the step that needs it builds it again)"
  fi
  log "all done in $((SECONDS - t0))s"
}

# The session's processes (this job and its builds) if it still runs.
running() {
  local pid
  pid=$(cat "$PID_FILE" 2>/dev/null) || return 1
  [[ "$(ps -o sid= -p "$pid" 2>/dev/null | tr -d ' ')" == "$pid" ]] || return 1
  echo "$pid"
}

case "${1:-}" in
  start)
    mkdir -p "$CACHE"
    if pid=$(running); then
      log "already running (session $pid)"
      exit 0
    fi
    ((EUID == 0)) || { log "not root: nothing started (the image and kind steps need root)"; exit 0; }
    setsid bash "$0" --run >"$LOG" 2>&1 </dev/null &
    echo "$!" >"$PID_FILE"
    log "started (session $!, log $LOG)"
    ;;
  --run) run ;;
  stop)
    if pid=$(running); then
      log "stopping session $pid (last lines of $LOG:)"
      tail -n 5 "$LOG" || true
      kill -TERM -- "-$pid" 2>/dev/null || true
      for _ in $(seq 100); do running >/dev/null || break; sleep 0.1; done
      kill -KILL -- "-$pid" 2>/dev/null || true
    fi
    rm -f "$PID_FILE"
    ;;
  *) sed -n '2,16p' "$0" >&2; exit 2 ;;
esac
