#!/usr/bin/env bash
# Builds the image from the top-level Dockerfile, for real, as a user's `docker build .` does,
# with a private Docker engine (dockerd.sh: its own namespaces, nothing leaves them) and no
# registry:
#  1. the base images' local stand-ins (base-images.sh), under the names the Dockerfile uses;
#  2. the build context: the checkout's files (committed or not, .gitignore honoured; the
#     Dockerfile's .dockerignore applies as for any build), the crates this machine already
#     fetched (`cargo vendor --locked`, cached by Cargo.lock) and a .cargo/config.toml that
#     points cargo at them. The engine's namespace has no route out, so nothing in the build
#     can fetch anything; the Dockerfile a user builds fetches its crates from crates.io;
#  3. `docker build` (BuildKit; PGO as the Dockerfile does by default, DOCKER_BUILD_ARGS
#     adds arguments), the image tagged local/sidecar-injector:e2e;
#  4. checks of the image as Docker made it: it runs (`--help` and `--version` through its
#     entrypoint), as uid 65532, has no shell, holds the bundled templates, and the binary is
#     the profile-guided build when PGO=1;
#  5. `docker save` to OUT (a docker archive that containerd's `ctr images import` and
#     `kind load image-archive` take).
#
# Usage: e2e/docker/build-image.sh OUT.tar   (root)
#   env DOCKER_BUILD_ARGS   more `docker build` arguments, e.g. "--build-arg PGO=0"
set -euo pipefail

HERE=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd -- "$HERE/../.." && pwd)
CACHE=${SIDECAR_INJECTOR_CACHE:-$HOME/.cache/sidecar-injector}
IMAGE=local/sidecar-injector:e2e
log() { printf '[image %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# ------------------------------------------------------------------ inside the engine
if [[ "${1:-}" == --inside ]]; then
  context=$2 out=$3
  bash "$HERE/base-images.sh" load
  log "docker build -t $IMAGE ${DOCKER_BUILD_ARGS:-}"
  start=$SECONDS
  # shellcheck disable=SC2086 # word-split on purpose: several arguments
  docker build --progress plain ${DOCKER_BUILD_ARGS:-} -t "$IMAGE" - <"$context" \
    >"$out.build.log" 2>&1 || { tail -n 40 "$out.build.log" >&2; die "docker build failed (log: $out.build.log)"; }
  log "built in $((SECONDS - start))s ($(docker image inspect --format '{{.Size}}' "$IMAGE" | numfmt --to=iec) bytes)"

  # The image as Docker made it: it starts, as the user the chart expects, with no shell.
  user=$(docker image inspect --format '{{.Config.User}}' "$IMAGE")
  [[ "$user" == 65532:65532 ]] || die "the image runs as '$user', not 65532:65532"
  docker run --rm --network none "$IMAGE" --help >"$out.help" 2>&1 ||
    die "the image does not start: $(cat "$out.help")"
  grep -q -- '--listen' "$out.help" || die "'serve --help' from the image says nothing of --listen"
  version=$(docker run --rm --network none --entrypoint /sidecar-injector "$IMAGE" --version)
  log "the image's binary: $version"
  if docker run --rm --network none --entrypoint /bin/sh "$IMAGE" -c true >/dev/null 2>&1; then
    die "the image has a shell: its runtime base is not distroless-like"
  fi
  # The bundled templates, as `serve` finds them by default.
  container=$(docker create "$IMAGE")
  docker export "$container" | tar -tf - >"$out.files"
  docker rm "$container" >/dev/null
  for f in sidecar-injector templates/config.yaml; do
    grep -qx "$f" "$out.files" || die "the image has no /$f"
  done
  # The profile-guided build shows in the log of the build that ran it. A build BuildKit
  # answers wholly from its cache (the same context again) logs no step, but yields the same
  # image id: ids whose build log showed PGO are kept, so such an image is known for what it is.
  if [[ "${DOCKER_BUILD_ARGS:-}" != *PGO=0* ]]; then
    id=$(docker image inspect --format '{{.Id}}' "$IMAGE")
    verified=$CACHE/docker/pgo-image-ids
    if grep -q '\[pgo [0-9:]*\] optimized build' "$out.build.log"; then
      { grep -vxF "$id" "$verified" 2>/dev/null | tail -n 19 || true; echo "$id"; } >"$verified.tmp"
      mv "$verified.tmp" "$verified"
    elif grep -qxF "$id" "$verified" 2>/dev/null; then
      log "the build was wholly cached: image $id was a profile-guided build when it was made"
    else
      die "the build log shows no profile-guided build (tools/pgo-build.sh), and image $id was not seen built with one"
    fi
  fi
  docker save -o "$out.tmp" "$IMAGE"
  mv "$out.tmp" "$out"
  rm -f "$out.help" "$out.files"
  log "saved $IMAGE to $out ($(du -h "$out" | cut -f1))"
  exit 0
fi

# ------------------------------------------------------------------ outside
[[ $# -eq 1 ]] || { sed -n '2,22p' "$0" >&2; exit 2; }
OUT=$(realpath -m "$1")
((EUID == 0)) || die "the Docker engine needs root"
mkdir -p "$(dirname "$OUT")"
bash "$HERE/install.sh"
bash "$HERE/base-images.sh" prepare
cd "$REPO"
CARGO=${CARGO:-cargo}

VENDOR_ROOT=$CACHE/docker/vendor
vendor=$VENDOR_ROOT/$(sha256sum Cargo.lock | cut -c1-16)
if [[ ! -f "$vendor/.complete" ]]; then
  log "cargo vendor --locked ($vendor)"
  rm -rf "$vendor"
  mkdir -p "$VENDOR_ROOT"
  "$CARGO" vendor --locked --versioned-dirs --quiet "$vendor" >/dev/null
  touch "$vendor/.complete"
  find "$VENDOR_ROOT" -mindepth 1 -maxdepth 1 ! -name "$(basename "$vendor")" -exec rm -rf {} +
fi

WORK=$(mktemp -d -t sidecar-injector-image.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
context=$WORK/context.tar
git ls-files -z --cached --others --exclude-standard |
  while IFS= read -r -d '' f; do [[ -e "$f" || -L "$f" ]] && printf '%s\0' "$f"; done |
  tar --null -T - -cf "$context"
tar -C "$vendor" --exclude=.complete --transform 's,^\.,vendor,' -rf "$context" .
mkdir -p "$WORK/cfg/.cargo"
printf '%s\n' '[source.crates-io]' 'replace-with = "vendored-sources"' '' \
  '[source.vendored-sources]' 'directory = "vendor"' >"$WORK/cfg/.cargo/config.toml"
tar -C "$WORK/cfg" -rf "$context" .cargo/config.toml
log "build context: $(du -h "$context" | cut -f1) (the checkout and $(find "$vendor" -mindepth 1 -maxdepth 1 -type d | wc -l) vendored crates)"

bash "$HERE/dockerd.sh" bash "$0" --inside "$context" "$OUT"
