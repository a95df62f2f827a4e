#!/bin/bash
# A runc for dockerd (e2e/docker/dockerd.sh sets it as the default runtime when needed):
# runs /usr/sbin/runc unchanged, except that on `create`/`run` (the bundle's config.json) and
# `exec` (its --process file) it removes from the capability sets every capability this
# process's bounding set lacks.
#
# Why: dockerd 20.10 gives a --privileged container (kind's nodes) every capability the kernel
# knows, and on a machine whose own bounding set is smaller (here: no CAP_SYS_RESOURCE) runc
# then fails with "unable to apply caps: operation not permitted". Newer Docker engines limit
# --privileged to the caps the daemon holds; this does the same for 20.10. A capability the
# machine does not grant could not be used by the container anyway.
set -euo pipefail
RUNC=${RUNC_CAPFILTER_RUNC:-/usr/sbin/runc}

sub=""
bundle=""
process=""
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  case "${args[i]}" in
    create | run | exec) [[ -n "$sub" ]] || sub=${args[i]} ;;
    --bundle | -b) bundle=${args[i + 1]:-} ;;
    --bundle=*) bundle=${args[i]#--bundle=} ;;
    --process | -p) process=${args[i + 1]:-} ;;
    --process=*) process=${args[i]#--process=} ;;
  esac
done
if [[ -n "$sub" ]]; then
  if [[ "$sub" == exec ]]; then
    config=$process
    path=.capabilities
  else
    config="${bundle:-.}/config.json"
    path=.process.capabilities
  fi
  names=(CAP_CHOWN CAP_DAC_OVERRIDE CAP_DAC_READ_SEARCH CAP_FOWNER CAP_FSETID CAP_KILL CAP_SETGID
    CAP_SETUID CAP_SETPCAP CAP_LINUX_IMMUTABLE CAP_NET_BIND_SERVICE CAP_NET_BROADCAST CAP_NET_ADMIN
    CAP_NET_RAW CAP_IPC_LOCK CAP_IPC_OWNER CAP_SYS_MODULE CAP_SYS_RAWIO CAP_SYS_CHROOT
    CAP_SYS_PTRACE CAP_SYS_PACCT CAP_SYS_ADMIN CAP_SYS_BOOT CAP_SYS_NICE CAP_SYS_RESOURCE
    CAP_SYS_TIME CAP_SYS_TTY_CONFIG CAP_MKNOD CAP_LEASE CAP_AUDIT_WRITE CAP_AUDIT_CONTROL
    CAP_SETFCAP CAP_MAC_OVERRIDE CAP_MAC_ADMIN CAP_SYSLOG CAP_WAKE_ALARM CAP_BLOCK_SUSPEND
    CAP_AUDIT_READ CAP_PERFMON CAP_BPF CAP_CHECKPOINT_RESTORE)
  bnd=$((16#$(sed -n 's/^CapBnd:[[:space:]]*//p' /proc/self/status)))
  denied=()
  for ((c = 0; c < ${#names[@]}; c++)); do
    if (((bnd >> c & 1) == 0)); then denied+=("${names[c]}"); fi
  done
  if ((${#denied[@]})) && [[ -n "$config" && -f "$config" ]]; then
    tmp="$config.capfilter"
    jq --args "if $path == null then . else $path |= with_entries(.value |= if . == null then . else map(select(. as \$c | \$ARGS.positional | index(\$c) | not)) end) end" \
      "${denied[@]}" <"$config" >"$tmp"
    mv -f "$tmp" "$config"
  fi
fi
exec "$RUNC" "$@"
