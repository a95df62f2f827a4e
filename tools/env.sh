# shellcheck shell=bash
# Source me after tools/install.sh: puts the test tools first on PATH and keeps helm's own
# state (config, cache, plugins) beside them instead of in the user's home.
_si_tools="${SIDECAR_INJECTOR_CACHE:-$HOME/.cache/sidecar-injector}/tools"
export PATH="$_si_tools/bin:$_si_tools/venv/bin:$PATH"
export HELM_CONFIG_HOME="$_si_tools/helm/config"
export HELM_CACHE_HOME="$_si_tools/helm/cache"
export HELM_DATA_HOME="$_si_tools/helm/data"
unset _si_tools
