#!/usr/bin/env bash
# Two builds of the engine inside the server, compared by what a request costs the server:
# `ceiling --engine` (the transport plus the engine on every body) from each build directory, and
# the plain ceiling from the second, closed loop on 127.0.0.1, each run bounded in time. The
# server's CPU (user + system, /proc/PID/stat) over a run divided by the requests answered.
# Every round runs the three in turn, and the order of the two engines flips from round to
# round: which one runs second in a round moves the numbers as much as a 10% step of the code
# (docs/benchmarks-history.md, "At 21ce87f").
#
# usage: bash bench/engine-ab.sh OLD_BIN_DIR NEW_BIN_DIR [ROUNDS] [SECONDS] [HTTP]
#   a BIN_DIR holds release `ceiling` and `loadgen` (cargo build --release -p
#   sidecar-injector-bench --bin ceiling --bin loadgen), e.g. a worktree's target/release.
set -euo pipefail
old=${1:?usage: engine-ab.sh OLD_BIN_DIR NEW_BIN_DIR [ROUNDS] [SECONDS] [HTTP]}
new=${2:?usage: engine-ab.sh OLD_BIN_DIR NEW_BIN_DIR [ROUNDS] [SECONDS] [HTTP]}
rounds=${3:-6}
seconds=${4:-4}
http=${5:-1}
for bin in "$old/ceiling" "$new/ceiling" "$new/loadgen"; do
  [[ -x $bin ]] || { echo "engine-ab.sh: $bin is not an executable" >&2; exit 2; }
done

dir=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  rm -rf "$dir"
}
trap cleanup EXIT

# Each server stops by itself after the whole comparison's time, whatever happens here.
limit=$((rounds * 3 * (seconds + 5) + 30))
serve() { # NAME BIN PORT ARGS...
  local name=$1 bin=$2 port=$3
  shift 3
  "$bin" --listen "127.0.0.1:$port" --dev-ca-file "$dir/$name.pem" --exit-after "$limit" "$@" \
    >/dev/null 2>&1 &
  pids+=($!)
  eval "pid_$name=$!"
}
serve plain "$new/ceiling" 19870
serve old "$old/ceiling" 19871 --engine
serve new "$new/ceiling" 19872 --engine
for name in plain old new; do
  for _ in $(seq 50); do [[ -s $dir/$name.pem ]] && break; sleep 0.1; done
done
sleep 0.5

ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)
run() { # NAME PORT -> "NAME req/s server-CPU-us-per-request"
  local name=$1 port=$2 pid_var="pid_$1"
  local pid=${!pid_var} t0 t1 out
  t0=$(ticks "$pid")
  out=$("$new/loadgen" --addr "127.0.0.1:$port" --ca "$dir/$name.pem" --http "$http" \
    --connections 16 --duration "$seconds" --warmup 0)
  t1=$(ticks "$pid")
  python3 -c '
import json, sys
r = json.loads(sys.argv[1]); n = max(r["requests"], 1); rps = r["rps"]
cpu = (int(sys.argv[3]) - int(sys.argv[2])) * 1e6 / int(sys.argv[4]) / n
print(f"{sys.argv[5]} {rps:.0f} {cpu:.1f}")' "$out" "$t0" "$t1" "$hz" "$name"
}

results=()
for round in $(seq "$rounds"); do
  if ((round % 2)); then order=(old new); else order=(new old); fi
  for name in plain "${order[@]}"; do
    port=19870
    [[ $name == old ]] && port=19871
    [[ $name == new ]] && port=19872
    line=$(run "$name" "$port")
    echo "round $round: $line"
    results+=("$line")
  done
done

printf '%s\n' "${results[@]}" | python3 -c '
import sys, statistics
rows = {}
for line in sys.stdin:
    name, rps, cpu = line.split()
    rows.setdefault(name, []).append(float(cpu))
for name in ("plain", "old", "new"):
    v = rows.get(name, [])
    if v:
        print(f"{name:5s} server CPU per request: median {statistics.median(v):.1f} us, "
              f"mean {statistics.mean(v):.1f}, range {min(v):.1f}-{max(v):.1f} ({len(v)} runs)")
'
