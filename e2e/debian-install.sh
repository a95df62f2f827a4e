#!/usr/bin/env bash
# Installs the Debian packages given that are missing (the e2e suites' install.sh scripts list
# theirs). Idempotent and quiet when all are present; as root, `apt-get install` with the
# packages' scripts starting no service (policy-rc.d 101: there may be no init system, and the
# suites start their own containerd and dockerd in their own namespaces). Its output goes to
# $SIDECAR_INJECTOR_CACHE/NAME-install.log.
#
# Usage: e2e/debian-install.sh NAME PACKAGE...
set -euo pipefail

(($# >= 2)) || { sed -n '2,8p' "$0" >&2; exit 2; }
name=$1
shift
log="${SIDECAR_INJECTOR_CACHE:-$HOME/.cache/sidecar-injector}/$name-install.log"
mkdir -p "$(dirname "$log")"
find_missing() { # packages...: sets missing to those not installed
  missing=()
  local p
  for p in "$@"; do
    if [[ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" != "install ok installed" ]]; then
      missing+=("$p")
    fi
  done
}
find_missing "$@"
if ((${#missing[@]} == 0)); then exit 0; fi
if ((EUID != 0)); then
  echo "e2e ($name): missing Debian packages: ${missing[*]}; install them as root" \
    "(apt-get install ${missing[*]}) or run as root" >&2
  exit 1
fi
# One apt at a time (`make test` runs the image and kind steps' installs in the background,
# tools/prefetch.sh): wait for the other, then ask again what is missing.
exec 9>"$(dirname "$log")/apt.lock"
flock 9
find_missing "$@"
if ((${#missing[@]} == 0)); then exit 0; fi
echo "e2e ($name): apt-get install ${missing[*]}" >&2
(
  apt-get update -q || exit 1
  made_policy=0
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
    chmod +x /usr/sbin/policy-rc.d
    made_policy=1
  fi
  rc=0
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" || rc=$?
  if ((made_policy)); then rm -f /usr/sbin/policy-rc.d; fi
  exit "$rc"
) >"$log" 2>&1 || {
  echo "e2e ($name): apt-get failed; last lines of $log:" >&2
  tail -n 30 "$log" >&2
  exit 1
}
