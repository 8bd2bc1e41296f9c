#!/usr/bin/env bash
# strata-info --tuning: one rank says there is nothing to measure and how to measure; under
# strata-run -n 2 rank 0 measures at create (one line per probe size), stores the figures in the
# cache, and the next run reads them from there; collectives.tuning = off and cached (with an
# empty cache) say so; a corrupted cache is ignored with a warning and measured afresh. The
# measured choice (collectives.measure_calls) is on by default at 2 ranks and off with tuning off.
#
# With STRATA_PERF: ranks that have the same single_copy_min_bytes, one from the default and one
# set explicitly, still run the same algorithms (rank 0's answer counts on every rank).
#
#   test_tuning_cli.sh STRATA_INFO STRATA_RUN [STRATA_PERF]
set -u
info=$1 run=$2 perf=${3:-}
fail() { echo "FAIL: $*"; exit 1; }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/strata-tuning-cli.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
export XDG_CACHE_HOME=$tmp/cache
cache=$XDG_CACHE_HOME/strata/host-tuning.txt

out=$("$info" --tuning 2>&1) || fail "strata-info --tuning (one rank) failed: $out"
echo "$out"
grep -q '^host collectives tuning: not needed' <<<"$out" || fail "one rank does not say tuning is not needed"
grep -q 'strata-run -n N strata-info --tuning' <<<"$out" || fail "one rank does not say how to measure"
grep -qF "Tuning cache: $cache (absent)" <<<"$out" || fail "the cache file is not named as absent"

out=$("$run" -n 2 "$info" --tuning 2>&1) || fail "strata-run -n 2 strata-info --tuning failed: $out"
echo "$out"
if grep -q '^host collectives tuning: not needed: single copy is not available' <<<"$out"; then
  echo "SKIP: process_vm_readv between the ranks is not permitted here (ptrace), nothing is measured"
  exit 77
fi
[[ $(grep -c '^host collectives tuning:' <<<"$out") -eq 1 ]] || fail "not exactly one rank printed the report"
grep -q '^host collectives tuning: measured at create' <<<"$out" || fail "the first run did not measure at create"
grep -q '^machine: .*2 ranks per host' <<<"$out" || fail "no machine line for 2 ranks per host"
[[ -s $cache ]] || fail "the first run wrote no cache file $cache"
entry=$(grep '^cpu=' "$cache") || fail "the cache has no entry: $(cat "$cache")"
samples=$(sed 's/.* samples=//' <<<"$entry" | tr ',' '\n' | grep -c .)
lines=$(grep -cE '^  [0-9]+ B: process_vm_readv [0-9.]+ GB/s, mapped copy [0-9.]+ GB/s, ratio [0-9.]+$' <<<"$out")
((samples > 0)) && [[ $lines -eq $samples ]] ||
  fail "$lines sample lines for the $samples samples of the cache entry"
between=' \(below 16384 and from 4194304 B per rank; between, the measured choice\)'
grep -qE "^allReduce single copy$between: (from [0-9]+ B|never)\$" <<<"$out" || fail "no allReduce crossover"
for op in allGather reduceScatter broadcast allToAll; do
  grep -qE "^$op single copy$between: (from [0-9]+ B|never)\$" <<<"$out" || fail "no $op crossover"
done
grep -q '^measured choice: auto times single copy against the slots on 8 calls of each way' <<<"$out" ||
  fail "no measured-choice line (on by default)"
grep -qE '^zero copy \(allocHost buffers\): (available|not available), auto from [0-9]+ B per rank$' <<<"$out" ||
  fail "no zero copy line"
grep -qF "Tuning cache: $cache" <<<"$out" && grep -qF "  $entry" <<<"$out" ||
  fail "the cache file and its entry are not printed"

out=$("$run" -n 2 "$info" --tuning 2>&1) || fail "the second run failed: $out"
echo "$out"
grep -qF "host collectives tuning: cache $cache" <<<"$out" || fail "the second run did not read the cache"
[[ $(grep -c ' B: process_vm_readv ' <<<"$out") -eq $samples ]] || fail "the cached samples are not listed"

out=$(STRATA_COLLECTIVES_TUNING=off "$run" -n 2 "$info" --tuning 2>&1) || fail "tuning = off failed: $out"
echo "$out"
grep -q '^host collectives tuning: collectives.tuning = off' <<<"$out" || fail "tuning = off is not said"
grep -q ' B: process_vm_readv ' <<<"$out" && fail "tuning = off lists samples"
grep -q '^measured choice: off (collectives.tuning = off)$' <<<"$out" || fail "tuning = off still measures calls"
grep -qE '^allReduce single copy: (from [0-9]+ B|never)$' <<<"$out" ||
  fail "tuning = off: the crossover line names the measured choice"
out=$(STRATA_COLLECTIVES_MEASURE_CALLS=0 "$run" -n 2 "$info" --tuning 2>&1) || fail "measure_calls = 0 failed: $out"
grep -q '^measured choice: off (collectives.measure_calls = 0)$' <<<"$out" || fail "measure_calls = 0 is not said"

out=$(XDG_CACHE_HOME=$tmp/empty STRATA_COLLECTIVES_TUNING=cached "$run" -n 2 "$info" --tuning 2>&1) ||
  fail "tuning = cached failed: $out"
echo "$out"
grep -q '^host collectives tuning: collectives.tuning = cached, but the cache has no entry' <<<"$out" ||
  fail "tuning = cached with an empty cache does not say the cache has no entry"
[[ -e $tmp/empty/strata/host-tuning.txt ]] && fail "tuning = cached wrote a cache file"

printf 'garbage\n\x01\x02 not a cache\n' >"$cache"
out=$(STRATA_LOG_LEVEL=warn "$run" -n 2 "$info" --tuning 2>"$tmp/err") ||
  fail "the run with a corrupted cache failed: $out $(cat "$tmp/err")"
echo "$out"
cat "$tmp/err"
grep -q 'host tuning cache ignored' "$tmp/err" || fail "no warning on stderr about the corrupted cache"
grep -q '^host collectives tuning: measured at create' <<<"$out" ||
  fail "a corrupted cache did not lead to a fresh measurement"
grep -q '^cpu=' "$cache" && ! grep -q garbage "$cache" || fail "the cache was not rewritten: $(cat "$cache")"
if [[ -n $perf ]]; then
  # Rank 1 sets the key to its default value; rank 0 leaves it. Before rank 0's answer was
  # broadcast, rank 1 took single copy from 16 KiB while rank 0 measured, and the first call
  # failed on a mismatch.
  # shellcheck disable=SC2016  # expanded by the inner bash
  out=$("$run" -n 2 bash -c '[[ $STRATA_RANK == 1 ]] && export STRATA_COLLECTIVES_SINGLE_COPY_MIN_BYTES=16384
    exec "$0" allgather -b 32K -e 32K -n 40 -w 2 -c 1' "$perf" 2>&1) ||
    fail "ranks with single_copy_min_bytes from different sources failed: $out"
  grep -q 'Out of bounds values : 0 OK' <<<"$out" || fail "wrong results: $out"
fi
echo "PASS"
