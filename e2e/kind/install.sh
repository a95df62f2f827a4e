#!/usr/bin/env bash
# Installs what the kind e2e needs from Debian's packages, when missing (e2e/debian-install.sh):
# the Docker engine (docker.io: dockerd 20.10 and its CLI at /usr/bin/docker), mmdebstrap (the
# node's root file systems), containerd (a temporary one imports the images into the node
# image), gcc and libc6-dev (the pause binary, static, from Kubernetes' own pause.c), jq,
# busybox-static (the stand-in images).
set -euo pipefail
exec bash "$(dirname -- "${BASH_SOURCE[0]}")/../debian-install.sh" kind \
  docker.io mmdebstrap containerd runc gcc libc6-dev jq iproute2 util-linux busybox-static
