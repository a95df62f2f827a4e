#!/usr/bin/env bash
# A release build of sidecar-injector (and the bench programs) optimized with a profile of the
# server at work (profile-guided optimization): the image (Dockerfile) and `make bench` use it.
#
#   bash tools/pgo-build.sh          prints the directory holding the optimized release binaries
#   bash tools/pgo-build.sh --env    prints `export CARGO_TARGET_DIR=… RUSTFLAGS=…` for further
#                                    cargo commands on the same build (bench/run.sh evals it)
#
# 1. Builds the webhook and the load generator instrumented (-Cprofile-generate) into
#    $BASE/pgo-generate.
# 2. Trains: the instrumented `sidecar-injector serve` on 127.0.0.1 (a development certificate)
#    answers the AdmissionReviews of tests/inputs/{inject,skip,deny} (the golden suite's reviews: injected,
#    skipped and denied pods, v1 and v1beta1, /mutate and /validate; one of them also with 300
#    and 2,000 env vars a container, for large pods) from the load generator,
#    closed and open loop, over HTTP/1.1 and HTTP/2, about 25 s in all, with its memory of
#    answers off so that every review is read; then a server with the memory on answers the
#    same reviews again and again for about 7 s (its memory at work, and its misses). Not bench/review.json:
#    the benchmark's own body is not what the profile is taken from.
# 3. Merges the profile with the llvm-profdata of rustc's LLVM and builds with -Cprofile-use
#    into $BASE/pgo. The profile is kept under a name taken from what it was trained on (the
#    sources, the lock file and rustc's version), so a later run with nothing changed reuses it,
#    and one with a change trains again. The instrumented build's flags do not change with the
#    sources, so it rebuilds only what changed; the optimized build rebuilds everything when the
#    profile is new (every crate is laid out by it).
#
# BASE is CARGO_TARGET_DIR (or target/). The code is the same code as a plain release build;
# only its layout and inlining follow the profile (docs/benchmarks-history.md, "At b4affd8").
# llvm-profdata comes from rustup's llvm-tools component (`rustup component add llvm-tools`) or from
# the distribution's LLVM of the same major version as rustc's (Debian: `apt install llvm-22`).
set -euo pipefail
cd "$(dirname "$0")/.."
env_out=false
[[ ${1:-} == --env ]] && env_out=true
cargo=${CARGO:-cargo}
base=${CARGO_TARGET_DIR:-$PWD/target}
log() { echo "[pgo $(date -u +%H:%M:%S)] $*" >&2; }

llvm_major=$(rustc -vV | sed -n 's/^LLVM version: \([0-9]*\).*/\1/p')
find_profdata() {
  local candidate
  for candidate in "$(rustc --print sysroot)"/lib/rustlib/*/bin/llvm-profdata \
    "/usr/lib/llvm-$llvm_major/bin/llvm-profdata" "$(command -v "llvm-profdata-$llvm_major" || true)"; do
    if [[ -x $candidate ]]; then
      echo "$candidate"
      return
    fi
  done
}
profdata=$(find_profdata)
# A fresh machine with rustup has none: rustup's llvm-tools component is rustc's own LLVM
# (installed once, beside the toolchain, as the Dockerfile's builder does).
if [[ -z $profdata ]] && command -v rustup >/dev/null; then
  log "no llvm-profdata: rustup component add llvm-tools"
  rustup component add llvm-tools >&2 || true
  profdata=$(find_profdata)
fi
if [[ -z $profdata ]]; then
  echo "tools/pgo-build.sh: no llvm-profdata for LLVM $llvm_major (rustc's): run" \
    "'rustup component add llvm-tools' or install llvm-$llvm_major" >&2
  exit 3
fi

# What the profile depends on: the server's sources and templates, the lock file, the training
# (this script and its reviews), the compiler. Not the bench programs' sources: the load
# generator only drives the training, and none of its code is in the profile.
# The files themselves, committed or not, in a checkout or a Docker build context alike.
key=$({
  rustc -vV
  find src templates Cargo.lock Cargo.toml tests/inputs tools/pgo-build.sh -type f \
    -exec sha256sum {} + | LC_ALL=C sort
} | sha256sum | cut -c1-16)
data="$base/pgo-data"
profile="$data/$key.profdata"
packages=(-p sidecar-injector -p sidecar-injector-bench --bins)

if [[ ! -s $profile ]]; then
  raw="$data/raw"
  mkdir -p "$raw"
  log "instrumented build (profile $key)"
  RUSTFLAGS="-Cprofile-generate=$raw" CARGO_TARGET_DIR="$base/pgo-generate" \
    "$cargo" build --release --locked "${packages[@]}" >&2
  # The build scripts ran instrumented too, and an earlier training may have left some: only
  # this training's server profile is merged.
  rm -f "$raw"/*.profraw
  bin="$base/pgo-generate/release"
  tmp=$(mktemp -d)
  server=""
  cleanup() {
    [[ -n $server ]] && kill "$server" 2>/dev/null || true
    rm -rf "$tmp"
  }
  trap cleanup EXIT
  # Below the kernel's ephemeral ports (32768 on): an outgoing connection cannot hold it.
  port=$((20000 + RANDOM % 12000))
  # The load generator's own profile is not wanted: it goes to the scratch directory. Every
  # review goes out compact, as an API server writes it (the files are indented for people):
  # trained on indented text, the build took the reader's whitespace paths for the hot ones.
  load() {
    LLVM_PROFILE_FILE="$tmp/loadgen-%p.profraw" "$bin/loadgen" --addr "127.0.0.1:$port" \
      --ca "$tmp/ca.pem" --warmup 0 --compact "$@" >"$tmp/load.log" 2>&1
  }
  train() {
    load "$@" || { cat "$tmp/load.log" >&2; echo "tools/pgo-build.sh: training failed: loadgen $*" >&2; exit 1; }
  }
  # A server with the given flags, on $port, once it answers.
  start_server() {
    rm -f "$tmp/ca.pem"
    LLVM_PROFILE_FILE="$raw/server-%p.profraw" RUST_LOG=error "$bin/sidecar-injector" serve \
      --listen "127.0.0.1:$port" --admin-listen "127.0.0.1:$((port + 1))" \
      --dev-ca-file "$tmp/ca.pem" "$@" >"$tmp/serve.log" 2>&1 &
    server=$!
    local started=false
    for _ in $(seq 200); do
      if [[ -s $tmp/ca.pem ]] && load --check --body tests/inputs/inject/pod-v1.json; then
        started=true
        break
      fi
      sleep 0.05
    done
    $started || { cat "$tmp/serve.log" >&2; echo "tools/pgo-build.sh: the server did not start" >&2; exit 1; }
  }
  stop_server() {
    kill -TERM "$server"
    wait "$server" || { echo "tools/pgo-build.sh: the trained server did not exit cleanly" >&2; exit 1; }
    server=""
  }
  reviews=(tests/inputs/{inject,skip,deny}/*.json)
  # The engine, with the memory of answers off: the load generator sends one body again and
  # again (a fresh uid each time), which the memory would answer without reading it.
  log "training on 127.0.0.1:$port: the engine"
  start_server --memo-entries 0
  for review in "${reviews[@]}"; do
    for path in /mutate /validate; do
      train --path "$path" --body "$review" --duration 0.25
      train --path "$path" --body "$review" --duration 0.25 --http 2 --connections 2 --streams 8
    done
  done
  for review in "${reviews[@]}"; do
    train --body "$review" --duration 0.2 --rate 3000
  done
  # Large pods: a few hundred and a few thousand env vars a container.
  for count in 300 2000; do
    train --body tests/inputs/inject/pod-v1.json --pad-env "$count" --duration 1
    train --body tests/inputs/inject/pod-v1.json --pad-env "$count" --duration 0.5 --path /validate
  done
  stop_server
  # The memory of answers, as the replicas of a workload meet it: with a token volume name
  # each (as the API server names them) and with one name (pods that mount no token).
  log "training on 127.0.0.1:$port: the memory of answers"
  start_server
  for review in "${reviews[@]}"; do
    train --body "$review" --duration 0.1 --fixed-token
    train --body "$review" --duration 0.1 --http 2 --connections 2 --streams 8 --fixed-token
    train --body "$review" --duration 0.1 --rate 3000 --path /validate --fixed-token
    train --body "$review" --duration 0.1
  done
  stop_server
  compgen -G "$raw/server-*.profraw" >/dev/null \
    || { echo "tools/pgo-build.sh: the server wrote no profile" >&2; exit 1; }
  "$profdata" merge -o "$profile.tmp" "$raw"/server-*.profraw
  # One profile kept (about 16 MB each): the sources it was trained on are gone.
  find "$data" -maxdepth 1 -name '*.profdata' ! -name "$key.profdata" -delete
  mv "$profile.tmp" "$profile"
  rm -f "$raw"/*.profraw
  log "profile $profile ($(du -h "$profile" | cut -f1))"
else
  log "reusing profile $profile"
fi

log "optimized build"
RUSTFLAGS="-Cprofile-use=$profile" CARGO_TARGET_DIR="$base/pgo" \
  "$cargo" build --release --locked "${packages[@]}" >&2
if $env_out; then
  printf 'export CARGO_TARGET_DIR=%q RUSTFLAGS=%q\n' "$base/pgo" "-Cprofile-use=$profile"
else
  echo "$base/pgo/release"
fi
