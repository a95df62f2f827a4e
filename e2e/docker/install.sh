#!/usr/bin/env bash
# Installs what the image build needs from Debian's packages, when missing: the Docker engine
# (docker.io: dockerd 20.10 with BuildKit, its CLI, containerd, runc) and mmdebstrap (the root
# file systems of the local stand-in base images). Idempotent and quiet when all are present.
set -euo pipefail

PACKAGES=(docker.io mmdebstrap iproute2 util-linux)
log="${SIDECAR_INJECTOR_CACHE:-$HOME/.cache/sidecar-injector}/docker-install.log"
mkdir -p "$(dirname "$log")"

missing=()
for p in "${PACKAGES[@]}"; do
  if [[ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" != "install ok installed" ]]; then
    missing+=("$p")
  fi
done
if ((${#missing[@]} == 0)); then exit 0; fi

if ((EUID != 0)); then
  echo "e2e/docker/install.sh: missing Debian packages: ${missing[*]}; install them as root" \
    "(apt-get install ${missing[*]}) or run as root" >&2
  exit 1
fi
echo "e2e/docker/install.sh: apt-get install ${missing[*]}" >&2
{
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
} >"$log" 2>&1 || {
  echo "e2e/docker/install.sh: apt-get failed; last lines of $log:" >&2
  tail -n 30 "$log" >&2
  exit 1
}
# The package would start a system engine where there is an init to start it; the tests run
# their own, in a namespace of their own (dockerd.sh), and neither need nor touch a system one.
