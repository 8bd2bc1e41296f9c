#!/usr/bin/env bash
# The exit storm: RUNS short jobs in a row, each a random mix of collectives and sizes ending in
# a different op (exit-storm SEED), every rank destroying its Communicator and exiting as soon as
# it is done. Every run must exit 0 and print nothing (strata prints nothing at the default log
# level on success, so a warning at exit is a failure too). The runs go on after a failure; the
# summary names every failed seed, and `exit-storm SEED` under the same launcher replays it.
#
# usage: exit_storm.sh MODE RUNS BINARY
#   MODE  strata-run:PATH   PATH -n N BINARY SEED        (ranks on this host; shm, or fabric when
#                                                          STRATA_TRANSPORT_INTRA_NODE=fabric)
#         srun              tests/harness/run-srun.sh --mpi=pmix N BINARY SEED (local Slurm)
#         two-hosts         tests/transport/two_hosts.sh BINARY SEED (2 namespaces x 2 ranks)
# env:  EXIT_STORM_N      ranks per job (default 8; two-hosts is always 4)
#       EXIT_STORM_SEED   first seed (default: derived from the time; printed)
#       EXIT_STORM_TIMEOUT seconds per job (default 120)
# Exit status: 0 all runs passed, 1 a run failed, 77 the launcher is not available (skip).
set -u

mode=${1:?usage: exit_storm.sh MODE RUNS BINARY}
runs=${2:?usage: exit_storm.sh MODE RUNS BINARY}
bin=${3:?usage: exit_storm.sh MODE RUNS BINARY}
[[ $runs =~ ^[1-9][0-9]*$ ]] || { echo "exit_storm: RUNS must be a positive number" >&2; exit 2; }
[[ -x $bin ]] || { echo "exit_storm: $bin is not an executable" >&2; exit 2; }
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
n=${EXIT_STORM_N:-8}
seed0=${EXIT_STORM_SEED:-$(( $(date +%s) % 100000 * 100 ))}
per_run=${EXIT_STORM_TIMEOUT:-120}

# Loopback only, whatever the caller's environment says.
export STRATA_BOOTSTRAP_TCP_INTERFACE=lo FI_TCP_IFACE=lo UCX_NET_DEVICES=lo

case $mode in
  strata-run:*) launch=("${mode#strata-run:}" -n "$n" "$bin") ;;
  srun) launch=(bash "$here/../harness/run-srun.sh" --mpi=pmix "$n" "$bin") ;;
  two-hosts) launch=(bash "$here/../transport/two_hosts.sh" "$bin"); n=4 ;;
  *) echo "exit_storm: unknown MODE '$mode'" >&2; exit 2 ;;
esac

echo "exit storm: $runs jobs of $n ranks ($mode), seeds $seed0..$((seed0 + runs - 1))"
failed=()
start=$SECONDS
for ((i = 0; i < runs; i++)); do
  seed=$((seed0 + i))
  out=$(timeout --kill-after=10 "$per_run" "${launch[@]}" "$seed" 2>&1)
  rc=$?
  if [[ $rc -eq 77 ]]; then
    echo "$out"
    echo "SKIP: the launcher is not available ($mode)"
    exit 77
  fi
  # two_hosts.sh prints each rank's output prefixed with [rank R], then its own verdict.
  [[ $mode == two-hosts ]] && out=$(grep '^\[rank ' <<<"$out")
  # srun's own notes about the allocation ("srun: job 16 queued and waiting for resources").
  [[ $mode == srun ]] && out=$(grep -v '^srun: job [0-9]* \(queued\|has been allocated\)' <<<"$out")
  if [[ $rc -ne 0 || -n $out ]]; then
    failed+=("$seed")
    echo "--- seed $seed: exit status $rc$([[ $rc -eq 124 ]] && echo " (timed out after ${per_run}s)")"
    head -n 20 <<<"$out"
  fi
done
echo "exit storm: $((runs - ${#failed[@]})) of $runs jobs passed in $((SECONDS - start)) s"
if [[ ${#failed[@]} -gt 0 ]]; then
  echo "FAIL: seeds ${failed[*]} (replay one with: ${launch[*]} SEED)"
  exit 1
fi
