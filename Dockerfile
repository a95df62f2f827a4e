# The sidecar-injector image: the binary (linked against glibc) and the bundled templates on
# distroless, running as the distroless "nonroot" user.
#   docker build -t sidecar-injector .
# The binary is built with profile-guided optimization (tools/pgo-build.sh): an instrumented
# build serves the golden suite's reviews on the builder's loopback for about 25 seconds, and
# the release build is laid out by that profile (the engine costs the server about a third
# less a review; BENCHMARKS.md). `--build-arg PGO=0` builds a plain release binary instead: the same
# code, built in half the time. The build uses BuildKit's cache mounts (Docker 23 and later
# build with BuildKit by default; Docker 20.10 with DOCKER_BUILDKIT=1), so a rebuild compiles
# only what changed. `make image` runs this very build here, with local stand-ins for the two
# base images (e2e/docker/).

FROM rust:1.95.0-bookworm AS builder
# llvm-profdata of rustc's own LLVM, for merging the profile.
RUN rustup component add llvm-tools
WORKDIR /src
COPY . .
ARG PGO=1
# The registry's crates and the build's output are kept between builds (BuildKit's cache
# mounts): a rebuild compiles what changed, and the profile is reused while its inputs stay.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    if [ "$PGO" = 1 ]; then \
      bin=$(bash tools/pgo-build.sh); \
    else \
      cargo build --release --locked --package sidecar-injector --bin sidecar-injector && bin=target/release; \
    fi \
 && install -D -m 0755 "$bin/sidecar-injector" /out/sidecar-injector

# glibc and libgcc, no shell, no package manager. Debian 12, as the builder, so the glibc the
# binary was linked against is there.
FROM gcr.io/distroless/cc-debian12:nonroot
LABEL org.opencontainers.image.title="sidecar-injector" \
      org.opencontainers.image.description="Kubernetes admission webhook that injects sidecars from templates" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=builder /out/sidecar-injector /sidecar-injector
COPY templates/ /templates/
USER 65532:65532
# 8443: webhooks (TLS). 8080: /livez, /readyz, /metrics (plain HTTP).
EXPOSE 8443 8080
ENTRYPOINT ["/sidecar-injector", "serve"]
