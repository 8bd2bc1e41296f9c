#!/usr/bin/env bash
# run_srun_ft.sh [SRUN_OPTION...] NTASKS PROGRAM [ARGS...]: a case of the fault-tolerance suite
# under the local Slurm (tests/harness/run-srun.sh, which exits 77 without one), with
# --kill-on-bad-exit=0 so that the victims' SIGKILL does not end the step. srun then exits with
# the victims' status (137): the case passes when no task reports a Boost.Test failure and at
# least one survivor reports "No errors detected".
set -uo pipefail
harness=$(cd "$(dirname "${BASH_SOURCE[0]}")/../harness" && pwd)
out=$(mktemp)
trap 'rm -f "$out"' EXIT
bash "$harness/run-srun.sh" --kill-on-bad-exit=0 "$@" 2>&1 | tee "$out"
rc=${PIPESTATUS[0]}
[[ $rc -eq 77 ]] && exit 77
passed=$(grep -c 'No errors detected' "$out")
failed=$(grep -c 'failure.* detected\|fatal error' "$out")
echo "run_srun_ft: srun exited $rc; $passed task(s) passed, $failed failed"
[[ ($rc -eq 0 || $rc -eq 137) && $passed -ge 1 && $failed -eq 0 ]]
