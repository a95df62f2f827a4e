#!/usr/bin/env bash
# Shared helpers for up.sh and down.sh; sourced, not run.
# shellcheck shell=bash

CP_COMPONENTS=(etcd kube-apiserver kube-controller-manager)

cp_log() { printf '[control-plane %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }

# Absolute path without requiring it to exist.
cp_abspath() { realpath -m -- "$1"; }

# True when PID is alive and its command line mentions WORKDIR (guards against pid reuse).
cp_pid_is_ours() { # pid workdir
  local pid=$1 workdir=$2 cmdline
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  [[ -r "/proc/$pid/cmdline" ]] || return 1
  cmdline=$({ tr '\0' ' ' <"/proc/$pid/cmdline"; } 2>/dev/null) || return 1
  [[ "$cmdline" == *"$workdir/"* ]]
}

# Waits until PID, just started in the background as `setsid program ...`, has become the
# program. Until the first exec its command line is the starting script's, which
# cp_pid_is_ours does not take for ours; then it is setsid's, which it does, while setsid is
# still to exec the program, and reading /proc/PID/cmdline across that second exec can come
# back without the workdir. Two CI runs failed so ("exited", with an empty log, a process that
# was alive a moment later), the second after this function waited for the first exec only.
# So it waits for the program's own name (comm neither the shell's nor setsid's). Bounded: 5 s,
# or until the process is gone.
cp_wait_exec() { # pid workdir
  local i comm
  for ((i = 0; i < 50; i++)); do
    kill -0 "$1" 2>/dev/null || return 0
    comm=$(cat "/proc/$1/comm" 2>/dev/null) || comm=
    if [[ -n "$comm" && "$comm" != setsid && "$comm" != bash ]] && cp_pid_is_ours "$1" "$2"; then
      return 0
    fi
    sleep 0.1
  done
}

# True while PID is ours; a process that looks gone once is looked at again for a second
# before it is taken for exited (a read of /proc/PID/cmdline can come back short while the
# process execs). Prints what it saw last when it gives up.
cp_alive() { # pid workdir
  local i
  for ((i = 0; i < 10; i++)); do
    cp_pid_is_ours "$1" "$2" && return 0
    kill -0 "$1" 2>/dev/null || break
    sleep 0.1
  done
  cp_log "pid $1: $(if kill -0 "$1" 2>/dev/null; then
    printf 'alive, comm %s, cmdline %.200s' "$(cat "/proc/$1/comm" 2>/dev/null)" \
      "$(tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null)"
  else echo gone; fi)"
  return 1
}

# Pids of processes of one component (default: all three) whose command line
# mentions WORKDIR: a safety net for processes whose pid file was never written.
cp_stray_pids() { # workdir [component]
  local workdir=$1 want=${2:-} d pid comm
  for d in /proc/[0-9]*; do
    pid=${d#/proc/}
    [[ "$pid" == "$$" ]] && continue
    comm=$(cat "$d/comm" 2>/dev/null) || continue
    case "$comm" in
      etcd|kube-apiserver|kube-controller*) ;;
      *) continue ;;
    esac
    # /proc/PID/comm is cut to 15 characters ("kube-controller").
    [[ -z "$want" || "$want" == "$comm"* ]] || continue
    if cp_pid_is_ours "$pid" "$workdir"; then echo "$pid"; fi
  done
}

# True once PID is no longer ours (cp_pid_is_ours), polled every 0.1 s at most TENTHS times.
cp_gone_within() { # pid workdir tenths
  local i
  for ((i = 0; i < $3; i++)); do
    cp_pid_is_ours "$1" "$2" || return 0
    sleep 0.1
  done
  return 1
}

# Stop one pid: TERM, wait up to 15 s, then KILL.
cp_stop_pid() { # pid workdir name
  local pid=$1 workdir=$2 name=$3
  cp_pid_is_ours "$pid" "$workdir" || return 0
  cp_log "stopping $name (pid $pid)"
  kill -TERM "$pid" 2>/dev/null || true
  cp_gone_within "$pid" "$workdir" 150 && return 0
  cp_log "$name (pid $pid) ignored SIGTERM for 15s; sending SIGKILL"
  kill -KILL "$pid" 2>/dev/null || true
  cp_gone_within "$pid" "$workdir" 50 && return 0
  cp_log "WARNING: $name (pid $pid) is still alive"
  return 1
}

# Stop everything started for WORKDIR, newest first, then any stray.
cp_down() { # workdir
  local workdir=$1 rc=0 name pidfile pid idx
  for ((idx = ${#CP_COMPONENTS[@]} - 1; idx >= 0; idx--)); do
    name=${CP_COMPONENTS[idx]}
    pidfile="$workdir/run/$name.pid"
    [[ -f "$pidfile" ]] || continue
    pid=$(<"$pidfile")
    cp_stop_pid "$pid" "$workdir" "$name" || rc=1
    rm -f "$pidfile"
  done
  for ((idx = ${#CP_COMPONENTS[@]} - 1; idx >= 0; idx--)); do
    name=${CP_COMPONENTS[idx]}
    for pid in $(cp_stray_pids "$workdir" "$name"); do
      cp_stop_pid "$pid" "$workdir" "stray $name" || rc=1
    done
  done
  return "$rc"
}

# Prints a loopback TCP port nothing uses now, other than the ports given. It is drawn from
# below the kernel's ephemeral range (ip_local_port_range): a port inside it can be taken
# between this check and the bind by any outgoing connection's local end (the apiserver's own
# connections to etcd, say), and the listener then fails with "address already in use".
cp_free_port() { # [port to avoid]...
  local eph_lo=32768 eph_hi=60999 lo hi p i
  read -r eph_lo eph_hi </proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || true
  if ((eph_lo > 21000)); then
    lo=20000 hi=$((eph_lo - 1))
  else
    lo=$((eph_hi + 1)) hi=65535
  fi
  ((hi - lo >= 100)) || { cp_log "ERROR: no port range outside the ephemeral $eph_lo-$eph_hi"; return 1; }
  for ((i = 0; i < 200; i++)); do
    p=$((lo + (RANDOM * 32768 + RANDOM) % (hi - lo + 1)))
    [[ " $* " == *" $p "* ]] && continue
    if [[ -z "$(ss -Htan "( sport = :$p )" 2>/dev/null)" ]]; then
      echo "$p"
      return 0
    fi
  done
  cp_log "ERROR: no free loopback port found in $lo-$hi"
  return 1
}
