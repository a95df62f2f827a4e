#!/usr/bin/env bash
# Writes the chart's shipped export (files/policies/): the backstop for the chart's default
# values, and the fingerprint of what it was exported from (the ConfigMap's
# sidecar-injector.io/policy-fingerprint). Run after changing the default config, a bundled
# template or the exporter; `charts/test.sh` fails while the shipped export is stale.
#   charts/export-policies.sh [OUT_DIR]   (default: charts/sidecar-injector/files/policies)
#   env SIDECAR_INJECTOR_BIN  the binary (default: cargo build, then the debug binary)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
chart="$root/charts/sidecar-injector"
out="${1:-$chart/files/policies}"
# shellcheck source=../tools/env.sh
source "$root/tools/env.sh"
bin="${SIDECAR_INJECTOR_BIN:-}"
if [[ -z "$bin" ]]; then
  (cd "$root" && cargo build --quiet --bin sidecar-injector)
  dir=$(cd "$root" && cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
  bin="$dir/debug/sidecar-injector"
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
helm template sidecar-injector "$chart" --namespace sidecar-injector \
  --show-only templates/configmap.yaml 2> >(grep -v "symbolic link in path" >&2) >"$work/cm.yaml"
sed -n 's/^ *sidecar-injector.io\/policy-fingerprint: "\(.*\)"$/\1/p' "$work/cm.yaml" >"$work/fingerprint"
[[ -s "$work/fingerprint" ]] || { echo "export-policies.sh: no fingerprint in the rendered ConfigMap" >&2; exit 1; }
mkdir -p "$out"
SIDECAR_INJECTOR_NAMESPACE=__RELEASE_NAMESPACE__ "$bin" export backstop --configmap "$work/cm.yaml" >"$out/backstop.yaml"
cp "$work/fingerprint" "$out/fingerprint"
