#!/usr/bin/env bash
# Installs what the kind e2e needs from Debian's packages, when missing: the Docker engine
# (docker.io: dockerd 20.10 and its CLI at /usr/bin/docker), mmdebstrap (the node's root file
# systems), containerd (a temporary one imports the images into the node image), gcc and
# libc6-dev (the pause binary, static, from Kubernetes' own pause.c), jq, busybox-static (the
# cluster check's test image). Idempotent; quiet when all are present. The packages' scripts
# start no service: the tests start their own dockerd inside their namespaces.
set -euo pipefail

PACKAGES=(docker.io mmdebstrap containerd runc gcc libc6-dev jq iproute2 util-linux busybox-static)
log="${SIDECAR_INJECTOR_CACHE:-$HOME/.cache/sidecar-injector}/kind-install.log"
mkdir -p "$(dirname "$log")"
missing=()
for p in "${PACKAGES[@]}"; do
  if [[ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" != "install ok installed" ]]; then
    missing+=("$p")
  fi
done
if ((${#missing[@]} == 0)); then exit 0; fi
if ((EUID != 0)); then
  echo "e2e/kind/install.sh: missing Debian packages: ${missing[*]}; run as root" >&2
  exit 1
fi
echo "e2e/kind/install.sh: apt-get install ${missing[*]}" >&2
(
  apt-get update -q || exit 1
  # policy-rc.d 101: the packages' scripts start no service (there may be no init system).
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
  echo "e2e/kind/install.sh: apt-get failed; last lines of $log:" >&2
  tail -n 30 "$log" >&2
  exit 1
}
