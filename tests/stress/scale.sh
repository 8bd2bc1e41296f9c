#!/usr/bin/env bash
# Scale on one small machine: one job of N ranks (128, 256 on 2 cores) runs tests/stress/scale.cpp
# (rendezvous, bootstrap allGather and barrier, Communicator::create over shm, a small allReduce
# and allGather, destroy; every result checked) and prints rank 0's table of phase times and its
# memory, descriptors and threads after each phase.
#
# usage: scale.sh MODE N BINARY
#   MODE  strata-run:PATH   PATH -n N BINARY
#         srun              tests/harness/run-srun.sh --mpi=pmix N BINARY (local Slurm)
# env:  SCALE_TIMEOUT  seconds for the job (default 170; meson sets 90); the job's own deadlines are
#                      the configured bootstrap.connect_timeout, bootstrap.timeout, transport.timeout
#       SCALE_NOFILE   run the job under `ulimit -n SCALE_NOFILE` (a soft limit; default: as is)
# Exit status: 0 passed, 1 failed, 77 the launcher is not available (skip).
set -u

mode=${1:?usage: scale.sh MODE N BINARY}
n=${2:?usage: scale.sh MODE N BINARY}
bin=${3:?usage: scale.sh MODE N BINARY}
[[ $n =~ ^[1-9][0-9]*$ ]] || { echo "scale: N must be a positive number" >&2; exit 2; }
[[ -x $bin ]] || { echo "scale: $bin is not an executable" >&2; exit 2; }
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
limit=${SCALE_TIMEOUT:-170}

# Loopback only, whatever the caller's environment says.
export STRATA_BOOTSTRAP_TCP_INTERFACE=lo FI_TCP_IFACE=lo UCX_NET_DEVICES=lo

case $mode in
  strata-run:*) launch=("${mode#strata-run:}" -n "$n" "$bin") ;;
  srun) launch=(bash "$here/../harness/run-srun.sh" --mpi=pmix "$n" "$bin") ;;
  *) echo "scale: unknown MODE '$mode'" >&2; exit 2 ;;
esac
case_name="scale-${mode%%:*}-n$n${SCALE_NOFILE:+-nofile$SCALE_NOFILE}"

work=$(mktemp -d "${TMPDIR:-/tmp}/strata-scale.XXXXXX") || exit 1
trap 'rm -rf "$work"' EXIT

echo "case $case_name: $n ranks ($mode) on $(nproc) CPUs, limit ${limit}s, ulimit -n ${SCALE_NOFILE:-$(ulimit -n)}"
start=$(date +%s.%N)
(
  [[ -n ${SCALE_NOFILE:-} ]] && ulimit -S -n "$SCALE_NOFILE"
  exec timeout --kill-after=10 "$limit" "${launch[@]}" --json "$work/phases.json"
) >"$work/out" 2>&1
rc=$?
wall=$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f", e - s }')
if [[ $rc -eq 77 ]]; then
  cat "$work/out"
  echo "SKIP: the launcher is not available ($mode)"
  exit 77
fi
# srun's own notes about the allocation.
grep -v '^srun: job [0-9]* \(queued\|has been allocated\)' "$work/out" >"$work/shown"
# The table, then anything else anyone printed (at most 40 lines).
grep '^scale: [0-9]* ranks' "$work/shown"
others=$(grep -v '^scale: [0-9]* ranks' "$work/shown")
if [[ -n $others ]]; then
  echo "--- other output ($(wc -l <<<"$others") lines):"
  head -n 40 <<<"$others"
fi
phases=$(cat "$work/phases.json" 2>/dev/null | grep -c '"phase"')
echo "case $case_name: exit status $rc, $phases of 7 phases reported, wall ${wall}s"
if [[ $rc -ne 0 || $phases -ne 7 ]]; then
  [[ $rc -eq 124 || $rc -eq 137 ]] && echo "FAIL: $case_name: timed out after ${limit}s"
  echo "FAIL: $case_name"
  exit 1
fi
echo "PASS: $case_name"
