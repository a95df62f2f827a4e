#!/bin/sh
# Stands in for fluent-bit on the e2e node (busybox, no registry here). It reads the bundled
# log-shipper template's arguments (-p path=GLOB -p tag=TAG), waits for a file matching GLOB,
# and writes every line of it to its stdout as "[TAG] line": what the application wrote to the
# shared volume is what this container's log shows. On SIGTERM (the kubelet stops a native
# sidecar once the application has ended) it keeps shipping for a grace of 2 s, as fluent-bit
# flushes in its own grace period, so the application's last lines are shipped, then exits 0.
path=
tag=
while [ $# -gt 0 ]; do
  if [ "$1" = -p ] && [ $# -gt 1 ]; then
    case "$2" in
      path=*) path=${2#path=} ;;
      tag=*) tag=${2#tag=} ;;
    esac
    shift
  fi
  shift
done
[ -n "$path" ] || { echo "log-shipper: no -p path=GLOB argument" >&2; exit 2; }
# As PID 1 of its container, this shell would ignore SIGTERM without a handler. Exiting ends
# the container, and with it the pipeline below.
stop() {
  sleep 2
  echo "log-shipper: stopped"
  exit 0
}
trap stop TERM INT
echo "log-shipper: tailing $path as [$tag]"
while :; do
  # shellcheck disable=SC2086 # the glob is meant to expand
  set -- $path
  [ -e "$1" ] && break
  sleep 0.2
done
# In the background, so that the shell is in `wait` and runs its handler when SIGTERM comes.
tail -n +1 -F "$@" 2>/dev/null | while IFS= read -r line; do
  echo "[$tag] $line"
done &
shipper=$!
wait "$shipper"
