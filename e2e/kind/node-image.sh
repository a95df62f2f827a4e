#!/usr/bin/env bash
# Assembles a kind node image locally, with no registry: the root file system kind's
# images/base + `kind build node-image` would make, from this machine's pieces:
#   - a Debian bookworm root file system (mmdebstrap, cached) with the packages of kind's
#     images/base, plus Debian's containerd 1.6, runc and CNI plugins;
#   - kind's own files (entrypoint, units, containerd config, /kind/bin) from the kind module;
#   - kubeadm, kubelet, kubectl, crictl from e2e/kind/build.sh (Go module proxy);
#   - every image kubeadm and kind's manifests name, made here from those binaries
#     (e2e/node/oci_image.py) and imported into /var/lib/containerd (namespace k8s.io) by a
#     temporary containerd under the exact names kubeadm and the manifests use.
# Result, cached by a key of all its inputs:
#   $SIDECAR_INJECTOR_CACHE/kind/node-<K8S_VERSION>-<key>/node.tar  the root file system (tar)
#   .../image.env  KIND_NODE_IMAGE, KIND_NODE_TAR, KIND, KUBE_BIN, KIND_BIN, DOCKER_IMPORT_CHANGES
# A Docker engine loads it with `docker import` (e2e/kind/lib.sh: kind_node_image_load).
#
# Usage: e2e/kind/node-image.sh        (root; prints the image.env lines on stdout)
#   env K8S_VERSION (default v1.35.8), KIND_VERSION (default v0.33.0), SIDECAR_INJECTOR_CACHE
set -euo pipefail

HERE=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
E2E=$(cd -- "$HERE/.." && pwd)
export K8S_VERSION="${K8S_VERSION:-v1.35.8}"
export KIND_VERSION="${KIND_VERSION:-v0.33.0}"
DEBIAN_SUITE=bookworm
CACHE="${SIDECAR_INJECTOR_CACHE:-$HOME/.cache/sidecar-injector}/kind"
log() { printf '[node-image %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
[[ $# -eq 0 ]] || { sed -n '2,20p' "$0" >&2; exit 2; }
((EUID == 0)) || die "needs root (mmdebstrap, device nodes, a temporary containerd)"
for tool in mmdebstrap containerd ctr python3 gcc jq unshare flock; do
  command -v "$tool" >/dev/null || die "$tool is required (e2e/kind/install.sh installs the Debian packages)"
done
START=$(date +%s)

# What kind's images/base installs (less nfs-common, open-iscsi: network storage), plus the
# container runtime from Debian instead of kind's builds of containerd 2, runc 1.4, CNI 1.9.
NODE_PACKAGES=(systemd conntrack iptables nftables iproute2 ethtool util-linux mount kmod
  libseccomp2 pigz fuse-overlayfs e2fsprogs bash ca-certificates curl jq procps
  containerd runc containernetworking-plugins)
# The base of the kube-proxy, kindnetd stand-in and pause-less images: iptables and nft inside.
NET_PACKAGES=(iptables nftables conntrack iproute2 curl jq ca-certificates)

# ------------------------------------------------------------------ binaries
eval "$(bash "$HERE/build.sh" | grep -E '^(KUBE_BIN|KIND_BIN)=')"
[[ -n "${KUBE_BIN:-}" && -n "${KIND_BIN:-}" ]] || die "e2e/kind/build.sh gave no bin directories"
mod_dir() { go mod download -json "$1" | jq -r .Dir; }
KIND_SRC=$(mod_dir "sigs.k8s.io/kind@$KIND_VERSION")
K8S_SRC=$(mod_dir "k8s.io/kubernetes@$K8S_VERSION")
[[ -d "$KIND_SRC/images/base/files" ]] || die "no images/base/files in $KIND_SRC"
[[ -f "$K8S_SRC/build/pause/linux/pause.c" ]] || die "no build/pause/linux/pause.c in $K8S_SRC"

mapfile -t KUBEADM_IMAGES < <("$KUBE_BIN/kubeadm" config images list --kubernetes-version "$K8S_VERSION")
image_named() { # short name (kube-apiserver, coredns, pause, etcd ...) -> full name kubeadm uses
  local i
  for i in "${KUBEADM_IMAGES[@]}"; do
    [[ "${i##*/}" == "$1:"* ]] && { echo "$i"; return; }
  done
  die "kubeadm config images list names no $1 image"
}
# kind's manifests name their images as Go constants.
go_const() { # file name
  sed -n "s/^const $2 = \"\(.*\)\"$/\1/p" "$KIND_SRC/pkg/build/nodeimage/$1"
}
KINDNETD_IMAGE=$(go_const const_cni.go kindnetdImage)
STORAGE_IMAGE=$(go_const const_storage.go storageProvisionerImage)
STORAGE_HELPER_IMAGE=$(go_const const_storage.go storageHelperImage)
[[ -n "$KINDNETD_IMAGE" && -n "$STORAGE_IMAGE" && -n "$STORAGE_HELPER_IMAGE" ]] ||
  die "image constants not found in kind's const_cni.go / const_storage.go"
BUSYBOX=$(command -v busybox) || die "busybox is missing (e2e/kind/install.sh installs busybox-static)"
[[ "$(LC_ALL=C ldd "$BUSYBOX" 2>&1 || true)" == *"not a dynamic executable"* ]] ||
  die "$BUSYBOX is not statically linked (install busybox-static)"

# ------------------------------------------------------------------ Debian root file systems
rootfs_tar() { # name packages... -> path of a cached tar
  local name=$1
  shift
  local key
  key=$(printf '%s\n' "$DEBIAN_SUITE" "$@" | sha256sum | cut -c1-12)
  local tar="$CACHE/rootfs/$name-$DEBIAN_SUITE-$key.tar"
  if [[ ! -f "$tar" ]]; then
    mkdir -p "$CACHE/rootfs"
    local t0
    t0=$(date +%s)
    log "mmdebstrap $name ($DEBIAN_SUITE, ${#@} packages)"
    # mmdebstrap picks the output format by the name's extension: keep .tar on the partial one.
    mmdebstrap --quiet --variant=minbase --include="$(IFS=,; echo "$*")" "$DEBIAN_SUITE" \
      "${tar%.tar}.partial.tar" >&2 || die "mmdebstrap of $name failed"
    mv -f "${tar%.tar}.partial.tar" "$tar"
    log "mmdebstrap $name in $(($(date +%s) - t0))s"
  fi
  echo "$tar"
}
mkdir -p "$CACHE"
exec 8>"$CACHE/.lock"
flock 8
NODE_ROOTFS=$(rootfs_tar node "${NODE_PACKAGES[@]}")
NET_ROOTFS=$(rootfs_tar net "${NET_PACKAGES[@]}")

# ------------------------------------------------------------------ cache key
KEY=$({
  cat "$0" "$E2E/node/oci_image.py" "$HERE/kindnetd-standin.sh"
  echo "$K8S_VERSION $KIND_VERSION $NODE_ROOTFS $NET_ROOTFS"
  cat "$KUBE_BIN/.complete" "$KIND_BIN/.complete"
} | sha256sum | cut -c1-12)
OUT="$CACHE/node-$K8S_VERSION-$KEY"
# The tag carries the key: a Docker engine whose data root is kept between runs never runs an
# older image of the same version.
NODE_IMAGE="sidecar-injector.local/kind-node:$K8S_VERSION-$KEY"
print_env() { cat "$OUT/image.env"; }
if [[ -f "$OUT/.complete" ]]; then
  log "cached: $OUT"
  print_env
  exit 0
fi

WORK=$(mktemp -d "$CACHE/work.XXXXXX")
CTD_PID=""
cleanup() {
  local rc=$?
  if [[ -n "$CTD_PID" ]]; then kill "$CTD_PID" 2>/dev/null || true; wait "$CTD_PID" 2>/dev/null || true; fi
  rm -rf "$WORK"
  exit "$rc"
}
trap cleanup EXIT
ROOT="$WORK/rootfs"
mkdir -p "$ROOT"
log "assembling the node root file system in $WORK"
tar -xpf "$NODE_ROOTFS" -C "$ROOT" --numeric-owner

# ------------------------------------------------------------------ kind's images/base
F="$KIND_SRC/images/base/files"
install -m 0755 "$F"/usr/local/bin/* "$ROOT/usr/local/bin/"
mkdir -p "$ROOT/kind/bin" "$ROOT/LICENSES"
cp -r "$F/kind/." "$ROOT/kind/"
find "$ROOT/kind" -type f -exec chmod 0644 {} +
chmod 0755 "$ROOT/kind" "$ROOT/kind/bin" "$ROOT"/kind/bin/*
install -m 0644 "$F"/LICENSES/* "$ROOT/LICENSES/"
install -m 0644 "$F/etc/crictl.yaml" "$ROOT/etc/"
install -D -m 0644 -t "$ROOT/etc/containerd" "$F"/etc/containerd/*
install -m 0644 "$F"/etc/default/* "$ROOT/etc/default/"
install -m 0644 "$F"/etc/sysctl.d/* "$ROOT/etc/sysctl.d/"
install -m 0644 "$F"/etc/systemd/system/*.service "$F"/etc/systemd/system/*.slice "$ROOT/etc/systemd/system/"
install -D -m 0644 -t "$ROOT/etc/systemd/system/kubelet.service.d" "$F"/etc/systemd/system/kubelet.service.d/*
# The Dockerfile's clean-up of Debian's units, then kind's own enabled.
find "$ROOT/lib/systemd/system/sysinit.target.wants/" -name systemd-tmpfiles-setup.service -delete
rm -f "$ROOT"/lib/systemd/system/multi-user.target.wants/* "$ROOT"/etc/systemd/system/*.wants/* \
  "$ROOT"/lib/systemd/system/local-fs.target.wants/* "$ROOT"/lib/systemd/system/sockets.target.wants/*udev* \
  "$ROOT"/lib/systemd/system/sockets.target.wants/*initctl* "$ROOT"/lib/systemd/system/basic.target.wants/*
echo "ReadKMsg=no" >>"$ROOT/etc/systemd/journald.conf"
ln -sf /usr/lib/systemd/systemd "$ROOT/sbin/init"
systemctl --root="$ROOT" --quiet enable kubelet.service containerd.service undo-mount-hacks.service
systemctl --root="$ROOT" --quiet mask systemd-binfmt.service
mkdir -p "$ROOT/etc/kubernetes/manifests"

# ------------------------------------------------------------------ runtime, at kind's paths
for b in containerd ctr containerd-shim-runc-v2; do ln -sf "/usr/bin/$b" "$ROOT/usr/local/bin/$b"; done
mkdir -p "$ROOT/usr/local/sbin" "$ROOT/opt/cni/bin"
ln -sf /usr/sbin/runc "$ROOT/usr/local/sbin/runc"
for p in host-local loopback ptp portmap bridge; do ln -sf "/usr/lib/cni/$p" "$ROOT/opt/cni/bin/$p"; done
# kind's base image: `ctr oci spec` + the product-files hook, without rlimits.
chroot "$ROOT" /usr/bin/ctr oci spec |
  jq '.hooks.createContainer[.hooks.createContainer| length] |= . + {"path": "/kind/bin/mount-product-files.sh"}' |
  jq 'del(.process.rlimits)' >"$ROOT/etc/containerd/cri-base.json"
PAUSE_IMAGE=$(image_named pause)
CONFIG="$ROOT/etc/containerd/config.toml"
# The sandbox image kubeadm of this version names (kind's node build does the same), and
# restrict_oom_score_adj: this machine grants no CAP_SYS_RESOURCE, so a negative
# oom_score_adj (the kubelet asks -998 for sandboxes) is refused and runc fails.
sed -i -e "s#^\(  sandbox_image = \).*#\1\"$PAUSE_IMAGE\"#" \
  -e 's/restrict_oom_score_adj = false/restrict_oom_score_adj = true/' "$CONFIG"
grep -q "sandbox_image = \"$PAUSE_IMAGE\"" "$CONFIG" || die "could not set sandbox_image in $CONFIG"
grep -q 'restrict_oom_score_adj = true' "$CONFIG" || die "could not set restrict_oom_score_adj in $CONFIG"

# ------------------------------------------------------------------ Kubernetes
install -m 0755 "$KUBE_BIN/kubeadm" "$KUBE_BIN/kubelet" "$KUBE_BIN/kubectl" "$ROOT/usr/bin/"
install -m 0755 "$KIND_BIN/crictl" "$ROOT/usr/local/bin/"
echo "$K8S_VERSION" >"$ROOT/kind/version"
mkdir -p "$ROOT/kind/manifests"
# kind's default CNI and storage manifests, as `kind build node-image` writes them (the CNI one
# is still a template: kind fills in the pod subnet and the control-plane endpoint at create time).
manifest() { # go-file const-name NAME=value...
  python3 - "$KIND_SRC/pkg/build/nodeimage/$1" "${@:2}" <<'EOF'
import re, sys
src = open(sys.argv[1]).read()
# The constant ends with a backtick alone on its line; images are spliced in with ` + name + `.
m = re.search(r"const " + sys.argv[2] + r" = `(.*?\n)`\n", src, re.S)
if not m:
    sys.exit(sys.argv[2] + " not found in " + sys.argv[1])
text = m.group(1)
for kv in sys.argv[3:]:
    k, v = kv.split("=", 1)
    text = text.replace("` + " + k + " + `", v)
if "` + " in text:
    sys.exit("a constant is left unreplaced in " + sys.argv[2])
sys.stdout.write(text)
EOF
}
manifest const_cni.go defaultCNIManifest "kindnetdImage=$KINDNETD_IMAGE" >"$ROOT/kind/manifests/default-cni.yaml"
manifest const_storage.go defaultStorageManifest "storageProvisionerImage=$STORAGE_IMAGE" \
  "storageHelperImage=$STORAGE_HELPER_IMAGE" >"$ROOT/kind/manifests/default-storage.yaml"
grep -q "image: $KINDNETD_IMAGE" "$ROOT/kind/manifests/default-cni.yaml" || die "default-cni.yaml names no $KINDNETD_IMAGE"
grep -q "image: $STORAGE_IMAGE" "$ROOT/kind/manifests/default-storage.yaml" || die "default-storage.yaml names no $STORAGE_IMAGE"

# ------------------------------------------------------------------ images
IMG="$WORK/images"
mkdir -p "$IMG"
gcc -Os -static -DVERSION="${PAUSE_IMAGE##*:}" -o "$WORK/pause" "$K8S_SRC/build/pause/linux/pause.c"
strip "$WORK/pause"
oci() { python3 "$E2E/node/oci_image.py" "$@" >&2; }
for c in kube-apiserver kube-controller-manager kube-scheduler etcd; do
  oci --name "$(image_named "$c")" --out "$IMG/$c.tar" \
    --file "/usr/local/bin/$c=$KUBE_BIN/$c" --dir /tmp:1777 --entrypoint "[\"/usr/local/bin/$c\"]"
done
oci --name "$(image_named coredns)" --out "$IMG/coredns.tar" \
  --file "/coredns=$KIND_BIN/coredns" --dir /tmp:1777 --entrypoint '["/coredns"]'
oci --name "$PAUSE_IMAGE" --out "$IMG/pause.tar" --file "/pause=$WORK/pause" \
  --entrypoint '["/pause"]' --user 65535:65535
oci --name "$(image_named kube-proxy)" --out "$IMG/kube-proxy.tar" --base-tar "$NET_ROOTFS" \
  --file "/usr/local/bin/kube-proxy=$KUBE_BIN/kube-proxy" --entrypoint '["/usr/local/bin/kube-proxy"]'
# kind's local-path-provisioner (static binary, run as `local-path-provisioner ...`) and its
# helper (kind's holds sh, mkdir and rm for the setup/teardown scripts: busybox here).
oci --name "$STORAGE_IMAGE" --out "$IMG/local-path-provisioner.tar" \
  --file "/usr/local/bin/local-path-provisioner=$KIND_BIN/local-path-provisioner" --dir /tmp:1777 \
  --entrypoint '["/usr/local/bin/local-path-provisioner"]'
oci --name "$STORAGE_HELPER_IMAGE" --out "$IMG/local-path-helper.tar" \
  --file "/bin/busybox=$BUSYBOX" --busybox-links /bin/busybox --dir /tmp:1777
oci --name "$KINDNETD_IMAGE" --out "$IMG/kindnetd.tar" --base-tar "$NET_ROOTFS" \
  --file "/usr/local/bin/kindnetd=$HERE/kindnetd-standin.sh" \
  --entrypoint '["/usr/local/bin/kindnetd"]'

# A temporary containerd (Debian's, the node's own version) on the node's /var/lib/containerd,
# in a private mount namespace (its unpack mounts stay there) and without network.
log "importing ${#KUBEADM_IMAGES[@]}+3 images into the node's containerd (k8s.io)"
cat >"$WORK/containerd.toml" <<EOF
version = 2
root = "$ROOT/var/lib/containerd"
state = "$WORK/containerd-state"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "$WORK/containerd.sock"
EOF
unshare --net --mount --propagation private -- containerd --config "$WORK/containerd.toml" \
  >"$WORK/containerd.log" 2>&1 &
CTD_PID=$!
CTR=(ctr --address "$WORK/containerd.sock" --namespace k8s.io)
for _ in $(seq 50); do "${CTR[@]}" version >/dev/null 2>&1 && break; sleep 0.2; done
"${CTR[@]}" version >/dev/null || { cat "$WORK/containerd.log" >&2; die "temporary containerd did not start"; }
for t in "$IMG"/*.tar; do
  "${CTR[@]}" images import --snapshotter overlayfs "$t" >&2
done
for name in "${KUBEADM_IMAGES[@]}" "$KINDNETD_IMAGE" "$STORAGE_IMAGE" "$STORAGE_HELPER_IMAGE"; do
  "${CTR[@]}" images label "$name" io.cri-containerd.pinned=pinned >/dev/null ||
    die "image $name was not imported"
done
"${CTR[@]}" images ls -q >"$WORK/images.txt"
kill "$CTD_PID"
wait "$CTD_PID" || true
CTD_PID=""
rm -rf "$ROOT/var/lib/containerd/tmpmounts"

# ------------------------------------------------------------------ pack
mkdir -p "$OUT.tmp"
log "packing $OUT/node.tar"
tar -C "$ROOT" --numeric-owner -cf "$OUT.tmp/node.tar" .
cp "$WORK/images.txt" "$OUT.tmp/images.txt"
{
  echo "KIND_NODE_IMAGE=$NODE_IMAGE"
  echo "KIND_NODE_TAR=$OUT/node.tar"
  echo "KIND=$KIND_BIN/kind"
  echo "KUBE_BIN=$KUBE_BIN"
  echo "KIND_BIN=$KIND_BIN"
} >"$OUT.tmp/image.env"
echo "seconds=$(($(date +%s) - START))" >"$OUT.tmp/.complete"
rm -rf "$OUT"
mv "$OUT.tmp" "$OUT"
# Older node images of this version (other inputs) are 1.5 GB each: keep only this one.
for old in "$CACHE/node-$K8S_VERSION-"*; do
  [[ "$old" == "$OUT" ]] || rm -rf "$old"
done
log "done in $(($(date +%s) - START))s: $OUT"
print_env
