#!/usr/bin/env bash
# Compares strata's bootstrap allGather (64 B per rank) and rendezvous with Open MPI's
# MPI_Allgather and MPI_Init, on loopback TCP, for N ranks on this machine.
#
#   tools/bench/bootstrap_vs_mpi.sh [BUILD_DIR]        (default BUILD_DIR: build)
#
# Environment: BACKENDS (strata bootstrap backends, default "tcp ucx pmix"; a backend whose
# module is missing shows as failed), NS (rank counts, default "2 8 32"), ITERS (timed iterations, default 1000),
# WARMUP (default 50), BENCH_TIMEOUT (seconds per run, default 300), RESULTS_DIR (keep the raw
# JSON lines and logs there; default: a temporary directory that is removed), REPEAT (rounds of
# all runs, default 1: the allGather table shows the last round, the rendezvous table every
# round).
#
# The rendezvous at scale (docs/benchmarks.md, "Rendezvous at scale"):
#   NS="64 128 256" BACKENDS=tcp ITERS=20 WARMUP=2 REPEAT=3 tools/bench/bootstrap_vs_mpi.sh build
#
# A benchmark, never a pass/fail test: a run that fails or times out shows as "failed" and the
# script goes on. Both sides measure the same way: per-iteration time is the max over ranks,
# then median and p99 over iterations. Everything stays on loopback (interface lo).
set -u

build_dir=${1:-build}
ns=${NS:-"2 8 32"}
iters=${ITERS:-1000}
warmup=${WARMUP:-50}
run_timeout=${BENCH_TIMEOUT:-300}
repeat=${REPEAT:-1}
[[ $repeat =~ ^[1-9][0-9]*$ ]] || { echo "bootstrap_vs_mpi: REPEAT must be a positive number" >&2; exit 1; }
bytes=64

here=$(cd "$(dirname "$0")" && pwd)
strata_run="$build_dir/tools/strata-run/strata-run"
strata_perf="$build_dir/tools/strata-perf/strata-perf"
for exe in "$strata_run" "$strata_perf"; do
  if [[ ! -x $exe ]]; then
    echo "bootstrap_vs_mpi: $exe not found; build first (ninja -C $build_dir) or pass the build directory" >&2
    exit 1
  fi
done
for tool in mpicc mpirun; do
  if ! command -v "$tool" >/dev/null; then
    echo "bootstrap_vs_mpi: $tool not found; install Open MPI (apt-get install libopenmpi-dev openmpi-bin)" >&2
    exit 1
  fi
done

if [[ -n ${RESULTS_DIR:-} ]]; then
  work=$RESULTS_DIR
  mkdir -p "$work" || exit 1
else
  work=$(mktemp -d "${TMPDIR:-/tmp}/strata-bench.XXXXXX") || exit 1
  trap 'rm -rf "$work"' EXIT
fi

# Loopback only, for both stacks and for anything they spawn.
export OMPI_MCA_btl_tcp_if_include=lo
export OMPI_MCA_oob_tcp_if_include=lo
export STRATA_BOOTSTRAP_TCP_INTERFACE=lo

if ! mpicc -O2 -o "$work/mpi_allgather" "$here/mpi_allgather.c"; then
  echo "bootstrap_vs_mpi: mpicc failed to build mpi_allgather.c" >&2
  exit 1
fi

# field FILE OP KEY: the numeric value of KEY in the JSON line whose op is OP.
field() {
  grep -h "\"op\":\"$2\"" "$1" 2>/dev/null | head -n 1 |
    sed -n "s/.*\"$3\":\([-0-9.eE+]*\).*/\1/p"
}

# run_strata BACKEND N JSON LOG: strata-perf under the launcher that backend needs.
run_strata() {
  local backend=$1 n=$2 json=$3 log=$4
  local perf=("$strata_perf" bootstrap --ops allgather -b "$bytes" -e "$bytes" -n "$iters" -w "$warmup"
    --json "$json")
  if [[ $backend == pmix ]]; then
    # Open MPI's mpirun serves PMIx; the module finds the server through PMIX_* variables.
    timeout "$run_timeout" mpirun --allow-run-as-root --oversubscribe -np "$n" \
      --mca oob_tcp_if_include lo -x STRATA_BOOTSTRAP_BACKEND=pmix -x STRATA_MODULE_PATH \
      -x STRATA_BOOTSTRAP_TCP_INTERFACE "${perf[@]}" >"$log" 2>&1
  else
    STRATA_BOOTSTRAP_BACKEND=$backend timeout "$run_timeout" "$strata_run" -n "$n" "${perf[@]}" \
      >"$log" 2>&1
  fi
}

module_dirs=$(find "$build_dir/backends" -name 'strata-bootstrap-*.so' -printf '%h\n' 2>/dev/null |
  sort -u | paste -sd:)
export STRATA_MODULE_PATH=${STRATA_MODULE_PATH:-$module_dirs}
export UCX_NET_DEVICES=${UCX_NET_DEVICES:-lo} UCX_TLS=${UCX_TLS:-tcp,self}
backends=${BACKENDS:-"tcp ucx pmix"}

now() { date +%s.%N; }
elapsed() { awk -v s="$1" -v e="$(now)" 'BEGIN { printf "%.2f", e - s }'; }

# Per (backend, N, round): init median and max over ranks (us), the launch's wall time (s).
declare -A med p99 create cmax wall
for ((k = 1; k <= repeat; k++)); do
  for n in $ns; do
    for b in $backends; do
      sj="$work/$b-$n.r$k.json"
      echo "# round $k, N=$n: $b: strata-perf bootstrap ..." >&2
      t0=$(now)
      if ! run_strata "$b" "$n" "$sj" "$work/$b-$n.r$k.log"; then
        echo "# $b at N=$n failed; last lines of its output:" >&2
        tail -n 5 "$work/$b-$n.r$k.log" | sed 's/^/#   /' >&2
      fi
      wall[$b,$n,$k]=$(elapsed "$t0")
      med[$b,$n]=$(field "$sj" allgather median_us)
      p99[$b,$n]=$(field "$sj" allgather p99_us)
      create[$b,$n,$k]=$(field "$sj" rendezvous median_us)
      cmax[$b,$n,$k]=$(field "$sj" rendezvous max_us)
    done
    mj="$work/mpi-$n.r$k.json"
    echo "# round $k, N=$n: mpirun -np $n mpi_allgather $bytes $iters ..." >&2
    t0=$(now)
    if ! timeout "$run_timeout" mpirun --allow-run-as-root --oversubscribe -np "$n" \
      --mca pml ob1 --mca btl self,tcp --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo \
      "$work/mpi_allgather" "$bytes" "$iters" "$warmup" >"$mj" 2>"$work/mpi-$n.r$k.log"; then
      echo "# MPI run at N=$n failed; last lines of its output:" >&2
      tail -n 5 "$work/mpi-$n.r$k.log" | sed 's/^/#   /' >&2
    fi
    wall[mpi,$n,$k]=$(elapsed "$t0")
    med[mpi,$n]=$(field "$mj" allgather median_us)
    p99[mpi,$n]=$(field "$mj" allgather p99_us)
    create[mpi,$n,$k]=$(field "$mj" init median_us)
    cmax[mpi,$n,$k]=$(field "$mj" init max_us)
  done
done

echo
echo "# allGather of $bytes B per rank: median (p99) in us over $iters iterations after $warmup warm-up;"
echo "# per-iteration time = max over ranks. tcp and ucx run under strata-run, pmix under Open MPI's"
echo "# mpirun (its PMIx server); MPI = Open MPI MPI_Allgather, pml ob1, btl self,tcp on lo."
echo "# ratio = MPI median / backend median (> 1: strata faster). init = Bootstrap::create / MPI_Init"
echo "# median over ranks, ms."

read -r -a cols <<<"$backends"
printf "%4s" "N"
for b in "${cols[@]}" mpi; do printf " %20s" "$b"; done
for b in "${cols[@]}"; do printf " %8s" "r_$b"; done
for b in "${cols[@]}" mpi; do printf " %9s" "init_$b"; done
echo
for n in $ns; do
  printf "%4s" "$n"
  for b in "${cols[@]}" mpi; do
    awk -v m="${med[$b,$n]}" -v p="${p99[$b,$n]}" 'BEGIN {
      if (m ~ /^[-0-9.eE+]+$/) printf " %20s", sprintf("%.2f (%.1f)", m, p); else printf " %20s", "failed" }'
  done
  for b in "${cols[@]}"; do
    awk -v s="${med[$b,$n]}" -v m="${med[mpi,$n]}" 'BEGIN {
      if (s ~ /^[-0-9.eE+]+$/ && m ~ /^[-0-9.eE+]+$/ && s > 0) printf " %8.2f", m / s; else printf " %8s", "-" }'
  done
  for b in "${cols[@]}" mpi; do
    awk -v c="${create[$b,$n,$repeat]}" 'BEGIN {
      if (c ~ /^[-0-9.eE+]+$/) printf " %9.2f", c / 1000; else printf " %9s", "-" }'
  done
  echo
done

echo
echo "# Rendezvous: Bootstrap::create (strata) and MPI_Init (Open MPI), ms, median and max over"
echo "# ranks, per round; ratio = MPI / strata (> 1: strata faster); wall = the launcher's whole"
echo "# run in s (process start, rendezvous, $iters allGathers, exit)."
printf "%4s %5s" "N" "round"
for b in "${cols[@]}" mpi; do printf " %9s %9s %7s" "${b}_med" "${b}_max" "wall_$b"; done
for b in "${cols[@]}"; do printf " %7s %7s" "rmed_$b" "rmax_$b"; done
echo
for n in $ns; do
  for ((k = 1; k <= repeat; k++)); do
    printf "%4s %5s" "$n" "$k"
    for b in "${cols[@]}" mpi; do
      awk -v c="${create[$b,$n,$k]}" -v x="${cmax[$b,$n,$k]}" -v w="${wall[$b,$n,$k]}" 'BEGIN {
        num = "^[-0-9.eE+]+$"
        if (c ~ num) printf " %9.1f", c / 1000; else printf " %9s", "-"
        if (x ~ num) printf " %9.1f", x / 1000; else printf " %9s", "-"
        printf " %7s", w }'
    done
    for b in "${cols[@]}"; do
      awk -v s="${create[$b,$n,$k]}" -v m="${create[mpi,$n,$k]}" -v sx="${cmax[$b,$n,$k]}" \
        -v mx="${cmax[mpi,$n,$k]}" 'BEGIN {
        num = "^[-0-9.eE+]+$"
        if (s ~ num && m ~ num && s > 0) printf " %7.2f", m / s; else printf " %7s", "-"
        if (sx ~ num && mx ~ num && sx > 0) printf " %7.2f", mx / sx; else printf " %7s", "-" }'
    done
    echo
  done
done
if [[ -n ${RESULTS_DIR:-} ]]; then
  echo "# raw JSON lines and logs: $work"
fi
exit 0
