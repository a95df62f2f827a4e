#!/usr/bin/env bash
# `make bench`: the image's release build (profile-guided, tools/pgo-build.sh: two builds and
# a 25-second training the first time), then on 127.0.0.1 only and bounded in time:
#   1. criterion: engine time as pods grow (benches/engine.rs), about a minute; instruction
#      counts per review under valgrind (bench/profile.sh), about two minutes;
#   2. bench-run: the transport ceiling, the webhook and the peer (Istio's injector, built from
#      the Go module proxy by bench/istio/build.sh and cached outside the checkout) under the
#      same load generator, the large pod on webhook and peer, latency at 0.4 x the ceiling rate,
#      peak RSS, start-up to /readyz (about three minutes).
# Prints a table with the goals and writes target/bench/summary.json in the repository.
# Extra arguments go to bench-run (e.g. --duration 3 --rounds 1 --latency-seconds 6 for a quick look).
set -euo pipefail
cd "$(dirname "$0")/.."
out="$PWD/target/bench"
mkdir -p "$out"
cargo=${CARGO:-cargo}

# The release build the image ships: optimized with a profile of the server at work
# (tools/pgo-build.sh; trained on the golden suite's reviews, not on the bench's). Every cargo
# command below then builds with the same flags into the same directory, so nothing is built
# twice. One invocation there: the webhook and the bench programs share one feature
# resolution, so the webhook's crate is compiled once, not once per program. pgo-build.sh
# installs rustup's llvm-tools when no llvm-profdata is there; if the profile-guided build
# still fails, the bench stops: the goals are judged on the build the image ships, never on
# another (a plain release build missed them on a fresh machine). BENCH_PLAIN=1 measures a
# plain release build on purpose, and the report says so.
pgo=true
if [[ "${BENCH_PLAIN:-0}" == 1 ]]; then
  pgo=false
  "$cargo" build --release -p sidecar-injector -p sidecar-injector-bench --bins
elif pgo_env=$(CARGO="$cargo" bash tools/pgo-build.sh --env); then
  eval "$pgo_env"
else
  echo "ERROR: tools/pgo-build.sh failed (above): the image's profile-guided build is what the" \
    "goals are judged on. Fix it, or run BENCH_PLAIN=1 make bench to measure a plain release" \
    "build (reported as such)." >&2
  exit 1
fi

# Criterion writes under CRITERION_HOME; keep it with the summary whatever CARGO_TARGET_DIR is.
# Built first, outside the time limit: the bench profile's build (every crate, with the
# profile) takes minutes here, the benches themselves about one.
"$cargo" bench -p sidecar-injector --bench engine --no-run
CRITERION_HOME="$out/criterion" timeout 300 \
  "$cargo" bench -p sidecar-injector --bench engine -- --noplot

# Instruction counts per review under valgrind (callgrind), with the same release build: the
# engine alone and whole processes. They repeat from run to run, unlike times here.
instructions=()
if command -v valgrind >/dev/null; then
  if PROFILE_LINE_TABLES=0 PROFILE_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}" timeout 600 \
    bash bench/profile.sh >"$out/profile.log" 2>&1; then
    instructions=(--instructions "$out/profile/instructions.json")
    tail -n 9 "$out/profile.log"
  else
    echo "WARNING: bench/profile.sh failed (see $out/profile.log): no instruction counts" >&2
  fi
else
  echo "WARNING: valgrind is not installed: no instruction counts" >&2
fi

# Which code was measured: the commit, and whether src/ differed from it.
revision=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
git diff --quiet HEAD -- src 2>/dev/null || revision="$revision+uncommitted-src"
$pgo || revision="$revision (plain release build, no PGO)"

# The peer. If it cannot be built (no Go toolchain, no network on a first build), everything
# else is still measured and the report says why the peer rows are missing.
peer=()
if istio=$(timeout 900 bash bench/istio/build.sh 2>"$out/istio-build.log" | tail -n 1) \
  && [[ -x "$istio" ]]; then
  peer=(--istio "$istio")
else
  reason="bench/istio/build.sh failed: $(tail -n 3 "$out/istio-build.log" | tr '\n' ' ')"
  echo "WARNING: the peer row is not measured: $reason" >&2
  peer=(--istio-unavailable "$reason")
fi

timeout 1020 "$cargo" run --release -q -p sidecar-injector-bench --bin bench-run -- \
  --out "$out" --criterion "$out/criterion" --revision "$revision" "${peer[@]}" \
  "${instructions[@]}" "$@"
