#!/usr/bin/env bash
# `make bench`: release builds, then on 127.0.0.1 only and bounded in time:
#   1. criterion: engine time as pods grow (benches/engine.rs), about a minute;
#   2. bench-run: the transport ceiling and the webhook under the same load generator,
#      latency at half the ceiling rate, peak RSS, start-up to /readyz (about two minutes).
# Prints a table with the goals and writes target/bench/summary.json in the repository.
# Extra arguments go to bench-run (e.g. --duration 3 --rounds 1 for a quick look).
set -euo pipefail
cd "$(dirname "$0")/.."
out="$PWD/target/bench"
mkdir -p "$out"
cargo=${CARGO:-cargo}

# One invocation: the webhook and the bench programs share one feature resolution, so the
# webhook's crate is compiled once, not once per program.
"$cargo" build --release -p sidecar-injector -p sidecar-injector-bench --bins

# Criterion writes under CRITERION_HOME; keep it with the summary whatever CARGO_TARGET_DIR is.
CRITERION_HOME="$out/criterion" timeout 300 \
  "$cargo" bench -p sidecar-injector --bench engine -- --noplot

# Which code was measured: the commit, and whether src/ differed from it.
revision=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
git diff --quiet HEAD -- src 2>/dev/null || revision="$revision+uncommitted-src"

timeout 540 "$cargo" run --release -q -p sidecar-injector-bench --bin bench-run -- \
  --out "$out" --criterion "$out/criterion" --revision "$revision" "$@"
