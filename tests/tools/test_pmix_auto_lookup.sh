#!/usr/bin/env bash
# A job from the build tree under a PMIx server (mpirun, or srun --mpi=pmix) with no
# STRATA_MODULE_PATH anywhere: bootstrap.backend=auto must find the build tree's pmix module and
# run on it. strata-perf allreduce (2 ranks, results checked) prints the backend in its header.
#
# Usage: test_pmix_auto_lookup.sh WRAPPER [WRAPPER_OPTION...] STRATA_PERF
#   WRAPPER: tests/harness/run-mpirun.sh or run-srun.sh (they exit 77 without mpirun / Slurm);
#   WRAPPER_OPTIONs start with "--" (e.g. --mpi=pmix for run-srun.sh).
set -uo pipefail
fail() {
  echo "FAIL: $*"
  exit 1
}
[[ $# -ge 2 ]] || { echo "usage: $0 WRAPPER [--OPTION...] STRATA_PERF" >&2; exit 2; }
wrapper=$1
shift
opts=()
while [[ $# -gt 1 && $1 == --* ]]; do
  opts+=("$1")
  shift
done
perf=$1

unset STRATA_MODULE_PATH
export STRATA_BOOTSTRAP_BACKEND=auto STRATA_CONFIG=/dev/null/none

# Every rank checks that it has no STRATA_MODULE_PATH either (the launcher could add one).
# shellcheck disable=SC2016  # expanded by the rank's shell
rank_cmd='if [[ -n ${STRATA_MODULE_PATH+x} ]]; then
  echo "rank has STRATA_MODULE_PATH=$STRATA_MODULE_PATH"; exit 3; fi; exec "$0" "$@"'
out=$(bash "$wrapper" "${opts[@]}" 2 bash -c "$rank_cmd" "$perf" allreduce -b 8 -e 64K -f 8 -c 1 \
  -n 5 -w 1 2>&1)
rc=$?
echo "$out"
[[ $rc -eq 77 ]] && exit 77
[[ $rc -eq 0 ]] || fail "the job exited $rc"
grep -q '^# backend: pmix ' <<<"$out" || fail "strata-perf did not run on pmix (no '# backend: pmix' line)"
grep -q '^# Out of bounds values : 0 OK$' <<<"$out" || fail "allreduce results were not all correct"
echo "ok: ran on pmix without STRATA_MODULE_PATH"
