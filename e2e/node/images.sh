#!/usr/bin/env bash
# Builds the e2e node's images as OCI layout tars (oci_image.py), from files on this machine:
#   docker.io/local/busybox:1            busybox-static and its applets: the test applications
#   docker.io/local/pause:1              the same files, entrypoint `sleep infinity`: the sandbox
#   docker.io/local/proxy:1              stand-in for Envoy (standins/proxy.sh)
#   docker.io/local/log-shipper:1        stand-in for fluent-bit (standins/log-shipper.sh)
#   docker.io/local/sidecar-injector:e2e the release binary in the Dockerfile's layout
# The injector image follows the Dockerfile: the binary's path, the templates' path, USER and
# ENTRYPOINT are read from it (and this fails if it no longer has that shape); the libraries the
# distroless base provides are the binary's own (`ldd`).
#
# Usage: e2e/node/images.sh OUT_DIR RELEASE_BINARY
# Prints one "name digest" line per image; the tars are OUT_DIR/<short name>.tar.
set -euo pipefail

HERE=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd -- "$HERE/../.." && pwd)
[[ $# -eq 2 ]] || { sed -n '2,15p' "$0" >&2; exit 2; }
OUT=$1
BIN=$2
die() { echo "images.sh: $*" >&2; exit 1; }
[[ -x "$BIN" ]] || die "$BIN is not an executable"
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

# ------------------------------------------------ the injector, in the Dockerfile's layout
DOCKERFILE="$REPO/Dockerfile"
final_stage=$(awk '/^FROM /{buf=""} {buf=buf $0 "\n"} END{printf "%s", buf}' "$DOCKERFILE")
bin_dest=$(sed -n 's#^COPY --from=builder /out/sidecar-injector \(/[^ ]*\)$#\1#p' <<<"$final_stage")
tpl_dest=$(sed -n 's#^COPY templates/ \(/[^ ]*\)$#\1#p' <<<"$final_stage")
user=$(sed -n 's#^USER \([0-9]*:[0-9]*\)$#\1#p' <<<"$final_stage")
entrypoint=$(sed -n 's#^ENTRYPOINT \(\[.*\]\)$#\1#p' <<<"$final_stage")
[[ -n "$bin_dest" && -n "$tpl_dest" && -n "$user" && -n "$entrypoint" ]] ||
  die "the Dockerfile's final stage no longer has the shape this script reads (COPY of the binary and templates/, USER uid:gid, ENTRYPOINT [...]); update images.sh with it"
args=(--name docker.io/local/sidecar-injector:e2e --out "$OUT/sidecar-injector.tar"
  --file "$bin_dest=$BIN" --dir /tmp:1777 --user "$user" --entrypoint "$entrypoint")
for f in "$REPO"/templates/*; do
  args+=(--file "${tpl_dest%/}/$(basename "$f")=$f")
done
# Each library the binary loads, at the path the loader looks for it (distroless cc has these).
while read -r lib; do
  [[ -n "$lib" ]] && args+=(--file "$lib=$lib")
done < <(ldd "$BIN" | sed -n 's#.*=> \(/[^ ]*\) .*#\1#p; s#^[[:space:]]*\(/[^ ]*\) (.*#\1#p')
image "${args[@]}"
