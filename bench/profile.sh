#!/usr/bin/env bash
# Instruction counts (valgrind callgrind) per review: the engine alone (engine-loop), and the
# webhook and the transport ceiling each serving REQUESTS requests on 127.0.0.1. Instruction
# counts repeat from run to run, unlike times on a shared machine, so they show what a change
# did. Per-request numbers are (run with 1 + N) - (run with 1), divided by N: the first
# request (which renders the templates and reads their YAML, about 2 million instructions) is
# in both, as the first review is in both engine runs.
# Output: target/bench/profile/*.out (callgrind_annotate --inclusive=yes FILE), a summary, and
# target/bench/profile/instructions.json (read by bench-run for the instruction goals).
# The first run builds with line tables into its own target directory (several minutes).
set -euo pipefail
cd "$(dirname "$0")/.."
out="$PWD/target/bench/profile"
mkdir -p "$out"
export CARGO_TARGET_DIR="${PROFILE_TARGET_DIR:-$PWD/target/bench/profile-target}"
# Line tables let callgrind name inlined frames; the usual release builds stay as they are.
# PROFILE_LINE_TABLES=0 (make bench) counts with the usual release build: the same code, no
# second build.
if [ "${PROFILE_LINE_TABLES:-1}" = 1 ]; then
  export CARGO_PROFILE_RELEASE_DEBUG=line-tables-only
fi
"${CARGO:-cargo}" build --release -p sidecar-injector -p sidecar-injector-bench --bins
bin="$CARGO_TARGET_DIR/release"
n=${REQUESTS:-200}
iterations=${ITERATIONS:-40}

total() { awk '/^(summary|totals):/ {print $2; exit}' "$1"; }
per() { echo $(( ($(total "$2") - $(total "$1")) / $3 )); }
callgrind() { local file=$1; shift; valgrind --tool=callgrind --callgrind-out-file="$file" "$@" 2>>"$out/valgrind.log"; }

# The engine: one review (start-up included) against 1 + ITERATIONS reviews.
for pod in typical typical-view typical-step typical-memo typical-distinct typical-namespace 2x2000 env1000 env10000; do
  case $pod in
    typical) args=() ;;
    # Parts of the typical review: reading its view only, and stepping over its JSON only
    # (checked, nothing built): the floor of any review read strictly with this reader.
    typical-view) args=(--stage view) ;;
    typical-step) args=(--stage step) ;;
    # The server's memory of answers: the same pod with another uid each time (a replica).
    typical-memo) args=(--memo) ;;
    # Every review the first pod of a new ReplicaSet (its pod-template-hash and generateName).
    typical-distinct) args=(--distinct $((iterations + 1))) ;;
    # Every review in a new namespace, which the bundled templates read: every template renders
    # and its output is read as YAML (no cached rendering at all).
    typical-namespace) args=(--distinct $((iterations + 1)) --new-namespace) ;;
    2x2000) args=(--env 2000 --containers 2) ;;
    # The scaling goal's two pods (criterion times them too), counted: a stall of the machine
    # during one criterion bench moves its time ratio, not these.
    env1000) args=(--env 1000) ;;
    env10000) args=(--env 10000) ;;
  esac
  callgrind "$out/engine-$pod-1.out" "$bin/engine-loop" --iterations 1 "${args[@]}" >/dev/null
  callgrind "$out/engine-$pod-n.out" "$bin/engine-loop" --iterations $((iterations + 1)) "${args[@]}" >/dev/null
done

# The typical review when nothing of it is cached: cold-probe writes 4 MiB between reviews,
# which evicts callgrind's simulated 2 MiB last-level cache, and only the review is counted
# (cold-probe's one_review; the simulation still sees everything). Its misses there are the
# cache lines of code and data a cold review must fetch from memory: in the server, TLS, hyper,
# the kernel and the other connections run between two reviews, so this, not the instruction
# count, is what a review costs there (docs/benchmarks-history.md, "What the goals needed").
cold() {
  valgrind --tool=callgrind --cache-sim=yes --LL=2097152,16,64 \
    --toggle-collect='cold_probe::one_review' --callgrind-out-file="$out/engine-cold-$1.out" \
    "$bin/cold-probe" --modes thrash4 --reviews "$1" >/dev/null 2>>"$out/valgrind.log"
}
cold 1
cold $((iterations + 1))
# The summary's events: Ir Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw.
event() { awk -v i="$2" '/^summary:/ {print $(i + 1); exit}' "$1"; }
cold_per() { echo $(( ($(event "$out/engine-cold-$((iterations + 1)).out" "$1") - $(event "$out/engine-cold-1.out" "$1")) / iterations )); }
cold_code=$(cold_per 7)
cold_data=$(( $(cold_per 8) + $(cold_per 9) ))

# A server under callgrind, REQUESTS requests (or none), then SIGINT: both exit cleanly, so
# callgrind writes its counts.
serve() {
  # The port below the kernel's ephemeral ports (32768 on): no outgoing connection holds it.
  local kind=$1 requests=$2 port=$((20000 + RANDOM % 12000))
  local file="$out/$kind-$requests.out" ca="$out/$kind-ca.pem"
  rm -f "$ca"
  # valgrind itself in the background (not a function): $! must be its pid for the SIGINT.
  if [ "$kind" = webhook ]; then
    # The production default log level (info), whatever the caller's shell says: an empty
    # RUST_LOG would mean errors only and hide what logging costs.
    # Its memory of answers off: every request (a uid and a token volume name of its own, as
    # the API server sends a workload's replicas) is read in full. `webhook-memo` keeps it on,
    # as deployed: the replicas are answered from memory.
    env -u RUST_LOG valgrind --tool=callgrind --callgrind-out-file="$file" "$bin/sidecar-injector" serve \
      --listen "127.0.0.1:$port" --admin-listen "127.0.0.1:$((port + 1))" --dev-ca-file "$ca" \
      --log-format json --memo-entries 0 2>>"$out/valgrind.log" &
  elif [ "$kind" = webhook-memo ]; then
    env -u RUST_LOG valgrind --tool=callgrind --callgrind-out-file="$file" "$bin/sidecar-injector" serve \
      --listen "127.0.0.1:$port" --admin-listen "127.0.0.1:$((port + 1))" --dev-ca-file "$ca" \
      --log-format json 2>>"$out/valgrind.log" &
  else
    valgrind --tool=callgrind --callgrind-out-file="$file" "$bin/ceiling" --listen "127.0.0.1:$port" \
      --dev-ca-file "$ca" --exit-after 600 2>>"$out/valgrind.log" &
  fi
  local pid=$!
  for _ in $(seq 1 600); do
    [ -s "$ca" ] && (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
    sleep 0.1
  done
  # One request first, on its own connection; then the counted ones.
  "$bin/loadgen" --addr "127.0.0.1:$port" --ca "$ca" --http 1 --connections 1 --check >/dev/null
  if [ "$requests" -gt 0 ]; then
    "$bin/loadgen" --addr "127.0.0.1:$port" --ca "$ca" --http 1 --connections 2 \
      --rate 20 --duration $((requests / 20)) --warmup 0 >/dev/null
  fi
  # SIGINT until it exits: a background job starts with SIGINT ignored until the server installs
  # its handler, so a first signal can be lost. Bounded: after 60 s it is killed (counts lost).
  for i in $(seq 1 600); do
    kill -0 "$pid" 2>/dev/null || break
    [ $((i % 10)) = 1 ] && kill -INT "$pid" 2>/dev/null
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" || true
}
for kind in webhook webhook-memo ceiling; do
  serve "$kind" 0
  serve "$kind" "$n"
done

typical=$(per "$out/engine-typical-1.out" "$out/engine-typical-n.out" "$iterations")
view=$(per "$out/engine-typical-view-1.out" "$out/engine-typical-view-n.out" "$iterations")
step=$(per "$out/engine-typical-step-1.out" "$out/engine-typical-step-n.out" "$iterations")
memo=$(per "$out/engine-typical-memo-1.out" "$out/engine-typical-memo-n.out" "$iterations")
distinct=$(per "$out/engine-typical-distinct-1.out" "$out/engine-typical-distinct-n.out" "$iterations")
namespace=$(per "$out/engine-typical-namespace-1.out" "$out/engine-typical-namespace-n.out" "$iterations")
large=$(per "$out/engine-2x2000-1.out" "$out/engine-2x2000-n.out" "$iterations")
env1000=$(per "$out/engine-env1000-1.out" "$out/engine-env1000-n.out" "$iterations")
env10000=$(per "$out/engine-env10000-1.out" "$out/engine-env10000-n.out" "$iterations")
webhook=$(per "$out/webhook-0.out" "$out/webhook-$n.out" "$n")
webhook_memo=$(per "$out/webhook-memo-0.out" "$out/webhook-memo-$n.out" "$n")
ceiling=$(per "$out/ceiling-0.out" "$out/ceiling-$n.out" "$n")
cat > "$out/instructions.json" <<JSON
{"engine_typical": $typical, "engine_typical_view": $view, "engine_typical_step": $step, "memo_typical": $memo, "engine_typical_distinct": $distinct,
 "engine_typical_new_namespace": $namespace, "engine_2x2000": $large,
 "engine_env_1000": $env1000, "engine_env_10000": $env10000,
 "engine_typical_cold_code_lines": $cold_code, "engine_typical_cold_data_lines": $cold_data,
 "webhook_process": $webhook, "webhook_memo_process": $webhook_memo, "ceiling_process": $ceiling, "requests": $n, "iterations": $iterations}
JSON
echo "instructions per review (valgrind callgrind, Ir)"
echo "  engine, typical pod:       $typical"
echo "    its view alone:          $view; its JSON alone, stepped over, checked, nothing built: $step"
echo "  memory of answers, typical pod again with another uid and token volume name: $memo"
echo "  engine, typical, new ReplicaSet: $distinct"
echo "  engine, typical, new namespace:  $namespace  (every template renders)"
echo "  engine, 2 x 2,000 env pod: $large"
echo "  engine, 1,000 / 10,000 env: $env1000 / $env10000"
echo "  engine, typical pod, cold: $cold_code lines of code and $cold_data of data from memory (64-byte lines missed in a 2 MiB cache)"
echo "  webhook, whole process:    $webhook  (HTTP/1.1, 2 connections, $n requests after a first one, each with a uid and a token volume name of its own; memory of answers off: every review read)"
echo "  webhook, memory on:        $webhook_memo  (the same requests, as deployed: answered from memory from the third on)"
echo "  ceiling, whole process:    $ceiling"
echo "  (also in $out/instructions.json)"
echo "profiles: $out/*.out (callgrind_annotate --inclusive=yes FILE | less)"
