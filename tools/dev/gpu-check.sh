#!/usr/bin/env bash
# gpu-check.sh — the nvlink transport's checks on a machine with an NVIDIA GPU.
#
# What it runs (in order, each step with its own time limit, no network access needed):
#   1. nvidia-smi -L and the driver/CUDA versions (what machine this is);
#   2. meson setup of a build directory (default build-gpu; -Dcuda=enabled, network-free:
#      --wrap-mode=nodownload) and ninja of the nvlink module and the tests/gpu programs only
#      (GPU_CHECK_FULL=1 builds everything and also runs the 'transport' suite);
#   3. meson test --suite gpu (test-nvlink-records, test-nvlink: in-process and cross-process
#      CUDA IPC import, writes of several sizes, updateAndSync ordering, PeerLost, stats);
#   4. GPU_CHECK_PROCS (default 4) copies of test-nvlink at once, all on the same GPU, each
#      spawning its own importer process (several processes sharing one GPU);
#   5. test-nvlink --bench: write bandwidth (same process and cross-process via IPC) and the
#      cost of loadSignal and updateAndSync+flush (numbers only, never pass/fail);
#   6. a summary, one line per step. Exit status 0 only when every step passed.
# Usage: tools/dev/gpu-check.sh [build-dir]. Logs go to <build-dir>/gpu-check/, and also to
# $OUT/gpu-check/ when OUT is set. Takes a few minutes, most of it the build.

set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
BUILD=${1:-build-gpu}
PROCS=${GPU_CHECK_PROCS:-4}
FULL=${GPU_CHECK_FULL:-0}
LOGS=$BUILD/gpu-check
mkdir -p "$LOGS"
export PATH=/usr/local/cuda/bin:$PATH
declare -a SUMMARY=()
FAILED=0

step() {  # step NAME LIMIT_SECONDS COMMAND...: runs it, logs it, records PASS/FAIL/SKIP
  local name=$1 limit=$2
  shift 2
  local start=$SECONDS rc
  echo "=== $name"
  timeout --kill-after=10 "$limit" "$@" >"$LOGS/$name.log" 2>&1
  rc=$?
  tail -n 25 "$LOGS/$name.log"
  local verdict=PASS
  if [ $rc -eq 77 ]; then verdict=SKIP; elif [ $rc -ne 0 ]; then verdict="FAIL (exit $rc)"; FAILED=1; fi
  [ $rc -eq 124 ] && verdict="FAIL (timeout after ${limit}s)"
  SUMMARY+=("$(printf '%-14s %-26s %4ds' "$name" "$verdict" $((SECONDS - start)))")
}

finish() {
  echo
  echo "=== summary (logs in $LOGS)"
  printf '%s\n' "${SUMMARY[@]}"
  if [ -n "${OUT:-}" ] && [ -d "${OUT:-}" ]; then mkdir -p "$OUT/gpu-check" && cp "$LOGS"/*.log "$OUT/gpu-check/" 2>/dev/null; fi
  exit $FAILED
}

step machine 60 bash -c 'nvidia-smi -L && nvidia-smi --query-gpu=name,driver_version,pci.bus_id,memory.total --format=csv && nvcc --version | tail -2 && (nvidia-smi topo -m || true)'

if [ -f "$BUILD/build.ninja" ]; then
  step configure 180 meson setup --reconfigure "$BUILD" -Dcuda=enabled -Dtests=enabled --wrap-mode=nodownload
else
  step configure 180 meson setup "$BUILD" -Dcuda=enabled -Dtests=enabled --wrap-mode=nodownload
fi
[ -f "$BUILD/build.ninja" ] || finish

TARGETS=(backends/transport/nvlink/strata-transport-nvlink.so tests/gpu/test-nvlink tests/gpu/test-nvlink-records)
if [ "$FULL" = 1 ]; then
  step build 600 ninja -C "$BUILD"
else
  step build 300 ninja -C "$BUILD" "${TARGETS[@]}"
fi
if [ ! -x "$BUILD/tests/gpu/test-nvlink" ]; then
  echo "tests/gpu was not built (is it included from tests/meson.build?)"
  FAILED=1
  finish
fi

step suite-gpu 300 meson test -C "$BUILD" --no-rebuild --suite gpu --print-errorlogs
if [ "$FULL" = 1 ]; then
  step suite-transport 300 meson test -C "$BUILD" --no-rebuild --suite transport --print-errorlogs
fi

MODULE=$PWD/$BUILD/backends/transport/nvlink/strata-transport-nvlink.so
# Several processes on one GPU: each copy runs every case, and its cross-process case spawns
# an importer, so up to 2 x PROCS processes share the device.
# shellcheck disable=SC2317  # run through bash -c below
shared_gpu() {
  local pids=() i r rc=0 skipped=0
  for i in $(seq 1 "$PROCS"); do
    "$BUILD/tests/gpu/test-nvlink" --nvlink-module="$MODULE" --log_level=test_suite \
      >"$LOGS/shared-gpu-$i.log" 2>&1 &
    pids+=($!)
  done
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}"
    r=$?
    echo "process $((i + 1)): exit $r"
    if [ $r -eq 77 ]; then
      skipped=$((skipped + 1))
    elif [ $r -ne 0 ]; then
      tail -n 20 "$LOGS/shared-gpu-$((i + 1)).log"
      rc=1
    fi
  done
  [ $rc -eq 0 ] && [ $skipped -eq "${#pids[@]}" ] && return 77
  return $rc
}
export -f shared_gpu
export BUILD PROCS MODULE LOGS STRATA_CONFIG=/dev/null/none LD_LIBRARY_PATH="$PWD/$BUILD/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
step shared-gpu 300 bash -c shared_gpu

step bench 300 "$BUILD/tests/gpu/test-nvlink" --nvlink-module="$MODULE" --bench

finish
