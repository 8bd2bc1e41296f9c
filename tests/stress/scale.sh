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
#       SCALE_NOFILE   SOFT or SOFT:HARD: the job runs under these limits of open files (default:
#                      as is). strata raises a soft limit below what N ranks need up to the hard
#                      limit, so SOFT alone must pass.
#       SCALE_EXPECT   pass (default), or fd-limit: the hard limit is too low, and the job must
#                      fail within the limit with the reason and the remedy ("ran out of file
#                      descriptors", "ulimit -n") at a quarter of the ranks or more (the others
#                      may see it leave first), and rank 0 must warn at start-up, instead of a
#                      hang or an error that blames a peer
# A passing job prints nothing but rank 0's table: any other line (a warning) fails the case.
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
expect=${SCALE_EXPECT:-pass}
nofile=${SCALE_NOFILE:-}
soft=${nofile%%:*}
hard=
[[ $nofile == *:* ]] && hard=${nofile#*:}
case_name="scale-${mode%%:*}-n$n${soft:+-nofile$soft}${hard:+-hard$hard}"

work=$(mktemp -d "${TMPDIR:-/tmp}/strata-scale.XXXXXX") || exit 1
trap 'rm -rf "$work"' EXIT

echo "case $case_name: $n ranks ($mode) on $(nproc) CPUs, limit ${limit}s, open files" \
  "${soft:-$(ulimit -Sn)} (hard ${hard:-$(ulimit -Hn)}), expect $expect"
start=$(date +%s.%N)
(
  [[ -n $soft ]] && { ulimit -S -n "$soft" || exit 2; }
  [[ -n $hard ]] && { ulimit -H -n "$hard" || exit 2; }
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
phases=$(grep -c '"phase"' "$work/phases.json" 2>/dev/null)
phases=${phases:-0}
echo "case $case_name: exit status $rc, $phases of 7 phases reported, wall ${wall}s"
if [[ $expect == fd-limit ]]; then
  advice='ran out of file descriptors.*ulimit -n'
  told=$(grep -c "^scale: rank [0-9]*: .*$advice" "$work/shown")
  failed=$(grep -c '^scale: rank [0-9]*: ' "$work/shown")
  echo "case $case_name: $failed ranks failed, $told of them with the reason and the remedy"
  if [[ $rc -eq 124 || $rc -eq 137 ]]; then
    echo "FAIL: $case_name: timed out after ${limit}s instead of failing with a clear error"
  elif [[ $rc -eq 0 ]]; then
    echo "FAIL: $case_name: the job passed; the hard limit was meant to be too low"
  elif ! grep -q "r0 [a-z]*\] WARN a job of $n ranks needs about" "$work/shown"; then
    echo "FAIL: $case_name: rank 0 did not warn that the limit is too low"
  elif ((told * 4 < n)); then
    echo "FAIL: $case_name: fewer than a quarter of the ranks named the reason"
  else
    echo "PASS: $case_name"
    exit 0
  fi
  exit 1
fi
if [[ $rc -ne 0 || $phases -ne 7 || -n $others ]]; then
  [[ $rc -eq 124 || $rc -eq 137 ]] && echo "FAIL: $case_name: timed out after ${limit}s"
  # strata prints nothing at the default log level when all goes well: a warning fails the case
  # (ranks that finished first were once reported lost to ranks still in their last call).
  [[ -n $others ]] && echo "FAIL: $case_name: output besides rank 0's table (above)"
  echo "FAIL: $case_name"
  exit 1
fi
echo "PASS: $case_name"
