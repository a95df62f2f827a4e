#!/usr/bin/env bash
# Runs a command with a private Docker engine (Debian's dockerd 20.10) inside a network and mount
# namespace this script creates (unshare -n -m): the engine's bridges, every container and
# every address exist only there, and nothing of the engine outlives the command.
#
# Usage: e2e/kind/with-dockerd.sh WORKDIR CMD [ARGS...]
#   The engine keeps its data root, exec root, socket and log under WORKDIR (which must exist
#   and be empty of a previous engine); CMD runs inside with DOCKER_HOST pointing at it and
#   PATH starting with WORKDIR/bin, where `docker` is Debian's CLI (/usr/bin/docker, the
#   engine's own version). On the way out: every container is removed, dockerd is stopped
#   (it stops its containerd), and the exit code is CMD's, or 1 if the engine left a process.
set -euo pipefail

log() { printf '[dockerd %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
[[ $# -ge 2 ]] || { sed -n '2,11p' "$0" >&2; exit 2; }
W=$(cd -- "$1" && pwd)
shift

if [[ "${WITH_DOCKERD_INSIDE:-0}" != 1 ]]; then
  ((EUID == 0)) || die "needs root"
  for tool in dockerd unshare ip; do command -v "$tool" >/dev/null || die "$tool is required"; done
  [[ -x /usr/bin/docker ]] || die "/usr/bin/docker is missing (Debian's docker.io: e2e/kind/install.sh)"
  # docker run -v /lib/modules:... (kind does) makes the directory when it is missing.
  modules_made=0
  [[ -e /lib/modules ]] || modules_made=1
  rc=0
  WITH_DOCKERD_INSIDE=1 unshare --net --mount --propagation private -- "$0" "$W" "$@" || rc=$?
  if ((modules_made)) && [[ -d /lib/modules ]]; then rmdir /lib/modules 2>/dev/null || true; fi
  # The namespace is gone with its last process; anything still naming WORKDIR is a leak.
  if pgrep -f -- "$W/" >/dev/null; then
    log "ERROR: processes of the engine outlived it:"
    pgrep -a -f -- "$W/" >&2 || true
    rc=1
  fi
  exit "$rc"
fi

# ------------------------------------------------------------------ inside the namespaces
ip link set lo up
# dockerd writes /etc/docker/key.json; keep that in the run's directory.
mkdir -p "$W/etc-docker" "$W/bin" "$W/docker" "$W/exec"
mkdir -p /etc/docker # docker.io's own directory; in this namespace it is WORKDIR's
mount --bind "$W/etc-docker" /etc/docker
ln -sf /usr/bin/docker "$W/bin/docker"
# dockerd 20.10 gives --privileged containers every capability the kernel knows; where this
# machine's bounding set is smaller, runc refuses ("unable to apply caps"): then the default
# runtime is runc behind runc-capfilter.sh, which drops only the capabilities not granted here.
HERE=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
cap_last=$(cat /proc/sys/kernel/cap_last_cap)
bnd=$((16#$(sed -n 's/^CapBnd:[[:space:]]*//p' /proc/self/status)))
if ((bnd != (1 << (cap_last + 1)) - 1)); then
  printf '{"runtimes": {"runc-capfilter": {"path": "%s"}}, "default-runtime": "runc-capfilter"}\n' \
    "$HERE/runc-capfilter.sh" >"$W/daemon.json"
else
  echo '{}' >"$W/daemon.json"
fi
export DOCKER_HOST="unix://$W/docker.sock"
export PATH="$W/bin:$PATH"
unset DOCKER_CONTEXT DOCKER_CONFIG DOCKER_API_VERSION

dockerd --config-file "$W/daemon.json" --data-root "$W/docker" --exec-root "$W/exec" \
  --pidfile "$W/dockerd.pid" -H "$DOCKER_HOST" --log-level warn >"$W/dockerd.log" 2>&1 &
DOCKERD_PID=$!

# shellcheck disable=SC2329 # called from the EXIT trap
stop_engine() {
  local ids
  ids=$(docker ps -aq 2>/dev/null || true)
  if [[ -n "$ids" ]]; then
    # shellcheck disable=SC2086 # one id per word
    docker rm -f -v $ids >/dev/null 2>&1 || log "WARNING: docker rm -f failed"
  fi
  kill -TERM "$DOCKERD_PID" 2>/dev/null || true
  for _ in $(seq 60); do kill -0 "$DOCKERD_PID" 2>/dev/null || break; sleep 0.5; done
  if kill -0 "$DOCKERD_PID" 2>/dev/null; then
    log "ERROR: dockerd did not stop in 30s; killing it"
    kill -KILL "$DOCKERD_PID" 2>/dev/null || true
  fi
  wait "$DOCKERD_PID" 2>/dev/null || true
  # Its containerd, if it did not go with it (its pid file, so only that process).
  local ctd
  ctd=$(cat "$W/exec/containerd/containerd.pid" 2>/dev/null || true)
  if [[ -n "$ctd" ]] && kill -0 "$ctd" 2>/dev/null; then
    log "WARNING: dockerd's containerd ($ctd) outlived it; stopping it"
    kill -TERM "$ctd" 2>/dev/null || true
  fi
}
trap 'rc=$?; trap - EXIT; stop_engine; exit $rc' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

for _ in $(seq 120); do
  docker version >/dev/null 2>&1 && break
  kill -0 "$DOCKERD_PID" 2>/dev/null || { tail -n 30 "$W/dockerd.log" >&2; die "dockerd exited"; }
  sleep 0.5
done
docker version >/dev/null 2>&1 || { tail -n 30 "$W/dockerd.log" >&2; die "dockerd did not answer in 60s"; }
log "dockerd $(docker version -f '{{.Server.Version}}') at $DOCKER_HOST (network namespace of pid $$)"
rc=0
"$@" || rc=$?
exit "$rc"
