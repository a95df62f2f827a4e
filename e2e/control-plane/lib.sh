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
# program: until setsid's exec its command line is the starting script's, and
# cp_pid_is_ours would take it for a process that exited (a CI run once failed so, with an
# empty log). Bounded: 5 s, or until the process is gone.
cp_wait_exec() { # pid workdir
  local i
  for ((i = 0; i < 50; i++)); do
    cp_pid_is_ours "$1" "$2" && return 0
    kill -0 "$1" 2>/dev/null || return 0
    sleep 0.1
  done
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
