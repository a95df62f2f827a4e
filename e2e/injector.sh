#!/usr/bin/env bash
# Start or stop the sidecar-injector server of a local end-to-end run (e2e/run.sh). The
# suite calls it too (E2E_INJECTOR_CTL) to stop the server and start it again.
#
# Usage: e2e/injector.sh start|stop|status
#   env E2E_WORKDIR              the run's WORKDIR (pid file in run/, log in logs/)
#   env E2E_INJECTOR_BIN         the sidecar-injector binary
#   env E2E_INJECTOR_PORT        TLS port (/mutate, /validate)
#   env E2E_INJECTOR_ADDRESS     the address it listens on (default 127.0.0.1; in kind the
#                                network's gateway, which the apiserver reaches)
#   env E2E_INJECTOR_ADMIN_PORT  admin port on 127.0.0.1 (/readyz)
#   env E2E_INJECTOR_CERT, E2E_INJECTOR_KEY  serving certificate and key
#   env SIDECAR_INJECTOR_NAMESPACE           passed on to the server
#   env SIDECAR_INJECTOR_CONFIG  the server's configuration; default WORKDIR/injector-config/
#                                config.yaml, made on the first start from the repository's
#                                templates/ (the embedded default, as files): scenarios edit it
#                                to change the running configuration, which the server reloads.
# The server runs in its own session, so it outlives the caller; `stop` (and run.sh's exit
# trap) ends it: SIGTERM, then SIGKILL after 15 s.
set -euo pipefail

HERE=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=control-plane/lib.sh source-path=SCRIPTDIR
. "$HERE/control-plane/lib.sh"

[[ $# -eq 1 ]] || { sed -n '2,19p' "$0" >&2; exit 2; }
: "${E2E_WORKDIR:?}"
PID_FILE="$E2E_WORKDIR/run/sidecar-injector.pid"
CONFIG_DIR="$E2E_WORKDIR/injector-config"
LOG_FILE="$E2E_WORKDIR/logs/sidecar-injector.log"
log() { printf '[injector %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }

# The server's command line names its certificate under WORKDIR, which guards against pid reuse.
running_pid() {
  local pid
  pid=$(cat "$PID_FILE" 2>/dev/null) || return 1
  cp_pid_is_ours "$pid" "$E2E_WORKDIR" || return 1
  echo "$pid"
}

start() {
  : "${E2E_INJECTOR_BIN:?}" "${E2E_INJECTOR_PORT:?}" "${E2E_INJECTOR_ADMIN_PORT:?}"
  : "${E2E_INJECTOR_CERT:?}" "${E2E_INJECTOR_KEY:?}" "${SIDECAR_INJECTOR_NAMESPACE:?}"
  if running_pid >/dev/null; then
    log "already running (pid $(<"$PID_FILE"))"
    return 0
  fi
  mkdir -p "$E2E_WORKDIR/run" "$E2E_WORKDIR/logs"
  if [[ -z "${SIDECAR_INJECTOR_CONFIG:-}" ]]; then
    if [[ ! -f "$CONFIG_DIR/config.yaml" ]]; then
      mkdir -p "$CONFIG_DIR"
      cp "$HERE"/../templates/*.yaml.j2 "$CONFIG_DIR/"
      { cat "$HERE/../templates/config.yaml"; echo "templatesDir: ."; } >"$CONFIG_DIR/config.yaml"
    fi
    export SIDECAR_INJECTOR_CONFIG="$CONFIG_DIR/config.yaml"
  fi
  setsid "$E2E_INJECTOR_BIN" serve \
    --listen "${E2E_INJECTOR_ADDRESS:-127.0.0.1}:$E2E_INJECTOR_PORT" \
    --admin-listen "127.0.0.1:$E2E_INJECTOR_ADMIN_PORT" \
    --tls-cert-file "$E2E_INJECTOR_CERT" \
    --tls-key-file "$E2E_INJECTOR_KEY" \
    --log-format text \
    --shutdown-timeout 3s \
    --reload-interval 2s \
    >>"$LOG_FILE" 2>&1 </dev/null &
  echo "$!" >"$PID_FILE"
  cp_wait_exec "$!" "$E2E_WORKDIR"
  local end=$((SECONDS + 30))
  until curl --silent --fail --noproxy '*' --max-time 2 \
    "http://127.0.0.1:$E2E_INJECTOR_ADMIN_PORT/readyz" >/dev/null 2>&1; do
    if ! running_pid >/dev/null; then
      log "ERROR: the server exited; last lines of $LOG_FILE:"
      tail -n 20 "$LOG_FILE" >&2 || true
      return 1
    fi
    if ((SECONDS >= end)); then
      log "ERROR: not ready after 30s (log: $LOG_FILE)"
      return 1
    fi
    sleep 0.2
  done
  log "ready: https://${E2E_INJECTOR_ADDRESS:-127.0.0.1}:$E2E_INJECTOR_PORT (pid $(<"$PID_FILE"))"
}

stop() {
  local pid
  if ! pid=$(running_pid); then
    rm -f "$PID_FILE"
    return 0
  fi
  # TERM, at most 15 s for the drain, then KILL.
  cp_stop_pid "$pid" "$E2E_WORKDIR" sidecar-injector || return 1
  rm -f "$PID_FILE"
  log "stopped (pid $pid)"
}

case "$1" in
  start) start ;;
  stop) stop ;;
  status) if pid=$(running_pid); then echo "running $pid"; else echo stopped; exit 1; fi ;;
  *) sed -n '2,19p' "$0" >&2; exit 2 ;;
esac
