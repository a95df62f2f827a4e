# shellcheck shell=bash
# Shared by e2e/run.sh (local control plane), e2e/node/run.sh (a real node) and e2e/kind/run.sh
# (kind), so they build, run and count the scenarios the same way. Sourced, not run.

# The control plane's helpers too (cp_free_port, cp_log): one copy of each.
# shellcheck source=control-plane/lib.sh
. "$(dirname -- "${BASH_SOURCE[0]}")/control-plane/lib.sh"

E2E_SUITE=(test -p sidecar-injector-e2e --test scenarios --test policy)
# An opted-in pod for server-side dry-run probes (pause image: nothing pulls it).
# shellcheck disable=SC2034 # used by the scripts that source this file
E2E_PROBE_POD='{"apiVersion":"v1","kind":"Pod","metadata":{"name":"probe","labels":{"sidecar-injector.io/inject":"true"}},"spec":{"containers":[{"name":"app","image":"registry.k8s.io/pause:3.10"}]}}'

e2e_log() { printf '[e2e %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }

# Prints cargo's target directory (where `cargo build` put the binaries).
e2e_target_dir() { # cargo
  local dir
  dir=$("$1" metadata --format-version 1 --no-deps |
    sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
  [[ -n "$dir" ]] || { e2e_log "ERROR: cannot find cargo's target directory"; return 1; }
  echo "$dir"
}

# Makes PKI/NAME.crt and PKI/NAME.key, a serving certificate for SANS (openssl's
# subjectAltName syntax, e.g. "IP:127.0.0.1") signed by the cluster's CA. openssl's output
# goes to LOG.
e2e_serving_cert() { # ca-cert ca-key pki name sans log
  local signer_cert=$1 signer_key=$2 pki=$3 name=$4 sans=$5 log=$6
  {
    openssl req -new -newkey rsa:2048 -nodes -keyout "$pki/$name.key" -out "$pki/$name.csr" \
      -subj "/CN=$name"
    printf '%s\n' "basicConstraints=critical,CA:FALSE" \
      "keyUsage=critical,digitalSignature,keyEncipherment" \
      "extendedKeyUsage=serverAuth" "subjectAltName=$sans" >"$pki/$name.ext"
    openssl x509 -req -in "$pki/$name.csr" -CA "$signer_cert" -CAkey "$signer_key" -CAcreateserial \
      -days 2 -sha256 -extfile "$pki/$name.ext" -out "$pki/$name.crt"
  } >>"$log" 2>&1
}

# Makes PKI/ca.crt and PKI/ca.key, a CA of the run's own (kind, whose cluster CA stays in its
# node), for e2e_serving_cert. openssl's output goes to LOG.
e2e_ca() { # pki log
  local pki=$1 log=$2
  mkdir -p "$pki"
  openssl req -x509 -newkey rsa:2048 -nodes -keyout "$pki/ca.key" -out "$pki/ca.crt" -days 2 \
    -subj "/CN=sidecar-injector e2e CA" -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" >>"$log" 2>&1
}

# Writes OUT: the embedded configuration (templates/config.yaml) with the node scenarios'
# stand-in images, as node/values.yaml gives the chart: a pod that a server outside the cluster
# injects must not make the node try to pull the real images.
e2e_standin_config() { # out
  local repo
  repo=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
  sed -e 's#^\(  *image:\) cr\.fluentbit\.io/.*#\1 local/log-shipper:1#' \
    -e 's#^\(  *image:\) docker\.io/envoyproxy/.*#\1 local/proxy:1#' \
    "$repo/templates/config.yaml" >"$1"
  [[ $(grep -c 'image: local/' "$1") == 2 ]] || {
    e2e_log "ERROR: templates/config.yaml no longer names the two images e2e_standin_config replaces"
    return 1
  }
}

# A Prometheus on 127.0.0.1 (of the run's network namespace) that finds the release's pods
# through Kubernetes service discovery and scrapes their admin ports, labelled as the chart's
# ServiceMonitor labels them (job <release>, namespace, pod). It loads the chart's rules as this
# installation renders them (CHART-ARGS: the install's --values/--set), with the down alert
# after 5 s, not 2 min. The run's namespace must reach the pod addresses (a node's namespace,
# or kind's pod route). Exports E2E_PROMETHEUS_URL and E2E_PROMETHEUS_RULES for the suite;
# e2e_prometheus_stop ends it. Its log is LOGS/prometheus.log.
E2E_PROMETHEUS_PID=""
e2e_prometheus_start() { # bin-dir dir logs apiserver-url ca cert key release namespace chart-args...
  local bin=$1 dir=$2 logs=$3 url=$4 ca=$5 cert=$6 key=$7 release=$8 ns=$9 port i repo
  shift 9
  repo=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
  mkdir -p "$dir/data" "$logs"
  HELM=${HELM:-helm} python3 "$repo/charts/prometheus-rules.py" --namespace "$ns" "$@" \
    --set prometheusRule.alerts.SidecarInjectorDown.for=5s \
    >"$dir/rules.yaml" 2> >(grep -v 'symbolic link in path' >&2) || {
    e2e_log "ERROR: cannot render the chart's rules"
    return 1
  }
  cat >"$dir/prometheus.yml" <<EOF
global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files: [rules.yaml]
scrape_configs:
  - job_name: $release
    kubernetes_sd_configs:
      - role: pod
        api_server: $url
        namespaces: {names: [$ns]}
        tls_config: {ca_file: $ca, cert_file: $cert, key_file: $key}
    relabel_configs:
      - source_labels: [__meta_kubernetes_pod_label_app_kubernetes_io_instance]
        regex: $release
        action: keep
      - source_labels: [__meta_kubernetes_pod_container_port_name]
        regex: admin
        action: keep
      - source_labels: [__meta_kubernetes_namespace]
        target_label: namespace
      - source_labels: [__meta_kubernetes_pod_name]
        target_label: pod
EOF
  "$bin/promtool" check config "$dir/prometheus.yml" >"$logs/promtool.log" 2>&1 || {
    e2e_log "ERROR: promtool check config failed (see $logs/promtool.log)"
    return 1
  }
  port=$(cp_free_port) || return 1
  e2e_log "prometheus on 127.0.0.1:$port"
  "$bin/prometheus" --config.file="$dir/prometheus.yml" \
    --storage.tsdb.path="$dir/data" --storage.tsdb.retention.time=1d \
    --web.listen-address="127.0.0.1:$port" --log.level=warn \
    >"$logs/prometheus.log" 2>&1 </dev/null &
  E2E_PROMETHEUS_PID=$!
  for ((i = 0; i < 120; i++)); do
    if curl --silent --fail --noproxy '*' --max-time 2 "http://127.0.0.1:$port/-/ready" >/dev/null; then
      export E2E_PROMETHEUS_URL="http://127.0.0.1:$port"
      export E2E_PROMETHEUS_RULES="$dir/rules.yaml"
      return 0
    fi
    kill -0 "$E2E_PROMETHEUS_PID" 2>/dev/null || {
      e2e_log "ERROR: prometheus exited (see $logs/prometheus.log)"
      return 1
    }
    sleep 0.5
  done
  e2e_log "ERROR: prometheus not ready in 60s (see $logs/prometheus.log)"
  return 1
}

# Ends the Prometheus of e2e_prometheus_start, if any: TERM, then KILL after 10 s.
e2e_prometheus_stop() {
  local pid=$E2E_PROMETHEUS_PID i
  [[ -n "$pid" ]] || return 0
  E2E_PROMETHEUS_PID=""
  kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < 100; i++)); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
}

# True when no process whose command line names WORKDIR is left; else lists them (stderr).
e2e_nothing_left_of() { # workdir
  pgrep -f -- "$1/" >/dev/null || return 0
  e2e_log "ERROR: processes left behind:"
  pgrep -af -- "$1/" >&2 || true
  return 1
}

# Removes WORKDIR after a pass (RC 0) unless KEEP_WORKDIR=1; otherwise says where it is.
e2e_remove_or_keep_workdir() { # rc workdir
  if (($1 == 0)) && [[ "${KEEP_WORKDIR:-0}" != 1 ]]; then
    rm -rf "$2"
  else
    e2e_log "WORKDIR kept: $2 (logs/, audit.log)"
  fi
}

# The closing line of a runner that skips nothing, printed once (the exit trap may come twice).
# A run that failed (RC non-zero) outside the scenarios, in setup or teardown, counts the
# scenarios that did not pass as failed (at least one).
E2E_REPORTED=0
e2e_report() { # rc
  ((E2E_REPORTED)) && return 0
  E2E_REPORTED=1
  if (($1 != 0 && FAILED == 0)); then
    # shellcheck disable=SC2153 # TOTAL, PASSED and FAILED are the sourcing runner's
    FAILED=$((TOTAL > PASSED ? TOTAL - PASSED : 1))
  fi
  echo "$PASSED passed, $FAILED failed"
}

# Polls server-side dry-run creates of E2E_PROBE_POD in `default` until one comes back injected
# (the webhooks are registered and answer), at most SECONDS. CURL is the admin curl (array
# contents) and the last argument the apiserver's URL. Prints how long it took on stderr.
e2e_wait_for_injection() { # seconds curl-args... apiserver-url
  local limit=$1 t0=$SECONDS out
  shift
  local url=${*: -1}
  local curl=("${@:1:$#-1}")
  until out=$("${curl[@]}" -X POST -H 'Content-Type: application/json' --data "$E2E_PROBE_POD" \
    "$url/api/v1/namespaces/default/pods?dryRun=All" 2>/dev/null) &&
    [[ "$out" == *'sidecar-injector.io/status'* ]]; do
    if ((SECONDS - t0 >= limit)); then
      e2e_log "ERROR: no injection in a server-side dry-run after ${limit}s"
      return 1
    fi
    sleep 0.5
  done
  e2e_log "webhooks effective after ~$((SECONDS - t0))s"
}

# Builds the suite and prints how many scenarios match the filter (E2E_TEST_FILTER: names or
# parts of names, space-separated; a scenario matching any of them runs).
e2e_count_scenarios() { # cargo
  local cargo=$1 list filter=() skip
  # shellcheck disable=SC2206 # split on spaces: one filter per word
  filter=(${E2E_TEST_FILTER:-})
  for skip in ${E2E_TEST_SKIP:-}; do filter+=(--skip "$skip"); done
  "$cargo" "${E2E_SUITE[@]}" --no-run >&2 || return 1
  list=$("$cargo" "${E2E_SUITE[@]}" --quiet -- --list "${filter[@]}" 2>/dev/null) || return 1
  grep -c ': test$' <<<"$list" || true
}

# Runs the scenarios one at a time (some change the shared webhook configurations), with their
# output shown as they run and kept in LOG. Sets E2E_PASSED, E2E_FAILED and E2E_SKIPPED from
# cargo's summary lines (one per test target, summed; --no-fail-fast runs every target). A
# scenario that skips itself prints "SKIPPED name: reason" (after the harness's "test name ... ") and counts as skipped, not passed. Without a summary line, every
# scenario counts as failed. Returns cargo's exit code.
# E2E_SUITE may name several test targets (e2e/node/run.sh runs scenarios and node).
# The suite runs in its own session in the background, so a signal to the caller is acted on at
# once: the caller's exit trap calls e2e_stop_scenarios, which ends cargo and the test binary.
E2E_SUITE_PID=""
e2e_run_scenarios() { # cargo total log
  local cargo=$1 total=$2 log=$3 rc=0 tail_pid filter=() skip
  # shellcheck disable=SC2206 # split on spaces: one filter per word
  filter=(${E2E_TEST_FILTER:-})
  # E2E_TEST_SKIP: names (substrings) of scenarios left out, space-separated.
  for skip in ${E2E_TEST_SKIP:-}; do filter+=(--skip "$skip"); done
  : >"$log"
  # A failed scenario's error is its message and context; a backtrace of the harness adds nothing.
  RUST_LIB_BACKTRACE="${RUST_LIB_BACKTRACE:-0}" setsid -w \
    "$cargo" "${E2E_SUITE[@]}" --no-fail-fast -- --test-threads=1 --nocapture "${filter[@]}" \
    >"$log" 2>&1 </dev/null &
  E2E_SUITE_PID=$!
  tail --pid="$E2E_SUITE_PID" -n +1 -f "$log" &
  tail_pid=$!
  wait "$E2E_SUITE_PID" || rc=$?
  E2E_SUITE_PID=""
  wait "$tail_pid" || true
  E2E_PASSED=0
  E2E_FAILED=0
  # One summary line per test target (the node run has two): the counts are their sums.
  local summaries=0 line
  while IFS= read -r line; do
    if [[ "$line" =~ ([0-9]+)\ passed\;\ ([0-9]+)\ failed ]]; then
      E2E_PASSED=$((E2E_PASSED + BASH_REMATCH[1]))
      E2E_FAILED=$((E2E_FAILED + BASH_REMATCH[2]))
      summaries=$((summaries + 1))
    fi
  done < <(grep -E '^test result: ' "$log" || true)
  if ((summaries == 0)); then
    E2E_FAILED=$total
  fi
  E2E_SKIPPED=$(grep -cE '(^| )SKIPPED [a-z0-9-]+: ' "$log" || true)
  E2E_PASSED=$((E2E_PASSED - E2E_SKIPPED))
  if ((E2E_PASSED < 0)); then E2E_PASSED=0; fi
  if ((rc == 0 && E2E_FAILED > 0)); then rc=1; fi
  return "$rc"
}

# Runs the scenarios (e2e_run_scenarios) where every scenario has what it needs, so a
# scenario that skips itself counts as failed. Sets PASSED and FAILED for the caller's report;
# returns non-zero when anything failed.
e2e_run_scenarios_none_skipped() { # cargo total log
  local rc=0
  e2e_run_scenarios "$@" || rc=$?
  # shellcheck disable=SC2034 # read by the runner that sources this file
  PASSED=$E2E_PASSED
  FAILED=$E2E_FAILED
  if ((E2E_SKIPPED > 0)); then
    e2e_log "ERROR: $E2E_SKIPPED scenarios skipped themselves (nothing may be skipped here)"
    FAILED=$((FAILED + E2E_SKIPPED))
  fi
  ((rc == 0 && FAILED == 0))
}

# Ends a suite still running (cargo and the test binary: the whole session), if any.
e2e_stop_scenarios() {
  local pid=$E2E_SUITE_PID i
  [[ -n "$pid" ]] || return 0
  E2E_SUITE_PID=""
  kill -TERM -- "-$pid" "$pid" 2>/dev/null || true
  for ((i = 0; i < 50; i++)); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  kill -KILL -- "-$pid" "$pid" 2>/dev/null || true
}

# The chart's own test: `sidecar-injector check` from the release's image, in a pod, with the
# test's RBAC (templates/tests/check.yaml); every check must pass. The test pod's log is read
# here (helm's --logs asks for the logs of every test hook, the RBAC objects too, and fails on
# them), then the pod is deleted: it carries the release's labels and must not be taken for a
# server. Prints "helm test: N passed, ..." on stderr; fails with the log's tail.
e2e_helm_test() { # release namespace log [kubeconfig]
  local release=$1 ns=$2 log=$3 kc=() rc=0
  if [[ -n "${4:-}" ]]; then kc=(--kubeconfig "$4"); fi
  helm test "$release" "${kc[@]}" --namespace "$ns" --timeout 120s \
    >"$log" 2> >(grep -v 'symbolic link in path' >&2) || rc=$?
  kubectl "${kc[@]}" -n "$ns" logs "$release-test-check" >>"$log" 2>&1 || true
  kubectl "${kc[@]}" -n "$ns" delete pod "$release-test-check" --wait=true >/dev/null 2>&1 || true
  if ((rc != 0)); then
    tail -n 40 "$log" >&2
    return 1
  fi
  grep -E "passed, [0-9]+ failed" "$log" | sed 's/^/helm test: /' >&2 || true
}
