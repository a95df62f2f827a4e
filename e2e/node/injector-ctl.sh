#!/usr/bin/env bash
# The suite's "stop the server" and "start the server" (E2E_INJECTOR_CTL) when the injector runs
# in the cluster (e2e/node/run.sh, e2e/kind/run.sh): stop scales its Deployment to 0 and waits
# until it has no pod and its Service no endpoint; start scales it back, waits for the rollout
# and then until the apiserver reaches the servers through the Service: a server-side dry-run
# create of an opted-in pod no longer fails calling a webhook (in kind the Service's cluster IP
# goes through kube-proxy, whose rules follow the endpoints a moment later).
#
# Usage: e2e/node/injector-ctl.sh stop|start
#   env KUBECONFIG, E2E_RELEASE_NAMESPACE, E2E_WEBHOOK_CONFIG (the release name), E2E_REPLICAS (2)
set -euo pipefail
[[ $# -eq 1 ]] || { sed -n '2,11p' "$0" >&2; exit 2; }
# shellcheck source=../lib.sh source-path=SCRIPTDIR
. "$(dirname -- "${BASH_SOURCE[0]}")/../lib.sh"
ns=${E2E_RELEASE_NAMESPACE:?}
name=${E2E_WEBHOOK_CONFIG:?}
kubectl=(kubectl --kubeconfig "${KUBECONFIG:?}" -n "$ns")
case "$1" in
  stop)
    "${kubectl[@]}" scale "deployment/$name" --replicas=0 >/dev/null
    for ((i = 0; i < 240; i++)); do
      # Finished pods (the chart's `helm test` pod) are not servers.
      pods=$("${kubectl[@]}" get pods -l "app.kubernetes.io/instance=$name" \
        --field-selector=status.phase!=Succeeded,status.phase!=Failed -o name)
      ready=$("${kubectl[@]}" get endpointslices -l "kubernetes.io/service-name=$name" \
        -o jsonpath='{range .items[*].endpoints[*]}{.conditions.ready}{"\n"}{end}' | grep -c true || true)
      if [[ -z "$pods" && "$ready" == 0 ]]; then exit 0; fi
      sleep 0.25
    done
    echo "injector-ctl.sh: the injector's pods did not go away in 60s" >&2
    exit 1
    ;;
  start)
    "${kubectl[@]}" scale "deployment/$name" --replicas="${E2E_REPLICAS:-2}" >/dev/null
    "${kubectl[@]}" rollout status "deployment/$name" --timeout=120s >&2
    for ((i = 0; i < 240; i++)); do
      out=$(kubectl --kubeconfig "$KUBECONFIG" -n default create --dry-run=server -o name -f - \
        <<<"$E2E_PROBE_POD" 2>&1) && exit 0
      [[ "$out" == *'failed calling webhook'* ]] || exit 0 # answered (a denial is an answer)
      sleep 0.25
    done
    echo "injector-ctl.sh: the apiserver still cannot call the webhooks 60s after the rollout: $out" >&2
    exit 1
    ;;
  *) sed -n '2,11p' "$0" >&2; exit 2 ;;
esac
