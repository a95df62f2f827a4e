#!/bin/bash
# Stand-in for kindnetd in the locally assembled kind node image (e2e/kind/node-image.sh).
# kindnetd's module (sigs.k8s.io/kind/images/kindnetd) is not served by the Go module proxy this
# project can reach, so it cannot be built here. For a one-node cluster kindnetd's job is to
# write the CNI configuration for this node's pod CIDR (ptp + host-local + portmap, plugins from
# /opt/cni/bin), which is what this does; it does not route to other nodes, masquerade pod
# traffic or enforce NetworkPolicies. Runs as kind's DaemonSet runs kindnetd: host network,
# /etc/cni/net.d mounted, env HOST_IP, POD_SUBNET and CONTROL_PLANE_ENDPOINT.
set -euo pipefail
log() { echo "kindnetd-standin: $*" >&2; }

SA=/var/run/secrets/kubernetes.io/serviceaccount
API="${CONTROL_PLANE_ENDPOINT:-${HOST_IP:?}:6443}"
CONF=/etc/cni/net.d/10-kindnet.conflist
log "api https://$API, host ip ${HOST_IP:-?}, pod subnet ${POD_SUBNET:-?}"

# The kindnet ClusterRole may list nodes (not get one): list, and pick this node by its address.
pod_cidr() {
  curl --silent --fail --max-time 5 --cacert "$SA/ca.crt" \
    -H "Authorization: Bearer $(cat "$SA/token")" "https://$API/api/v1/nodes" |
    jq -r --arg ip "$HOST_IP" \
      '.items[] | select(any(.status.addresses[]; .address == $ip)) | .spec.podCIDR // empty'
}
cidr=""
until [[ -n "$cidr" ]]; do
  cidr=$(pod_cidr || true)
  [[ -n "$cidr" ]] || { log "waiting for this node's podCIDR"; sleep 2; }
done
log "podCIDR $cidr"

tmp="$CONF.tmp"
cat >"$tmp" <<EOF
{
  "cniVersion": "0.3.1",
  "name": "kindnet",
  "plugins": [
    {
      "type": "ptp",
      "ipMasq": false,
      "ipam": {
        "type": "host-local",
        "dataDir": "/run/cni-ipam-state",
        "routes": [{"dst": "0.0.0.0/0"}],
        "ranges": [[{"subnet": "$cidr"}]]
      },
      "mtu": 1500
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
mv -f "$tmp" "$CONF"
log "wrote $CONF"
# Stay up like kindnetd; exit promptly on SIGTERM.
trap 'exit 0' TERM INT
while :; do sleep 3600 & wait $!; done
