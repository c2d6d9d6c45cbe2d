#!/usr/bin/env bash
# Runs N copies of COMMAND as one multi-process JAX job on this machine (development and CI).
#
#   bash scripts/local_cluster.sh N DEVICES_PER_PROCESS -- COMMAND [ARGS...]
#
# Process i gets RSTAR_COORDINATOR=127.0.0.1:<free port>, RSTAR_NUM_PROCESSES=N,
# RSTAR_PROCESS_ID=i and XLA_FLAGS=--xla_force_host_platform_device_count=DEVICES_PER_PROCESS
# (added to XLA_FLAGS, replacing a device count already there); `rstar_jax.distributed.init.initialize_from_env` reads
# them (the launchers call it). Each output line is prefixed with "[i] ". When one process fails
# the others are ended (SIGTERM to each process group, SIGKILL after LOCAL_CLUSTER_GRACE_S,
# default 10 s); the exit status is the first failure's status (0 when all succeed). Ctrl-C or a
# SIGTERM to this script ends every process group too, so nothing is left running.
set -u

usage() { echo "usage: $0 N DEVICES_PER_PROCESS -- COMMAND [ARGS...]" >&2; exit 2; }
[ $# -ge 4 ] || usage
N=$1; DEV=$2; shift 2
[ "$1" = "--" ] || usage
shift
case "$N" in ''|*[!0-9]*) echo "$0: N: expected a positive integer, got '$N'" >&2; exit 2;; esac
case "$DEV" in ''|*[!0-9]*) echo "$0: DEVICES_PER_PROCESS: expected a positive integer, got '$DEV'" >&2; exit 2;; esac
[ "$N" -ge 1 ] && [ "$DEV" -ge 1 ] || usage

PY=${LOCAL_CLUSTER_PYTHON:-python3}
PORT=$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
GRACE=${LOCAL_CLUSTER_GRACE_S:-10}

# A device count already in XLA_FLAGS (e.g. from a test harness) is replaced, not doubled.
BASE_XLA_FLAGS=$(printf '%s' "${XLA_FLAGS:-}" | sed -E 's/--xla_force_host_platform_device_count=[0-9]+//g; s/^ +| +$//g')

pids=()
kill_all() {
  local sig=$1 p
  for p in "${pids[@]}"; do kill "-$sig" -- "-$p" 2>/dev/null; done
}
alive() {
  local p
  for p in "${pids[@]}"; do kill -0 -- "-$p" 2>/dev/null && return 0; done
  return 1
}
stop_all() {
  kill_all TERM
  local t=0
  while alive && [ "$t" -lt $((GRACE * 10)) ]; do sleep 0.1; t=$((t + 1)); done
  kill_all KILL
}
trap 'stop_all; exit 130' INT
trap 'stop_all; exit 143' TERM
trap 'stop_all' EXIT

for ((i = 0; i < N; i++)); do
  # setsid: each process (and its pipeline, and anything it starts) in its own process group,
  # so one kill reaches all of it.
  RSTAR_COORDINATOR="127.0.0.1:$PORT" RSTAR_NUM_PROCESSES="$N" RSTAR_PROCESS_ID="$i" \
  XLA_FLAGS="${BASE_XLA_FLAGS:+$BASE_XLA_FLAGS }--xla_force_host_platform_device_count=$DEV" \
  PYTHONUNBUFFERED=1 \
    setsid bash -c 'set -o pipefail; "$@" 2>&1 | sed -u "s/^/[$RSTAR_PROCESS_ID] /"' _ "$@" &
  pids+=("$!")
done

status=0
declare -A running=()
for ((i = 0; i < N; i++)); do running[${pids[$i]}]=$i; done
while [ "${#running[@]}" -gt 0 ]; do
  done_pid=""
  wait -n -p done_pid "${!running[@]}"
  rc=$?
  [ -n "$done_pid" ] || break   # nothing left to wait for
  idx=${running[$done_pid]}
  unset "running[$done_pid]"
  if [ "$rc" -ne 0 ]; then
    status=$rc
    echo "local_cluster: process $idx exited with status $rc; ending the others" >&2
    stop_all
    wait 2>/dev/null
    break
  fi
done
exit "$status"
