#!/usr/bin/env bash
# Installs what the e2e node needs from Debian's packages, when missing (e2e/debian-install.sh):
# containerd (with its CRI plugin), runc, the CNI plugins (bridge, host-local, loopback,
# portmap) and busybox-static (the files the local images are made of). kubelet and
# kube-scheduler are built with the control plane (e2e/control-plane/build.sh). The node runs
# its own containerd, with its own socket and state; a system one is neither needed nor touched.
set -euo pipefail
exec bash "$(dirname -- "${BASH_SOURCE[0]}")/../debian-install.sh" node \
  containerd runc containernetworking-plugins busybox-static iproute2 util-linux
