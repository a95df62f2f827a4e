#!/usr/bin/env bash
# Installs what the e2e node needs from Debian's packages, when missing: containerd (with its
# CRI plugin), runc, the CNI plugins (bridge, host-local, loopback, portmap) and busybox-static
# (the files the local images are made of). Idempotent and quiet when all are present.
# kubelet and kube-scheduler are built with the control plane (e2e/control-plane/build.sh).
set -euo pipefail

PACKAGES=(containerd runc containernetworking-plugins busybox-static iproute2 util-linux)
log="${SIDECAR_INJECTOR_CACHE:-$HOME/.cache/sidecar-injector}/node-install.log"
mkdir -p "$(dirname "$log")"

missing=()
for p in "${PACKAGES[@]}"; do
  if [[ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" != "install ok installed" ]]; then
    missing+=("$p")
  fi
done
if ((${#missing[@]} == 0)); then exit 0; fi

if ((EUID != 0)); then
  echo "e2e/node/install.sh: missing Debian packages: ${missing[*]}; install them as root" \
    "(apt-get install ${missing[*]}) or run as root" >&2
  exit 1
fi
echo "e2e/node/install.sh: apt-get install ${missing[*]}" >&2
{
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
} >"$log" 2>&1 || {
  echo "e2e/node/install.sh: apt-get failed; last lines of $log:" >&2
  tail -n 30 "$log" >&2
  exit 1
}
# Debian starts containerd as a service on install; the e2e node runs its own instance, with
# its own socket and state, so the system one is neither needed nor touched.
