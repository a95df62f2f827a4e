#!/usr/bin/env bash
# Start a local Kubernetes control plane (etcd, kube-apiserver,
# kube-controller-manager) on 127.0.0.1 only, for the end-to-end tests.
#
# Usage: e2e/control-plane/up.sh WORKDIR
#   env CONTROL_PLANE_BIN_DIR   use these binaries (default: output of build.sh)
#   env CONTROL_PLANE_TIMEOUT   seconds to wait for readiness (default 180)
#   env KEEP_ON_FAILURE=1       leave processes running when up.sh fails
#   env KCM_CONTROLLERS         kube-controller-manager --controllers value
#   env CONTROL_PLANE_NODE_IP   set by e2e/node/ (inside its network namespace): the apiserver
#                               authorizes kubelets (Node,RBAC), dials kubelets with a client
#                               certificate and webhook Services at their endpoints
#                               (--enable-aggregator-routing), advertises this address; the
#                               controller-manager runs its default controllers; a kubelet
#                               client certificate is made (pki/kubelet.{crt,key})
#   env CONTROL_PLANE_ADMISSION_PLUGINS  --enable-admission-plugins (default AlwaysPullImages
#                               without a node, none with one: the node has no registry to pull from)
#
# Writes WORKDIR/kubeconfig, WORKDIR/env (source it), WORKDIR/audit.log,
# WORKDIR/logs/*.log, WORKDIR/pki/*, WORKDIR/run/*.pid.
# Stop with: e2e/control-plane/down.sh WORKDIR
set -euo pipefail

HERE=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh source-path=SCRIPTDIR
. "$HERE/lib.sh"

[[ $# -eq 1 && "$1" != -* ]] || { sed -n '2,13p' "$0" >&2; exit 2; }
WORKDIR=$(cp_abspath "$1")
TIMEOUT="${CONTROL_PLANE_TIMEOUT:-180}"
SERVICE_CIDR="10.0.0.0/24" # allocation range; only the `kubernetes` Service's address is dialled (by pods, with a node)
KUBERNETES_SERVICE_IP="10.0.0.1"
NODE_IP="${CONTROL_PLANE_NODE_IP:-}"
NODE_NAME="${CONTROL_PLANE_NODE_NAME:-e2e-node}"
if [[ -n "$NODE_IP" ]]; then
  ADMISSION_PLUGINS="${CONTROL_PLANE_ADMISSION_PLUGINS-}"
  KCM_CONTROLLERS="${KCM_CONTROLLERS:-*}"
else
  ADMISSION_PLUGINS="${CONTROL_PLANE_ADMISSION_PLUGINS-AlwaysPullImages}"
fi
KCM_CONTROLLERS="${KCM_CONTROLLERS:-serviceaccount-controller,deployment-controller,replicaset-controller,garbage-collector-controller,namespace-controller,root-ca-certificate-publisher-controller,job-controller,statefulset-controller,cronjob-controller,resourcequota-controller}"

for tool in openssl curl ss setsid base64 realpath; do
  command -v "$tool" >/dev/null || { cp_log "ERROR: $tool is required"; exit 1; }
done

if [[ -z "${CONTROL_PLANE_BIN_DIR:-}" ]]; then
  CONTROL_PLANE_BIN_DIR=$("$HERE/build.sh" | tail -n1)
fi
BIN_DIR=$(cp_abspath "$CONTROL_PLANE_BIN_DIR")
for b in etcd kube-apiserver kube-controller-manager; do
  [[ -x "$BIN_DIR/$b" ]] || { cp_log "ERROR: $BIN_DIR/$b missing: run build.sh"; exit 1; }
done

mkdir -p "$WORKDIR"/{pki,logs,run,etcd-data,kcm-certs}
for name in "${CP_COMPONENTS[@]}"; do
  if [[ -f "$WORKDIR/run/$name.pid" ]] && cp_pid_is_ours "$(<"$WORKDIR/run/$name.pid")" "$WORKDIR"; then
    cp_log "ERROR: $name already running for $WORKDIR; run down.sh $WORKDIR first"
    exit 1
  fi
done
if [[ -n "$(cp_stray_pids "$WORKDIR")" ]]; then
  cp_log "ERROR: control-plane processes for $WORKDIR already running; run down.sh $WORKDIR first"
  exit 1
fi
# A fresh cluster each time: no old data, pid files, logs or audit log.
rm -rf "$WORKDIR/etcd-data" "$WORKDIR"/run/*.pid "$WORKDIR"/logs/*.log "$WORKDIR"/audit*.log
mkdir -p "$WORKDIR/etcd-data"
chmod 700 "$WORKDIR/etcd-data"

LOGS="$WORKDIR/logs"
PKI="$WORKDIR/pki"

dump_logs() {
  local f
  for f in "$LOGS"/*.log; do
    [[ -f "$f" && "$f" != */openssl.log ]] || continue
    echo "----- last 40 lines of $f -----" >&2
    tail -n 40 "$f" >&2 || true
  done
}
on_exit() {
  local rc=$?
  if ((rc != 0)); then
    cp_log "FAILED (exit $rc)"
    dump_logs
    if [[ "${KEEP_ON_FAILURE:-0}" == 1 ]]; then
      cp_log "KEEP_ON_FAILURE=1: leaving processes running; stop them with down.sh $WORKDIR"
    else
      cp_down "$WORKDIR" || true
    fi
  fi
}
trap on_exit EXIT
die() { cp_log "ERROR: $*"; exit 1; }

# ------------------------------------------------------------------ ports
ETCD_CLIENT_PORT=$(cp_free_port) || die "no free loopback port"
ETCD_PEER_PORT=$(cp_free_port "$ETCD_CLIENT_PORT") || die "no free loopback port"
APISERVER_PORT=$(cp_free_port "$ETCD_CLIENT_PORT" "$ETCD_PEER_PORT") || die "no free loopback port"
KCM_PORT=$(cp_free_port "$ETCD_CLIENT_PORT" "$ETCD_PEER_PORT" "$APISERVER_PORT") ||
  die "no free loopback port"
ETCD_URL="http://127.0.0.1:$ETCD_CLIENT_PORT"
APISERVER_URL="https://127.0.0.1:$APISERVER_PORT"

# -------------------------------------------------------------------- pki
cp_log "generating certificates in $PKI"
: >"$LOGS/openssl.log"
ossl() {
  openssl "$@" >>"$LOGS/openssl.log" 2>&1 || { tail -n 20 "$LOGS/openssl.log" >&2; die "openssl $1 failed"; }
}
new_ca() { # name CN
  ossl req -x509 -newkey rsa:2048 -nodes -days 3650 -sha256 \
    -keyout "$PKI/$1.key" -out "$PKI/$1.crt" -subj "/CN=$2" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature"
}
new_cert() { # name ca subject extendedKeyUsage [subjectAltName]
  local name=$1 ca=$2 subj=$3 eku=$4 san=${5:-}
  ossl req -new -newkey rsa:2048 -nodes -keyout "$PKI/$name.key" -out "$PKI/$name.csr" -subj "$subj"
  {
    echo "basicConstraints=critical,CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    echo "extendedKeyUsage=$eku"
    if [[ -n "$san" ]]; then echo "subjectAltName=$san"; fi
  } >"$PKI/$name.ext"
  ossl x509 -req -in "$PKI/$name.csr" -CA "$PKI/$ca.crt" -CAkey "$PKI/$ca.key" -CAcreateserial \
    -days 3650 -sha256 -extfile "$PKI/$name.ext" -out "$PKI/$name.crt"
  rm -f "$PKI/$name.csr"
}
new_ca ca "sidecar-injector-e2e-ca"
new_ca client-ca "sidecar-injector-e2e-client-ca"
# With a node, pods reach the API server as in any cluster: at the `kubernetes` Service's
# cluster IP (the first of SERVICE_CIDR), which e2e/node/node.sh forwards to it.
new_cert apiserver ca "/CN=kube-apiserver" serverAuth \
  "IP:127.0.0.1,${NODE_IP:+IP:$NODE_IP,IP:$KUBERNETES_SERVICE_IP,}DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc"
new_cert admin client-ca "/O=system:masters/CN=e2e-admin" clientAuth
if [[ -n "$NODE_IP" ]]; then
  # The kubelet's identity (the Node authorizer knows it by this group and name), and the
  # apiserver's client certificate for logs and exec (the kubelet trusts client-ca).
  new_cert kubelet client-ca "/O=system:nodes/CN=system:node:$NODE_NAME" clientAuth
  new_cert apiserver-kubelet-client client-ca "/O=system:masters/CN=kube-apiserver-kubelet-client" clientAuth
fi
ossl genrsa -out "$PKI/sa.key" 2048
ossl rsa -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub"
chmod 600 "$PKI"/*.key

# ------------------------------------------------------------- kubeconfig
b64() { base64 -w0 <"$1"; }
cat >"$WORKDIR/kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: e2e
  cluster:
    server: $APISERVER_URL
    certificate-authority-data: $(b64 "$PKI/ca.crt")
users:
- name: e2e-admin
  user:
    client-certificate-data: $(b64 "$PKI/admin.crt")
    client-key-data: $(b64 "$PKI/admin.key")
contexts:
- name: e2e
  context:
    cluster: e2e
    user: e2e-admin
current-context: e2e
EOF
chmod 600 "$WORKDIR/kubeconfig"

# ----------------------------------------------------------- audit policy
# The suites' one policy (pods at Request level: the webhook annotations the scenarios read).
cp "$HERE/../audit-policy.yaml" "$WORKDIR/audit-policy.yaml"

# ------------------------------------------------------------------ start
# Each process gets its own session (setsid) so it outlives this script, and its
# pid file is written right away so down.sh can always find it.
start() { # name args...
  local name=$1; shift
  cp_log "starting $name"
  setsid "$@" >>"$LOGS/$name.log" 2>&1 </dev/null &
  local pid=$!
  echo "$pid" >"$WORKDIR/run/$name.pid"
  cp_wait_exec "$pid" "$WORKDIR"
}
check_alive() {
  local name pidfile
  for name in "$@"; do
    pidfile="$WORKDIR/run/$name.pid"
    cp_alive "$(cat "$pidfile" 2>/dev/null || true)" "$WORKDIR" || die "$name exited (log: $LOGS/$name.log)"
  done
}
DEADLINE=$((SECONDS + TIMEOUT))
wait_for() { # description command... ; also fails if a started process died
  local what=$1; shift
  local started=()
  local name
  for name in "${CP_COMPONENTS[@]}"; do
    [[ -f "$WORKDIR/run/$name.pid" ]] && started+=("$name")
  done
  until "$@" >/dev/null 2>&1; do
    check_alive "${started[@]}"
    ((SECONDS < DEADLINE)) || die "timed out after ${TIMEOUT}s waiting for $what"
    sleep 0.5
  done
  cp_log "ready: $what ($((TIMEOUT - DEADLINE + SECONDS))s)"
}
CURL=(curl --silent --show-error --fail --noproxy '*' --max-time 5)
ADMIN_CURL=("${CURL[@]}" --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key")

start etcd "$BIN_DIR/etcd" \
  --name=e2e \
  --data-dir="$WORKDIR/etcd-data" \
  --listen-client-urls="$ETCD_URL" \
  --advertise-client-urls="$ETCD_URL" \
  --listen-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" \
  --initial-advertise-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" \
  --initial-cluster="e2e=http://127.0.0.1:$ETCD_PEER_PORT" \
  --initial-cluster-state=new \
  --unsafe-no-fsync=true \
  --log-level=warn
wait_for "etcd $ETCD_URL/health" "${CURL[@]}" "$ETCD_URL/health"

APISERVER_NODE_FLAGS=()
AUTHZ=RBAC
if [[ -n "$NODE_IP" ]]; then
  AUTHZ=Node,RBAC
  APISERVER_NODE_FLAGS=(
    # Every address of the run's own network namespace (loopback and the node's): pods reach it
    # at the node address, through the `kubernetes` Service's cluster IP (e2e/node/node.sh).
    --bind-address=0.0.0.0
    --advertise-address="$NODE_IP"
    --enable-aggregator-routing=true
    --kubelet-client-certificate="$PKI/apiserver-kubelet-client.crt"
    --kubelet-client-key="$PKI/apiserver-kubelet-client.key"
    --kubelet-preferred-address-types=InternalIP
  )
else
  APISERVER_NODE_FLAGS=(--bind-address=127.0.0.1 --advertise-address=127.0.0.1)
fi
if [[ -n "$ADMISSION_PLUGINS" ]]; then
  APISERVER_NODE_FLAGS+=(--enable-admission-plugins="$ADMISSION_PLUGINS")
fi
# MutatingAdmissionPolicy is GA (admissionregistration.k8s.io/v1, on by default) from 1.36;
# on 1.34-1.35 it is beta, off unless its feature gate and API version are turned on, which the
# policy scenarios (e2e/tests/policy.rs) need.
API_MINOR=$("$BIN_DIR/kube-apiserver" --version | sed -n 's/^Kubernetes v1\.\([0-9]*\)\..*/\1/p')
if [[ -n "$API_MINOR" ]] && ((API_MINOR >= 34 && API_MINOR <= 35)); then
  APISERVER_NODE_FLAGS+=(--feature-gates=MutatingAdmissionPolicy=true
    --runtime-config=admissionregistration.k8s.io/v1beta1=true)
fi
# Default admission plugins stay on (MutatingAdmissionWebhook, ValidatingAdmissionWebhook,
# ...); --enable-admission-plugins only adds. Never pass an empty --admission-control.
start kube-apiserver "$BIN_DIR/kube-apiserver" \
  --etcd-servers="$ETCD_URL" \
  "${APISERVER_NODE_FLAGS[@]}" \
  --secure-port="$APISERVER_PORT" \
  --cert-dir="$PKI" \
  --tls-cert-file="$PKI/apiserver.crt" \
  --tls-private-key-file="$PKI/apiserver.key" \
  --client-ca-file="$PKI/client-ca.crt" \
  --authorization-mode="$AUTHZ" \
  --service-account-issuer="$APISERVER_URL" \
  --service-account-key-file="$PKI/sa.pub" \
  --service-account-signing-key-file="$PKI/sa.key" \
  --service-cluster-ip-range="$SERVICE_CIDR" \
  --endpoint-reconciler-type=none \
  --allow-privileged=true \
  --audit-policy-file="$WORKDIR/audit-policy.yaml" \
  --audit-log-path="$WORKDIR/audit.log" \
  --audit-log-maxbackup=1 \
  --audit-log-maxsize=200 \
  --profiling=false \
  --v=1
wait_for "kube-apiserver $APISERVER_URL/readyz" "${ADMIN_CURL[@]}" "$APISERVER_URL/readyz"

start kube-controller-manager "$BIN_DIR/kube-controller-manager" \
  --kubeconfig="$WORKDIR/kubeconfig" \
  --authentication-kubeconfig="$WORKDIR/kubeconfig" \
  --authorization-kubeconfig="$WORKDIR/kubeconfig" \
  --bind-address=127.0.0.1 \
  --secure-port="$KCM_PORT" \
  --cert-dir="$WORKDIR/kcm-certs" \
  --leader-elect=false \
  --service-account-private-key-file="$PKI/sa.key" \
  --root-ca-file="$PKI/ca.crt" \
  --service-cluster-ip-range="$SERVICE_CIDR" \
  --controllers="$KCM_CONTROLLERS" \
  --profiling=false \
  --v=1
wait_for "kube-controller-manager https://127.0.0.1:$KCM_PORT/healthz" \
  "${CURL[@]}" --insecure "https://127.0.0.1:$KCM_PORT/healthz"
# Pods can only be created once the namespace's "default" ServiceAccount exists.
wait_for "ServiceAccount default/default" \
  "${ADMIN_CURL[@]}" "$APISERVER_URL/api/v1/namespaces/default/serviceaccounts/default"

cat >"$WORKDIR/env" <<EOF
# Generated by e2e/control-plane/up.sh; source it.
export CONTROL_PLANE_WORKDIR='$WORKDIR'
export CONTROL_PLANE_BIN_DIR='$BIN_DIR'
export KUBECONFIG='$WORKDIR/kubeconfig'
export APISERVER_URL='$APISERVER_URL'
export KUBERNETES_SERVICE_IP='$KUBERNETES_SERVICE_IP'
export AUDIT_LOG='$WORKDIR/audit.log'
export ETCD_URL='$ETCD_URL'
export KCM_URL='https://127.0.0.1:$KCM_PORT'
export CA_CERT='$PKI/ca.crt'
export CA_KEY='$PKI/ca.key'
export ADMIN_CERT='$PKI/admin.crt'
export ADMIN_KEY='$PKI/admin.key'
export ETCD_PID_FILE='$WORKDIR/run/etcd.pid'
export APISERVER_PID_FILE='$WORKDIR/run/kube-apiserver.pid'
export KCM_PID_FILE='$WORKDIR/run/kube-controller-manager.pid'
export CONTROL_PLANE_LOGS='$LOGS'
export CLIENT_CA_CERT='$PKI/client-ca.crt'
export ADMISSION_PLUGINS='$ADMISSION_PLUGINS'
EOF
cp_log "control plane up: $APISERVER_URL (source $WORKDIR/env; stop with $HERE/down.sh $WORKDIR)"
echo "$WORKDIR/env"
