#!/usr/bin/env bash
# Smoke test of strata-perf's collective modes: every op at 2 and 3 ranks over a few sizes with
# -c 1 exits 0, prints nccl-tests' column header, 0 wrong elements per row and the trailer, and
# writes matching JSON lines; -d all -o all once; bad flags exit 2 with a message. No timing is
# checked.
#
# Usage: test_perf_coll.sh STRATA_RUN STRATA_PERF
set -uo pipefail
run=$1 perf=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export STRATA_BOOTSTRAP_TCP_INTERFACE=lo FI_TCP_IFACE=lo
fail() { echo "FAIL: $*"; exit 1; }

# Rows: size count type redop root, then time algbw busbw #wrong twice (out-of-place, in-place).
check_rows() {  # OUT OP EXPECTED_ROWS
  local out=$1 op=$2 want=$3 rows
  rows=$(awk '$1 ~ /^[0-9]+$/' <<<"$out")
  [[ $(wc -l <<<"$rows") -eq $want ]] || fail "$op: expected $want rows"
  awk 'NF != 13 { exit 1 }' <<<"$rows" || fail "$op: a row has not 13 columns"
  awk '$9 != "0" || ($13 != "0" && $13 != "N/A") { exit 1 }' <<<"$rows" || fail "$op: wrong elements"
  grep -q '^#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong$' <<<"$out" ||
    fail "$op: no nccl-tests column header"
  grep -q '^#                                                              out-of-place                       in-place' <<<"$out" ||
    fail "$op: no out-of-place / in-place header"
  grep -q '^# nThread 1 nGpus 1 minBytes ' <<<"$out" || fail "$op: no '# nThread' line"
  grep -q '^# Using devices$' <<<"$out" || fail "$op: no '# Using devices'"
  grep -q '^# Out of bounds values : 0 OK$' <<<"$out" || fail "$op: no '# Out of bounds values : 0 OK'"
  grep -q '^# Avg bus bandwidth    : ' <<<"$out" || fail "$op: no '# Avg bus bandwidth'"
}

for n in 2 3; do
  for op in allreduce allgather reducescatter broadcast alltoall sendrecv; do
    out=$(timeout 120 "$run" -n "$n" "$perf" "$op" -b 8 -e 64K -f 32 -n 5 -w 1 -c 1 -r $((n - 1)) \
      --json "$work/$op.$n.json" 2>&1)
    rc=$?
    echo "$out"
    [[ $rc -eq 0 ]] || fail "strata-perf $op with $n ranks exited $rc"
    check_rows "$out" "$op" 4
    [[ $(grep -c "Rank .* host memory" <<<"$out") -eq $n ]] || fail "$op: '# Using devices' does not list $n ranks"
    root=-1
    [[ $op == broadcast ]] && root=$((n - 1))
    awk -v r="$root" '$1 ~ /^[0-9]+$/ && $5 != r { exit 1 }' <<<"$out" || fail "$op: root column is not $root"
    lines=8
    [[ $op == alltoall || $op == sendrecv ]] && lines=4  # no in-place form: no JSON line for it
    [[ $(wc -l <"$work/$op.$n.json") -eq $lines ]] || { cat "$work/$op.$n.json"; fail "$op: expected $lines JSON lines"; }
    grep -v -q "^{\"tool\":\"strata-perf\",\"label\":\"strata\",\"op\":\"$op\",\"nranks\":$n,\"backend\":\"[a-z]*\",\"memory\":\"host\",\"size\":[0-9]*,\"count\":[0-9]*,\"type\":\"float\",\"redop\":\"[a-z]*\",\"root\":$root,\"algorithm\":\"host/[a-z]*\",\"inplace\":\(true\|false\),\"time_us\":[0-9.]*,\"algbw\":[0-9.]*,\"busbw\":[0-9.]*,\"wrong\":0}$" "$work/$op.$n.json" &&
      { cat "$work/$op.$n.json"; fail "$op: a JSON line does not match the schema"; }
  done
done

# Every type and every reduction (10 x 5 x 2 sizes).
out=$(timeout 300 "$run" -n 2 "$perf" allreduce -b 8 -e 1K -f 128 -n 2 -w 1 -d all -o all 2>&1)
rc=$?
echo "$out" | tail -5
[[ $rc -eq 0 ]] || { echo "$out"; fail "allreduce -d all -o all exited $rc"; }
check_rows "$out" "allreduce -d all -o all" 100
for t in int8 uint8 int32 uint32 int64 uint64 half float double bfloat16; do
  for o in sum prod min max avg; do
    [[ $(awk -v t="$t" -v o="$o" '$3 == t && $4 == o' <<<"$out" | wc -l) -eq 2 ]] || fail "no rows for $t $o"
  done
done

# -c 0: '#wrong' is N/A, the JSON says null.
out=$(timeout 60 "$run" -n 2 "$perf" reducescatter -b 1K -e 1K -n 2 -w 1 -c 0 --json - 2>"$work/table")
rc=$?
[[ $rc -eq 0 ]] || fail "-c 0 exited $rc"
awk '$1 ~ /^[0-9]+$/ { print $9, $13 }' "$work/table" | grep -qx 'N/A N/A' || { cat "$work/table"; fail "-c 0 should print N/A"; }
grep -q '"wrong":null}$' <<<"$out" || fail "-c 0 should give \"wrong\":null"

# Bad flags: exit 2 with a message, in every rank.
expect_usage() {  # PATTERN ARGS...
  local pattern=$1 out rc
  shift
  out=$(timeout 60 "$run" -n 2 "$perf" "$@" 2>&1)
  rc=$?
  echo "$out"
  grep -q "exited with status 2" <<<"$out" || fail "'$*' should exit 2 (strata-run rc $rc)"
  grep -q -- "$pattern" <<<"$out" || fail "'$*' should say '$pattern'"
}
expect_usage "unknown data type 'foo'" allreduce -d foo
expect_usage "unknown reduction 'mean'" allreduce -o mean
expect_usage "--root 7 is not a rank of this job" broadcast -r 7 -b 8 -e 8
expect_usage "not both" allgather -i 8 -f 2
"$perf" allreduce -c 2 >/dev/null 2>&1
[[ $? -eq 2 ]] || fail "-c 2 should exit 2"
echo ok
