#!/usr/bin/env bash
# The slurm-multinode suite's shell cases: jobs across the namespace nodes of the local multi-node
# Slurm (tools/dev/slurm-up.sh --nodes 2), launched through tests/harness/run-srun.sh with
# STRATA_SRUN_NODES=2 (meson sets it), which skips (77) when no such Slurm is up.
#
# usage: multinode.sh CASE [PROGRAM]
#   hostnames  srun -N 2 -n 4 hostname: two different names, two tasks each
#   perf       srun -N 2 -n 4 --mpi=pmix strata-perf allreduce -b 8 -e 16M: every row correct, the
#              ranks on both nodes, the hierarchical algorithm between them
#   link-cut   a 1 MiB allReduce loop (tcp bootstrap); node2's data link is cut: every rank fails
#              within transport.timeout (5 s) plus 20 s, with an error whose first rank is on the
#              other node; srun ends and Slurm has no job left; the link is healed afterwards
#   net-emu-link-cut CUDA_NET_EMU
#              the emulated cross-host CUDA collectives (one process per node, 2 ranks each) in a
#              loop; node2's data link is cut: both processes end within the wait limit (5 s)
#              plus 20 s, each with a kernel that timed out waiting for a rank on the other node
# Exit status: 0 passed, 1 failed, 77 skipped.
set -uo pipefail
case_name=${1:?usage: multinode.sh CASE [PROGRAM]}
perf=${2:-}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
run_srun=$repo/tests/harness/run-srun.sh
: "${STRATA_SRUN_NODES:=2}"
export STRATA_SRUN_NODES
work=$(mktemp -d "${TMPDIR:-/tmp}/multinode.XXXXXX")
trap 'rm -rf "$work"' EXIT

fail() {
  echo "FAIL: $*"
  exit 1
}
# Runs the job; exits 77 when run-srun.sh skipped it. Output in $work/out, status in $rc.
job() {
  bash "$run_srun" "$@" >"$work/out" 2>&1
  rc=$?
  if [[ $rc -eq 77 ]] && grep -q '^SKIP:' "$work/out"; then
    cat "$work/out"
    exit 77
  fi
}

# "RANK NODE" per rank, from strata-perf's "Using devices" lines.
rank_nodes() {
  sed -n 's/^\([0-9]*: \)\{0,1\}#  Rank *\([0-9]*\) Group *[0-9]* Pid *[0-9]* on *\([^ ]*\) .*/\2 \3/p' "$work/out"
}

# cut_during READY_REGEX READY_COUNT SETTLE SRUN_ARGS...: starts the job (tcp bootstrap,
# transport.timeout $timeout, every task reporting its own error), waits until READY_REGEX
# matches READY_COUNT lines of its output, SETTLE seconds more, then cuts node2's data link and
# waits at most $timeout + 20 s for the job to end. Sets rc (srun's status) and took (seconds from
# the cut); the link is healed again at exit and after the job. Exits 77 when no multi-node Slurm
# is up or the job skipped.
cut_during() {
  local ready=$1 count=$2 settle=$3
  shift 3
  # shellcheck source=../harness/find-slurm-nodes.sh
  . "$repo/tests/harness/find-slurm-nodes.sh"
  envf=$(find_slurm_nodes_env "$repo")
  [[ -n $envf ]] || { echo "SKIP: no local multi-node Slurm is up"; exit 77; }
  state=$(dirname "$envf")
  export STRATA_BOOTSTRAP_BACKEND=tcp STRATA_TRANSPORT_TIMEOUT=$timeout
  heal() { bash "$repo/tools/dev/slurm-link.sh" "$state" node2 up >/dev/null 2>&1; }
  trap 'heal; rm -rf "$work"' EXIT
  STRATA_SRUN_TIME=3 bash "$run_srun" --kill-on-bad-exit=0 "$@" >"$work/out" 2>&1 &
  local srun_pid=$!
  for _ in $(seq 240); do
    [[ $(grep -c -- "$ready" "$work/out") -ge $count ]] && break
    kill -0 "$srun_pid" 2>/dev/null || break
    sleep 0.25
  done
  if ! kill -0 "$srun_pid" 2>/dev/null; then
    wait "$srun_pid"
    rc=$?
    cat "$work/out"
    [[ $rc -eq 77 ]] && exit 77
    fail "the job ended (status $rc) before the link was cut"
  fi
  sleep "$settle"
  bash "$repo/tools/dev/slurm-link.sh" "$state" node2 down || fail "could not cut node2's link"
  local cut=$SECONDS limit=$((timeout + 20))
  while kill -0 "$srun_pid" 2>/dev/null && ((SECONDS - cut <= limit)); do sleep 0.25; done
  if kill -0 "$srun_pid" 2>/dev/null; then
    kill -INT "$srun_pid"; sleep 1; kill -INT "$srun_pid" 2>/dev/null
    wait "$srun_pid"
    cat "$work/out"
    fail "the job still ran ${limit} s after the cut"
  fi
  wait "$srun_pid"
  rc=$?
  took=$((SECONDS - cut))
  heal
  cat "$work/out"
}

case $case_name in
hostnames)
  job 4 hostname
  cat "$work/out"
  [[ $rc -eq 0 ]] || fail "srun exited $rc"
  names=$(grep -v '^srun: ' "$work/out" | sort | uniq -c | awk '{ print $2 "x" $1 }' | tr '\n' ' ')
  [[ $(grep -v '^srun: ' "$work/out" | sort -u | wc -l) -eq 2 ]] || fail "expected two host names, got: $names"
  [[ $names =~ ^[^\ ]+x2\ [^\ ]+x2\ $ ]] || fail "expected two tasks on each node, got: $names"
  echo "hostnames: $names"
  ;;
perf)
  [[ -x $perf ]] || fail "usage: multinode.sh perf STRATA_PERF"
  export STRATA_BOOTSTRAP_BACKEND=pmix
  job --mpi=pmix 4 "$perf" allreduce -b 8 -e 16M
  cat "$work/out"
  [[ $rc -eq 0 ]] || fail "srun exited $rc"
  nodes=$(rank_nodes | awk '{ print $2 }' | sort -u | tr '\n' ' ')
  [[ $(rank_nodes | wc -l) -eq 4 && $(wc -w <<<"$nodes") -eq 2 ]] ||
    fail "expected 4 ranks on 2 nodes in the 'Using devices' lines, got nodes: $nodes"
  # Rows: size count type redop root time algbw busbw #wrong time algbw busbw #wrong.
  rows=$(awk '$1 ~ /^[0-9]+$/ && NF == 13' "$work/out")
  [[ $(wc -l <<<"$rows") -eq 8 ]] || fail "expected 8 result rows (8 B to 16 MiB by 8x)"
  bad=$(awk '$9 != 0 || $13 != 0' <<<"$rows")
  [[ -z $bad ]] || fail "rows with wrong elements: $bad"
  grep -q 'Out of bounds values : 0 OK' "$work/out" || fail "no 'Out of bounds values : 0 OK'"
  grep -q 'algorithm: host/hierarchical' "$work/out" ||
    fail "the hierarchical algorithm (across the nodes) ran at no size"
  # How the host collectives reach the other node (debug log of each rank's set-up): written by
  # the calling thread (collectives.net_path = direct), 256 KiB chunks (the default across hosts).
  STRATA_LOG_LEVEL=debug job --mpi=pmix 4 "$perf" allreduce -b 1M -e 1M -n 2 -w 1
  [[ $rc -eq 0 ]] || { cat "$work/out"; fail "the debug-logged job exited $rc"; }
  setup=$(grep -c 'host collectives: 4 ranks, chunk 262144 B, .* 2 peers not mapped (written by the calling thread)' "$work/out")
  [[ $setup -eq 4 ]] || {
    grep 'host collectives:' "$work/out"
    fail "expected every rank's set-up with 256 KiB chunks and its 2 peers on the other node written directly, got $setup of 4"
  }
  echo "perf: 8 sizes correct on nodes $nodes; links across the nodes written directly, 256 KiB chunks"
  ;;
link-cut)
  [[ -x $perf ]] || fail "usage: multinode.sh link-cut STRATA_PERF"
  timeout=5
  # A few calls in (2 s after every rank's "Using devices" line).
  cut_during 'Using devices' 1 2 --label 4 "$perf" allreduce -b 1M -e 1M -n 1000000 -w 1
  [[ $rc -ne 0 ]] || fail "srun exited 0 although the link was cut"
  declare -A node_of=()
  while read -r r nd; do node_of[$r]=$nd; done < <(rank_nodes | sed 's/^[0-9]*: //')
  [[ ${#node_of[@]} -eq 4 ]] || fail "no 'Using devices' line for every rank"
  for r in 0 1 2 3; do
    line=$(grep -m1 "^$r: strata-perf: rank $r: error" "$work/out") ||
      fail "rank $r printed no error"
    peer=$(sed -n 's/.*(peer rank \([0-9]*\)).*/\1/p' <<<"$line")
    first=$(grep -o 'rank [0-9]*' <<<"${line#*): }" | head -n1 | awk '{ print $2 }')
    for k in "$peer" "$first"; do
      [[ -n $k && -n ${node_of[$k]:-} && ${node_of[$k]} != "${node_of[$r]}" ]] ||
        fail "rank $r (on ${node_of[$r]}) names rank '${k}' first, not a rank on the other node: $line"
    done
  done
  # Slurm cleans the step up: no job of ours left.
  # shellcheck disable=SC1090  # written by slurm-up.sh
  . "$envf"
  for _ in $(seq 40); do
    [[ -z $(squeue -h -o %A 2>/dev/null) ]] && break
    sleep 0.25
  done
  left=$(squeue -h -o '%A %T' 2>/dev/null)
  [[ -z $left ]] || fail "Slurm still has jobs 10 s after srun ended: $left"
  echo "link-cut: every rank failed naming a rank on the other node; srun ended ${took} s after the cut"
  ;;
net-emu-link-cut)
  emu=$perf
  [[ -x $emu ]] || fail "usage: multinode.sh net-emu-link-cut CUDA_NET_EMU"
  timeout=5
  cut_during 'running$' 2 1 --label 2 "$emu" --local 2 --cut --timeout "$timeout"
  [[ $rc -eq 0 ]] || fail "srun exited $rc (a process found no rank on the other node named)"
  for t in 0 1; do
    grep -q "^$t: .*a rank gave up waiting for a rank on another host" "$work/out" ||
      fail "task $t did not report a wait that gave up naming a rank on the other node"
  done
  echo "net-emu-link-cut: both nodes' kernels gave up naming a rank on the other node, ${took} s after the cut"
  ;;
*)
  echo "multinode.sh: unknown case '$case_name'" >&2
  exit 2
  ;;
esac
