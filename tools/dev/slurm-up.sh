#!/usr/bin/env bash
# Starts a private Slurm 22.05 (munged, slurmctld, slurmd) for strata's `slurm` test suites. Every
# file it writes (config, munge key and socket, spool, logs, pid files) lives under STATE_DIR, so it
# neither needs nor touches a system Slurm or munge. See docs/local-slurm.md.
#
# One node (the default, suite `slurm`): everything listens on 127.0.0.1 only, on ports above 10000.
# --nodes N (2..8, suite `slurm-multinode`): N nodes, each a slurmd in its own network, UTS and mount
# namespace (host name nodeI, its own TmpFS and /etc/hosts), joined through a "head" namespace that runs
# slurmctld, srun and the other client commands. Two networks join them, as in a cluster: the
# control network (ctl0 in each node, 10.232.0.0/24, head 10.232.0.1) that Slurm uses, and the
# data network (data0, 10.233.0.0/24, node I at .(10+I)) for the jobs' own traffic, whose links
# tools/dev/slurm-link.sh cuts and heals. Nothing of it is reachable from outside the namespaces.
#
# Usage: tools/dev/slurm-up.sh [--nodes N] STATE_DIR
# Then:  . STATE_DIR/env && srun -O -n 4 hostname      (with --nodes: srun -N 2 -n 4 hostname)
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

nodes=1
if [[ ${1:-} == --nodes ]]; then
  nodes=${2:-}
  shift 2 || die "usage: $0 [--nodes N] STATE_DIR"
  [[ $nodes =~ ^[1-8]$ ]] || die "--nodes takes a number of nodes from 1 to 8 (got '$nodes')"
fi
[[ $# -eq 1 && -n "$1" ]] || die "usage: $0 [--nodes N] STATE_DIR"
[[ $(id -u) -eq 0 ]] || die "must run as root (munged and slurmd run as root with SlurmUser=root); use sudo"

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
mkdir -p "$1"
state=$(cd "$1" && pwd -P)
ctld_port=${STRATA_SLURM_CTLD_PORT:-16817}
slurmd_port=${STRATA_SLURM_SLURMD_PORT:-16818}
resv_ports=${STRATA_SLURM_RESV_PORTS:-20000-20999}
up_timeout=${STRATA_SLURM_UP_TIMEOUT:-60}
node=localhost
multi=0
[[ $nodes -gt 1 ]] && multi=1

for bin in munged munge unmunge slurmctld slurmd sinfo srun scontrol ss flock; do
  command -v "$bin" >/dev/null 2>&1 ||
    die "'$bin' not found; install the dependencies with tools/dev/install-deps.sh"
done

if [[ $multi -eq 1 ]]; then
  for bin in ip nsenter unshare hostname mount; do
    command -v "$bin" >/dev/null 2>&1 || die "'$bin' not found (--nodes needs iproute2 and util-linux)"
  done
fi

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

# Multi-node: the namespaces' names come from the state directory, so that two instances (one per
# build directory) never share one; slurm-down finds them in STATE/netns.
tag=sn$(printf '%s' "$state" | cksum | awk '{ printf "%05d", $1 % 100000 }')
head_ns=$tag-head
node_names=()
for ((i = 1; i <= nodes; ++i)); do node_names+=("node$i"); done
# Slurm's client commands run where slurmctld listens: the head namespace with --nodes.
ctl_prefix=()
[[ $multi -eq 1 ]] && ctl_prefix=(ip netns exec "$head_ns")

# The nodes' states, one word each ("idle", "down*", ...), or nothing when slurmctld does not answer.
node_states() {
  SLURM_CONF=$conf timeout 10 "${ctl_prefix[@]}" sinfo -h -N -o %T 2>/dev/null || true
}
all_idle() {
  local st n=0
  while read -r st; do
    [[ $st =~ ^(idle|mixed|allocated) ]] || return 1
    n=$((n + 1))
  done < <(node_states)
  [[ $n -eq $nodes ]]
}

# --- Already up? ----------------------------------------------------------------------------------
if [[ -f $pids_file ]]; then
  healthy=1
  while read -r name pid; do
    pid_alive "$pid" "$name" || healthy=0
  done <"$pids_file"
  if [[ $healthy -eq 1 ]] && all_idle; then
    echo "slurm-up: already up in $state (source $state/env)"
    exit 0
  fi
  echo "slurm-up: found a stale or half-started instance in $state; restarting it" >&2
  flock -u 9
  "$here/slurm-down.sh" "$state" >&2
  flock -w 120 9 || die "another slurm-up/slurm-down holds $state/.lock"
fi

# Namespaces left by an instance that died without slurm-down.
if [[ -f $state/netns && ! -f $pids_file ]]; then
  flock -u 9
  "$here/slurm-down.sh" "$state" >&2
  flock -w 120 9 || die "another slurm-up/slurm-down holds $state/.lock"
fi

# --- Ports ----------------------------------------------------------------------------------------
# (With --nodes the daemons listen in namespaces of their own, where every port is free.)
for port in "$ctld_port" "$slurmd_port"; do
  [[ $port =~ ^[0-9]+$ && $port -gt 10000 && $port -lt 65536 ]] ||
    die "port '$port' must be a number between 10001 and 65535"
  [[ $multi -eq 1 ]] && continue
  if [[ -n "$(ss -Htln "sport = :$port" 2>/dev/null)" ]]; then
    die "TCP port $port is already in use (another local Slurm? see 'ss -tlnp sport = :$port');" \
      "stop it, or pick other ports with STRATA_SLURM_CTLD_PORT / STRATA_SLURM_SLURMD_PORT"
  fi
done
[[ $resv_ports =~ ^[0-9]+-[0-9]+$ ]] || die "STRATA_SLURM_RESV_PORTS must look like 20000-20999"

# --- Fresh state ----------------------------------------------------------------------------------
# Old job state is useless to tests and can hold the node in a bad state, so each start is clean.
rm -rf "$state/spool" "$state/log" "$state/run" "$state/tmp" "$state/munge" "$pids_file" "$state/env" \
  "${state:?}/bin" "$state/links"
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

# --- Namespace nodes (--nodes) --------------------------------------------------------------------
ctl_net=10.232.0 data_net=10.233.0
if [[ $multi -eq 1 ]]; then
  # Recorded first, so that slurm-down removes them whatever happens next.
  printf '%s\n' "$head_ns" "${node_names[@]/#/$tag-}" >"$state/netns"
  started+=(netns)
  ip netns add "$head_ns" || fail_start "ip netns add $head_ns failed (no network namespaces here?)"
  ip -n "$head_ns" link set lo up
  # Two switches: the control network (the head's address is on it) and the data network.
  for br in swc swd; do
    ip -n "$head_ns" link add name "$br" type bridge forward_delay 0
    ip -n "$head_ns" link set "$br" up
  done
  ip -n "$head_ns" addr add "$ctl_net.1/24" dev swc
  for ((i = 1; i <= nodes; ++i)); do
    ns=$tag-node$i
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    # A veth pair per network: one end becomes ctl0 / data0 in the node, the other a port of the
    # switch in the head (its name there, e.g. sn01234D2, is what slurm-link.sh takes down).
    for net in c:ctl0:swc:$ctl_net d:data0:swd:$data_net; do
      IFS=: read -r k dev br prefix <<<"$net"
      upper=${k^^}
      ip link add "$tag$k$i" type veth peer name "$tag$upper$i"
      ip link set "$tag$k$i" netns "$ns"
      ip link set "$tag$upper$i" netns "$head_ns"
      ip -n "$ns" link set "$tag$k$i" name "$dev"
      ip -n "$ns" addr add "$prefix.$((10 + i))/24" dev "$dev"
      ip -n "$ns" link set "$dev" up
      ip -n "$head_ns" link set "$tag$upper$i" master "$br" up
    done
    echo "node$i $tag-node$i $tag""D$i $data_net.$((10 + i))" >>"$state/links"
  done
fi

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
if [[ $multi -eq 1 ]]; then
  ctld_host="head($ctl_net.1)"
  # %n: each slurmd's node name, so that the nodes keep their spool, pid file and log apart.
  slurmd_files="SlurmdSpoolDir=$state/spool/slurmd-%n
SlurmdPidFile=$state/run/slurmd-%n.pid
SlurmdLogFile=$state/log/slurmd-%n.log"
  node_lines=""
  for ((i = 1; i <= nodes; ++i)); do
    node_lines+="NodeName=node$i NodeAddr=$ctl_net.$((10 + i)) NodeHostname=node$i CPUs=$ncpu State=UNKNOWN"$'\n'
  done
  part_nodes="node[1-$nodes]"
  ucx_dev=ctl0
else
  ctld_host="localhost(127.0.0.1)"
  slurmd_files="SlurmdSpoolDir=$state/spool/slurmd
SlurmdPidFile=$state/run/slurmd.pid
SlurmdLogFile=$state/log/slurmd.log"
  node_lines="NodeName=$node NodeAddr=127.0.0.1 NodeHostname=$node CPUs=$ncpu State=UNKNOWN"
  part_nodes=$node
  ucx_dev=lo
fi
cat >"$conf" <<EOF
# Generated by tools/dev/slurm-up.sh for strata's tests; rewritten on every start.
ClusterName=strata-test
SlurmctldHost=$ctld_host
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$munge_sock
CredType=cred/munge
StateSaveLocation=$state/spool/ctld
SlurmctldPidFile=$state/run/slurmctld.pid
SlurmctldLogFile=$state/log/slurmctld.log
$slurmd_files
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
$node_lines
# OverSubscribe=FORCE lets several test jobs (meson runs tests in parallel) share the few cores;
# 'srun -O' lets one job run more tasks than cores.
PartitionName=test Nodes=$part_nodes Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:64
EOF

# Slurm reads mpi.conf from the directory of slurm.conf. These pin slurmstepd's PMIx/UCX traffic
# to loopback, or to the control network with --nodes (see /work/shared/notes/peers.md §2.2).
cat >"$state/mpi.conf" <<EOF
PMIxNetDevicesUCX=$ucx_dev
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
if [[ $multi -eq 1 ]]; then
  # The client commands run in the head namespace, where the control network is.
  mkdir -p "$state/bin"
  for cmd in srun sbatch salloc sinfo squeue scontrol scancel sattach sstat; do
    command -v "$cmd" >/dev/null 2>&1 || continue
    printf '#!/bin/sh\n# Runs %s in the head namespace of the local multi-node Slurm (tools/dev/slurm-up.sh).\nexec ip netns exec %s %s "$@"\n' \
      "$cmd" "$head_ns" "$(command -v "$cmd")" >"$state/bin/$cmd"
    chmod 0755 "$state/bin/$cmd"
  done
  cat >>"$state/env" <<EOF
export PATH=$state/bin:\$PATH
# The nodes, and the interface of the data network in each (the jobs' traffic).
export STRATA_SLURM_NODES=$nodes
export STRATA_SLURM_DATA_IFACE=data0
EOF
fi

# --- slurmctld, slurmd ----------------------------------------------------------------------------
# With --nodes it runs in the head namespace, under the host name slurm.conf gives it.
ctld_cmd=(slurmctld -f "$conf" -i)
[[ $multi -eq 1 ]] &&
  ctld_cmd=(nsenter --net="/run/netns/$head_ns" unshare --uts sh -c 'hostname head && exec "$@"' sh "${ctld_cmd[@]}")
"${daemon_env[@]}" "${ctld_cmd[@]}" >>"$state/log/slurmctld.out" 2>&1 9>&- ||
  fail_start "slurmctld failed to start" "$state/log/slurmctld.out" "$state/log/slurmctld.log"
wait_pid_file slurmctld "$state/run/slurmctld.pid" "$state/log/slurmctld.log"

if [[ $multi -eq 0 ]]; then
  "${daemon_env[@]}" slurmd -f "$conf" -N "$node" >>"$state/log/slurmd.out" 2>&1 9>&- ||
    fail_start "slurmd failed to start" "$state/log/slurmd.out" "$state/log/slurmd.log"
  wait_pid_file slurmd "$state/run/slurmd.pid" "$state/log/slurmd.log"
else
  # The nodes' names resolve to their control addresses, as a cluster's DNS would have it (the
  # tcp bootstrap's root under srun is the first node's name); their /etc/hosts is this file.
  {
    echo "127.0.0.1 localhost"
    echo "$ctl_net.1 head"
    for ((i = 1; i <= nodes; ++i)); do echo "$ctl_net.$((10 + i)) node$i"; done
  } >"$state/hosts"
  for n in "${node_names[@]}"; do
    # nsenter, not `ip netns exec`: that one mounts a fresh /sys, without the cgroup tree slurmd
    # looks at. Its own host name (tasks see it in `hostname`; strata tells hosts apart by it) and its own
    # /tmp for jobs (TmpFS: Slurm's PMIx server keeps per-step files there under the same name
    # on every node) and /etc/hosts.
    mkdir -p "$state/spool/slurmd-$n"
    # shellcheck disable=SC2016  # expanded by that sh
    "${daemon_env[@]}" nsenter --net="/run/netns/$tag-$n" unshare --uts --mount --propagation private \
      sh -c 'hostname "$1" && mount -t tmpfs -o size=256m,mode=1777 "strata-$1-tmp" "$2" &&
             mount --bind "$4" /etc/hosts && exec slurmd -f "$3" -N "$1"' \
      sh "$n" "$state/tmp" "$conf" "$state/hosts" \
      >>"$state/log/slurmd-$n.out" 2>&1 9>&- ||
      fail_start "slurmd of $n failed to start" "$state/log/slurmd-$n.out" "$state/log/slurmd-$n.log"
    wait_pid_file slurmd "$state/run/slurmd-$n.pid" "$state/log/slurmd-$n.log"
  done
fi

deadline=$((SECONDS + up_timeout))
st=""
while :; do
  all_idle && break
  while read -r name pid; do
    pid_alive "$pid" "$name" ||
      fail_start "$name (pid $pid) exited during start-up" "$state/log/$name"*.log
  done <"$pids_file"
  if ((SECONDS >= deadline)); then
    st=$(node_states | tr '\n' ' ')
    fail_start "nodes not idle after ${up_timeout}s (states: '${st:-no answer from slurmctld}')" \
      "$state/log/slurmctld.log" "$state/log/slurmd"*.log
  fi
  sleep 0.5
done
trap - ERR

if [[ $multi -eq 1 ]]; then
  echo "slurm-up: local Slurm up in $state ($nodes namespace nodes node1..node$nodes, $ncpu CPUs" \
    "each; control network $ctl_net.0/24, data network $data_net.0/24 on data0); use: . $state/env"
else
  echo "slurm-up: local Slurm up in $state (node $node, $ncpu CPUs, ports $ctld_port/$slurmd_port);" \
    "use: . $state/env"
fi
