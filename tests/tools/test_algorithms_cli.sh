#!/usr/bin/env bash
# strata-info --algorithms lists the host backend's algorithms with what they accept; strata-perf
# -a forces one (header and rows say which ran), and a forced name that cannot serve the call
# or does not exist for the op fails with NotSupported / InvalidConfig naming it.
#
#   test_algorithms_cli.sh STRATA_INFO STRATA_RUN STRATA_PERF
set -u
info=$1 run=$2 perf=$3
fail() { echo "FAIL: $*"; exit 1; }

out=$("$info" --algorithms 2>&1) || fail "strata-info --algorithms failed: $out"
echo "$out"
for a in zerocopy oneshot hierarchical twoshot singlecopy direct; do
  grep -q "^  host/$a\$" <<<"$out" || fail "host/$a is not listed"
done
grep -q '^    ops: *allReduce, allGather, reduceScatter, broadcast, allToAll$' <<<"$out" ||
  fail "singlecopy's ops are not listed"
out=$(STRATA_COLLECTIVES_ALGORITHM=twoshot "$info" --algorithms 2>&1) || fail "$out"
grep -q 'forced by the configuration for: allReduce' <<<"$out" || fail "the forced algorithm is not marked"

out=$("$run" -n 2 "$perf" allreduce -a twoshot -b 1K -e 64K -f 8 2>&1) ||
  fail "strata-perf -a twoshot failed: $out"
echo "$out"
grep -q '^# algorithm: twoshot (forced with -a' <<<"$out" || fail "the header does not name the forced algorithm"
grep -q '^# algorithm: host/twoshot$' <<<"$out" || fail "the rows do not say host/twoshot ran"
grep -q '^# algorithm: host/oneshot' <<<"$out" && fail "oneshot ran although twoshot was forced"

out=$(STRATA_COLLECTIVES_ZERO_COPY_MIN_BYTES=2M "$run" -n 2 "$perf" allreduce -b 2K -e 2M -f 8 2>&1) ||
  fail "strata-perf (auto) failed: $out"
grep -q '^# algorithm: auto' <<<"$out" || fail "the header does not say auto"
grep -q '^# algorithm: host/oneshot$' <<<"$out" || fail "auto did not run oneshot at 2 KiB"
grep -q '^# algorithm: host/twoshot$' <<<"$out" || fail "auto did not run twoshot at 1 MiB"
# From collectives.zero_copy_min_bytes zerocopy takes the call; malloc'ed buffers run what auto
# would have chosen, and the row says which; after 8 such calls in a row auto asks zerocopy only
# every 64th call; allocHost buffers are read in place.
out=$(STRATA_COLLECTIVES_ZERO_COPY_MIN_BYTES=1M "$run" -n 2 "$perf" allreduce -b 1M -e 1M -n 1 -w 0 2>&1) ||
  fail "strata-perf (zerocopy on malloc) failed: $out"
grep -q '^# algorithm: host/zerocopy (twoshot: not every buffer is allocHost memory)$' <<<"$out" ||
  fail "auto did not say zerocopy fell back to twoshot at 1 MiB"
out=$(STRATA_COLLECTIVES_ZERO_COPY_MIN_BYTES=1M "$run" -n 2 "$perf" allreduce -b 1M -e 1M -n 20 -w 0 2>&1) ||
  fail "strata-perf (zerocopy backing off) failed: $out"
grep -q '^# algorithm: host/twoshot$' <<<"$out" || fail "auto kept asking zerocopy after 8 fallbacks"
out=$("$run" -n 2 "$perf" allreduce --alloc allochost -b 1M -e 1M 2>&1) ||
  fail "strata-perf --alloc allochost failed: $out"
grep -q '^# algorithm: host/zerocopy (mapped)$' <<<"$out" || fail "allocHost buffers were not read in place"

out=$("$run" -n 2 "$perf" allreduce -a hierarchical -b 1K -e 1K 2>&1) && fail "hierarchical on one host ran: $out"
echo "$out"
grep -q 'NotSupported.*host/hierarchical.*several hosts' <<<"$out" || fail "no NotSupported naming host/hierarchical"

out=$("$run" -n 2 "$perf" allgather -a oneshot -b 1K -e 1K 2>&1) && fail "allgather -a oneshot ran: $out"
echo "$out"
grep -q 'InvalidConfig.*collectives.allgather.algorithm = oneshot.*choices: auto, host/zerocopy, host/singlecopy, host/direct' <<<"$out" ||
  fail "no InvalidConfig naming the allGather choices"
# The 4096-byte chunk floor overrides a collectives.buffer_bytes too small for the rank count:
# said once at create (rank 0), and the collectives still run.
out=$(STRATA_COLLECTIVES_BUFFER_BYTES=65536 "$run" -n 8 "$perf" allreduce -b 64K -e 64K 2>&1) ||
  fail "strata-perf with a small buffer failed: $out"
echo "$out"
[[ $(grep -c 'collectives.buffer_bytes = 65536 is too small for 8 ranks' <<<"$out") -eq 1 ]] ||
  fail "the chunk floor is not reported once"
# The CUDA module (where it was built) checks that every rank has the same collectives.cuda.*:
# with one rank off, create fails on every rank with InvalidConfig naming the key and the rank.
if grep -q '^  cuda/direct-staged$' <<<"$(STRATA_CONFIG=/dev/null/none "$info" --algorithms 2>&1)"; then
  out=$("$run" -n 2 bash -c 'if [ "$STRATA_RANK" = 1 ]; then export STRATA_COLLECTIVES_CUDA_STAGING_BYTES=4M; fi; exec "$0" "$@"' \
    "$perf" allreduce -b 1K -e 1K 2>&1) && fail "ranks with different collectives.cuda.staging_bytes ran: $out"
  echo "$out"
  grep -q 'InvalidConfig.*ranks disagree on collectives.cuda.staging_bytes: rank 0 has 8388608, rank 1 has 4194304' <<<"$out" ||
    fail "no InvalidConfig naming collectives.cuda.staging_bytes and rank 1"
fi
echo "PASS"
