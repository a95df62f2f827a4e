#!/bin/sh
# Stands in for Envoy on the e2e node (busybox, no registry here). It takes the bundled proxy
# template's arguments as they are, finds the inbound listener's port in --config-yaml (15001
# if there is none) and serves HTTP there, so the template's startupProbe, and anyone in the
# pod dialling 127.0.0.1:PORT, sees a proxy that is up.
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
exec httpd -f -p "$port" -h /standin/www
