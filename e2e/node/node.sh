#!/usr/bin/env bash
# The e2e node: containerd (CRI) + runc + CNI, kubelet and kube-scheduler, next to the control
# plane of e2e/control-plane/up.sh. Run only inside the network and mount namespace that
# e2e/node/run.sh creates (unshare -n -m): every address below exists only there.
#
# Usage (inside the namespace): e2e/node/node.sh up WORKDIR IMAGES_DIR | down WORKDIR
#   env CONTROL_PLANE_BIN_DIR  kubelet and kube-scheduler (built by e2e/control-plane/build.sh)
# `up` expects the control plane started with CONTROL_PLANE_NODE_IP=$NODE_IP (WORKDIR/env); it
# starts containerd, imports IMAGES_DIR/*.tar, starts the kubelet and the scheduler, and waits
# for the node to be Ready. `down` stops the kubelet and the scheduler, kills every pod's task,
# stops containerd and removes the node's cgroups.
set -euo pipefail

HERE=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=../control-plane/lib.sh source-path=SCRIPTDIR
. "$HERE/../control-plane/lib.sh"

NODE_NAME=e2e-node
NODE_IP=192.168.77.2
NODE_GW=192.168.77.1
POD_SUBNET=10.88.0.0/24
# The pods' cgroups, under every controller's hierarchy, one per run (WORKDIR's name), so two
# runs never share one; removed by `down`.
cgroup_root() { echo "/sidecar-injector-e2e-$(basename "$1")"; }

log() { printf '[node %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

in_own_netns() {
  [[ "$(readlink /proc/self/ns/net)" != "$(readlink /proc/1/ns/net)" ]]
}

# ------------------------------------------------------------------ network and mounts
# Loopback, and a veth pair whose one end carries the node's address and a default route: the
# kubelet needs an address to report, the apiserver dials it for logs and exec. Nothing is
# connected beyond the pair: no packet leaves the namespace.
setup_namespace() { # workdir
  local w=$1
  in_own_netns || die "not in a network namespace of its own: run e2e/node/run.sh"
  ip link set lo up
  ip link add e2e-node type veth peer name e2e-gw
  ip addr add "$NODE_IP/24" dev e2e-node
  ip link set e2e-node up
  ip link set e2e-gw up
  ip route add default via "$NODE_GW" dev e2e-node onlink
  # Paths containerd and the kubelet use whatever their configuration says: fresh, empty and
  # private to this mount namespace.
  local d
  for d in /run/containerd /run/netns /var/log/containers /var/lib/cni /run/flannel; do
    mkdir -p "$d"
    mount -t tmpfs -o mode=0755 tmpfs "$d"
  done
  mkdir -p "$w"/{containerd,cni/net.d,cni/ipam,kubelet,pod-logs,images}
  # Name lookups go to this namespace's loopback, where nothing answers: an image pull that
  # should never happen fails at once instead of sending a packet anywhere.
  echo "nameserver 127.0.0.1" >"$w/resolv.conf"
  mount --bind "$w/resolv.conf" /etc/resolv.conf
}

write_containerd_config() { # workdir
  local w=$1
  cat >"$w/containerd/config.toml" <<TOML
version = 2
root = "$w/containerd/root"
state = "$w/containerd/state"
[grpc]
  address = "$w/containerd/containerd.sock"
[ttrpc]
  address = "$w/containerd/containerd.sock.ttrpc"
[debug]
  level = "warn"
[plugins."io.containerd.internal.v1.opt"]
  path = "$w/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  # Images come from ctr import only; the sandbox image is one of them (its full name: the CRI
  # normalizes local/pause:1 to docker.io/local/pause:1).
  sandbox_image = "docker.io/local/pause:1"
  # This sandbox cannot lower oom_score_adj (no CAP_SYS_RESOURCE); without this runc fails.
  restrict_oom_score_adj = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$w/cni/net.d"
TOML
  cat >"$w/cni/net.d/10-e2e.conflist" <<JSON
{
  "cniVersion": "1.0.0",
  "name": "e2e",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "e2e-cni0",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "$POD_SUBNET"}]],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dataDir": "$w/cni/ipam"
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}},
    {"type": "loopback"}
  ]
}
JSON
}

write_kubelet_config() { # workdir
  local w=$1
  # shellcheck source=/dev/null
  . "$w/env"
  local pki="$CONTROL_PLANE_WORKDIR/pki"
  cat >"$w/kubelet/kubeconfig" <<EOF2
apiVersion: v1
kind: Config
clusters:
- name: e2e
  cluster:
    server: $APISERVER_URL
    certificate-authority: $pki/ca.crt
users:
- name: kubelet
  user:
    client-certificate: $pki/kubelet.crt
    client-key: $pki/kubelet.key
contexts:
- name: e2e
  context: {cluster: e2e, user: kubelet}
current-context: e2e
EOF2
  cat >"$w/kubelet/config.yaml" <<EOF2
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# This machine runs cgroup v1: kubelet 1.35 refuses it unless told, and drives it by cgroupfs.
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: $(cgroup_root "$w")
failSwapOn: false
containerRuntimeEndpoint: unix://$w/containerd/containerd.sock
address: $NODE_IP
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: $pki/client-ca.crt}
authorization: {mode: AlwaysAllow}
podLogsDir: $w/pod-logs
# A busy disk must neither evict the test pods nor collect the imported images.
evictionHard: {}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
# Secret and ConfigMap volumes follow their objects within seconds (certificate rotation).
syncFrequency: 5s
serializeImagePulls: false
resolvConf: ""
clusterDomain: cluster.local
registerNode: true
nodeStatusUpdateFrequency: 4s
EOF2
}

start_proc() { # workdir name args...
  local w=$1 name=$2
  shift 2
  log "starting $name"
  setsid "$@" >>"$w/logs/$name.log" 2>&1 </dev/null &
  echo "$!" >"$w/run/$name.pid"
  cp_wait_exec "$!" "$w"
}

wait_until() { # seconds description command...
  local limit=$1 what=$2 t0=$SECONDS name
  shift 2
  until "$@" >/dev/null 2>&1; do
    for name in containerd kubelet kube-scheduler; do
      [[ -f "$W/run/$name.pid" ]] || continue
      cp_alive "$(<"$W/run/$name.pid")" "$W" ||
        die "$name exited; last lines of $W/logs/$name.log: $(tail -n 5 "$W/logs/$name.log")"
    done
    ((SECONDS - t0 < limit)) || die "timed out after ${limit}s waiting for $what"
    sleep 0.25
  done
  log "ready: $what ($((SECONDS - t0))s)"
}

# The kubelet wants its cgroupRoot to exist under every controller (cgroup v1); a cpuset
# cgroup starts without CPUs or memory nodes, so it gets its parent's. (On cgroup v2, one
# directory; not tried here: this machine runs v1.)
make_cgroups() { # workdir
  local c root
  root=$(cgroup_root "$1")
  if [[ -f /sys/fs/cgroup/cgroup.controllers ]]; then
    mkdir -p "/sys/fs/cgroup$root"
    return 0
  fi
  for c in /sys/fs/cgroup/*/; do
    c=${c%/}
    [[ -f "$c/cgroup.procs" ]] || continue
    mkdir -p "$c$root"
    if [[ -f "$c/cpuset.cpus" ]]; then
      cat "$c/cpuset.cpus" >"$c$root/cpuset.cpus"
      cat "$c/cpuset.mems" >"$c$root/cpuset.mems"
    fi
  done
}

CTR() { ctr --address "$W/containerd/containerd.sock" --namespace k8s.io "$@"; }

up() { # workdir images_dir
  W=$1
  local images=$2 bin=${CONTROL_PLANE_BIN_DIR:?}
  [[ -f "$W/env" ]] || die "no $W/env: start the control plane first"
  # shellcheck source=/dev/null
  . "$W/env"
  # What kube-proxy does for the `kubernetes` Service: its cluster IP, port 443, goes to the
  # API server on the node's address, so that pods reach the API as in any cluster (the
  # injector applies its backstop there). Inside this namespace only.
  local port=${APISERVER_URL##*:}
  iptables -t nat -A PREROUTING -d "${KUBERNETES_SERVICE_IP:?}" -p tcp --dport 443 \
    -j DNAT --to-destination "$NODE_IP:$port" ||
    die "cannot forward the kubernetes Service's address to the API server (iptables nat)"
  write_containerd_config "$W"
  start_proc "$W" containerd containerd --config "$W/containerd/config.toml"
  wait_until 30 "containerd" CTR version
  local tar
  for tar in "$images"/*.tar; do
    CTR images import --no-unpack=false "$tar" >>"$W/logs/ctr-import.log" 2>&1 ||
      die "ctr images import $tar failed (see $W/logs/ctr-import.log)"
  done
  log "images: $(CTR images ls -q | grep -c '^docker.io/local/') imported"

  write_kubelet_config "$W"
  make_cgroups "$W"
  start_proc "$W" kubelet "$bin/kubelet" \
    --config="$W/kubelet/config.yaml" \
    --kubeconfig="$W/kubelet/kubeconfig" \
    --root-dir="$W/kubelet/root" \
    --cert-dir="$W/kubelet/pki" \
    --node-ip="$NODE_IP" \
    --hostname-override="$NODE_NAME" \
    --v=1
  start_proc "$W" kube-scheduler "$bin/kube-scheduler" \
    --kubeconfig="$KUBECONFIG" \
    --authentication-kubeconfig="$KUBECONFIG" \
    --authorization-kubeconfig="$KUBECONFIG" \
    --bind-address=127.0.0.1 \
    --secure-port=10259 \
    --leader-elect=false \
    --v=1
  local admin=(curl --silent --show-error --fail --noproxy '*' --max-time 5
    --cacert "$CA_CERT" --cert "$ADMIN_CERT" --key "$ADMIN_KEY")
  node_ready() {
    "${admin[@]}" "$APISERVER_URL/api/v1/nodes/$NODE_NAME" |
      tr -d ' \n' | grep -q '"type":"Ready","status":"True"'
  }
  wait_until 90 "node $NODE_NAME Ready" node_ready
  wait_until 30 "kube-scheduler healthz" curl --silent --fail --insecure https://127.0.0.1:10259/healthz
  cat >>"$W/env" <<EOF2
export NODE_NAME='$NODE_NAME'
export NODE_IP='$NODE_IP'
export CONTAINERD_ADDRESS='$W/containerd/containerd.sock'
EOF2
}

stop_pidfile() { # workdir name
  local pidfile="$1/run/$2.pid" pid
  [[ -f "$pidfile" ]] || return 0
  pid=$(<"$pidfile")
  cp_stop_pid "$pid" "$1" "$2" || return 1
  rm -f "$pidfile"
}

# Kills what is still in the node's cgroups and waits (5 s at most) until they are empty: all of
# it is the run's. A container that was being created when teardown killed its shim leaves its
# `runc init` waiting for a start that never comes, holding its cgroup (seen once in a CI run).
kill_cgroup_procs() { # workdir
  local root pids i
  root=$(cgroup_root "$1")
  for ((i = 0; i < 50; i++)); do
    pids=$(find /sys/fs/cgroup/*"$root" "/sys/fs/cgroup$root" -name cgroup.procs \
      -exec cat {} + 2>/dev/null | sort -u) || true # (a hierarchy may be missing)
    [[ -n "$pids" ]] || return 0
    # shellcheck disable=SC2086 # one pid a word
    kill -KILL $pids 2>/dev/null || true
    sleep 0.1
  done
}

remove_cgroups() { # workdir
  local d root
  root=$(cgroup_root "$1")
  kill_cgroup_procs "$1"
  for d in /sys/fs/cgroup/*"$root" "/sys/fs/cgroup$root"; do
    [[ -d "$d" ]] || continue
    # Deepest first: a cgroup directory goes only when empty of children.
    find "$d" -depth -type d -exec rmdir {} + 2>/dev/null || true
  done
}

down() { # workdir
  W=$1
  local rc=0 t
  stop_pidfile "$W" kubelet || rc=1
  stop_pidfile "$W" kube-scheduler || rc=1
  if [[ -S "$W/containerd/containerd.sock" ]]; then
    for t in $(CTR tasks ls -q 2>/dev/null); do
      CTR tasks kill -s SIGKILL "$t" >/dev/null 2>&1 || true
    done
    sleep 0.5
    for t in $(CTR tasks ls -q 2>/dev/null); do
      CTR tasks rm -f "$t" >/dev/null 2>&1 || true
    done
  fi
  stop_pidfile "$W" containerd || rc=1
  # A shim whose containerd is gone: named by its -address under WORKDIR.
  pkill -KILL -f -- "containerd-shim.*$W/" 2>/dev/null || true
  remove_cgroups "$W"
  return "$rc"
}

case "${1:-}" in
  setup) setup_namespace "$2" ;;
  up) up "$2" "$3" ;;
  down) down "$2" ;;
  *) sed -n '2,12p' "$0" >&2; exit 2 ;;
esac
