# shellcheck shell=bash
# Helpers for the scripts that run kind (kind/run.sh, kind/run-here.sh, kind/cluster-check.sh).
# Sourced, not run.

# kind_render_config SRC DIR: prints the kind configuration SRC with @AUDIT_DIR@ filled in as
# DIR, which it makes and gives the suites' audit policy (e2e/audit-policy.yaml); the
# apiserver then writes DIR/audit.log (kind/cluster.yaml mounts DIR into the node).
kind_render_config() { # src dir
  local src=$1 dir=$2
  mkdir -p "$dir"
  cp "$(dirname -- "${BASH_SOURCE[0]}")/../audit-policy.yaml" "$dir/audit-policy.yaml" || return 1
  sed "s|@AUDIT_DIR@|$dir|g" "$src"
}

# The next one is for the locally assembled node image (e2e/kind/node-image.sh): call it after
# `eval "$(e2e/kind/node-image.sh)"`, inside e2e/docker/dockerd.sh (DOCKER_HOST set).

# kind_node_image_load: `docker import` the node's root file system as $KIND_NODE_IMAGE, with
# the metadata kind's base image sets (systemd must know it runs in a container; kind's
# entrypoint then /sbin/init). STOPSIGNAL cannot be set by import; kind removes its nodes with
# `docker rm -f`, which does not use it.
# The tag ends with node-image.sh's cache key, so an image already in the engine is the right
# one; older node images of the same Kubernetes version (1.5 GB each) are removed.
kind_node_image_load() {
  : "${KIND_NODE_IMAGE:?}" "${KIND_NODE_TAR:?}"
  if ! docker image inspect "$KIND_NODE_IMAGE" >/dev/null 2>&1; then
    docker import \
      --change 'ENV container=docker' \
      --change 'ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]' \
      "$KIND_NODE_TAR" "$KIND_NODE_IMAGE" >/dev/null || return 1
  fi
  local repo=${KIND_NODE_IMAGE%:*} tag=${KIND_NODE_IMAGE##*:} other
  while read -r other; do
    [[ "$other" == "$repo:${tag%-*}-"* && "$other" != "$KIND_NODE_IMAGE" ]] &&
      docker rmi "$other" >/dev/null 2>&1
  done < <(docker images --format '{{.Repository}}:{{.Tag}}' "$repo")
  return 0
}
