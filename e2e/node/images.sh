#!/usr/bin/env bash
# Builds the e2e node's images as OCI layout tars (oci_image.py), from files on this machine:
#   docker.io/local/busybox:1            busybox-static and its applets: the test applications
#   docker.io/local/pause:1              the same files, entrypoint `sleep infinity`: the sandbox
#   docker.io/local/proxy:1              stand-in for Envoy (standins/proxy.sh)
#   docker.io/local/log-shipper:1        stand-in for fluent-bit (standins/log-shipper.sh)
# The injector's own image is not made here: it is the image `docker build` makes of the
# Dockerfile (e2e/docker/build-image.sh).
#
# Usage: e2e/node/images.sh OUT_DIR
# Prints one "name digest" line per image; the tars are OUT_DIR/<short name>.tar.
set -euo pipefail

HERE=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
[[ $# -eq 1 ]] || { sed -n '2,12p' "$0" >&2; exit 2; }
OUT=$1
die() { echo "images.sh: $*" >&2; exit 1; }
BUSYBOX=$(command -v busybox) || die "busybox is missing (e2e/node/install.sh installs busybox-static)"
file_out=$(LC_ALL=C ldd "$BUSYBOX" 2>&1 || true)
[[ "$file_out" == *"not a dynamic executable"* ]] || die "$BUSYBOX is not statically linked (install busybox-static)"
mkdir -p "$OUT"

image() { python3 "$HERE/oci_image.py" "$@"; }
BB=(--file "/bin/busybox=$BUSYBOX" --busybox-links /bin/busybox --dir /tmp:1777)

image --name docker.io/local/busybox:1 --out "$OUT/busybox.tar" "${BB[@]}" --cmd '["sh"]'
image --name docker.io/local/pause:1 --out "$OUT/pause.tar" "${BB[@]}" \
  --entrypoint '["/bin/sleep","infinity"]'
image --name docker.io/local/proxy:1 --out "$OUT/proxy.tar" "${BB[@]}" \
  --file "/standin/proxy.sh=$HERE/standins/proxy.sh" \
  --file "/standin/www/index.html=$HERE/standins/www/index.html" \
  --entrypoint '["/bin/sh","/standin/proxy.sh"]'
image --name docker.io/local/log-shipper:1 --out "$OUT/log-shipper.tar" "${BB[@]}" \
  --file "/standin/log-shipper.sh=$HERE/standins/log-shipper.sh" \
  --entrypoint '["/bin/sh","/standin/log-shipper.sh"]'
