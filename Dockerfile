# syntax=docker/dockerfile:1
# The sidecar-injector image: the binary (linked against glibc) and the bundled templates on
# distroless, running as the distroless "nonroot" user.
#   docker build -t sidecar-injector .
# Dependencies are built in their own layer (cargo-chef), so a source change rebuilds only the
# crate itself. Workspace members (e2e, bench) may come and go: chef's recipe follows the
# workspace, and only the sidecar-injector binary is built.

FROM rust:1.95.0-bookworm AS chef
RUN cargo install cargo-chef --locked --version 0.1.78
WORKDIR /src

# The recipe: every manifest and lock file of the workspace, no sources.
FROM chef AS planner
COPY . .
RUN cargo chef prepare --recipe-path recipe.json

FROM chef AS builder
COPY --from=planner /src/recipe.json recipe.json
# Dependencies only; this layer is reused until Cargo.toml or Cargo.lock change.
RUN cargo chef cook --release --locked --recipe-path recipe.json \
      --package sidecar-injector --bin sidecar-injector
COPY . .
RUN cargo build --release --locked --package sidecar-injector --bin sidecar-injector \
 && install -D -m 0755 target/release/sidecar-injector /out/sidecar-injector

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
