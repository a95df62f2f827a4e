#!/usr/bin/env bash
# Local stand-ins, under the same names, for the two public images the Dockerfile starts from
# (no registry can be reached here):
#   rust:1.95.0-bookworm                  Debian 12 (minbase) with gcc, libc6-dev, make, git,
#                                         curl, ca-certificates and pkg-config (what the build
#                                         uses of buildpack-deps), and this machine's Rust
#                                         toolchain of the Dockerfile's version as rustup's
#                                         default in /usr/local/rustup, rustup and its proxies
#                                         in /usr/local/cargo/bin, RUSTUP_HOME, CARGO_HOME and
#                                         PATH as the official image sets them. llvm-tools is
#                                         already installed (the Dockerfile's `rustup component
#                                         add` then has nothing to fetch).
#   gcr.io/distroless/cc-debian12:nonroot what distroless/cc holds, from Debian 12's packages
#                                         unpacked without a shell or package manager: glibc,
#                                         libgcc, libstdc++, libgomp, libssl3, CA certificates,
#                                         tzdata, netbase, base-files, /etc/passwd with root,
#                                         nobody and nonroot (65532), USER 65532, /tmp 1777.
#
# Usage:
#   e2e/docker/base-images.sh prepare   (outside, root, needs Debian's mirror) builds the root
#                                       file systems as tars in $CACHE/docker/base/, once per
#                                       key (this script, the toolchain's rustc -vV)
#   e2e/docker/base-images.sh load      (inside e2e/docker/dockerd.sh) imports them into the
#                                       engine, unless an image of the same key is there
set -euo pipefail

HERE=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd -- "$HERE/../.." && pwd)
CACHE=${SIDECAR_INJECTOR_CACHE:-$HOME/.cache/sidecar-injector}
BASE=$CACHE/docker/base
SUITE=bookworm
log() { printf '[base-images %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# The builder's names and Rust version, read from the Dockerfile (it must keep this shape).
builder_ref=$(sed -n 's/^FROM \(rust:[^ ]*\) AS builder$/\1/p' "$REPO/Dockerfile")
runtime_ref=$(awk '/^FROM /{ref=$2} END{print ref}' "$REPO/Dockerfile")
[[ "$builder_ref" =~ ^rust:([0-9]+\.[0-9]+\.[0-9]+)-$SUITE$ ]] ||
  die "the Dockerfile's builder is not 'FROM rust:X.Y.Z-$SUITE AS builder' (got '$builder_ref')"
RUST_VERSION=${BASH_REMATCH[1]}
[[ "$runtime_ref" == gcr.io/distroless/cc-debian12:nonroot ]] ||
  die "the Dockerfile's last stage is not FROM gcr.io/distroless/cc-debian12:nonroot (got '$runtime_ref')"

toolchain_dir() {
  local sysroot
  sysroot=$(rustup run "$RUST_VERSION" rustc --print sysroot 2>/dev/null) ||
    die "no Rust $RUST_VERSION toolchain here (rustup toolchain install $RUST_VERSION)"
  readlink -f "$sysroot"
}
# What a stand-in is made of: how it is made (the function's own text) and the toolchain.
key_of() { # name
  { declare -f "prepare_$1"; rustup run "$RUST_VERSION" rustc -vV; } | sha256sum | cut -c1-16
}

prepare_builder() { # out.tar
  local out=$1 root toolchain
  toolchain=$(toolchain_dir)
  [[ -x "$toolchain/lib/rustlib/x86_64-unknown-linux-gnu/bin/llvm-profdata" ]] || {
    log "rustup component add llvm-tools (toolchain $RUST_VERSION)"
    rustup component add --toolchain "$RUST_VERSION" llvm-tools >&2
  }
  root=$(mktemp -d -t stand-in-rust.XXXXXX)
  log "mmdebstrap $SUITE: the builder's Debian ($root)"
  mmdebstrap --quiet --variant=minbase \
    --include=ca-certificates,curl,git,gcc,libc6-dev,make,pkg-config,xz-utils \
    "$SUITE" "$root" >&2
  log "the Rust $RUST_VERSION toolchain from $toolchain (without its HTML docs)"
  mkdir -p "$root/usr/local/rustup/toolchains" "$root/usr/local/cargo/bin"
  tar -C "$toolchain" --exclude=./share/doc -cf - . |
    tar -C "$root/usr/local/rustup/toolchains" --one-top-level="$RUST_VERSION-x86_64-unknown-linux-gnu" -xf -
  printf 'version = "12"\ndefault_toolchain = "%s-x86_64-unknown-linux-gnu"\nprofile = "minimal"\n' \
    "$RUST_VERSION" >"$root/usr/local/rustup/settings.toml"
  install -m 0755 "$(command -v rustup)" "$root/usr/local/cargo/bin/rustup"
  local proxy
  for proxy in cargo rustc rustdoc rust-gdb rust-lldb; do
    ln -s rustup "$root/usr/local/cargo/bin/$proxy"
  done
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  tar -C "$root" --numeric-owner -cf "$out.tmp" .
  rm -rf "$root"
  mv "$out.tmp" "$out"
}

prepare_runtime() { # out.tar
  local out=$1 root
  root=$(mktemp -d -t stand-in-distroless.XXXXXX)
  log "mmdebstrap $SUITE (extract): the runtime's files ($root)"
  mmdebstrap --quiet --variant=extract \
    --include=base-files,netbase,tzdata,libc6,libgcc-s1,libstdc++6,libgomp1,libssl3,ca-certificates \
    "$SUITE" "$root" >&2
  # What the packages' scripts would have made, and distroless's users.
  mkdir -p "$root/etc/ssl/certs" "$root/home/nonroot" "$root/root" "$root/tmp"
  find "$root/usr/share/ca-certificates" -name '*.crt' -print0 | LC_ALL=C sort -z |
    xargs -0 cat >"$root/etc/ssl/certs/ca-certificates.crt"
  [[ -s "$root/etc/ssl/certs/ca-certificates.crt" ]] || die "no CA certificates in the runtime"
  printf '%s\n' 'root:x:0:0:root:/root:/sbin/nologin' \
    'nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin' \
    'nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin' >"$root/etc/passwd"
  printf '%s\n' 'root:x:0:' 'nobody:x:65534:' 'tty:x:5:' 'staff:x:50:' 'nonroot:x:65532:' \
    >"$root/etc/group"
  chown 65532:65532 "$root/home/nonroot"
  chmod 0700 "$root/root"
  chmod 1777 "$root/tmp"
  # Neither a shell nor a package manager's state: only the files.
  rm -rf "$root"/bin/sh "$root"/usr/bin/sh "$root"/var/lib/dpkg "$root"/var/cache/* \
    "$root"/var/lib/apt "$root"/usr/share/doc "$root"/usr/share/man "$root"/usr/share/info
  tar -C "$root" --numeric-owner -cf "$out.tmp" .
  rm -rf "$root"
  mv "$out.tmp" "$out"
}

case "${1:-}" in
  prepare)
    ((EUID == 0)) || die "mmdebstrap needs root here"
    mkdir -p "$BASE"
    exec 9>"$BASE/.lock"
    flock 9
    for name in builder runtime; do
      tar="$BASE/$name-$(key_of "$name").tar"
      if [[ -s "$tar" ]]; then
        log "cached: $tar"
        continue
      fi
      start=$SECONDS
      "prepare_$name" "$tar"
      find "$BASE" -maxdepth 1 -name "$name-*.tar" ! -name "$(basename "$tar")" -delete
      log "$tar ($(du -h "$tar" | cut -f1), $((SECONDS - start))s)"
    done
    ;;
  load)
    [[ -n "${DOCKER_HOST:-}" ]] || die "load runs inside e2e/docker/dockerd.sh"
    rust_env=(--change "ENV RUSTUP_HOME=/usr/local/rustup" --change "ENV CARGO_HOME=/usr/local/cargo"
      --change "ENV PATH=/usr/local/cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
      --change "ENV RUST_VERSION=$RUST_VERSION")
    runtime_cfg=(--change "USER 65532" --change "WORKDIR /home/nonroot"
      --change "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
      --change "ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt")
    for name in builder runtime; do
      key=$(key_of "$name")
      tar="$BASE/$name-$key.tar"
      [[ -s "$tar" ]] || die "$tar is missing: run e2e/docker/base-images.sh prepare first"
      if [[ $name == builder ]]; then ref=$builder_ref; cfg=("${rust_env[@]}"); else ref=$runtime_ref; cfg=("${runtime_cfg[@]}"); fi
      have=$(docker image inspect --format '{{index .Config.Labels "io.sidecar-injector.stand-in"}}' "$ref" 2>/dev/null || true)
      if [[ "$have" == "$key" ]]; then
        log "$ref: stand-in $key loaded already"
        continue
      fi
      log "$ref: importing the stand-in $key"
      docker import "${cfg[@]}" --change "LABEL io.sidecar-injector.stand-in=$key" "$tar" "$ref" >/dev/null
    done
    ;;
  *) sed -n '2,28p' "$0" >&2; exit 2 ;;
esac
