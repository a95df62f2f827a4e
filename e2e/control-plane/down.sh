#!/usr/bin/env bash
# Stop the local control plane started by up.sh for WORKDIR (also after a
# half-finished up.sh). Keeps WORKDIR's logs, audit log and certificates.
#
# Usage: e2e/control-plane/down.sh WORKDIR [--purge]
#   --purge   also delete the etcd data directory
set -euo pipefail

HERE=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh source-path=SCRIPTDIR
. "$HERE/lib.sh"

[[ $# -ge 1 && "$1" != -* ]] || { sed -n '2,7p' "$0" >&2; exit 2; }
WORKDIR=$(cp_abspath "$1")
PURGE=0
[[ "${2:-}" == --purge ]] && PURGE=1

[[ -d "$WORKDIR" ]] || { cp_log "no such WORKDIR $WORKDIR: nothing to stop"; exit 0; }

rc=0
cp_down "$WORKDIR" || rc=1
if ((PURGE)); then rm -rf "$WORKDIR/etcd-data"; fi
if ((rc)); then
  cp_log "some processes did not stop"
  exit 1
fi
cp_log "stopped (WORKDIR $WORKDIR)"
