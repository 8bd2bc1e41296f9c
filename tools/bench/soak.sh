#!/usr/bin/env bash
# Soak: N ranks (default 8) under strata-run create a Communicator, run a random mix of
# collectives of random sizes and types (every result checked), destroy it, and start again, for
# MINUTES. Each rank samples its resident memory, descriptors, threads, memory mappings and the
# host's /dev/shm entries between cycles, once a minute; at the end the script prints a table
# (per sample: max over ranks and rank 0) and a verdict: "no growth after warm-up", or what grew.
# Not a CI test: it runs for minutes.
#
#   tools/bench/soak.sh MINUTES [BUILD_DIR]            (default BUILD_DIR: build)
#
# Environment: SOAK_N (ranks, default 8), SOAK_SAMPLE (seconds between samples, default 60),
# SOAK_WARMUP (samples of warm-up before the baseline, default 1), SOAK_SEED (default 1),
# SOAK_RSS_SLACK_KIB (RSS growth per rank tolerated, default 2048: the smallest RSS of the last
# third of the samples may exceed the largest of the first third after warm-up by this much), RESULTS_DIR (keep the samples
# there; default a temporary directory that is removed).
# Exit status: 0 no growth, 1 growth or a failed job, 2 bad arguments or nothing built.
set -u

minutes=${1:-}
build_dir=${2:-build}
if [[ ! $minutes =~ ^[0-9]+(\.[0-9]+)?$ ]] || awk -v m="$minutes" 'BEGIN { exit !(m <= 0) }'; then
  echo "usage: $0 MINUTES [BUILD_DIR]" >&2
  exit 2
fi
n=${SOAK_N:-8}
every=${SOAK_SAMPLE:-60}
warmup=${SOAK_WARMUP:-1}
seed=${SOAK_SEED:-1}
slack=${SOAK_RSS_SLACK_KIB:-2048}
strata_run=$build_dir/tools/strata-run/strata-run
soak=$build_dir/tests/stress/soak
for exe in "$strata_run" "$soak"; do
  if [[ ! -x $exe ]]; then
    echo "soak: $exe not found; build first (ninja -C $build_dir tools/strata-run/strata-run tests/stress/soak)" >&2
    exit 2
  fi
done

if [[ -n ${RESULTS_DIR:-} ]]; then
  work=$RESULTS_DIR
  mkdir -p "$work" || exit 2
else
  work=$(mktemp -d "${TMPDIR:-/tmp}/strata-soak.XXXXXX") || exit 2
  trap 'rm -rf "$work"' EXIT
fi

# Loopback only; no strata.toml; the modules of this build.
export STRATA_BOOTSTRAP_TCP_INTERFACE=lo FI_TCP_IFACE=lo UCX_NET_DEVICES=lo
export STRATA_CONFIG=/dev/null/none
export STRATA_MODULE_PATH=${STRATA_MODULE_PATH:-$build_dir/backends}

seconds=$(awk -v m="$minutes" 'BEGIN { printf "%d", m * 60 }')
echo "soak: $n ranks, $minutes min, a sample every ${every}s, seed $seed, samples in $work"
start=$SECONDS
timeout --kill-after=10 $((seconds + 180)) "$strata_run" -n "$n" "$soak" "$seconds" "$work" \
  "$every" "$seed" >"$work/out" 2>&1
rc=$?
echo "soak: the job ended with exit status $rc after $((SECONDS - start)) s"
if [[ -s $work/out ]]; then
  echo "--- its output:"
  head -n 40 "$work/out"
fi

# The table: per sample index, max over ranks of each column, and rank 0's values.
awk -v ranks="$n" -v warmup="$warmup" -v slack="$slack" '
  FNR == 1 { r = FILENAME; sub(/.*rank-/, "", r); sub(/\.tsv$/, "", r) }
  {
    i = FNR; if (i > rows) rows = i
    t[r, i] = $1; cyc[r, i] = $2; rss[r, i] = $3; fds[r, i] = $4; thr[r, i] = $5
    maps[r, i] = $6; mfd[r, i] = $7; shm[r, i] = $8; seen[r] = 1; last[r] = i
  }
  function max(a, i,   r, m) { m = -1; for (r in seen) if ((r, i) in a && a[r, i] > m) m = a[r, i]; return m }
  END {
    printf "%6s %7s | %10s %5s %7s %5s %5s | %10s %4s %7s | %8s\n", "t(s)", "cycles",
      "rss max KiB", "fds", "threads", "maps", "memfd", "rss0 KiB", "fds0", "threads0", "dev/shm"
    for (i = 1; i <= rows; i++)
      printf "%6d %7d | %10d %5d %7d %5d %5d | %10d %4d %7d | %8d\n", t[0, i], cyc[0, i],
        max(rss, i), max(fds, i), max(thr, i), max(maps, i), max(mfd, i), rss[0, i], fds[0, i],
        thr[0, i], max(shm, i)
    nr = 0; for (r in seen) nr++
    if (nr < ranks) { printf "verdict: only %d of %d ranks wrote samples\n", nr, ranks; exit 1 }
    base = warmup + 1
    if (rows < base + 1) {
      printf "verdict: too few samples (%d) for a warm-up of %d; run longer\n", rows, warmup; exit 1
    }
    grew = ""
    for (r in seen) {
      b = base; e = last[r]
      # RSS moves with what malloc keeps between cycles of different sizes: growth is when the
      # smallest of the last third of the samples is above the largest of the first third.
      k = int((e - b + 1) / 3); if (k < 1) k = 1
      hi = -1; for (j = b; j < b + k; j++) if (rss[r, j] > hi) hi = rss[r, j]
      lo = -1; for (j = e - k + 1; j <= e; j++) if (lo < 0 || rss[r, j] < lo) lo = rss[r, j]
      if (lo - hi > slack) grew = grew sprintf("; rank %s rss %+d KiB (min of the last %d samples - max of the first %d)", r, lo - hi, k, k)
      if (fds[r, e] > fds[r, b]) grew = grew sprintf("; rank %s fds %+d", r, fds[r, e] - fds[r, b])
      if (thr[r, e] > thr[r, b]) grew = grew sprintf("; rank %s threads %+d", r, thr[r, e] - thr[r, b])
      if (maps[r, e] > maps[r, b]) grew = grew sprintf("; rank %s maps %+d", r, maps[r, e] - maps[r, b])
      if (mfd[r, e] > mfd[r, b]) grew = grew sprintf("; rank %s memfd maps %+d", r, mfd[r, e] - mfd[r, b])
    }
    if (max(shm, rows) > max(shm, base)) grew = grew sprintf("; /dev/shm entries %+d (host-wide)", max(shm, rows) - max(shm, base))
    printf "baseline: sample %d (t=%ds, cycle %d); last: sample %d (t=%ds, cycle %d)\n", base,
      t[0, base], cyc[0, base], rows, t[0, rows], cyc[0, rows]
    if (grew == "") { print "verdict: no growth after warm-up"; exit 0 }
    print "verdict: growth after warm-up" grew; exit 1
  }' "$work"/rank-*.tsv
verdict=$?
[[ $rc -ne 0 ]] && { echo "soak: FAILED: the job exited with $rc"; exit 1; }
exit "$verdict"
