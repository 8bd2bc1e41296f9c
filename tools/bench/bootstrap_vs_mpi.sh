#!/usr/bin/env bash
# Compares strata's bootstrap allGather (64 B per rank) and rendezvous with Open MPI's
# MPI_Allgather and MPI_Init, on loopback TCP, for N ranks on this machine.
#
#   tools/bench/bootstrap_vs_mpi.sh [BUILD_DIR]        (default BUILD_DIR: build)
#
# Environment: NS (rank counts, default "2 8 32"), ITERS (timed iterations, default 1000),
# WARMUP (default 50), BENCH_TIMEOUT (seconds per run, default 300), RESULTS_DIR (keep the raw
# JSON lines and logs there; default: a temporary directory that is removed).
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

rows=()
for n in $ns; do
  sj="$work/strata-$n.json"
  mj="$work/mpi-$n.json"
  echo "# N=$n: strata-run -n $n strata-perf bootstrap ..." >&2
  timeout "$run_timeout" "$strata_run" -n "$n" "$strata_perf" bootstrap --ops allgather \
    -b "$bytes" -e "$bytes" -n "$iters" -w "$warmup" --json "$sj" >"$work/strata-$n.log" 2>&1
  src=$?
  if [[ $src -ne 0 ]]; then
    echo "# strata run at N=$n failed (exit $src); last lines of its output:" >&2
    tail -n 5 "$work/strata-$n.log" | sed 's/^/#   /' >&2
  fi
  echo "# N=$n: mpirun -np $n mpi_allgather $bytes $iters ..." >&2
  timeout "$run_timeout" mpirun --allow-run-as-root --oversubscribe -np "$n" \
    --mca pml ob1 --mca btl self,tcp --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo \
    "$work/mpi_allgather" "$bytes" "$iters" "$warmup" >"$mj" 2>"$work/mpi-$n.log"
  mrc=$?
  if [[ $mrc -ne 0 ]]; then
    echo "# MPI run at N=$n failed (exit $mrc); last lines of its output:" >&2
    tail -n 5 "$work/mpi-$n.log" | sed 's/^/#   /' >&2
  fi

  s_med=$(field "$sj" allgather median_us); s_p99=$(field "$sj" allgather p99_us)
  m_med=$(field "$mj" allgather median_us); m_p99=$(field "$mj" allgather p99_us)
  s_rdv=$(field "$sj" rendezvous median_us); s_rdvmax=$(field "$sj" rendezvous max_us)
  m_init=$(field "$mj" init median_us); m_initmax=$(field "$mj" init max_us)
  rows+=("$n|${s_med:-failed}|${s_p99:-failed}|${m_med:-failed}|${m_p99:-failed}|${s_rdv:-failed}|${s_rdvmax:-failed}|${m_init:-failed}|${m_initmax:-failed}")
done

echo
echo "# allGather of $bytes B per rank, $iters iterations after $warmup warm-up, loopback TCP"
echo "# strata: bootstrap backend from the config (tcp unless set); MPI: Open MPI, pml ob1, btl self,tcp"
echo "# per-iteration time = max over ranks; ratio = MPI median / strata median (> 1: strata faster)"
echo "# rendezvous = Bootstrap::create on each rank, MPI_Init on each rank: median / max over ranks, ms"
printf "%5s %12s %12s %12s %12s %7s %20s %20s\n" "N" "strata_med" "strata_p99" "mpi_med" \
  "mpi_p99" "ratio" "strata_create(ms)" "MPI_Init(ms)"
printf "%5s %12s %12s %12s %12s %7s %20s %20s\n" "" "(us)" "(us)" "(us)" "(us)" "" "med / max" \
  "med / max"
for row in "${rows[@]}"; do
  IFS='|' read -r n s_med s_p99 m_med m_p99 s_rdv s_rdvmax m_init m_initmax <<<"$row"
  awk -v n="$n" -v sm="$s_med" -v sp="$s_p99" -v mm="$m_med" -v mp="$m_p99" \
    -v sr="$s_rdv" -v srx="$s_rdvmax" -v mi="$m_init" -v mix="$m_initmax" '
    function num(x) { return x ~ /^[-0-9.eE+]+$/ }
    function us(x) { return num(x) ? sprintf("%.2f", x) : x }
    function ms(a, b) { return (num(a) && num(b)) ? sprintf("%.2f / %.2f", a / 1000, b / 1000) : "failed" }
    BEGIN {
      ratio = (num(sm) && num(mm) && sm > 0) ? sprintf("%.2f", mm / sm) : "-"
      printf "%5s %12s %12s %12s %12s %7s %20s %20s\n", n, us(sm), us(sp), us(mm), us(mp), ratio,
        ms(sr, srx), ms(mi, mix)
    }'
done
if [[ -n ${RESULTS_DIR:-} ]]; then
  echo "# raw JSON lines and logs: $work"
fi
exit 0
