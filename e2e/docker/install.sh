#!/usr/bin/env bash
# Installs what the image build needs from Debian's packages, when missing
# (e2e/debian-install.sh): the Docker engine (docker.io: dockerd 20.10 with BuildKit, its CLI,
# containerd, runc) and mmdebstrap (the root file systems of the local stand-in base images).
set -euo pipefail
exec bash "$(dirname -- "${BASH_SOURCE[0]}")/../debian-install.sh" docker \
  docker.io mmdebstrap iproute2 util-linux
