#!/usr/bin/env bash
# Compares strata-perf p2p bandwidth with what the same machine does without strata:
#   (1) transport shm   vs single-thread memcpy (tools/bench/memcpy_bw.c), hot and cold buffers;
#   (2) transport fabric vs a direct libfabric fi_write loop (tools/bench/fi_write_bw.c) with the
#       same provider, and ucx_perftest ucp_put_bw over UCX tcp when ucx_perftest is installed.
#
#   tools/bench/p2p_vs_peers.sh [BUILD_DIR]        (default BUILD_DIR: build)
#
# Environment: MIN (default 64K), MAX (64M), FACTOR (2), PROVIDER (fabric provider, default
# "tcp;ofi_rxm"), ITERS (messages per size for every tool; default: strata-perf's, 1000 and
# 1000 * 64 KiB / size above 64 KiB, at least 20), WINDOW (strata-perf --window, default 0),
# REPEAT (default 3: every strata and reference run is repeated, interleaved, and the best
# bandwidth per size is kept, because other load on the machine makes single runs noisy),
# UCX (0 skips ucx_perftest), BENCH_TIMEOUT (seconds per run, default 300), RESULTS_DIR (keep the
# raw outputs there; default: a temporary directory that is removed), VOLUME (e.g. 1G: every
# tool runs once per size with max(20, VOLUME / size) messages, so that each row moves the same
# amount of data; the default iteration counts move only 64 MiB per row above 64 KiB, a few
# milliseconds of transfer, which scheduling noise on a small machine swings by +-30 %),
# STAT (best, the default, or median: how the REPEAT runs of a size are combined).
#
# A benchmark, never a pass/fail test: a run that fails shows as "-" and the script goes on.
# Everything stays on loopback: FI_TCP_IFACE=lo, UCX_NET_DEVICES=lo, strata's bootstrap on lo,
# ucx_perftest's client connects to 127.0.0.1. GB = 1e9 B.
set -u

build_dir=${1:-build}
min=${MIN:-64K}
max=${MAX:-64M}
factor=${FACTOR:-2}
provider=${PROVIDER:-"tcp;ofi_rxm"}
iters=${ITERS:-}
window=${WINDOW:-0}
run_timeout=${BENCH_TIMEOUT:-300}
repeat=${REPEAT:-3}
volume=${VOLUME:-}
stat=${STAT:-best}
if [[ $stat != best && $stat != median ]]; then
  echo "p2p_vs_peers: STAT must be best or median, not '$stat'" >&2
  exit 2
fi

here=$(cd "$(dirname "$0")" && pwd)
strata_run="$build_dir/tools/strata-run/strata-run"
strata_perf="$build_dir/tools/strata-perf/strata-perf"
for exe in "$strata_run" "$strata_perf"; do
  if [[ ! -x $exe ]]; then
    echo "p2p_vs_peers: $exe not found; build first (ninja -C $build_dir) or pass the build directory" >&2
    exit 1
  fi
done
cc=${CC:-cc}

if [[ -n ${RESULTS_DIR:-} ]]; then
  work=$RESULTS_DIR
  mkdir -p "$work" || exit 1
else
  work=$(mktemp -d "${TMPDIR:-/tmp}/strata-p2p.XXXXXX") || exit 1
  trap 'rm -rf "$work"' EXIT
fi

export FI_TCP_IFACE=lo
export STRATA_BOOTSTRAP_TCP_INTERFACE=lo
export UCX_NET_DEVICES=lo
fabric_dir=$(find "$build_dir/backends" -name 'strata-transport-fabric.so' -printf '%h\n' 2>/dev/null | head -n 1)
export STRATA_MODULE_PATH=${STRATA_MODULE_PATH:-$fabric_dir}

if ! "$cc" -O2 -o "$work/memcpy_bw" "$here/memcpy_bw.c"; then
  echo "p2p_vs_peers: $cc failed to build memcpy_bw.c" >&2
  exit 1
fi
fi_libs=$(pkg-config --libs libfabric 2>/dev/null || echo -lfabric)
fi_cflags=$(pkg-config --cflags libfabric 2>/dev/null)
# shellcheck disable=SC2086  # word splitting of the pkg-config flags is intended
if ! "$cc" -O2 $fi_cflags -o "$work/fi_write_bw" "$here/fi_write_bw.c" $fi_libs; then
  echo "p2p_vs_peers: $cc failed to build fi_write_bw.c (libfabric-dev installed?)" >&2
fi

# to_bytes 64K -> 65536 (K, M, G suffixes as the tools take them).
to_bytes() {
  local v=${1%[kKmMgG]} m=1
  case $1 in
    *[kK]) m=1024 ;;
    *[mM]) m=$((1024 * 1024)) ;;
    *[gG]) m=$((1024 * 1024 * 1024)) ;;
  esac
  if [[ ! $v =~ ^[0-9]+$ ]]; then
    echo "p2p_vs_peers: bad size '$1'" >&2
    exit 2
  fi
  echo $((v * m))
}
# The runs: one over all sizes with the tools' own iteration counts, or with VOLUME one per size
# ("MIN MAX ITERS" each; ITERS empty = the tool's default).
runs=()
if [[ -n $volume ]]; then
  vol=$(to_bytes "$volume") && lo=$(to_bytes "$min") && hi=$(to_bytes "$max") || exit 2
  for ((s = lo; ; s = s * factor > hi && s < hi ? hi : s * factor)); do
    n=$((vol / s > 20 ? vol / s : 20))
    runs+=("$s $s $n")
    ((s >= hi)) && break
  done
else
  runs=("$min $max $iters")
fi

# strata-perf p2p for one transport; JSON lines into $work/strata-$1.$2.<k>.json (run $2).
run_strata() {
  local t=$1 r=$2 k=0 lo hi n
  for spec in "${runs[@]}"; do
    read -r lo hi n <<<"$spec"
    k=$((k + 1))
    local it=()
    [[ -n $n ]] && it=(-n "$n" -w $((n / 10 > 2 ? n / 10 : 2)))
    echo "# strata-run -n 2 strata-perf p2p --transport $t -b $lo -e $hi -f $factor ${it[*]} --window $window ..." >&2
    if ! STRATA_TRANSPORT_FABRIC_PROVIDER="$provider" timeout "$run_timeout" "$strata_run" -n 2 \
      "$strata_perf" p2p --transport "$t" -b "$lo" -e "$hi" -f "$factor" "${it[@]}" \
      --window "$window" --json "$work/strata-$t.$r.$k.json" >"$work/strata-$t.$r.$k.log" 2>&1; then
      echo "# strata-perf p2p --transport $t failed; last lines:" >&2
      tail -n 5 "$work/strata-$t.$r.$k.log" | sed 's/^/#   /' >&2
    fi
  done
}
# run_tool NAME RUN EXE [ARGS...]: EXE ARGS... LO HI FACTOR ITERS for every run spec, the rows
# into $work/NAME.RUN.<k>.txt.
run_tool() {
  local name=$1 r=$2 k=0 lo hi n
  shift 2
  for spec in "${runs[@]}"; do
    read -r lo hi n <<<"$spec"
    k=$((k + 1))
    echo "# ${name} $lo $hi $factor ${n:-0} ..." >&2
    timeout "$run_timeout" "$@" "$lo" "$hi" "$factor" "${n:-0}" \
      >"$work/$name.$r.$k.txt" 2>"$work/$name.$r.$k.log" || {
      echo "# $name failed; last lines:" >&2
      tail -n 5 "$work/$name.$r.$k.log" | sed 's/^/#   /' >&2
    }
  done
}

# pick: the best (largest) or the median (the lower middle one) of the numbers on stdin.
pick() {
  sort -g | awk -v stat="$stat" '{ v[NR] = $1 } END {
    if (NR) print (stat == "best" ? v[NR] : v[int((NR + 1) / 2)]) }'
}
# jbest PREFIX BYTES KEY: KEY over the JSON lines of that size in PREFIX.*.json, combined by STAT.
jbest() {
  cat "$1".*.json 2>/dev/null | grep -h "\"bytes\":$2," | sed -n "s/.*\"$3\":\([-0-9.eE+]*\).*/\1/p" |
    pick
}
# cbest PREFIX BYTES COLUMN: column COLUMN (1-based) of the lines that start with BYTES in
# PREFIX.*.txt, combined by STAT.
cbest() {
  cat "$1".*.txt 2>/dev/null | awk -v b="$2" -v c="$3" '$1 == b { print $c }' | pick
}

for ((r = 1; r <= repeat; ++r)); do
  echo "# run $r of $repeat" >&2
  run_strata shm "$r"
  run_tool memcpy "$r" "$work/memcpy_bw"
  run_strata fabric "$r"
  [[ -x $work/fi_write_bw ]] && run_tool fi_write "$r" "$work/fi_write_bw" "$provider"
done

# The sizes strata measured, in order.
mapfile -t sizes < <(cat "$work"/strata-*.json 2>/dev/null | sed -n 's/.*"bytes":\([0-9]*\),.*/\1/p' | sort -nu)
if ((${#sizes[@]} == 0)); then
  echo "p2p_vs_peers: strata-perf produced no rows; see above" >&2
  exit 0
fi

# ucx_perftest ucp_put_bw, one server/client pair per size, run once: UCX over tcp on lo, client
# to 127.0.0.1 (the server's control socket listens on its port). At least 200 iterations, since
# the first puts of a run include UCX's connection set-up. Its bandwidth column is MB/s with
# MB = 2^20 B; converted to GB/s here.
have_ucx=0
if [[ ${UCX:-1} != 0 ]] && command -v ucx_perftest >/dev/null; then
  have_ucx=1
  port=$((20000 + RANDOM % 20000))
  for s in "${sizes[@]}"; do
    n=${iters:-$((s <= 65536 ? 1000 : (1000 * 65536 / s < 200 ? 200 : 1000 * 65536 / s)))}
    [[ -n $volume ]] && n=$((vol / s > 200 ? vol / s : 200))
    echo "# ucx_perftest 127.0.0.1 -t ucp_put_bw -s $s -n $n (UCX_TLS=tcp) ..." >&2
    UCX_TLS=tcp timeout "$run_timeout" ucx_perftest -p "$port" >"$work/ucx-server-$s.log" 2>&1 &
    server=$!
    sleep 0.5
    UCX_TLS=tcp timeout "$run_timeout" ucx_perftest 127.0.0.1 -p "$port" -t ucp_put_bw -s "$s" \
      -n "$n" -w $((n / 10 > 2 ? n / 10 : 2)) -f >"$work/ucx-$s.txt" 2>&1 ||
      echo "# ucx_perftest at $s B failed" >&2
    wait "$server" 2>/dev/null
    port=$((port + 1))
  done
fi
ucx_gbps() {
  # With -f the last row is "iterations lat_50% lat_avg lat_overall bw_avg bw_overall rate_avg
  # rate_overall"; bandwidth in MB/s with MB = 2^20 B.
  awk 'NF == 8 && $1 ~ /^[0-9]+$/ { bw = $6 } END { if (bw != "") printf "%.3f", bw * 1048576 / 1e9 }' \
    "$work/ucx-$1.txt" 2>/dev/null
}

ratio() {
  awk -v a="$1" -v b="$2" 'BEGIN { if (a ~ /^[0-9.eE+-]+$/ && b ~ /^[0-9.eE+-]+$/ && b > 0) printf "%.2f", a / b; else printf "-" }'
}
num() {
  awk -v a="$1" 'BEGIN { if (a ~ /^[0-9.eE+-]+$/) printf "%.2f", a; else printf "-" }'
}

echo
echo "# (1) shm: strata-perf p2p --transport shm (rank 0 writes into rank 1's mapping, one memcpy"
echo "#     per write) vs single-thread memcpy: hot = same buffers every copy (as p2p does),"
echo "#     cold = buffers rotate through 1 GiB (DRAM). Bandwidth GB/s, $stat of $repeat runs;"
echo "#     ratio = strata / memcpy."
printf "%10s %10s %10s %10s %9s %9s\n" "size(B)" "strata" "memcpy_hot" "memcpy_cold" "r_hot" "r_cold"
for s in "${sizes[@]}"; do
  st=$(jbest "$work/strata-shm" "$s" bw_gbps)
  mh=$(cbest "$work/memcpy" "$s" 4)
  mc=$(cbest "$work/memcpy" "$s" 6)
  printf "%10s %10s %10s %10s %9s %9s\n" "$s" "$(num "$st")" "$(num "$mh")" "$(num "$mc")" \
    "$(ratio "$st" "$mh")" "$(ratio "$st" "$mc")"
done
echo
echo "# (2) fabric, provider $provider on lo: strata-perf p2p --transport fabric vs fi_write_bw"
echo "#     (direct fi_write loop, same provider and completion level)$( ((have_ucx)) && echo " and ucx_perftest ucp_put_bw (UCX_TLS=tcp)")."
echo "#     Bandwidth GB/s, $stat of $repeat runs (ucx: one run); ratio = strata / peer."
printf "%10s %10s %10s %10s %9s %9s\n" "size(B)" "strata" "fi_write" "ucx_put" "r_fi" "r_ucx"
for s in "${sizes[@]}"; do
  st=$(jbest "$work/strata-fabric" "$s" bw_gbps)
  fw=$(cbest "$work/fi_write" "$s" 4)
  ux=$( ((have_ucx)) && ucx_gbps "$s")
  printf "%10s %10s %10s %10s %9s %9s\n" "$s" "$(num "$st")" "$(num "$fw")" "$(num "$ux")" \
    "$(ratio "$st" "$fw")" "$(ratio "$st" "$ux")"
done
if [[ -n ${RESULTS_DIR:-} ]]; then
  echo "# raw outputs: $work"
fi
exit 0
