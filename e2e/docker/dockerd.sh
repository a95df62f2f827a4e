#!/usr/bin/env bash
# Runs a command against a private Docker engine (Debian's dockerd, e2e/docker/install.sh)
# inside a network and mount namespace this script creates (unshare -n -m): the engine's
# bridge and every container address exist only there, and no packet leaves the namespace
# (it has no route out; name lookups go to its own loopback, where nothing answers).
#
# Usage: e2e/docker/dockerd.sh COMMAND [ARGS...]   (root)
# COMMAND runs inside, with DOCKER_HOST set to the engine's socket and `docker` on PATH being
# the engine's own CLI (Debian's 20.10, which builds with BuildKit without buildx). Its exit
# status is this script's. After it, every container is removed (with its volumes) and the
# engine stopped; the namespace, its mounts and addresses end with the last process.
#   env DOCKER_DATA_ROOT  the engine's images, layers and build cache, kept between runs
#                         (default $SIDECAR_INJECTOR_CACHE/docker/data-root). One engine at a
#                         time uses it: a second run waits for the first. Set it to an
#                         empty directory of the run's for an engine that keeps nothing.
set -euo pipefail

HERE=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
CACHE=${SIDECAR_INJECTOR_CACHE:-$HOME/.cache/sidecar-injector}
DATA_ROOT=${DOCKER_DATA_ROOT:-$CACHE/docker/data-root}
log() { printf '[dockerd %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
(($# > 0)) || { sed -n '2,16p' "$0" >&2; exit 2; }

# ------------------------------------------------------------------ outside
if [[ "${E2E_DOCKERD_INSIDE:-0}" != 1 ]]; then
  ((EUID == 0)) || die "a Docker engine needs root"
  bash "$HERE/install.sh"
  mkdir -p "$DATA_ROOT"
  # One engine per data root: two would corrupt each other's layers.
  exec 8>"$DATA_ROOT.lock"
  if ! flock -n 8; then
    log "waiting for $DATA_ROOT.lock (another engine uses the data root)"
    flock 8
  fi
  # kind's nodes mount /lib/modules; docker makes the directory when it is missing.
  modules_made=0
  [[ -e /lib/modules ]] || modules_made=1
  rc=0
  E2E_DOCKERD_INSIDE=1 DATA_ROOT="$DATA_ROOT" \
    unshare --net --mount --propagation private -- bash "$0" "$@" || rc=$?
  if ((modules_made)) && [[ -d /lib/modules ]]; then rmdir /lib/modules 2>/dev/null || true; fi
  exit "$rc"
fi

# ------------------------------------------------------------------ inside
[[ "$(readlink /proc/self/ns/net)" != "$(readlink /proc/1/ns/net)" ]] ||
  die "not in a network namespace of its own"
RUN=$(mktemp -d -t sidecar-injector-dockerd.XXXXXX)
DOCKERD_PID=""
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  if [[ -n "$DOCKERD_PID" ]]; then
    local ids
    ids=$(docker ps -aq 2>/dev/null || true)
    if [[ -n "$ids" ]]; then
      # shellcheck disable=SC2086 # one id a word
      docker rm -f -v $ids >/dev/null 2>&1 || { log "ERROR: containers could not be removed"; rc=1; }
    fi
    kill -TERM "$DOCKERD_PID" 2>/dev/null || true
    local i
    for ((i = 0; i < 150; i++)); do
      kill -0 "$DOCKERD_PID" 2>/dev/null || break
      sleep 0.2
    done
    if kill -0 "$DOCKERD_PID" 2>/dev/null; then
      log "ERROR: dockerd did not stop in 30s; killing it"
      kill -KILL "$DOCKERD_PID" 2>/dev/null || true
      rc=1
    fi
    wait "$DOCKERD_PID" 2>/dev/null || true
  fi
  # The cgroups the engine made for its containers and BuildKit, once empty (rmdir removes only
  # an empty one; another engine's stay).
  rmdir /sys/fs/cgroup/*/docker/buildkit /sys/fs/cgroup/*/docker 2>/dev/null || true
  # dockerd's own containerd stops with it; anything still running from RUN is a leak.
  if pgrep -f -- "$RUN/" >/dev/null; then
    log "ERROR: processes left behind:"
    pgrep -af -- "$RUN/" >&2 || true
    pkill -KILL -f -- "$RUN/" || true
    rc=1
  fi
  if ((rc != 0)) && [[ -s "$RUN/dockerd.log" ]]; then
    log "last lines of dockerd's log:"
    tail -n 20 "$RUN/dockerd.log" >&2
  fi
  rm -rf "$RUN"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

ip link set lo up
# Paths dockerd and its containerd use whatever they are told: private to this namespace.
for d in /run/docker /run/containerd /var/run/docker /etc/docker; do
  mkdir -p "$d"
  mount -t tmpfs -o mode=0755 tmpfs "$d"
done
echo "nameserver 127.0.0.1" >"$RUN/resolv.conf"
mount --bind "$RUN/resolv.conf" /etc/resolv.conf

mkdir -p "$RUN/bin"
ln -s /usr/bin/docker "$RUN/bin/docker"
export PATH="$RUN/bin:$PATH"
export DOCKER_HOST="unix://$RUN/docker.sock"
export DOCKER_BUILDKIT=1
unset DOCKER_CONFIG DOCKER_CONTEXT DOCKER_TLS_VERIFY DOCKER_CERT_PATH
export DOCKER_CONFIG="$RUN/client"

# dockerd 20.10 gives a --privileged container (kind's nodes) every capability the kernel knows;
# where this machine's bounding set is smaller (here: no CAP_SYS_RESOURCE), runc refuses ("unable
# to apply caps: operation not permitted"). Then the default runtime is runc behind
# runc-capfilter.sh, which drops only the capabilities the machine does not grant (as newer
# engines do for --privileged).
runtime=()
cap_last=$(cat /proc/sys/kernel/cap_last_cap)
bounding=$((16#$(sed -n 's/^CapBnd:[[:space:]]*//p' /proc/self/status)))
if ((bounding != (1 << (cap_last + 1)) - 1)); then
  runtime=(--add-runtime "runc-capfilter=$HERE/runc-capfilter.sh" --default-runtime runc-capfilter)
fi
dockerd --data-root "$DATA_ROOT" --exec-root "$RUN/exec" --pidfile "$RUN/dockerd.pid" \
  --host "$DOCKER_HOST" --log-level warn "${runtime[@]}" >"$RUN/dockerd.log" 2>&1 &
DOCKERD_PID=$!
for ((i = 0; i < 300; i++)); do
  docker version >/dev/null 2>&1 && break
  kill -0 "$DOCKERD_PID" 2>/dev/null || die "dockerd exited: $(tail -n 5 "$RUN/dockerd.log")"
  sleep 0.2
done
docker version >/dev/null 2>&1 || die "dockerd does not answer on $DOCKER_HOST after 60s"
log "dockerd $(docker version --format '{{.Server.Version}}') on $DOCKER_HOST (data root $DATA_ROOT)"
"$@"
