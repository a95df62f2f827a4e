# shellcheck shell=bash
# Helpers for scripts that run kind with the locally assembled node image
# (e2e/kind/node-image.sh). Source after `eval "$(e2e/kind/node-image.sh)"`, inside
# e2e/docker/dockerd.sh (DOCKER_HOST set).

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
