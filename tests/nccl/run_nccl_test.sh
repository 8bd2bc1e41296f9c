#!/bin/bash
# run_nccl_test.sh LAUNCHER N PROGRAM file|comm-id|die|shrink|scalable:K: the NCCL API test at N ranks,
# the id passed through a file rank 0 writes, or through NCCL_COMM_ID (a free port on
# 127.0.0.1); die: rank 1 is killed after init and the others must fail cleanly (strata-run
# only); shrink: revoke and shrink, then shrink after a SIGKILL (strata-run --keep-going);
# scalable:K: ncclCommInitRankScalable with K ids, each written by its block's first rank. LAUNCHER is
# strata-run's path, or srun or mpirun (through tests/harness/run-srun.sh and run-mpirun.sh,
# which exit 77 when there is no local Slurm or no mpirun).
set -euo pipefail
launcher=$1 n=$2 prog=$3 mode=$4
harness=$(cd "$(dirname "${BASH_SOURCE[0]}")/../harness" && pwd)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
case $launcher in
  srun) cmd=(bash "$harness/run-srun.sh" "$n" "$prog") ;;
  mpirun) cmd=(bash "$harness/run-mpirun.sh" "$n" "$prog") ;;
  *) cmd=("$launcher" -n "$n" --tag-output --timeout 240 "$prog") ;;
esac
# survivors RC COMMAND...: runs the job, then the launcher must have exited RC and every rank but
# the one that died must have printed "PASS survivor".
survivors() {
  local want=$1 rc passed
  shift
  set +e
  "$@" | tee "$dir/out"
  rc=${PIPESTATUS[0]}
  set -e
  passed=$(grep -c 'PASS survivor' "$dir/out" || true)
  echo "run_nccl_test: strata-run exited $rc; $passed of $((n - 1)) survivors passed"
  [ "$rc" = "$want" ] && [ "$passed" = $((n - 1)) ]
}
if [ "$mode" = die ]; then
  # Rank 1 kills itself: strata-run exits 137 (its status).
  survivors 137 "${cmd[@]}" --die "$dir/id"
  exit
fi
if [ "$mode" = shrink ]; then
  # Rank 0 revokes, all shrink; then the last rank dies and the others shrink without it
  # (strata-run --keep-going: the killed rank does not end the job).
  survivors 0 "$launcher" -n "$n" --keep-going --tag-output --timeout 240 "$prog" --shrink "$dir/id"
  exit
fi
if [ "${mode%%:*}" = scalable ]; then
  # The bootstrap's debug line says which root each rank used: every block must appear.
  k=${mode#scalable:}
  STRATA_LOG_LEVEL=debug "${cmd[@]}" --scalable "$k" "$dir/id" 2>&1 | tee "$dir/out"
  [ "${PIPESTATUS[0]}" = 0 ]
  for ((b = 0; b < k; ++b)); do
    grep -q "rendezvous of $n ranks over $k roots took .* (block $b: " "$dir/out" ||
      { echo "run_nccl_test: no rank used rendezvous root $b"; exit 1; }
  done
  exit
fi
if [ "$mode" = comm-id ]; then
  # shellcheck source=../harness/hold-port.sh
  . "$harness/hold-port.sh"
  hold_port
  export NCCL_COMM_ID=127.0.0.1:$HOLD_PORT
  "${cmd[@]}"
  rc=$?
  release_port
  exit "$rc"
else
  "${cmd[@]}" "$dir/id"
fi
