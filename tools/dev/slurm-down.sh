#!/usr/bin/env bash
# Stops the local Slurm that tools/dev/slurm-up.sh started in STATE_DIR: cancels its jobs, stops
# slurmd (every node's), slurmctld and munged by the PIDs slurm-up recorded, then ends any process
# left over from this instance (slurmstepd and the tasks under it) and removes the network
# namespaces of a multi-node instance (STATE_DIR/netns). Only processes that carry this instance's
# STRATA_SLURM_OWNER mark, or descend from one, are touched; a system munged or another instance's
# daemons are left alone. Safe to run when nothing is up.
#
# Usage: tools/dev/slurm-down.sh STATE_DIR
set -uo pipefail

die() {
  echo "slurm-down: error: $*" >&2
  exit 1
}

[[ $# -eq 1 && -n "$1" ]] || die "usage: $0 STATE_DIR"
if [[ ! -d $1 ]]; then
  echo "slurm-down: $1 does not exist; nothing to stop"
  exit 0
fi
state=$(cd "$1" && pwd -P)
conf=$state/slurm.conf
pids_file=$state/pids
owner_mark="STRATA_SLURM_OWNER=$state"

exec 9>"$state/.lock"
flock -w 120 9 || die "another slurm-up/slurm-down holds $state/.lock"

# True when PID runs a program whose name starts with expected-comm and is not a zombie (a killed
# daemon lingers as a zombie until init reaps it).
pid_alive() {  # pid expected-comm
  local stat
  [[ $1 =~ ^[0-9]+$ ]] || return 1
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  [[ ${stat#*\(} == "$2"* && ${stat##*) } != Z* ]]
}

# PIDs of live processes whose environment carries this instance's mark.
marked_pids() {
  # -z: environ entries are NUL-separated; -x: the whole entry must match.
  grep -lzxF -- "$owner_mark" /proc/[0-9]*/environ 2>/dev/null | sed -n 's|^/proc/\([0-9]*\)/environ$|\1|p'
}

# The given PIDs plus all their live descendants (tasks under slurmstepd carry no mark).
with_descendants() {
  local -A parent_of=()
  local d pid stat ppid
  for d in /proc/[0-9]*; do
    pid=${d#/proc/}
    stat=$(cat "$d/stat" 2>/dev/null) || continue
    stat=${stat##*) }  # the command name may contain spaces and parentheses
    ppid=${stat#* }
    ppid=${ppid%% *}
    parent_of[$pid]=$ppid
  done
  local -A keep=()
  for pid in "$@"; do keep[$pid]=1; done
  local changed=1
  while [[ $changed -eq 1 ]]; do
    changed=0
    for pid in "${!parent_of[@]}"; do
      if [[ -z ${keep[$pid]:-} && -n ${keep[${parent_of[$pid]}]:-} ]]; then
        keep[$pid]=1
        changed=1
      fi
    done
  done
  for pid in "${!keep[@]}"; do
    is_running "$pid" && echo "$pid"
  done
  return 0
}

# True while the PID exists and is not a zombie (a zombie is already dead; reaping it is up to its
# parent, here usually init, which may be slow).
is_running() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  stat=${stat##*) }
  [[ ${stat:0:1} != Z ]]
}

# Sends TERM, waits up to $2 seconds, then KILLs whatever of the PIDs is left.
stop_pids() {  # "pids" grace
  local pids grace=$2 left
  read -r -d '' -a pids <<<"$1"
  [[ ${#pids[@]} -eq 0 ]] && return 0
  kill -TERM "${pids[@]}" 2>/dev/null
  for _ in $(seq $((grace * 10))); do
    left=()
    for p in "${pids[@]}"; do is_running "$p" && left+=("$p"); done
    [[ ${#left[@]} -eq 0 ]] && return 0
    sleep 0.1
  done
  kill -KILL "${left[@]}" 2>/dev/null
  sleep 0.2
}

# The recorded daemons that still run, as "name pid" lines (a multi-node instance has a slurmd
# per node).
live_daemons() {
  [[ -f $pids_file ]] || return 0
  local name pid
  while read -r name pid; do
    pid_alive "$pid" "$name" && echo "$name $pid"
  done <"$pids_file"
  return 0
}

# A multi-node instance: its namespaces (the head first), where the client commands must run.
netns=()
[[ -f $state/netns ]] && mapfile -t netns <"$state/netns"
ctl_prefix=()
if [[ ${#netns[@]} -gt 0 ]] && ip netns list 2>/dev/null | grep -qw -- "${netns[0]}"; then
  ctl_prefix=(ip netns exec "${netns[0]}")
fi

stopped=0
# Cancel jobs first so slurmstepd ends its tasks cleanly. That needs slurmctld and the slurmds;
# without them the jobs never finish completing, and the sweep below ends their processes instead.
live=$(live_daemons)
if grep -q '^slurmctld ' <<<"$live" && grep -q '^slurmd ' <<<"$live" && [[ -f $conf ]]; then
  mapfile -t jobs < <(SLURM_CONF=$conf timeout 10 "${ctl_prefix[@]}" squeue -h -o %A 2>/dev/null)
  if [[ ${#jobs[@]} -gt 0 ]]; then
    SLURM_CONF=$conf timeout 10 "${ctl_prefix[@]}" scancel "${jobs[@]}" 2>/dev/null
    for _ in $(seq 25); do
      [[ -z $(SLURM_CONF=$conf timeout 5 "${ctl_prefix[@]}" squeue -h -o %A 2>/dev/null) ]] && break
      sleep 0.2
    done
  fi
fi

# The daemons, each by its recorded PID (checked against its name, in case the PID has been
# reused), together with anything still running under them. They are stopped together: each takes
# one to two seconds to shut down and none needs another to do so.
daemons=()
while read -r _ pid; do
  [[ -n $pid ]] && daemons+=("$pid")
done <<<"$(live_daemons)"
if [[ ${#daemons[@]} -gt 0 ]]; then
  stop_pids "$(with_descendants "${daemons[@]}")" 10
  stopped=1
fi

# Leftovers of this instance: slurmstepd (started by slurmd with the mark) and its tasks.
leftover=$(marked_pids)
if [[ -n $leftover ]]; then
  # shellcheck disable=SC2086
  stop_pids "$(with_descendants $leftover)" 2
  stopped=$((stopped + 1))
fi

rm -f "$pids_file" "$state/env"
survivors=$(marked_pids)
if [[ -n $survivors ]]; then
  die "processes of $state still alive after SIGKILL: ${survivors//$'\n'/ }"
fi
# The namespaces go once their last process has: their veths and switches with them.
for ns in "${netns[@]}"; do
  if ip netns list 2>/dev/null | grep -qw -- "$ns"; then
    ip netns del "$ns" || die "could not remove network namespace $ns"
    stopped=$((stopped + 1))
  fi
done
rm -rf "${state:?}/netns" "${state:?}/bin" "${state:?}/links"
if [[ $stopped -gt 0 ]]; then
  echo "slurm-down: stopped the local Slurm in $state"
else
  echo "slurm-down: no local Slurm running in $state"
fi
