#!/usr/bin/env bash
# The e2e node: containerd (CRI) + runc + CNI, kubelet and kube-scheduler, next to the control
# plane of e2e/control-plane/up.sh. Run only inside the network and mount namespace that
# e2e/node/run.sh creates (unshare -n -m): every address below exists only there.
#
# Usage (inside the namespace): e2e/node/node.sh up WORKDIR IMAGES_DIR | down WORKDIR
#                                | up2 WORKDIR IMAGES_DIR | fail2 WORKDIR | revive2 WORKDIR
#   env CONTROL_PLANE_BIN_DIR  kubelet and kube-scheduler (built by e2e/control-plane/build.sh)
# `up` expects the control plane started with CONTROL_PLANE_NODE_IP=$NODE_IP (WORKDIR/env); it
# starts containerd, imports IMAGES_DIR/*.tar, starts the kubelet and the scheduler, and waits
# for the node to be Ready. `down` stops the kubelet and the scheduler, kills every pod's task,
# stops containerd and removes the node's cgroups (the second node's too, when there is one).
# `up2` (E2E_NODES=2) adds a second node, e2e-node-2, in a network namespace of its own (a child
# of the run's, joined to it by a veth pair): its own containerd, kubelet, pod subnet and CNI
# bridge, the same binaries and images. `fail2` makes it die without warning: every packet
# to or from it dropped, then its kubelet, containerd and containers killed; `revive2` lifts the
# drop and starts its containerd and kubelet again.
set -euo pipefail

HERE=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=../control-plane/lib.sh source-path=SCRIPTDIR
. "$HERE/../control-plane/lib.sh"

NODE_NAME=e2e-node
NODE_IP=192.168.77.2
NODE_GW=192.168.77.1
POD_SUBNET=10.88.0.0/24
# The second node (up2): its network namespace, the veth between the two (e2e-n2 in the run's
# namespace, eth0 in the node's), its address and its pods' subnet, routed through it.
NODE2_NAME=e2e-node-2
NODE2_NETNS=e2e-node2
NODE2_IP=192.168.78.2
NODE2_GW=192.168.78.1
NODE2_LINK=e2e-n2
POD2_SUBNET=10.88.1.0/24
# The pods' cgroups, under every controller's hierarchy, one per run (WORKDIR's name) and node,
# so two runs or two nodes never share one; removed by `down`.
cgroup_root() { echo "/sidecar-injector-e2e-$(basename "$1")${2:-}"; } # workdir [node suffix]

# What differs between the two nodes: set by node_vars 1|2.
#   ND   the node's directory (containerd/, kubelet/, cni/, pod-logs/): WORKDIR or WORKDIR/node2
#   NP   prefix of its logs and pid files (logs/NPkubelet.log, run/NPkubelet.pid)
#   NX   the command prefix that runs a program in its network namespace (empty for node 1)
#   CG   its cgroup suffix
node_vars() { # workdir 1|2
  if [[ "$2" == 1 ]]; then
    N_NAME=$NODE_NAME N_IP=$NODE_IP N_SUBNET=$POD_SUBNET ND=$1 NP="" NX=() CG=""
  else
    N_NAME=$NODE2_NAME N_IP=$NODE2_IP N_SUBNET=$POD2_SUBNET ND=$1/node2 NP=node2- CG=-node2
    NX=(nsenter "--net=/run/netns/$NODE2_NETNS" --)
  fi
}

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

write_containerd_config() { # node dir
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
        "ranges": [[{"subnet": "$N_SUBNET"}]],
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

write_kubelet_config() { # workdir node-dir server client-cert client-key
  local W0=$1 w=$2 server=$3 cert=$4 key=$5
  # shellcheck source=/dev/null
  . "$W0/env"
  local pki="$CONTROL_PLANE_WORKDIR/pki"
  cat >"$w/kubelet/kubeconfig" <<EOF2
apiVersion: v1
kind: Config
clusters:
- name: e2e
  cluster:
    server: $server
    certificate-authority: $pki/ca.crt
users:
- name: kubelet
  user:
    client-certificate: $cert
    client-key: $key
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
cgroupRoot: $(cgroup_root "$W0" "$CG")
failSwapOn: false
containerRuntimeEndpoint: unix://$w/containerd/containerd.sock
address: $N_IP
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
  local w=$1 name=$2 pid i
  shift 2
  log "starting $name"
  setsid "$@" >>"$w/logs/$name.log" 2>&1 </dev/null &
  pid=$!
  echo "$pid" >"$w/run/$name.pid"
  cp_wait_exec "$pid" "$w"
  # Started through nsenter (the second node): wait for its second exec as well.
  for ((i = 0; i < 50; i++)); do
    [[ "$(cat "/proc/$pid/comm" 2>/dev/null)" == nsenter ]] || break
    sleep 0.1
  done
}

wait_until() { # seconds description command...
  local limit=$1 what=$2 t0=$SECONDS name
  shift 2
  until "$@" >/dev/null 2>&1; do
    for name in containerd kubelet kube-scheduler node2-containerd node2-kubelet; do
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
make_cgroups() { # workdir [node suffix]
  local c root
  root=$(cgroup_root "$1" "${2:-}")
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

CTR() { ctr --address "$ND/containerd/containerd.sock" --namespace k8s.io "$@"; }

# containerd of the node (node_vars), its images imported from IMAGES_DIR.
start_containerd() { # workdir images_dir
  local tar
  mkdir -p "$ND"/{containerd,cni/net.d,cni/ipam,kubelet,pod-logs}
  write_containerd_config "$ND"
  start_proc "$W" "${NP}containerd" "${NX[@]}" containerd --config "$ND/containerd/config.toml"
  wait_until 30 "${NP}containerd" CTR version
  [[ -n "$2" ]] || return 0
  for tar in "$2"/*.tar; do
    CTR images import --no-unpack=false "$tar" >>"$W/logs/${NP}ctr-import.log" 2>&1 ||
      die "ctr images import $tar failed (see $W/logs/${NP}ctr-import.log)"
  done
  log "images: $(CTR images ls -q | grep -c '^docker.io/local/') imported into ${NP}containerd"
}

start_kubelet() { # workdir
  local bin=${CONTROL_PLANE_BIN_DIR:?}
  make_cgroups "$W" "$CG"
  start_proc "$W" "${NP}kubelet" "${NX[@]}" "$bin/kubelet" \
    --config="$ND/kubelet/config.yaml" \
    --kubeconfig="$ND/kubelet/kubeconfig" \
    --root-dir="$ND/kubelet/root" \
    --cert-dir="$ND/kubelet/pki" \
    --node-ip="$N_IP" \
    --hostname-override="$N_NAME" \
    --v=1
}

admin_curl() {
  curl --silent --show-error --fail --noproxy '*' --max-time 5 \
    --cacert "$CA_CERT" --cert "$ADMIN_CERT" --key "$ADMIN_KEY" "$@"
}
node_ready() { # name
  admin_curl "$APISERVER_URL/api/v1/nodes/$1" | tr -d ' \n' | grep -q '"type":"Ready","status":"True"'
}

up() { # workdir images_dir
  W=$1
  local images=$2
  [[ -f "$W/env" ]] || die "no $W/env: start the control plane first"
  # shellcheck source=/dev/null
  . "$W/env"
  node_vars "$W" 1
  # What kube-proxy does for the `kubernetes` Service: its cluster IP, port 443, goes to the
  # API server on the node's address, so that pods reach the API as in any cluster (the
  # injector applies its backstop there). Inside this namespace only.
  local port=${APISERVER_URL##*:}
  iptables -t nat -A PREROUTING -d "${KUBERNETES_SERVICE_IP:?}" -p tcp --dport 443 \
    -j DNAT --to-destination "$NODE_IP:$port" ||
    die "cannot forward the kubernetes Service's address to the API server (iptables nat)"
  start_containerd "$W" "$images"
  local pki="$CONTROL_PLANE_WORKDIR/pki"
  write_kubelet_config "$W" "$W" "$APISERVER_URL" "$pki/kubelet.crt" "$pki/kubelet.key"
  start_kubelet "$W"
  start_proc "$W" kube-scheduler "${CONTROL_PLANE_BIN_DIR:?}/kube-scheduler" \
    --kubeconfig="$KUBECONFIG" \
    --authentication-kubeconfig="$KUBECONFIG" \
    --authorization-kubeconfig="$KUBECONFIG" \
    --bind-address=127.0.0.1 \
    --secure-port=10259 \
    --leader-elect=false \
    --v=1
  wait_until 90 "node $NODE_NAME Ready" node_ready "$NODE_NAME"
  wait_until 30 "kube-scheduler healthz" curl --silent --fail --insecure https://127.0.0.1:10259/healthz
  cat >>"$W/env" <<EOF2
export NODE_NAME='$NODE_NAME'
export NODE_IP='$NODE_IP'
export CONTAINERD_ADDRESS='$W/containerd/containerd.sock'
EOF2
}

# ------------------------------------------------------------------ the second node
# Its network namespace, named under /run/netns (a tmpfs of this mount namespace: it goes with
# the run), joined to the run's by a veth pair; each side routes the other's pod subnet. The
# run's namespace forwards between the first node's bridge and the pair; nothing else is
# connected: no packet leaves the run's namespaces.
setup_node2_network() { # workdir
  local port=${APISERVER_URL##*:}
  ip netns add "$NODE2_NETNS"
  local N=(ip netns exec "$NODE2_NETNS")
  ip link add "$NODE2_LINK" type veth peer name eth0 netns "$NODE2_NETNS"
  ip addr add "$NODE2_GW/24" dev "$NODE2_LINK"
  ip link set "$NODE2_LINK" up
  ip route add "$POD2_SUBNET" via "$NODE2_IP" dev "$NODE2_LINK"
  "${N[@]}" ip link set lo up
  "${N[@]}" ip addr add "$NODE2_IP/24" dev eth0
  "${N[@]}" ip link set eth0 up
  "${N[@]}" ip route add default via "$NODE2_GW" dev eth0
  # Both namespaces route between pod subnets (a fresh namespace does not forward).
  echo 1 >/proc/sys/net/ipv4/ip_forward
  "${N[@]}" sh -c 'echo 1 >/proc/sys/net/ipv4/ip_forward'
  # The `kubernetes` Service for this node's pods, as on the first node.
  "${N[@]}" iptables -t nat -A PREROUTING -d "${KUBERNETES_SERVICE_IP:?}" -p tcp --dport 443 \
    -j DNAT --to-destination "$NODE_IP:$port" ||
    die "cannot forward the kubernetes Service's address on $NODE2_NAME (iptables nat)"
}

up2() { # workdir images_dir
  W=$1
  local images=$2
  # shellcheck source=/dev/null
  . "$W/env"
  [[ -n "${NODE_NAME:-}" ]] || die "start the first node first (node.sh up)"
  node_vars "$W" 2
  setup_node2_network "$W"
  # Its own identity for the Node authorizer: system:node:e2e-node-2, from the clients' CA.
  local pki="$CONTROL_PLANE_WORKDIR/pki" cp=$ND/kubelet/client
  mkdir -p "$cp"
  {
    openssl req -new -newkey rsa:2048 -nodes -keyout "$cp/kubelet.key" -out "$cp/kubelet.csr" \
      -subj "/O=system:nodes/CN=system:node:$NODE2_NAME" &&
      printf 'basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n' \
        >"$cp/kubelet.ext" &&
      openssl x509 -req -in "$cp/kubelet.csr" -CA "$pki/client-ca.crt" -CAkey "$pki/client-ca.key" \
        -CAcreateserial -CAserial "$cp/ca.srl" -days 2 -sha256 -extfile "$cp/kubelet.ext" \
        -out "$cp/kubelet.crt"
  } >>"$W/logs/openssl.log" 2>&1 || die "cannot sign $NODE2_NAME's kubelet certificate"
  chmod 600 "$cp/kubelet.key"
  start_containerd "$W" "$images"
  # It reaches the API server at the first node's address (its certificate names it).
  write_kubelet_config "$W" "$ND" "https://$NODE_IP:${APISERVER_URL##*:}" "$cp/kubelet.crt" "$cp/kubelet.key"
  start_kubelet "$W"
  wait_until 90 "node $NODE2_NAME Ready" node_ready "$NODE2_NAME"
  cat >>"$W/env" <<EOF2
export NODE2_NAME='$NODE2_NAME'
export NODE2_IP='$NODE2_IP'
EOF2
}

# The drop rules of fail2, in the run's namespace: every packet to or from the second node.
DROP_RULES=("INPUT -i $NODE2_LINK" "OUTPUT -o $NODE2_LINK" "FORWARD -i $NODE2_LINK" "FORWARD -o $NODE2_LINK")
drop2() { # -I|-D
  local r rc=0
  for r in "${DROP_RULES[@]}"; do
    # shellcheck disable=SC2086 # a chain and its match, one word each
    iptables "$1" $r -j DROP 2>/dev/null || rc=1
  done
  return "$rc"
}

# The second node dies without warning: its network first (a dead node answers nothing, not even
# a reset), then everything of it killed at once: kubelet, containerd, shims, containers.
fail2() { # workdir
  W=$1
  node_vars "$W" 2
  drop2 -I || die "cannot drop the second node's packets (iptables)"
  local name
  for name in node2-kubelet node2-containerd; do
    [[ -f "$W/run/$name.pid" ]] && kill -KILL "$(<"$W/run/$name.pid")" 2>/dev/null || true
  done
  kill_shims
  kill_cgroup_procs "$W" "$CG"
  log "$NODE2_NAME failed: packets dropped, kubelet, containerd and containers killed"
}

revive2() { # workdir
  W=$1
  # shellcheck source=/dev/null
  . "$W/env"
  node_vars "$W" 2
  while drop2 -D; do :; done
  rm -f "$W/run/node2-kubelet.pid" "$W/run/node2-containerd.pid"
  start_containerd "$W" ""
  start_kubelet "$W"
  wait_until 90 "node $NODE2_NAME Ready again" node_ready "$NODE2_NAME"
}

# ------------------------------------------------------------------ teardown
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
kill_cgroup_procs() { # workdir [node suffix]
  local root pids i
  root=$(cgroup_root "$1" "${2:-}")
  for ((i = 0; i < 50; i++)); do
    pids=$(find /sys/fs/cgroup/*"$root" "/sys/fs/cgroup$root" -name cgroup.procs \
      -exec cat {} + 2>/dev/null | sort -u) || true # (a hierarchy may be missing)
    [[ -n "$pids" ]] || return 0
    # shellcheck disable=SC2086 # one pid a word
    kill -KILL $pids 2>/dev/null || true
    sleep 0.1
  done
}

remove_cgroups() { # workdir [node suffix]
  local d root
  root=$(cgroup_root "$1" "${2:-}")
  kill_cgroup_procs "$1" "${2:-}"
  for d in /sys/fs/cgroup/*"$root" "/sys/fs/cgroup$root"; do
    [[ -d "$d" ]] || continue
    # Deepest first: a cgroup directory goes only when empty of children.
    find "$d" -depth -type d -exec rmdir {} + 2>/dev/null || true
  done
}

# Kills the containerd shims of one node (node_vars), found by their -address, the node's
# containerd socket.
kill_shims() {
  pkill -KILL -f -- "containerd-shim.*$ND/containerd/" 2>/dev/null || true
}

# Stops one node (node_vars): kubelet, every pod task, containerd, leftover shims, cgroups.
down_node() { # workdir
  local rc=0 t
  stop_pidfile "$W" "${NP}kubelet" || rc=1
  [[ -z "$NP" ]] && { stop_pidfile "$W" kube-scheduler || rc=1; }
  if [[ -f "$W/run/${NP}containerd.pid" ]] && cp_pid_is_ours "$(<"$W/run/${NP}containerd.pid")" "$W"; then
    for t in $(CTR tasks ls -q 2>/dev/null); do
      CTR tasks kill -s SIGKILL "$t" >/dev/null 2>&1 || true
    done
    sleep 0.5
    for t in $(CTR tasks ls -q 2>/dev/null); do
      CTR tasks rm -f "$t" >/dev/null 2>&1 || true
    done
  fi
  stop_pidfile "$W" "${NP}containerd" || rc=1
  # A shim whose containerd is gone: named by its -address under the node's directory.
  kill_shims
  remove_cgroups "$W" "$CG"
  return "$rc"
}

down() { # workdir
  W=$1
  local rc=0
  if [[ -d "$W/node2" ]]; then
    node_vars "$W" 2
    down_node || rc=1
    while drop2 -D; do :; done
    ip netns del "$NODE2_NETNS" 2>/dev/null || true
  fi
  node_vars "$W" 1
  down_node || rc=1
  # Any shim of the run (both nodes' are under WORKDIR).
  pkill -KILL -f -- "containerd-shim.*$W/" 2>/dev/null || true
  return "$rc"
}

case "${1:-}" in
  setup) setup_namespace "$2" ;;
  up) up "$2" "$3" ;;
  up2) up2 "$2" "$3" ;;
  fail2) fail2 "$2" ;;
  revive2) revive2 "$2" ;;
  down) down "$2" ;;
  *) sed -n '2,20p' "$0" >&2; exit 2 ;;
esac
