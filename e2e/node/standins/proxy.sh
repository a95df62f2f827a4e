#!/bin/sh
# Stands in for Envoy on the e2e node (busybox, no registry here). It takes the bundled proxy
# template's arguments as they are, finds the inbound listener's port in --config-yaml (15001
# if there is none) and serves HTTP there, so the template's startupProbe, and anyone in the
# pod dialling 127.0.0.1:PORT, sees a proxy that is up. On SIGTERM it stops at once, as Envoy
# does (as PID 1, httpd alone would ignore the signal, and every pod that runs to completion
# would wait its whole grace period for the kubelet's SIGKILL).
port=15001
while [ $# -gt 0 ]; do
  if [ "$1" = --config-yaml ] && [ $# -gt 1 ]; then
    found=$(printf '%s' "$2" | tr -d ' \n' |
      sed -n 's/.*"name":"inbound","address":{"socket_address":{"address":"[^"]*","port_value":\([0-9]*\)}.*/\1/p')
    [ -n "$found" ] && port=$found
  fi
  shift
done
echo "proxy: serving on port $port"
httpd -f -p "$port" -h /standin/www &
server=$!
trap 'kill "$server" 2>/dev/null; echo "proxy: stopped"; exit 0' TERM INT
wait "$server"
