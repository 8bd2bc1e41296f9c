#!/usr/bin/env bash
# Compares strata's host collectives with Open MPI and Gloo on this machine: bus bandwidth per
# size, measured the same way by all three (nccl-tests' rules; see docs/benchmarks.md).
#
#   tools/bench/coll_vs_peers.sh [--ranks "2 4"] [--min 8] [--max 64M] [--factor 4]
#       [--ops "allreduce allgather"] [--out DIR] [--build BUILD_DIR] [--bind core|none]
#       [--registered] [--nodes N]
#
#   --out     where the helper programs, JSON lines, logs and plots go (default: a new
#             /tmp/strata-coll.XXXXXX, kept and printed at the end)
#   --build   strata's meson build directory (default: build)
#   --bind    core (default): every tool's rank r runs on CPU r mod the CPU count (strata-run
#             --bind-to core for strata and Gloo, mpirun --bind-to core:overload-allowed --map-by
#             core for Open MPI); none: the scheduler places the ranks. With more ranks than
#             cores, unpinned rows vary up to 1.5x between runs with where the ranks landed.
#   --registered  also run strata-perf with --alloc allochost (buffers from
#             Communicator::allocHost, which the zerocopy algorithm reads in place) for each op
#             and N, with the same iterations and binding (files strata-reg-*, JSON label
#             strata-reg); each table gets the columns reg (its busbw) and r_reg (reg / the
#             better peer), and is followed by the algorithm strata-perf reported per size for
#             the normal and the registered run (a size whose rounds ran different algorithms
#             lists each, comma-separated).
#
#   --nodes   run across N nodes of the local multi-node Slurm (tools/dev/slurm-up.sh --nodes N,
#             found as tests/harness/run-srun.sh finds it): strata-perf and Open MPI's mpi_coll
#             under `srun -N N --mpi=pmix` (strata's pmix bootstrap; Open MPI's pml ob1 with btl
#             self,vader,tcp), both on the nodes' data network (data0); no binding (Slurm's
#             task/none); Gloo is skipped (it has no srun launch here).
#
# After the tables it prints the machine: CPU model, single-thread memcpy (hot and cold, built
# from memcpy_bw.c) and cross-process reads (process_vm_readv vs a shared mapping, cma_vs_shm.c).
#
# Environment: ITERS / WARMUP (timed and warm-up iterations for every tool and size; default:
# each tool's own, 200 up to 64 KiB then proportionally fewer, at least 5, for the peers),
# GLOO_ALGOS (Gloo allreduce algorithms to run, default "ring bcube"; the Gloo column shows the
# best per size), REPEAT (rounds of all runs, default 1; every tool keeps its best result per
# size, since other load on the machine makes single runs noisy), BENCH_TIMEOUT (seconds per run, default 900), CC (default mpicc), CXX (default
# g++), STRATA_PLOT (path of strata-plot; default tools/strata-plot).
#
# Runs one at a time, never in parallel (the benchmarks share the machine's cores). A benchmark,
# never a pass/fail test: a peer that is missing (no mpicc/mpirun, no Gloo headers or library)
# or a run that fails shows as "-" and the script goes on. Loopback only: strata's bootstrap on
# lo, FI_TCP_IFACE=lo, UCX_NET_DEVICES=lo, Open MPI's oob/btl on lo (and shared memory), Gloo's
# TCP device on 127.0.0.1.
set -u

ranks="2 4"
min=8
max=64M
factor=4
ops="allreduce allgather"
out=
build_dir=build
bind=core
registered=0
nodes=

usage() {
  sed -n '2,/^set -u/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
}
while (($# > 0)); do
  case $1 in
    --ranks) ranks=$2; shift 2 ;;
    --min) min=$2; shift 2 ;;
    --max) max=$2; shift 2 ;;
    --factor) factor=$2; shift 2 ;;
    --ops) ops=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --build) build_dir=$2; shift 2 ;;
    --bind) bind=$2; shift 2 ;;
    --registered) registered=1; shift ;;
    --nodes) nodes=$2; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "coll_vs_peers: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
case $bind in
  core) run_bind=(--bind-to core); mpi_bind=(--bind-to core:overload-allowed --map-by core) ;;
  none) run_bind=(--bind-to none); mpi_bind=(--bind-to none) ;;
  *) echo "coll_vs_peers: --bind takes core or none, not '$bind'" >&2; exit 2 ;;
esac
for op in $ops; do
  case $op in
    allreduce | allgather) ;;
    *) echo "coll_vs_peers: op '$op' is not compared (allreduce, allgather)" >&2; exit 2 ;;
  esac
done

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
run_timeout=${BENCH_TIMEOUT:-900}
gloo_algos=${GLOO_ALGOS:-"ring bcube"}
repeat=${REPEAT:-1}
iters=${ITERS:-}
warmup=${WARMUP:-}
if [[ -n $iters && -z $warmup ]]; then
  warmup=$((iters / 10 > 2 ? iters / 10 : 2))
fi

if [[ -z $out ]]; then
  out=$(mktemp -d "${TMPDIR:-/tmp}/strata-coll.XXXXXX") || exit 1
else
  mkdir -p "$out" || exit 1
fi
out=$(cd "$out" && pwd)
rm -f "$out"/*.r[0-9]*.json # rounds of an earlier run in the same directory must not mix in

# Loopback only, for every stack and for anything they spawn. STRATA_CONFIG points at a path
# that cannot exist so that no strata.toml on this machine changes what is measured.
export STRATA_BOOTSTRAP_TCP_INTERFACE=lo
export FI_TCP_IFACE=lo
export UCX_NET_DEVICES=lo
export STRATA_CONFIG=/dev/null/none
export OMPI_MCA_btl_tcp_if_include=lo
export OMPI_MCA_oob_tcp_if_include=lo
srun_cmd=()
if [[ -n $nodes ]]; then
  [[ $nodes =~ ^[2-8]$ ]] || { echo "coll_vs_peers: --nodes takes 2..8, not '$nodes'" >&2; exit 2; }
  # shellcheck source=../../tests/harness/find-slurm-nodes.sh
  . "$repo/tests/harness/find-slurm-nodes.sh"
  envf=$(find_slurm_nodes_env "$repo")
  [[ -n $envf ]] || { echo "coll_vs_peers: no local multi-node Slurm is up (tools/dev/slurm-up.sh --nodes $nodes BUILD/slurm-nodes)" >&2; exit 1; }
  unset SLURM_CONF
  # shellcheck disable=SC1090  # written by slurm-up.sh
  . "$envf"
  iface=${STRATA_SLURM_DATA_IFACE:-data0}
  export STRATA_BOOTSTRAP_TCP_INTERFACE="=$iface" FI_TCP_IFACE=$iface UCX_NET_DEVICES=$iface
  export OMPI_MCA_btl_tcp_if_include=$iface OMPI_MCA_oob_tcp_if_include=$iface
  export STRATA_BOOTSTRAP_BACKEND=pmix
  srun_cmd=(srun -N "$nodes" --mpi=pmix --export=ALL --kill-on-bad-exit=1)
  run_bind=()
  bind=none
fi

strata_run="$build_dir/tools/strata-run/strata-run"
strata_perf="$build_dir/tools/strata-perf/strata-perf"
[[ -x $strata_run ]] || strata_run=
# Across nodes srun launches instead (strata_run only says "a launcher is there").
[[ -n $nodes ]] && strata_run=srun
[[ -x $strata_perf ]] || strata_perf=
if [[ -z $strata_run ]]; then
  echo "# strata-run not found in $build_dir (build first, or pass --build): strata is skipped" >&2
fi
if [[ -n $strata_perf && -z ${STRATA_MODULE_PATH:-} ]]; then
  # Transport modules that are not compiled into the core, in case the config asks for one.
  mod_dir=$(find "$build_dir/backends" -name 'strata-transport-*.so' -printf '%h\n' 2>/dev/null |
    sort -u | paste -sd: -)
  [[ -n $mod_dir ]] && export STRATA_MODULE_PATH=$mod_dir
fi

# strata_has OP: whether this strata-perf has the collective mode OP. CLI11 answers an unknown
# subcommand's --help with the top-level help and status 0, so look for the mode's own usage.
strata_has() {
  [[ -n $strata_run && -n $strata_perf ]] &&
    "$strata_perf" "$1" --help 2>&1 | grep -q "strata-perf $1"
}

# strata_has_reg OP: whether this strata-perf's OP mode takes --alloc allochost.
strata_has_reg() {
  "$strata_perf" "$1" --help 2>&1 | grep -q allochost
}

# --- build the peers' programs ---------------------------------------------------------------
have_mpi=0
cc=${CC:-mpicc}
if ! command -v "$cc" >/dev/null || ! command -v mpirun >/dev/null; then
  echo "# Open MPI skipped: $cc or mpirun not found (apt-get install libopenmpi-dev openmpi-bin)" >&2
elif ! "$cc" -O2 -o "$out/mpi_coll" "$here/mpi_coll.c" 2>"$out/mpi_coll.build.log"; then
  echo "# Open MPI skipped: $cc failed to build mpi_coll.c; see $out/mpi_coll.build.log" >&2
else
  have_mpi=1
fi

have_gloo=0
cxx=${CXX:-g++}
if [[ ! -f /usr/include/gloo/allreduce.h ]] && ! echo '#include <gloo/allreduce.h>' |
  "$cxx" -std=c++17 -E -x c++ - >/dev/null 2>&1; then
  echo "# Gloo skipped: gloo headers not found (apt-get install libgloo-dev)" >&2
else
  # Debian's libgloo links its own dependencies; the extra libraries are a fallback for builds
  # that need them named.
  for libs in "-lgloo -lpthread" "-lgloo -lhiredis -libverbs -lpthread"; do
    # shellcheck disable=SC2086  # word splitting of the library list is intended
    if "$cxx" -std=c++17 -O2 -o "$out/gloo_coll" "$here/gloo_coll.cpp" $libs \
      2>"$out/gloo_coll.build.log"; then
      have_gloo=1
      break
    fi
  done
  ((have_gloo)) || echo "# Gloo skipped: $cxx failed to build gloo_coll.cpp; see $out/gloo_coll.build.log" >&2
fi
if ((have_gloo)) && [[ -n $nodes ]]; then
  echo "# Gloo skipped: no srun launch for it across nodes" >&2
  have_gloo=0
fi
if ((have_gloo)) && [[ -z $strata_run ]] && ((!have_mpi)); then
  echo "# Gloo skipped: it needs a launcher (strata-run or mpirun) and neither is available" >&2
  have_gloo=0
fi

peer_args=("$min" "$max" "$factor")
[[ -n $iters ]] && peer_args+=("$iters" "$warmup")
perf_iters=()
[[ -n $iters ]] && perf_iters=(-n "$iters" -w "$warmup")

# note LOG WHAT: says that a run failed and shows the end of its log.
note_failure() {
  echo "# $2 failed; last lines of $1:" >&2
  tail -n 5 "$1" | sed 's/^/#   /' >&2
}

# run_strata OP N [NAME EXTRA...]: strata-perf OP at N ranks into NAME-OP-nN.rREP.{json,log}
# (NAME default strata), with the EXTRA arguments (--registered: --alloc allochost).
run_strata() {
  local op=$1 n=$2 name=${3:-strata}
  local json="$out/$name-$op-n$n.r$rep.json" log="$out/$name-$op-n$n.r$rep.log"
  local extra=("${@:4}")
  rm -f "$json"
  local launch=("$strata_run" -n "$n" "${run_bind[@]}")
  [[ -n $nodes ]] && launch=("${srun_cmd[@]}" -n "$n")
  echo "# ${launch[*]/#*strata-run/strata-run} strata-perf $op -b $min -e $max -f $factor ${perf_iters[*]} -c 0${extra[*]:+ ${extra[*]}} ..." >&2
  timeout "$run_timeout" "${launch[@]}" "$strata_perf" "$op" -b "$min" -e "$max" \
    -f "$factor" "${perf_iters[@]}" -c 0 "${extra[@]}" --json "$json" >"$log" 2>&1 ||
    note_failure "$log" "strata-perf $op ${extra[*]} at N=$n"
}

run_mpi() {
  local op=$1 n=$2 json="$out/openmpi-$1-n$2.r$rep.json" log="$out/openmpi-$1-n$2.r$rep.log"
  [[ -n $nodes ]] ||
    echo "# mpirun -np $n ${mpi_bind[*]} mpi_coll $op ${peer_args[*]} (pml ob1, btl self,vader) ..." >&2
  # ob1 with the vader BTL is Open MPI's shared-memory path; without --mca pml ob1 Open MPI 4.1
  # would pick UCX's pml where UCX is installed.
  if [[ -n $nodes ]]; then
    echo "# ${srun_cmd[*]} -n $n mpi_coll $op ${peer_args[*]} (pml ob1, btl self,vader,tcp) ..." >&2
    OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader,tcp timeout "$run_timeout" "${srun_cmd[@]}" -n "$n" \
      "$out/mpi_coll" "$op" "${peer_args[@]}" >"$json" 2>"$log" ||
      note_failure "$log" "mpi_coll $op at N=$n across $nodes nodes"
    return
  fi
  timeout "$run_timeout" mpirun --allow-run-as-root --oversubscribe "${mpi_bind[@]}" -np "$n" \
    --mca pml ob1 --mca btl self,vader --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo \
    "$out/mpi_coll" "$op" "${peer_args[@]}" >"$json" 2>"$log" ||
    note_failure "$log" "mpi_coll $op at N=$n"
}

# run_gloo OP N ALGO: one run with a fresh FileStore directory (keys of an earlier run in the
# same directory would be read as this run's).
run_gloo() {
  local op=$1 n=$2 algo=$3 name=gloo
  [[ $algo != ring ]] && name=gloo-$algo
  local json="$out/$name-$op-n$n.r$rep.json" log="$out/$name-$op-n$n.r$rep.log"
  local store
  store=$(mktemp -d "$out/gloo-store.XXXXXX") || return
  echo "# gloo_coll $op ${peer_args[*]} at N=$n (GLOO_ALGO=$algo) ..." >&2
  if [[ -n $strata_run ]]; then
    GLOO_ALGO=$algo GLOO_STORE_DIR=$store timeout "$run_timeout" "$strata_run" -n "$n" \
      "${run_bind[@]}" "$out/gloo_coll" "$op" "${peer_args[@]}" >"$json" 2>"$log" ||
      note_failure "$log" "gloo_coll $op at N=$n"
  else
    timeout "$run_timeout" mpirun --allow-run-as-root --oversubscribe "${mpi_bind[@]}" -np "$n" \
      --mca oob_tcp_if_include lo -x GLOO_ALGO="$algo" -x GLOO_STORE_DIR="$store" \
      "$out/gloo_coll" "$op" "${peer_args[@]}" >"$json" 2>"$log" ||
      note_failure "$log" "gloo_coll $op at N=$n"
  fi
  rm -rf "$store"
}

# load: prints a warning when other work keeps the cores busy (polling benchmarks such as Open
# MPI's shared-memory BTL slow down by orders of magnitude when their ranks lose their core).
load() {
  awk -v c="$(nproc)" -v w="$1" '{ if ($1 >= c / 2) printf "# WARNING: load average %s on %d cores %s: other work is running, numbers are unreliable\n", $1, c, w }' /proc/loadavg >&2
}

# --- run, one after the other, REPEAT times; each tool's file keeps its best line per size ----
load "before the runs"
for ((rep = 1; rep <= repeat; ++rep)); do
  ((repeat > 1)) && echo "# round $rep of $repeat" >&2
  for n in $ranks; do
    for op in $ops; do
      if strata_has "$op"; then
        run_strata "$op" "$n"
        if ((registered)) && strata_has_reg "$op"; then
          run_strata "$op" "$n" strata-reg --alloc allochost --label strata-reg
        elif ((registered)) && [[ $rep == 1 ]]; then
          echo "# strata-reg skipped: '$strata_perf $op' has no --alloc allochost" >&2
        fi
      elif [[ -n $strata_perf && $rep == 1 ]]; then
        echo "# strata skipped: $strata_perf has no '$op' mode yet ('strata-perf $op --help' fails)" >&2
      fi
      ((have_mpi)) && run_mpi "$op" "$n"
      if ((have_gloo)); then
        if [[ $op == allreduce ]]; then
          for algo in $gloo_algos; do run_gloo "$op" "$n" "$algo"; done
        else
          run_gloo "$op" "$n" ring # GLOO_ALGO only selects among allreduce algorithms
        fi
      fi
    done
  done
done
load "after the runs"

# Merge the rounds: per label, op, N, size and in-place flag the line with the largest busbw,
# in size order, into NAME.json (the file the table and the plot read).
for f in "$out"/*.r1.json; do
  [[ -e $f ]] || continue
  base=${f%.r1.json}
  cat "$base".r*.json 2>/dev/null | awk '
    /"size":/ {
      key = $0; sub(/"time_us".*/, "", key)
      b = $0; sub(/.*"busbw":/, "", b); sub(/[,}].*/, "", b)
      s = $0; sub(/.*"size":/, "", s); sub(/,.*/, "", s)
      if (!(key in best) || b + 0 > best[key]) { best[key] = b + 0; line[key] = $0; size[key] = s }
    }
    END { for (k in line) print size[k], line[k] }' | sort -n -s -k1,1 | cut -d' ' -f2- >"$base.json"
done

# --- tables ----------------------------------------------------------------------------------
# rows FILE OP: "size busbw label" for the out-of-place result lines of OP in FILE (strata-perf
# also prints in-place lines; the peers measure out-of-place only).
rows() {
  [[ -f $1 ]] || return 0
  grep -h "\"op\":\"$2\"" "$1" 2>/dev/null | grep -v '"inplace":true' |
    sed -n 's/.*"label":"\([^"]*\)".*"size":\([0-9]*\),.*"busbw":\([-0-9.eE+]*\).*/\2 \3 \1/p'
}
# best SIZE: the largest busbw of that size in the rows on stdin, with its label.
best() {
  awk -v s="$1" '$1 == s && ($2 > b || l == "") { b = $2; l = $3 } END { if (l != "") print b, l }'
}
num() {
  awk -v a="$1" 'BEGIN { if (a ~ /^[0-9.eE+-]+$/) printf "%.4g", a; else printf "-" }'
}
ratio() {
  awk -v a="$1" -v b="$2" 'BEGIN { if (a ~ /^[0-9.eE+-]+$/ && b ~ /^[0-9.eE+-]+$/ && b > 0) printf "%.2f", a / b; else printf "-" }'
}
# algorithms NAME OP N: "size algorithm" per size of the strata-perf logs of NAME-OP-nN, rounds
# 1..REPEAT: the "# algorithm: ..." line in effect before each row (the header's "algorithm:
# auto (...)" or "(forced with -a ...)" line comes before the column header and is skipped).
# Sizes whose rounds ran different algorithms list each once, comma-separated, in round order.
algorithms() {
  local r logs=()
  for ((r = 1; r <= repeat; ++r)); do
    [[ -f $out/$1-$2-n$3.r$r.log ]] && logs+=("$out/$1-$2-n$3.r$r.log")
  done
  ((${#logs[@]} > 0)) || return 0
  awk 'FNR == 1 { rows = 0; cur = "-" }
    /^# +size +count/ { rows = 1; next }
    rows && /^# algorithm: / { cur = $0; sub(/^# algorithm: /, "", cur); next }
    rows && $1 ~ /^[0-9]+$/ {
      if (!($1 in algo)) { algo[$1] = cur; order[++n] = $1 }
      else if (index(", " algo[$1] ", ", ", " cur ", ") == 0) algo[$1] = algo[$1] ", " cur
    }
    END { for (i = 1; i <= n; ++i) print order[i], algo[order[i]] }' "${logs[@]}"
}

plot=${STRATA_PLOT:-$repo/tools/strata-plot}
[[ -d $plot && -x $plot/strata-plot ]] && plot=$plot/strata-plot
shortfalls=0
for op in $ops; do
  for n in $ranks; do
    strata_rows=$(rows "$out/strata-$op-n$n.json" "$op")
    mpi_rows=$(rows "$out/openmpi-$op-n$n.json" "$op")
    gloo_rows=$(for f in "$out"/gloo-"$op"-n"$n".json "$out"/gloo-*-"$op"-n"$n".json; do rows "$f" "$op"; done)
    reg_rows=
    ((registered)) && reg_rows=$(rows "$out/strata-reg-$op-n$n.json" "$op")
    mapfile -t sizes < <(printf '%s\n%s\n%s\n%s\n' "$strata_rows" "$mpi_rows" "$gloo_rows" \
      "$reg_rows" | awk 'NF { print $1 }' | sort -nu)
    echo
    echo "# $op, N = $n: busbw in GB/s (GB = 1e9 B), out-of-place, float$([[ $op == allreduce ]] && echo " sum")."
    echo "#   gloo = best of the Gloo algorithms run (algo column); r_* = strata / peer;"
    echo "#   '<' marks sizes >= 64 KiB where strata is below the better peer."
    ((registered)) &&
      echo "#   reg = strata with allocHost buffers (--alloc allochost); r_reg = reg / the better peer."
    if ((${#sizes[@]} == 0)); then
      echo "#   no results (every tool was skipped or failed; see above)"
      continue
    fi
    printf "%12s %9s %9s %9s %6s %7s %7s %7s" "size(B)" "strata" "openmpi" "gloo" "algo" \
      "r_mpi" "r_gloo" "r_best"
    ((registered)) && printf "   %9s %7s" "reg" "r_reg"
    printf "\n"
    for s in "${sizes[@]}"; do
      st=$(best "$s" <<<"$strata_rows" | awk '{ print $1 }')
      mp=$(best "$s" <<<"$mpi_rows" | awk '{ print $1 }')
      gl='' galgo=''
      read -r gl galgo < <(best "$s" <<<"$gloo_rows")
      galgo=${galgo#gloo}
      galgo=${galgo#-}
      [[ -n ${gl:-} ]] && galgo=${galgo:-ring}
      peer=$(awk -v a="${mp:-}" -v b="${gl:-}" 'BEGIN { m = ""; if (a ~ /^[0-9.eE+-]+$/) m = a;
        if (b ~ /^[0-9.eE+-]+$/ && (m == "" || b > m)) m = b; print m }')
      mark=
      if ((s >= 65536)) && [[ -n $st && -n $peer ]] &&
        awk -v a="$st" -v b="$peer" 'BEGIN { exit !(a < b) }'; then
        mark=" <"
        shortfalls=$((shortfalls + 1))
      fi
      printf "%12s %9s %9s %9s %6s %7s %7s %7s" "$s" "$(num "$st")" "$(num "$mp")" \
        "$(num "${gl:-}")" "${galgo:--}" "$(ratio "$st" "$mp")" "$(ratio "$st" "${gl:-}")" \
        "$(ratio "$st" "$peer")"
      if ((registered)); then
        # The mark stays next to r_best, the column it is about.
        rg=$(best "$s" <<<"$reg_rows" | awk '{ print $1 }')
        printf "%2s %9s %7s" "$mark" "$(num "$rg")" "$(ratio "$rg" "$peer")"
        mark=
      fi
      printf "%s\n" "$mark"
      gl='' galgo=''
    done
    if ((registered)); then
      # The algorithm strata-perf reported per size, for the normal and the registered run.
      st_algos=$(algorithms strata "$op" "$n")
      reg_algos=$(algorithms strata-reg "$op" "$n")
      mapfile -t algo_sizes < <(printf '%s\n%s\n' "$st_algos" "$reg_algos" |
        awk 'NF { print $1 }' | sort -nu)
      if ((${#algo_sizes[@]} > 0)); then
        width=$(cut -s -d' ' -f2- <<<"$st_algos" |
          awk '{ if (length > w) w = length } END { print (w > 16 ? w : 16) }')
        echo "#   algorithm per size (strata-perf's \"# algorithm:\" lines; reg: --alloc allochost):"
        printf "%12s  %-*s  %s\n" "size(B)" "$width" "strata-algorithm" "reg-algorithm"
        for s in "${algo_sizes[@]}"; do
          sa=$(awk -v s="$s" '$1 == s { sub(/^[^ ]+ /, ""); print; exit }' <<<"$st_algos")
          ra=$(awk -v s="$s" '$1 == s { sub(/^[^ ]+ /, ""); print; exit }' <<<"$reg_algos")
          printf "%12s  %-*s  %s\n" "$s" "$width" "${sa:--}" "${ra:--}"
        done
      fi
    fi
    files=()
    for f in "$out/strata-$op-n$n.json" "$out/strata-reg-$op-n$n.json" \
      "$out/openmpi-$op-n$n.json" "$out"/gloo-"$op"-n"$n".json "$out"/gloo-*-"$op"-n"$n".json; do
      [[ -s $f ]] && files+=("$f")
    done
    if [[ ! -x $plot ]]; then
      echo "# no plot: $plot not found"
    elif ((${#files[@]} > 0)); then
      if "$plot" -o "$out/$op-n$n.png" --metric busbw --op "$op" "${files[@]}" \
        >"$out/plot-$op-n$n.log" 2>&1; then
        echo "# plot: $out/$op-n$n.png"
      else
        note_failure "$out/plot-$op-n$n.log" "strata-plot for $op at N=$n"
      fi
    fi
  done
done
# --- the machine: what the numbers depend on (docs/benchmarks.md) ---------------------------
echo
cpu=$(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //')
feats=$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -xE 'avx2|avx512f|erms|fsrm' | tr '\n' ' ')
echo "# machine: ${cpu:-unknown CPU}, $(nproc) CPUs (${feats% })"
mcc=${MACHINE_CC:-cc}
if "$mcc" -O2 -o "$out/memcpy_bw" "$here/memcpy_bw.c" 2>"$out/memcpy_bw.build.log" &&
  "$out/memcpy_bw" 1M 64M 64 >"$out/memcpy_bw.txt" 2>&1; then
  awk '!/^#/ { printf "%s %s MiB hot %.1f cold %.1f", (n++ ? ";" : "# memcpy, one thread, GB/s:"), $1 / 1048576, $4, $6 }
       END { print "" }' "$out/memcpy_bw.txt"
else
  echo "# memcpy_bw failed; see $out/memcpy_bw.build.log and $out/memcpy_bw.txt"
fi
if "$mcc" -O2 -o "$out/cma_vs_shm" "$here/cma_vs_shm.c" 2>"$out/cma_vs_shm.build.log"; then
  for b in 256K 1M; do
    "$out/cma_vs_shm" "$b" 500 >"$out/cma_vs_shm-$b.txt" 2>&1 &&
      awk -v b="$b" '$1 ~ /^(readv|shm)-(clean|dirty)$/ { g[$1] = $5 }
        END { printf "# another process'"'"'s %s, GB/s: just written: process_vm_readv %s, shared mapping %s; unchanged: %s vs %s\n", b, g["readv-dirty"], g["shm-dirty"], g["readv-clean"], g["shm-clean"] }' \
        "$out/cma_vs_shm-$b.txt" || echo "# cma_vs_shm $b failed; see $out/cma_vs_shm-$b.txt"
  done
else
  echo "# cma_vs_shm did not build; see $out/cma_vs_shm.build.log"
fi

echo
for f in "$out"/*.json; do
  [[ -f $f ]] && grep -q '"wrong":[1-9]' "$f" &&
    echo "# WARNING: $f has results with wrong elements (\"wrong\" > 0): those numbers do not count"
done
echo "# sizes >= 64 KiB where strata is below the better peer: $shortfalls"
echo "# results, logs and plots: $out"
exit 0
