#!/usr/bin/env bash
# cuda_vs_nccl.sh — strata's CUDA collectives against NCCL on one multi-GPU machine: time and
# bus bandwidth per size of nccl-tests' all_reduce_perf (NCCL) and of strata-perf allreduce
# --memory cuda (strata), one process per GPU for both, side by side with the ratio strata/NCCL.
#
# NOT YET RUN: written where the project's machines have no GPU (or one); nothing it prints has
# been seen on real multi-GPU hardware. Read the first results with that in mind.
#
#   tools/bench/cuda_vs_nccl.sh [--gpus N] [--build DIR] [--out DIR] [-b 8] [-e 8G] [-f 2]
#       [--op allreduce] [--inplace]
#
#   --gpus    ranks = GPUs to use, one per rank (default: every GPU nvidia-smi -L lists)
#   --build   strata's meson build directory with CUDA (default: build)
#   --out     where logs and raw outputs go (default: a new /tmp/strata-nccl.XXXXXX, kept and
#             printed at the end)
#   -b -e -f  the size sweep, nccl-tests' flags and defaults of its README (8 B to 8 GiB, x2)
#   --op      allreduce (default), allgather, reducescatter, broadcast, alltoall or sendrecv:
#             compared with all_reduce_perf, all_gather_perf, ... of the same sizes
#   --inplace compare the in-place columns (default: out-of-place)
#
# Environment: NCCL_TESTS (nccl-tests' directory, or its build/; default: the programs on PATH),
# NCCL_LAUNCHER (how to start NGPUS nccl-tests processes with -g 1 each; default "mpirun -np N"
# when mpirun is on PATH; nccl-tests must then be built with MPI=1; "threads": one process with
# -g N instead), REPEAT (rounds, default 3: each tool keeps its best time per size), ITERS and
# WARMUP (-n and -w of both tools, default 20 and 5), CHECK (-c of both, default 0: checking
# 8 GiB rows takes long, and strata-perf then holds 2 host copies per rank), GRAPH (-G of both:
# CUDA graph launches, default 0), BENCH_TIMEOUT (seconds per run, default 1800).
#
# The machine (nvidia-smi -L, the GPUs, nvidia-smi topo -m, CPU, versions) is printed above the
# table. Runs one at a time, alternating the tools in each round. A benchmark, never a pass/fail
# test. strata's bootstrap stays on loopback (one machine); NCCL uses what it finds.
set -u

ngpus=
build_dir=build
out=
min=8
max=8G
factor=2
op=allreduce
inplace=0

usage() {
  sed -n '2,/^set -u/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
}
die() {
  echo "cuda_vs_nccl: $*" >&2
  exit 2
}
while (($# > 0)); do
  case $1 in
    --gpus) ngpus=$2; shift 2 ;;
    --build) build_dir=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -b) min=$2; shift 2 ;;
    -e) max=$2; shift 2 ;;
    -f) factor=$2; shift 2 ;;
    --op) op=$2; shift 2 ;;
    --inplace) inplace=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
case $op in
  allreduce) nccl_prog=all_reduce_perf ;;
  allgather) nccl_prog=all_gather_perf ;;
  reducescatter) nccl_prog=reduce_scatter_perf ;;
  broadcast) nccl_prog=broadcast_perf ;;
  alltoall) nccl_prog=alltoall_perf ;;
  sendrecv) nccl_prog=sendrecv_perf ;;
  *) die "--op takes allreduce, allgather, reducescatter, broadcast, alltoall or sendrecv, not '$op'" ;;
esac

repeat=${REPEAT:-3}
iters=${ITERS:-20}
warmup=${WARMUP:-5}
check=${CHECK:-0}
graph=${GRAPH:-0}
run_timeout=${BENCH_TIMEOUT:-1800}

# --- what is needed: GPUs, nccl-tests, strata built with CUDA ---------------------------------
command -v nvidia-smi >/dev/null || die "nvidia-smi not found: this script needs NVIDIA GPUs and their driver"
gpus_found=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
((gpus_found > 0)) || die "nvidia-smi lists no GPU"
[[ -z $ngpus ]] && ngpus=$gpus_found
if ! [[ $ngpus =~ ^[0-9]+$ ]] || ((ngpus < 1)); then die "--gpus takes a positive number, not '$ngpus'"; fi
((ngpus <= gpus_found)) || die "--gpus $ngpus, but nvidia-smi lists $gpus_found GPUs"

nccl_bin=
if [[ -n ${NCCL_TESTS:-} ]]; then
  for p in "$NCCL_TESTS/$nccl_prog" "$NCCL_TESTS/build/$nccl_prog"; do
    [[ -x $p ]] && nccl_bin=$p && break
  done
  [[ -n $nccl_bin ]] || die "no $nccl_prog in NCCL_TESTS=$NCCL_TESTS (nor in its build/)"
else
  nccl_bin=$(command -v "$nccl_prog") ||
    die "$nccl_prog not found: set NCCL_TESTS to nccl-tests' directory, or put its build/ on PATH (build it with: make MPI=1 MPI_HOME=... NCCL_HOME=..., from github.com/NVIDIA/nccl-tests)"
fi

launcher=${NCCL_LAUNCHER:-}
if [[ -z $launcher ]]; then
  if command -v mpirun >/dev/null; then launcher="mpirun -np $ngpus"; else launcher=threads; fi
fi

strata_run=$build_dir/tools/strata-run/strata-run
strata_perf=$build_dir/tools/strata-perf/strata-perf
[[ -x $strata_run && -x $strata_perf ]] ||
  die "no strata-run / strata-perf in $build_dir (build strata with CUDA first, or pass --build)"
"$strata_perf" "$op" --help 2>&1 | grep -q -- '--cudagraph' ||
  die "$strata_perf has no --memory cuda / -G (an older strata?)"

if [[ -z $out ]]; then
  out=$(mktemp -d "${TMPDIR:-/tmp}/strata-nccl.XXXXXX") || exit 1
else
  mkdir -p "$out" || exit 1
fi
out=$(cd "$out" && pwd)
rm -f "$out"/nccl.r*.txt "$out"/strata.r*.txt

export STRATA_BOOTSTRAP_TCP_INTERFACE=lo FI_TCP_IFACE=lo UCX_NET_DEVICES=lo
export STRATA_CONFIG=/dev/null/none
# The CUDA collectives module wherever the build tree's lookup does not list it (prepended).
build_abs=$(cd "$build_dir" && pwd)
export STRATA_MODULE_PATH="$build_abs/collectives/cuda${STRATA_MODULE_PATH:+:$STRATA_MODULE_PATH}"

flags=(-b "$min" -e "$max" -f "$factor" -n "$iters" -w "$warmup" -c "$check")
((graph > 0)) && flags+=(-G "$graph")

# --- the machine ------------------------------------------------------------------------------
{
  echo "# cuda_vs_nccl: $op, $ngpus GPUs, $(date -u '+%Y-%m-%d %H:%M UTC'), host $(hostname)"
  nvidia-smi -L | sed 's/^/#   /'
  nvidia-smi --query-gpu=index,name,driver_version,memory.total,clocks.max.sm,pci.bus_id \
    --format=csv | sed 's/^/#   /'
  echo "#   topology (nvidia-smi topo -m):"
  nvidia-smi topo -m 2>&1 | sed 's/^/#     /'
  echo "#   CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) CPUs"
  echo "#   nvcc: $(nvcc --version 2>/dev/null | tail -1)"
  echo "#   strata-perf: $("$strata_perf" --version 2>&1)"
  echo "#   nccl-tests: $nccl_bin (launcher: $launcher)"
} | tee "$out/machine.txt"

# --- the runs ---------------------------------------------------------------------------------
run_nccl() {  # run_nccl OUTFILE
  echo "# $launcher $nccl_prog ${flags[*]} ..." >&2
  if [[ $launcher == threads ]]; then
    NCCL_DEBUG=VERSION timeout "$run_timeout" "$nccl_bin" "${flags[@]}" -g "$ngpus" >"$1" 2>&1
  else
    # shellcheck disable=SC2086  # the launcher is a command line, split on purpose
    NCCL_DEBUG=VERSION timeout "$run_timeout" $launcher "$nccl_bin" "${flags[@]}" -g 1 >"$1" 2>&1
  fi || echo "# $nccl_prog failed (exit $?); see $1" >&2
  local devices
  devices=$(grep -c '^#  *Rank  *[0-9]* Group' "$1")
  if ((devices != ngpus)); then
    echo "# $nccl_prog listed $devices devices, not $ngpus: with mpirun, nccl-tests must be built" \
      "with MPI=1 (else each process is its own 1-GPU job); see $1" >&2
  fi
}
run_strata() {  # run_strata OUTFILE
  echo "# strata-run -n $ngpus strata-perf $op --memory cuda ${flags[*]} ..." >&2
  timeout "$run_timeout" "$strata_run" -n "$ngpus" "$strata_perf" "$op" --memory cuda "${flags[@]}" \
    >"$1" 2>&1 || echo "# strata-perf failed (exit $?); see $1" >&2
}
for rep in $(seq 1 "$repeat"); do
  if ((rep % 2)); then
    run_nccl "$out/nccl.r$rep.txt"
    run_strata "$out/strata.r$rep.txt"
  else
    run_strata "$out/strata.r$rep.txt"
    run_nccl "$out/nccl.r$rep.txt"
  fi
done
grep -h -m1 'NCCL version' "$out"/nccl.r*.txt 2>/dev/null | head -1 | sed 's/^[# ]*/# /'

# --- the table --------------------------------------------------------------------------------
# best FILES...: "size time busbw" per size, the best (smallest) time over the rounds; rows are
# nccl-tests' 13 columns (size count type redop root, then time algbw busbw #wrong twice).
tcol=6 bcol=8
((inplace)) && tcol=10 bcol=12
best() {
  cat "$@" 2>/dev/null | awk -v t=$tcol -v b=$bcol '
    $1 ~ /^[0-9]+$/ && NF >= 13 && $t ~ /^[0-9.]+$/ {
      if (!($1 in time) || $t + 0 < time[$1]) { time[$1] = $t + 0; bw[$1] = $b }
    }
    END { for (s in time) print s, time[s], bw[s] }' | sort -k1,1
}
# The algorithm strata's first round ran per size ("# algorithm: cuda/oneshot (grid 8 block 512)").
algorithms() {
  awk '/^# algorithm: / && !/^# algorithm: auto/ && !/forced with -a/ { sub(/^# algorithm: /, ""); a = $0 }
       $1 ~ /^[0-9]+$/ && NF >= 13 { gsub(/ /, "_", a); print $1, a }' "$1" 2>/dev/null | sort -k1,1 -u
}
best "$out"/nccl.r*.txt >"$out/nccl.best"
best "$out"/strata.r*.txt >"$out/strata.best"
algorithms "$out/strata.r1.txt" >"$out/strata.algorithms"

echo
echo "# $op on $ngpus GPUs, $( ((inplace)) && echo in-place || echo out-of-place ), best of $repeat" \
  "rounds; -n $iters -w $warmup -c $check$( ((graph > 0)) && echo " -G $graph" ); time in us," \
  "busbw in GB/s (nccl-tests' definition); ratio > 1: strata faster"
printf '# %12s %12s %10s %12s %10s %8s  %s\n' "size(B)" "nccl time" "nccl busbw" "strata time" \
  "strata bw" "ratio" "strata algorithm"
# join wants its inputs sorted as text; the table is sorted by size at the end.
join -a 1 -a 2 -e - -o 0,1.2,1.3,2.2,2.3 "$out/nccl.best" "$out/strata.best" |
  join -a 1 -e - -o 0,1.2,1.3,1.4,1.5,2.2 - "$out/strata.algorithms" | sort -n |
  awk '{
    ratio = ($3 != "-" && $5 != "-" && $3 + 0 > 0) ? sprintf("%.2f", $5 / $3) : "-"
    gsub(/_/, " ", $6)
    alg = $6; for (i = 7; i <= NF; ++i) alg = alg " " $i
    printf "  %12s %12s %10s %12s %10s %8s  %s\n", $1, $2, $3, $4, $5, ratio, alg
  }'
echo "# raw outputs and logs: $out"
