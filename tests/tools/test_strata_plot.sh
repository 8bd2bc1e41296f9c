#!/usr/bin/env bash
# strata-plot turns JSON lines of two runs (hand-written, in strata-perf's schema, mixed with a
# table and junk lines) into a PNG; no usable rows is a clear error; --help works. Skipped (77)
# without matplotlib.
#
# Usage: test_strata_plot.sh STRATA_PLOT
set -uo pipefail
plot=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# strata-plot falls back to /usr/bin/python3 (Debian's matplotlib) when the python3 on PATH lacks it.
if ! python3 -c 'import matplotlib' 2>/dev/null && ! /usr/bin/python3 -c 'import matplotlib' 2>/dev/null; then
  echo "SKIP: matplotlib is not installed (Debian: python3-matplotlib)"
  exit 77
fi

row() {  # LABEL NRANKS SIZE BUSBW INPLACE
  printf '{"tool":"strata-perf","label":"%s","op":"allreduce","nranks":%d,"backend":"tcp","memory":"host","size":%d,"count":%d,"type":"float","redop":"sum","root":-1,"inplace":%s,"time_us":10.0,"algbw":%s,"busbw":%s,"wrong":0}\n' \
    "$1" "$2" "$3" $(($3 / 4)) "$5" "$4" "$4"
}
{
  echo "# a table line that is not JSON"
  for s in 8 64 512 4096 32768 262144 2097152; do row strata 2 "$s" "0.$s" false; row strata 2 "$s" "0.$s" true; done
  echo '{"tool":"strata-perf","op":"allreduce"}'
  echo '[1, 2, 3]'
} >"$work/a.json"
{
  for s in 8 64 512 4096 32768 262144 2097152; do
    printf '{"tool":"openmpi","op":"allreduce","nranks":2,"size":%d,"count":%d,"type":"float","redop":"sum","root":-1,"inplace":false,"time_us":12.5,"algbw":1.5,"busbw":1.5,"wrong":0}\n' "$s" $((s / 4))
  done
  echo 'not json {'
} >"$work/b.json"

"$plot" --help | grep -q -- '--metric' || fail "--help does not list --metric"

out=$("$plot" -o "$work/out.png" --title "test plot" "$work/a.json" "$work/b.json" 2>&1)
rc=$?
echo "$out"
[[ $rc -eq 0 ]] || fail "strata-plot exited $rc"
[[ -s $work/out.png ]] || fail "no PNG written"
[[ $(head -c 4 "$work/out.png" | od -An -c | tr -d ' ') == '211PNG' ]] || fail "out.png is not a PNG"
grep -q '2 lines, 14 rows' <<<"$out" || fail "expected 2 lines from 14 rows: $out"

"$plot" -o "$work/in.png" --inplace --metric time_us --op allreduce "$work/a.json" || fail "--inplace --metric time_us failed"
[[ $(head -c 4 "$work/in.png" | od -An -c | tr -d ' ') == '211PNG' ]] || fail "in.png is not a PNG"

# No usable rows: exit 1 with a message that says what is needed.
echo "# nothing here" >"$work/empty.json"
out=$("$plot" -o "$work/none.png" "$work/empty.json" 2>&1)
rc=$?
echo "$out"
[[ $rc -eq 1 ]] || fail "no rows should exit 1, got $rc"
grep -q 'no rows to plot' <<<"$out" || fail "no rows: no clear message"
[[ ! -e $work/none.png ]] || fail "a PNG was written without rows"
out=$("$plot" -o "$work/none.png" --op broadcast "$work/a.json" 2>&1)
[[ $? -eq 1 ]] || fail "--op with no matching rows should exit 1"
"$plot" --metric nope "$work/a.json" >/dev/null 2>&1
[[ $? -eq 2 ]] || fail "a bad --metric should exit 2"
echo ok
