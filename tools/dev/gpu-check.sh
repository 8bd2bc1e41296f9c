#!/usr/bin/env bash
# gpu-check.sh — strata's GPU checks (the nvlink transport, the CUDA collectives) on a machine
# with an NVIDIA GPU.
#
# What it runs (in order, each step with its own time limit, no network access needed):
#   1. nvidia-smi -L and the driver/CUDA versions (what machine this is);
#   2. meson setup of a build directory (default build-gpu; -Dcuda=enabled, network-free:
#      --wrap-mode=nodownload) and ninja -k 0 of the nvlink module and the tests/gpu programs
#      (those of the CUDA collectives too, where the build has them) only (GPU_CHECK_FULL=1
#      builds everything and also runs the 'transport' suite);
#   3. meson test --suite gpu (test-nvlink-records, test-nvlink: in-process and cross-process
#      CUDA IPC import, writes of several sizes, updateAndSync ordering, PeerLost, stats; and
#      whatever else the build registers in suite gpu);
#   4. GPU_CHECK_PROCS (default 4) copies of test-nvlink at once, all on the same GPU, each
#      spawning its own importer process (several processes sharing one GPU);
#   5. test-nvlink --bench: write bandwidth (same process and cross-process via IPC) and the
#      cost of loadSignal and updateAndSync+flush (numbers only, never pass/fail);
#   6. the CUDA collectives (issue 13), each part SKIP with the reason where the build lacks it:
#      coll-build     ninja of collectives/cuda/strata-collectives-cuda.so (SKIP when the build
#                     has no such target: then 6b-6d are skipped too), tests/gpu/test-cuda-
#                     collectives where defined, strata-perf and strata-run;
#      coll-test      tests/gpu/test-cuda-collectives (all ranks as threads of one process on one
#                     GPU, N = 2, 4, 8, full correctness sweep, graph replay);
#      coll-pair      2 processes on this machine's GPUs (both on device 0 with one GPU):
#                     strata-run -n 2 strata-perf allreduce --memory cuda -b 8 -e 1M -f 4 -n 5
#                     -w 2 -c 1, and coll-graph the same with -G 4;
#      san-memcheck, san-racecheck, san-synccheck
#                     compute-sanitizer --tool <tool> test-cuda-collectives --short (SKIP without
#                     compute-sanitizer or the test);
#      cuda-baseline  tools/bench/cuda_baseline.cu built with nvcc: cudaMemcpy device-to-device
#                     bandwidth at 1/16/256 MiB and the mean of 1000 empty kernel launch+sync;
#      coll-numbers   strata-run -n 2 strata-perf allreduce --memory cuda -b 8 -e 256M -f 2 -n 20
#                     -w 5 (numbers to read against cuda-baseline; JSON in coll-numbers.json);
#   7. a summary, one line per step (a SKIP says why). Exit status 0 only when no step failed.
# The whole run fits GPU_CHECK_BUDGET seconds (default 520, about 9 minutes with the margins):
# a step gets at most what is left of it, and a step with less than 20 s left is skipped.
# GPU_CHECK_ONLY=nvlink runs steps 1-5 only, GPU_CHECK_ONLY=coll steps 1, 2 and 6 only.
# Usage: tools/dev/gpu-check.sh [build-dir]. Logs go to <build-dir>/gpu-check/, and also to
# $OUT/gpu-check/ when OUT is set. Takes a few minutes, most of it the build.
#
# tools/dev/gpu-check.sh --bundle DIR runs from a bundle that tools/dev/gpu-bundle.sh made on
# another machine (no build, no compiler, no -dev package needed: what the lent GPU machine
# allows), within GPU_CHECK_BUDGET (default 420 s there, so that a second run fits a 15-minute
# lease), in this order:
#   preflight     (15 s) strata-info --check (the topology, NICs, FI_HMEM, and the nvlink
#                 module's CUDA lines: compute mode, peer access, GPUDirect RDMA, multicast),
#                 driver and GPU (nvidia-smi), compute mode, MPS, compute-sanitizer,
#                 peer access between the visible GPUs (cuda_baseline --preflight); without a GPU
#                 the script stops here with exit 77 and the reason;
#   coll-test     the in-process correctness sweep (every rank a thread, one GPU), short timeout;
#   nvlink        test-nvlink-records and test-nvlink (CUDA IPC in and across processes);
#   coll-pair     2 processes on the machine's GPUs through strata-run: with one GPU under MPS
#                 (started here when nvidia-cuda-mps-control exists, stopped at the end), else
#                 SKIP ("time-sliced": two processes on one GPU without MPS give no numbers, and
#                 the module refuses that layout);
#   san-memcheck  compute-sanitizer memcheck of the sweep at 2 ranks only;
#   cuda-baseline cudaMemcpy device to device and an empty launch (cuda_baseline);
#   nccl-shim     strata-perf --api nccl --memory cuda at 1 rank through the bundle's
#                 libstrata-nccl (the NCCL API on device memory), when the bundle has it;
#   torch-nccl    PyTorch's backend="nccl" at world size 1 with libstrata-nccl preloaded
#                 (SKIP without a python3 whose torch has CUDA);
#   coll-numbers  allReduce at a few sizes (JSON), under MPS as coll-pair.
# Exit status: 0 when no step failed, 77 when there is no GPU (preflight), 1 otherwise.

set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
BUNDLE=
if [ "${1:-}" = --bundle ]; then
  BUNDLE=${2:?usage: gpu-check.sh --bundle DIR}
  [ -d "$BUNDLE/bin" ] && [ -d "$BUNDLE/lib" ] || {
    echo "gpu-check: $BUNDLE is not a bundle of tools/dev/gpu-bundle.sh (no bin/ or lib/)" >&2
    exit 1
  }
  BUNDLE=$(cd "$BUNDLE" && pwd)
fi
BUILD=${1:-build-gpu}
[ -n "$BUNDLE" ] && BUILD=$BUNDLE
PROCS=${GPU_CHECK_PROCS:-4}
FULL=${GPU_CHECK_FULL:-0}
ONLY=${GPU_CHECK_ONLY:-}
BUDGET=${GPU_CHECK_BUDGET:-520}
[ -n "$BUNDLE" ] && BUDGET=${GPU_CHECK_BUDGET:-420}
DEADLINE=$((SECONDS + BUDGET))
LOGS=$BUILD/gpu-check
mkdir -p "$LOGS"
export PATH=/usr/local/cuda/bin:$PATH
declare -a SUMMARY=()
FAILED=0

skip() {  # skip NAME REASON: records a step that is not run, and why
  echo "=== $1: SKIP ($2)"
  echo "SKIP: $2" >"$LOGS/$1.log"
  SUMMARY+=("$(printf '%-14s %-26s %4ds  %s' "$1" SKIP 0 "$2")")
}

step() {  # step NAME LIMIT_SECONDS COMMAND...: runs it, logs it, records PASS/FAIL/SKIP
  local name=$1 limit=$2
  shift 2
  local left=$((DEADLINE - SECONDS))
  if [ $left -lt 20 ]; then
    skip "$name" "no time left of GPU_CHECK_BUDGET=${BUDGET}s"
    return
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  local start=$SECONDS rc
  echo "=== $name"
  timeout --kill-after=10 "$limit" "$@" >"$LOGS/$name.log" 2>&1
  rc=$?
  tail -n 25 "$LOGS/$name.log"
  local verdict=PASS
  if [ $rc -eq 77 ]; then verdict=SKIP; elif [ $rc -ne 0 ]; then verdict="FAIL (exit $rc)"; FAILED=1; fi
  [ $rc -eq 124 ] && verdict="FAIL (timeout after ${limit}s)"
  local why=
  [ $rc -eq 77 ] && why=$(grep -m1 -i 'skip' "$LOGS/$name.log" | cut -c1-100)
  SUMMARY+=("$(printf '%-14s %-26s %4ds  %s' "$name" "$verdict" $((SECONDS - start)) "$why")")
}

# The targets of this build (ninja's names), to build and run only what exists.
build_targets() { ninja -C "$BUILD" -t targets all 2>/dev/null | sed 's/: .*//'; }
has_target() { grep -qxF "$1" <<<"$ALL_TARGETS"; }

finish() {
  [ -n "${MPS_STARTED:-}" ] && stop_mps
  echo
  echo "=== summary (logs in $LOGS)"
  printf '%s\n' "${SUMMARY[@]}"
  if [ -n "${OUT:-}" ] && [ -d "${OUT:-}" ]; then
    mkdir -p "$OUT/gpu-check" && cp "$LOGS"/*.log "$OUT/gpu-check/" 2>/dev/null
    cp "$LOGS"/*.json "$OUT/gpu-check/" 2>/dev/null
  fi
  exit "${1:-$FAILED}"
}

# MPS for processes that share a GPU (coll-pair, coll-numbers): started in a private pipe folder
# when the daemon exists and none runs, stopped by finish().
MPS_STARTED=
start_mps() {
  if [ -S "${CUDA_MPS_PIPE_DIRECTORY:-/tmp/nvidia-mps}/control" ] || [ -p "${CUDA_MPS_PIPE_DIRECTORY:-/tmp/nvidia-mps}/control" ]; then
    return 0  # one runs already
  fi
  command -v nvidia-cuda-mps-control >/dev/null || return 1
  export CUDA_MPS_PIPE_DIRECTORY=$LOGS/mps-pipe CUDA_MPS_LOG_DIRECTORY=$LOGS/mps-log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  nvidia-cuda-mps-control -d || return 1
  MPS_STARTED=1
  sleep 1
}
stop_mps() {
  echo quit | nvidia-cuda-mps-control >/dev/null 2>&1
  MPS_STARTED=
}

if [ -n "$BUNDLE" ]; then
  # --- From a bundle: nothing is built; the bundle's libraries come first, its modules are
  # where its libstrata looks (lib/strata).
  export LD_LIBRARY_PATH="$BUNDLE/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export STRATA_CONFIG=/dev/null/none STRATA_BOOTSTRAP_TCP_INTERFACE=lo FI_TCP_IFACE=lo \
    UCX_NET_DEVICES=lo CUDA_MODULE_LOADING=LAZY
  B=$BUNDLE/bin
  echo "bundle: $(sed -n 2,3p "$BUNDLE/MANIFEST" 2>/dev/null | tr '\n' ' ')"
  # shellcheck disable=SC2317  # run through bash -c below
  preflight() {
    # strata's own pre-flight first (it needs no GPU: informational, never fails the step).
    echo "strata-info --check:"
    "$B/strata-info" --check || echo "strata-info --check exited $?"
    if ! command -v nvidia-smi >/dev/null; then
      echo "SKIP: no NVIDIA GPU here (no nvidia-smi on PATH)"
      return 77
    fi
    if ! nvidia-smi -L; then
      echo "SKIP: no NVIDIA GPU here (nvidia-smi -L failed)"
      return 77
    fi
    nvidia-smi --query-gpu=name,driver_version,pci.bus_id,memory.total,compute_mode --format=csv
    echo "MPS control: $(command -v nvidia-cuda-mps-control || echo absent)"
    echo "compute-sanitizer: $(command -v compute-sanitizer || echo absent)"
    "$B/cuda_baseline" --preflight
    local rc=$?
    [ $rc -eq 77 ] && echo "SKIP: no usable CUDA device (cuda_baseline --preflight)"
    return $rc
  }
  export -f preflight
  export B
  step preflight 15 bash -c preflight
  if grep -q '^SKIP:' "$LOGS/preflight.log"; then
    echo "gpu-check: $(grep -m1 '^SKIP:' "$LOGS/preflight.log" | cut -c7-)"
    finish 77
  fi
  step coll-test 120 "$B/test-cuda-collectives" --timeout=110
  export NVLINK_MODULE=$BUNDLE/lib/strata/strata-transport-nvlink.so
  step nvlink 90 bash -c '"$B/test-nvlink-records" && "$B/test-nvlink" --nvlink-module="$NVLINK_MODULE"'
  MPS_OK=0
  GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
  if [ "${GPUS:-0}" -ge 2 ] || start_mps; then MPS_OK=1; fi
  PAIR=(-b 8 -e 1M -f 4 -n 5 -w 2 -c 1)
  if [ $MPS_OK = 1 ]; then
    step coll-pair 60 "$B/strata-run" -n 2 --tag-output --timeout 55 "$B/strata-perf" allreduce \
      --memory cuda "${PAIR[@]}" --json "$LOGS/coll-pair.json"
  else
    skip coll-pair "time-sliced: 2 processes on one GPU and no MPS daemon (nvidia-cuda-mps-control)"
  fi
  if command -v compute-sanitizer >/dev/null; then
    step san-memcheck 75 compute-sanitizer --tool memcheck --error-exitcode 1 \
      "$B/test-cuda-collectives" --short --ranks=2 --timeout=65
  else
    skip san-memcheck "no compute-sanitizer on PATH"
  fi
  step cuda-baseline 40 "$B/cuda_baseline"
  # The NCCL API (libstrata-nccl) on device memory at one rank, then PyTorch's own NCCL backend
  # with it preloaded (world size 1), when the bundle has it (docs/nccl-api.md).
  NCCL_SHIM=$(ls "$BUNDLE"/lib/libstrata-nccl.so.* 2>/dev/null | head -1)
  if [ -n "$NCCL_SHIM" ]; then
    step nccl-shim 40 "$B/strata-run" -n 1 --timeout 35 "$B/strata-perf" allreduce --memory cuda \
      --api nccl --nccl-lib "$NCCL_SHIM" -b 8 -e 1M -f 8 -n 5 -w 2 -c 1
    export NCCL_SHIM
    # shellcheck disable=SC2317  # run through bash -c below
    torch_nccl() {
      python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null ||
        { echo "SKIP: no python3 with a CUDA torch"; return 77; }
      LD_PRELOAD=$NCCL_SHIM python3 - <<'PY'
import torch, torch.distributed as dist
dist.init_process_group("nccl", init_method="tcp://127.0.0.1:29533", rank=0, world_size=1)
t = torch.arange(4, dtype=torch.float32, device="cuda")
dist.all_reduce(t)
torch.cuda.synchronize()
assert t.tolist() == [0.0, 1.0, 2.0, 3.0], t
print("torch", torch.__version__, "backend nccl over", torch.cuda.nccl.version(), "all_reduce ok")
dist.destroy_process_group()
PY
    }
    export -f torch_nccl
    step torch-nccl 60 bash -c torch_nccl
  else
    skip nccl-shim "the bundle has no libstrata-nccl (built without -Dnccl_api)"
  fi
  if [ $MPS_OK = 1 ]; then
    step coll-numbers 60 "$B/strata-run" -n 2 --tag-output --timeout 55 "$B/strata-perf" \
      allreduce --memory cuda -b 8 -e 64M -f 8 -n 20 -w 5 -c 1 --json "$LOGS/coll-numbers.json"
  else
    skip coll-numbers "time-sliced: 2 processes on one GPU and no MPS daemon"
  fi
  finish
fi

step machine 60 bash -c 'nvidia-smi -L && nvidia-smi --query-gpu=name,driver_version,pci.bus_id,memory.total --format=csv && nvcc --version | tail -2 && (nvidia-smi topo -m || true)'

if [ -f "$BUILD/build.ninja" ]; then
  step configure 180 meson setup --reconfigure "$BUILD" -Dcuda=enabled -Dtests=enabled --wrap-mode=nodownload
else
  step configure 180 meson setup "$BUILD" -Dcuda=enabled -Dtests=enabled --wrap-mode=nodownload
fi
[ -f "$BUILD/build.ninja" ] || finish

COLL_MODULE=collectives/cuda/strata-collectives-cuda.so
COLL_TEST=tests/gpu/test-cuda-collectives
ALL_TARGETS=$(build_targets)
TARGETS=(backends/transport/nvlink/strata-transport-nvlink.so tests/gpu/test-nvlink tests/gpu/test-nvlink-records)
# Whatever suite gpu runs must be built here (meson test --no-rebuild below): the nvcc check's
# object and the CUDA collectives' test and module where the build defines them. -k 0: a target
# that fails to build does not stop the others (coll-build reports the collectives' own).
for t in tests/gpu/channel_nvcc_check.o "$COLL_MODULE" "$COLL_TEST"; do
  has_target "$t" && TARGETS+=("$t")
done
if [ "$FULL" = 1 ]; then
  step build 600 ninja -C "$BUILD" -k 0
else
  step build 300 ninja -C "$BUILD" -k 0 "${TARGETS[@]}"
fi
if [ ! -x "$BUILD/tests/gpu/test-nvlink" ]; then
  echo "tests/gpu was not built (is it included from tests/meson.build?)"
  FAILED=1
  finish
fi

if [ "$ONLY" != coll ]; then
# test-cuda-collectives (suite gpu-collectives) runs in its own step below.
step suite-gpu 300 meson test -C "$BUILD" --no-rebuild --suite gpu --no-suite gpu-collectives --print-errorlogs
if [ "$FULL" = 1 ]; then
  step suite-transport 300 meson test -C "$BUILD" --no-rebuild --suite transport --print-errorlogs
fi
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
    if [ "$r" -eq 77 ]; then
      skipped=$((skipped + 1))
    elif [ "$r" -ne 0 ]; then
      tail -n 20 "$LOGS/shared-gpu-$((i + 1)).log"
      rc=1
    fi
  done
  [ "$rc" -eq 0 ] && [ "$skipped" -eq "${#pids[@]}" ] && return 77
  return "$rc"
}
export -f shared_gpu
export BUILD PROCS MODULE LOGS STRATA_CONFIG=/dev/null/none LD_LIBRARY_PATH="$PWD/$BUILD/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if [ "$ONLY" != coll ]; then
  step shared-gpu 300 bash -c shared_gpu
  step bench 300 "$BUILD/tests/gpu/test-nvlink" --nvlink-module="$MODULE" --bench
fi
[ "$ONLY" = nvlink ] && finish

# --- 6. The CUDA collectives. Multi-process runs: strata-run on loopback, one GPU per local
# rank (localRank % devices: with one GPU every rank shares device 0).
export STRATA_BOOTSTRAP_TCP_INTERFACE=lo FI_TCP_IFACE=lo UCX_NET_DEVICES=lo
# The module wherever the build tree's own lookup does not list it yet (prepended: the build
# tree's other modules are still found).
export STRATA_MODULE_PATH="$PWD/$BUILD/collectives/cuda${STRATA_MODULE_PATH:+:$STRATA_MODULE_PATH}"
RUN=$BUILD/tools/strata-run/strata-run
PERF=$BUILD/tools/strata-perf/strata-perf
COLL=0
if has_target "$COLL_MODULE"; then
  COLL_TARGETS=("$COLL_MODULE" tools/strata-perf/strata-perf tools/strata-run/strata-run)
  has_target "$COLL_TEST" && COLL_TARGETS+=("$COLL_TEST")
  step coll-build 240 ninja -C "$BUILD" -k 0 "${COLL_TARGETS[@]}"
  [ -f "$BUILD/$COLL_MODULE" ] && [ -x "$PERF" ] && [ -x "$RUN" ] && COLL=1
else
  skip coll-build "no target $COLL_MODULE in $BUILD (no collectives/cuda in this tree, or no CUDA)"
fi

NO_COLL="the CUDA collectives module was not built (see coll-build)"
if [ $COLL = 1 ] && [ -x "$BUILD/$COLL_TEST" ]; then
  step coll-test 150 "$BUILD/$COLL_TEST" --timeout=140
else
  skip coll-test "no $COLL_TEST in $BUILD"
fi

PAIR=(-b 8 -e 1M -f 4 -n 5 -w 2 -c 1)
if [ $COLL = 1 ]; then
  step coll-pair 90 "$RUN" -n 2 --tag-output --timeout 80 "$PERF" allreduce --memory cuda "${PAIR[@]}" \
    --json "$LOGS/coll-pair.json"
  step coll-graph 90 "$RUN" -n 2 --tag-output --timeout 80 "$PERF" allreduce --memory cuda "${PAIR[@]}" -G 4 \
    --json "$LOGS/coll-graph.json"
else
  skip coll-pair "$NO_COLL"
  skip coll-graph "$NO_COLL"
fi

# compute-sanitizer on a short run of the in-process test: errors fail the step (exit 1).
for tool in memcheck racecheck synccheck; do
  if ! command -v compute-sanitizer >/dev/null; then
    skip "san-$tool" "no compute-sanitizer on PATH (/usr/local/cuda/bin)"
  elif [ $COLL = 0 ] || [ ! -x "$BUILD/$COLL_TEST" ]; then
    skip "san-$tool" "no $COLL_TEST in $BUILD"
  else
    step "san-$tool" 75 compute-sanitizer --tool "$tool" --error-exitcode 1 "$BUILD/$COLL_TEST" --short --ranks=2 --timeout=65
  fi
done

# What the GPU does without strata (needs only nvcc), then strata's numbers to read against it.
# shellcheck disable=SC2317  # run through bash -c below
cuda_baseline() {
  nvcc -O2 -std=c++17 -arch=native -o "$BUILD/cuda_baseline" tools/bench/cuda_baseline.cu &&
    "$BUILD/cuda_baseline"
}
export -f cuda_baseline
step cuda-baseline 120 bash -c cuda_baseline
if [ $COLL = 1 ]; then
  step coll-numbers 180 "$RUN" -n 2 --tag-output --timeout 170 "$PERF" allreduce --memory cuda \
    -b 8 -e 256M -f 2 -n 20 -w 5 -c 1 --json "$LOGS/coll-numbers.json"
else
  skip coll-numbers "$NO_COLL"
fi

finish
