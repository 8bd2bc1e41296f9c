#!/usr/bin/env bash
# Starts a private single-node Slurm 22.05 (munged, slurmctld, slurmd) for strata's `slurm` test
# suite. Everything listens on 127.0.0.1 only, on ports above 10000, and every file it writes
# (config, munge key and socket, spool, logs, pid files) lives under STATE_DIR, so it neither needs
# nor touches a system Slurm or munge. See docs/local-slurm.md.
#
# Usage: tools/dev/slurm-up.sh STATE_DIR
# Then:  . STATE_DIR/env && srun -O -n 4 hostname
# Stop:  tools/dev/slurm-down.sh STATE_DIR
#
# Environment (all optional):
#   STRATA_SLURM_CTLD_PORT    slurmctld port (default 16817)
#   STRATA_SLURM_SLURMD_PORT  slurmd port (default 16818)
#   STRATA_SLURM_RESV_PORTS   range for srun --resv-ports (default 20000-20999)
#   STRATA_SLURM_UP_TIMEOUT   seconds to wait for the node to become idle (default 60)
#
# Running it again while that instance is healthy is a no-op; a half-dead instance is stopped and
# started afresh.
set -Eeuo pipefail

die() {
  echo "slurm-up: error: $*" >&2
  exit 1
}

[[ $# -eq 1 && -n "$1" ]] || die "usage: $0 STATE_DIR"
[[ $(id -u) -eq 0 ]] || die "must run as root (munged and slurmd run as root with SlurmUser=root); use sudo"

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
mkdir -p "$1"
state=$(cd "$1" && pwd -P)
ctld_port=${STRATA_SLURM_CTLD_PORT:-16817}
slurmd_port=${STRATA_SLURM_SLURMD_PORT:-16818}
resv_ports=${STRATA_SLURM_RESV_PORTS:-20000-20999}
up_timeout=${STRATA_SLURM_UP_TIMEOUT:-60}
node=localhost

for bin in munged munge unmunge slurmctld slurmd sinfo srun scontrol ss flock; do
  command -v "$bin" >/dev/null 2>&1 ||
    die "'$bin' not found; install the dependencies with tools/dev/install-deps.sh"
done

# One slurm-up/slurm-down at a time per state directory.
exec 9>"$state/.lock"
flock -w 120 9 || die "another slurm-up/slurm-down holds $state/.lock"

conf=$state/slurm.conf
pids_file=$state/pids
# Every daemon gets this variable in its environment (slurmd passes it on to slurmstepd), so that
# slurm-down can find exactly this instance's processes and nothing else.
owner_mark="STRATA_SLURM_OWNER=$state"

# True when PID runs a program whose name starts with expected-comm and is not a zombie (a killed
# daemon lingers as a zombie until init reaps it).
pid_alive() {  # pid expected-comm
  local stat
  [[ $1 =~ ^[0-9]+$ ]] || return 1
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  [[ ${stat#*\(} == "$2"* && ${stat##*) } != Z* ]]
}

node_state() {
  SLURM_CONF=$conf timeout 10 sinfo -h -N -n "$node" -o %T 2>/dev/null | head -n1 || true
}

# --- Already up? ----------------------------------------------------------------------------------
if [[ -f $pids_file ]]; then
  healthy=1
  while read -r name pid; do
    pid_alive "$pid" "$name" || healthy=0
  done <"$pids_file"
  if [[ $healthy -eq 1 ]] && [[ "$(node_state)" =~ ^(idle|mixed|allocated) ]]; then
    echo "slurm-up: already up in $state (source $state/env)"
    exit 0
  fi
  echo "slurm-up: found a stale or half-started instance in $state; restarting it" >&2
  flock -u 9
  "$here/slurm-down.sh" "$state" >&2
  flock -w 120 9 || die "another slurm-up/slurm-down holds $state/.lock"
fi

# --- Ports ----------------------------------------------------------------------------------------
for port in "$ctld_port" "$slurmd_port"; do
  [[ $port =~ ^[0-9]+$ && $port -gt 10000 && $port -lt 65536 ]] ||
    die "port '$port' must be a number between 10001 and 65535"
  if [[ -n "$(ss -Htln "sport = :$port" 2>/dev/null)" ]]; then
    die "TCP port $port is already in use (another local Slurm? see 'ss -tlnp sport = :$port');" \
      "stop it, or pick other ports with STRATA_SLURM_CTLD_PORT / STRATA_SLURM_SLURMD_PORT"
  fi
done
[[ $resv_ports =~ ^[0-9]+-[0-9]+$ ]] || die "STRATA_SLURM_RESV_PORTS must look like 20000-20999"

# --- Fresh state ----------------------------------------------------------------------------------
# Old job state is useless to tests and can hold the node in a bad state, so each start is clean.
rm -rf "$state/spool" "$state/log" "$state/run" "$state/tmp" "$state/munge" "$pids_file" "$state/env"
mkdir -p "$state/spool/ctld" "$state/spool/slurmd" "$state/log" "$state/run" "$state/tmp" "$state/munge"
# munged refuses a socket or key directory that others can write to.
chmod 0700 "$state/munge"
chmod 0755 "$state"

started=()
stop_started() {
  if [[ ${#started[@]} -gt 0 || -f $pids_file ]]; then
    echo "slurm-up: start failed; stopping what was started" >&2
    flock -u 9 || true
    "$here/slurm-down.sh" "$state" >&2 || true
  fi
}
on_error() {
  local rc=$?
  trap - ERR
  echo "slurm-up: error: unexpected failure (exit $rc) at line ${BASH_LINENO[0]}" >&2
  stop_started
  exit 1
}
trap on_error ERR

show_log() {  # file
  if [[ -s $1 ]]; then
    echo "---- last lines of $1 ----" >&2
    tail -n 25 "$1" >&2
  fi
}

fail_start() {  # message, logs...
  local msg=$1
  shift
  echo "slurm-up: error: $msg" >&2
  for f in "$@"; do show_log "$f"; done
  trap - ERR
  stop_started
  exit 1
}

# Daemons must not inherit the lock's fd 9 (see the redirections below), or they would hold the
# lock for as long as they live.
# Waits for a pid file and records the daemon.
wait_pid_file() {  # name pidfile log
  local name=$1 file=$2 log=$3 pid=""
  for _ in $(seq 100); do
    if [[ -s $file ]]; then
      pid=$(tr -dc 0-9 <"$file")
      if pid_alive "$pid" "$name"; then
        echo "$name $pid" >>"$pids_file"
        started+=("$name")
        return 0
      fi
    fi
    sleep 0.1
  done
  fail_start "$name did not start (no live pid in $file)" "$log"
}

daemon_env=(env -i "PATH=/usr/sbin:/usr/bin:/sbin:/bin" "HOME=${HOME:-/root}" "LANG=C.UTF-8"
  "SLURM_CONF=$conf" "$owner_mark")

# --- munge ----------------------------------------------------------------------------------------
# A private key and socket: a system munged (if any) keeps running untouched.
munge_sock=$state/munge/munge.socket
if command -v mungekey >/dev/null 2>&1; then
  mungekey --create --keyfile="$state/munge/munge.key" --bits=1024 >/dev/null 2>&1 ||
    dd if=/dev/urandom of="$state/munge/munge.key" bs=128 count=1 status=none
else
  dd if=/dev/urandom of="$state/munge/munge.key" bs=128 count=1 status=none
fi
chmod 0400 "$state/munge/munge.key"
# --force: munged refuses to run as root otherwise.
"${daemon_env[@]}" munged --force --socket="$munge_sock" --key-file="$state/munge/munge.key" \
  --pid-file="$state/munge/munged.pid" --log-file="$state/log/munged.log" \
  --seed-file="$state/munge/munged.seed" --num-threads=4 >>"$state/log/munged.log" 2>&1 9>&- ||
  fail_start "munged failed to start" "$state/log/munged.log"
wait_pid_file munged "$state/munge/munged.pid" "$state/log/munged.log"
munge -n -S "$munge_sock" | unmunge -S "$munge_sock" >/dev/null 2>&1 ||
  fail_start "munge credential round trip through $munge_sock failed" "$state/log/munged.log"

# --- configuration --------------------------------------------------------------------------------
ncpu=$(nproc)
cat >"$conf" <<EOF
# Generated by tools/dev/slurm-up.sh for strata's tests; rewritten on every start.
ClusterName=strata-test
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$munge_sock
CredType=cred/munge
StateSaveLocation=$state/spool/ctld
SlurmdSpoolDir=$state/spool/slurmd
SlurmctldPidFile=$state/run/slurmctld.pid
SlurmdPidFile=$state/run/slurmd.pid
SlurmctldLogFile=$state/log/slurmctld.log
SlurmdLogFile=$state/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
TmpFS=$state/tmp
PlugStackConfig=$state/plugstack.conf
# No cgroups: tests may run in containers without a writable cgroup tree.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
# srun --resv-ports=N hands tasks SLURM_STEP_RESV_PORTS from this range.
MpiParams=ports=$resv_ports
ReturnToService=2
SlurmdTimeout=300
InactiveLimit=0
KillWait=5
MinJobAge=30
MaxTasksPerNode=512
NodeName=$node NodeAddr=127.0.0.1 NodeHostname=$node CPUs=$ncpu State=UNKNOWN
# OverSubscribe=FORCE lets several test jobs (meson runs tests in parallel) share the few cores;
# 'srun -O' lets one job run more tasks than cores.
PartitionName=test Nodes=$node Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:64
EOF

# Slurm reads mpi.conf from the directory of slurm.conf. These pin slurmstepd's PMIx/UCX traffic
# to loopback (see /work/shared/notes/peers.md §2.2).
cat >"$state/mpi.conf" <<EOF
PMIxNetDevicesUCX=lo
PMIxTlsUCX=tcp
PMIxTimeout=120
EOF
# An empty plugin stack: never load site SPANK plugins from /etc/slurm.
: >"$state/plugstack.conf"

cat >"$state/env" <<EOF
# Source this file to use the local test Slurm started by tools/dev/slurm-up.sh.
export SLURM_CONF=$conf
export STRATA_SLURM_STATE=$state
EOF

# --- slurmctld, slurmd ----------------------------------------------------------------------------
"${daemon_env[@]}" slurmctld -f "$conf" -i >>"$state/log/slurmctld.out" 2>&1 9>&- ||
  fail_start "slurmctld failed to start" "$state/log/slurmctld.out" "$state/log/slurmctld.log"
wait_pid_file slurmctld "$state/run/slurmctld.pid" "$state/log/slurmctld.log"

"${daemon_env[@]}" slurmd -f "$conf" -N "$node" >>"$state/log/slurmd.out" 2>&1 9>&- ||
  fail_start "slurmd failed to start" "$state/log/slurmd.out" "$state/log/slurmd.log"
wait_pid_file slurmd "$state/run/slurmd.pid" "$state/log/slurmd.log"

deadline=$((SECONDS + up_timeout))
st=""
while :; do
  st=$(node_state)
  [[ $st == idle* ]] && break
  for name in munged slurmctld slurmd; do
    pid=$(awk -v n="$name" '$1 == n { print $2 }' "$pids_file")
    pid_alive "$pid" "$name" ||
      fail_start "$name (pid $pid) exited during start-up" "$state/log/$name.log"
  done
  if ((SECONDS >= deadline)); then
    fail_start "node '$node' not idle after ${up_timeout}s (state: '${st:-no answer from slurmctld}')" \
      "$state/log/slurmctld.log" "$state/log/slurmd.log"
  fi
  sleep 0.5
done
trap - ERR

echo "slurm-up: local Slurm up in $state (node $node, $ncpu CPUs, ports $ctld_port/$slurmd_port);" \
  "use: . $state/env"
