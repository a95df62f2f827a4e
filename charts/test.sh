#!/usr/bin/env bash
# Checks the Helm chart and the Dockerfile: helm lint, helm template snapshots (Helm 4 and
# Helm 3), the alert rules (promtool check rules and the unit tests of tests/alerts/), the
# chart's pytest suite, hadolint. The pytest suite also runs the chart against a
# real kube-apiserver on 127.0.0.1 and its config through the real binary, when those are
# already built. Ends with the line "N passed, M failed"; exits non-zero if anything failed.
#   charts/test.sh                      run everything
#   UPDATE_SNAPSHOTS=1 charts/test.sh   rewrite tests/snapshots/ from the current chart
# Tools come from tools/install.sh and tools/prometheus.sh (cached outside the checkout). Nothing here talks to an
# existing cluster: KUBECONFIG points at nothing (the apiserver tests start their own).
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
chart="$root/charts/sidecar-injector"
cases="$chart/tests/cases"
snapshots="$chart/tests/snapshots"

bash "$root/tools/install.sh" || { echo "0 passed, 1 failed"; exit 1; }
# shellcheck source=../tools/env.sh
source "$root/tools/env.sh"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# promtool, built from the Go module proxy the first time (a few minutes), then cached.
prometheus_bin="$(bash "$root/tools/prometheus.sh" 2>"$work/prometheus-build.log" | tail -n1)" || {
  tail -n 20 "$work/prometheus-build.log"
  echo "0 passed, 1 failed"
  exit 1
}
export KUBECONFIG="$work/no-kubeconfig"
export PYTHONDONTWRITEBYTECODE=1

helms=(helm)
if command -v helm3 >/dev/null 2>&1; then helms+=(helm3); fi

passed=0 failed=0 skipped=0
# check NAME COMMAND...: runs COMMAND quietly; on failure shows its output.
check() {
  local name="$1" log="$work/log"
  shift
  if "$@" >"$log" 2>&1; then
    passed=$((passed + 1))
    echo "ok   $name"
  else
    failed=$((failed + 1))
    echo "FAIL $name"
    grep -v "symbolic link in path" "$log" | tail -n 40 | sed 's/^/     /'
  fi
}

# Helm prints a notice for the files/templates link on every load; it is expected.
quiet_helm() { "$@" 2> >(grep -v "symbolic link in path" >&2); }

# Random certificates masked, documents in a fixed order: see tests/snapshot.py.
render() { # HELM CASE
  quiet_helm "$1" template sidecar-injector "$chart" --namespace sidecar-injector \
    --kube-version 1.35.0 --values "$cases/$2.yaml" >"$work/raw.yaml" || return 1
  python "$chart/tests/snapshot.py" <"$work/raw.yaml"
}

snapshot() { # HELM CASE
  render "$1" "$2" >"$work/$1-$2.yaml" || return 1
  if [[ "${UPDATE_SNAPSHOTS:-0}" == 1 ]]; then
    cp "$work/$1-$2.yaml" "$snapshots/$2.yaml"
  fi
  diff -u "$snapshots/$2.yaml" "$work/$1-$2.yaml"
}

templates_link() {
  [[ -L "$chart/files/templates" ]] || { echo "files/templates is not a symlink"; return 1; }
  [[ "$(cd "$chart/files/templates" && pwd -P)" == "$(cd "$root/templates" && pwd -P)" ]] \
    || { echo "files/templates does not lead to the repository's templates/"; return 1; }
  compgen -G "$root/templates/*.yaml.j2" >/dev/null || { echo "no templates/*.yaml.j2"; return 1; }
}

package() { # HELM: the packaged chart carries the templates behind the link as real files.
  local out="$work/package-$1"
  mkdir -p "$out"
  quiet_helm "$1" package "$chart" --destination "$out" >/dev/null || return 1
  local listing
  listing="$(tar -tzf "$out"/sidecar-injector-*.tgz)" || return 1
  local t
  for t in "$root"/templates/*.yaml.j2; do
    grep -qx "sidecar-injector/files/templates/$(basename "$t")" <<<"$listing" \
      || { echo "$(basename "$t") missing from the package"; return 1; }
  done
  if grep -q "sidecar-injector/tests/" <<<"$listing"; then echo "tests/ packaged"; return 1; fi
}

# The rules as the chart renders them with its defaults (release sidecar-injector in namespace
# sidecar-injector, as tests/alerts/ expects), beside the unit tests that load them.
alert_rules() { # HELM
  local dir="$work/alerts-$1"
  mkdir -p "$dir"
  HELM="$1" quiet_helm python "$root/charts/prometheus-rules.py" --namespace sidecar-injector \
    >"$dir/rules.yaml" || return 1
  cp "$chart/tests/alerts/"*.yaml "$dir/"
}
promtool_check() { # HELM
  alert_rules "$1" && "$prometheus_bin/promtool" check rules "$work/alerts-$1/rules.yaml"
}
promtool_test() { # HELM
  alert_rules "$1" || return 1
  local t
  for t in "$work/alerts-$1/"*_test.yaml; do
    "$prometheus_bin/promtool" test rules "$t" || return 1
  done
}

check "files/templates links to templates/" templates_link

case_names=()
for f in "$cases"/*.yaml; do case_names+=("$(basename "$f" .yaml)"); done

for h in "${helms[@]}"; do
  version="$("$h" version --short 2>/dev/null)"
  for c in "${case_names[@]}"; do
    check "$h ($version) lint --strict $c" \
      quiet_helm "$h" lint --strict "$chart" --namespace sidecar-injector --values "$cases/$c.yaml"
  done
  for c in "${case_names[@]}"; do
    check "$h ($version) template matches snapshots/$c.yaml" snapshot "$h" "$c"
  done
  check "$h ($version) package" package "$h"
  check "$h ($version) promtool check rules (the PrometheusRule's rules)" promtool_check "$h"
  check "$h ($version) promtool test rules tests/alerts/" promtool_test "$h"
done
if [[ ${#helms[@]} -lt 2 ]]; then
  echo "skip Helm 3 checks: helm3 is not installed (SIDECAR_INJECTOR_SKIP_HELM3=1?)"
  skipped=$((skipped + 1))
fi

check "hadolint --failure-threshold warning Dockerfile" \
  hadolint --failure-threshold warning "$root/Dockerfile"

# pytest: each test counts once.
junit="$work/pytest.xml"
HELM_BINARIES="${helms[*]}" python -m pytest -q -p no:cacheprovider --junitxml="$junit" \
  "$chart/tests" | grep -v "symbolic link in path"
if [[ -s "$junit" ]]; then
  read -r p f s < <(python - "$junit" <<'PY'
import sys, xml.etree.ElementTree as ET
suites = ET.parse(sys.argv[1]).getroot()
suites = [suites] if suites.tag == "testsuite" else list(suites)
tests = sum(int(s.get("tests", 0)) for s in suites)
bad = sum(int(s.get("failures", 0)) + int(s.get("errors", 0)) for s in suites)
skip = sum(int(s.get("skipped", 0)) for s in suites)
print(tests - bad - skip, bad, skip)
PY
  )
  passed=$((passed + p)) failed=$((failed + f)) skipped=$((skipped + s))
  if [[ "$((p + f))" -eq 0 ]]; then
    echo "FAIL pytest ran no test"
    failed=$((failed + 1))
  fi
else
  echo "FAIL pytest did not run"
  failed=$((failed + 1))
fi

if [[ "$skipped" -gt 0 ]]; then
  echo "($skipped skipped: see the skip lines and pytest's summary above)"
fi
echo "$passed passed, $failed failed"
[[ "$failed" -eq 0 ]]
