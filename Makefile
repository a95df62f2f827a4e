# sidecar-injector: the two commands a new user needs are `make run` and `make test`.
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
CARGO ?= cargo

# Every e2e run (API and node) runs on each of these Kubernetes versions: today's release and the
# newest the Go module proxy serves (MutatingAdmissionPolicy is v1 from 1.36; on 1.35 the suite
# turns on its beta).
K8S_VERSIONS ?= v1.35.8 v1.37.2

# The oldest Kubernetes the product supports (the chart's kubeVersion, `check`'s floor): the API
# scenarios run there too, all but the one of policy mode (no MutatingAdmissionPolicy before
# 1.34). Its control plane is built by tools/prefetch.sh while the earlier steps run.
FLOOR_K8S_VERSION ?= v1.30.14

# Nodes of the node suite: 2 (the default) adds a second node and its scenarios (n09 drain, n10
# node loss, about 130 s more per version); 1 leaves those two out, counted.
E2E_NODES ?= 2

# The image `docker build` makes of the Dockerfile (e2e/docker/build-image.sh: a private engine,
# local stand-ins for the base images, no registry), saved here for the suites that load it.
IMAGE_ARCHIVE ?= $(or $(SIDECAR_INJECTOR_CACHE),$(HOME)/.cache/sidecar-injector)/docker/images/sidecar-injector-e2e.tar

# The kind suite runs on one version: kind v0.33.0's own release line (its node image is made
# here, e2e/kind/node-image.sh; 1.37.2 works too: K8S_VERSION=v1.37.2 bash e2e/kind/run-here.sh).
KIND_K8S_VERSION ?= v1.35.8

.PHONY: run test test-steps test-unit test-chart test-e2e test-e2e-floor test-e2e-node test-e2e-kind control-plane image lint fuzz bench build release help

help: ## List the targets.
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/'

run: ## Serve on the embedded default (bundled templates, a development certificate).
	$(CARGO) run --release -- serve --listen 127.0.0.1:8443 --admin-listen 127.0.0.1:8080

build: ## Debug build.
	$(CARGO) build

release: ## Release build of the binary.
	$(CARGO) build --release --bin sidecar-injector

lint: ## Formatting and clippy on every package of the workspace (root, bench, e2e), warnings as errors.
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

test-unit: ## Unit, golden, property, CLI, server and hostile-client tests, a 3-second fuzz pass, and the bench tools' own tests.
	$(CARGO) test
	$(CARGO) test -p sidecar-injector-bench

FUZZ_SECONDS ?= 300
fuzz: ## Fuzz the review parser and patch builder for FUZZ_SECONDS (default 300; FUZZ_SEED replays a run).
	FUZZ_SECONDS=$(FUZZ_SECONDS) $(CARGO) test --test fuzz -- --nocapture

test-chart: ## helm lint, chart snapshots and webhook-field checks, promtool tests of the alert rules, hadolint.
	bash charts/test.sh

control-plane: ## Build (or reuse) kube-apiserver, kube-controller-manager, kube-scheduler, kubelet and etcd for each of K8S_VERSIONS, cached outside the checkout.
	for v in $(K8S_VERSIONS); do K8S_VERSION=$$v bash e2e/control-plane/build.sh >/dev/null; done

test-e2e: ## The scenarios against a real kube-apiserver + etcd on 127.0.0.1, on each of K8S_VERSIONS.
	for v in $(K8S_VERSIONS); do K8S_VERSION=$$v bash e2e/run.sh; done

test-e2e-floor: ## The API scenarios on the oldest supported Kubernetes (FLOOR_K8S_VERSION; policy mode's p01 and p04 left out, counted).
	K8S_VERSION=$(FLOOR_K8S_VERSION) bash e2e/run.sh

image: ## docker build of the Dockerfile by a private Docker engine in its own network namespace (root; no registry: local stand-ins for the base images), saved to IMAGE_ARCHIVE.
	bash e2e/docker/build-image.sh $(IMAGE_ARCHIVE)

test-e2e-node: image ## The scenarios on a real node: a whole cluster in its own network namespace (root), on each of K8S_VERSIONS, the injector's image from `make image`; two nodes (E2E_NODES=1 for one).
	for v in $(K8S_VERSIONS); do K8S_VERSION=$$v E2E_NODES=$(E2E_NODES) E2E_IMAGE_ARCHIVE=$(IMAGE_ARCHIVE) bash e2e/node/run.sh; done

test-e2e-kind: image ## The scenarios on a kind cluster (root): a private Docker engine in its own network namespace, a node image made here (no registry), the image from `make image`.
	K8S_VERSION=$(KIND_K8S_VERSION) E2E_IMAGE_ARCHIVE=$(IMAGE_ARCHIVE) bash e2e/kind/run-here.sh

# The control plane is built before the chart tests, which also install the chart into it.
# What only the image, node and kind steps need is built meanwhile in the background
# (tools/prefetch.sh): on a fresh machine it fills the time the suites leave the CPU idle.
test: ## Everything CI runs.
	trap 'bash tools/prefetch.sh stop' EXIT; \
	  KIND_K8S_VERSION=$(KIND_K8S_VERSION) FLOOR_K8S_VERSION=$(FLOOR_K8S_VERSION) bash tools/prefetch.sh start; \
	  $(MAKE) --no-print-directory test-steps

test-steps: lint test-unit control-plane test-chart test-e2e image test-e2e-node test-e2e-kind test-e2e-floor

bench: ## Benchmarks, with Istio's injector as the peer row (the image's profile-guided release build, tools/pgo-build.sh; loopback only; about 14 minutes, plus the first builds: about 15 for PGO, about 5 for the peer).
	bash bench/run.sh
