#!/usr/bin/env bash
# Smoke test of strata-perf p2p: it runs over one transport, prints the table with a row per size
# and 0 wrong bytes, and writes matching JSON lines. No timing is checked.
#
# Usage: test_perf_p2p.sh STRATA_RUN STRATA_PERF TRANSPORT [PROVIDER [NRANKS]]
#   TRANSPORT shm|fabric; PROVIDER for fabric (transport.fabric.provider), "-" for none;
#   NRANKS (default 2): ranks beyond 1 only wait in the barriers.
set -uo pipefail
run=$1 perf=$2 transport=$3 provider=${4:--} nranks=${5:-2}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
[[ $provider != - ]] && export STRATA_TRANSPORT_FABRIC_PROVIDER=$provider
export STRATA_BOOTSTRAP_TCP_INTERFACE=lo FI_TCP_IFACE=lo

out=$(timeout 120 "$run" -n "$nranks" "$perf" p2p --transport "$transport" -b 8 -e 64K \
  --json "$work/rows.json" 2>&1)
rc=$?
echo "$out"
[[ $rc -eq 0 ]] || { echo "FAIL: strata-perf p2p exited $rc"; exit 1; }
grep -q "^# transport: $transport " <<<"$out" || { echo "FAIL: no '# transport: $transport' header"; exit 1; }
if [[ $provider != - ]]; then
  grep -q "provider: $provider" <<<"$out" || { echo "FAIL: the header does not name provider $provider"; exit 1; }
fi
grep -q '#wrong' <<<"$out" || { echo "FAIL: no column header"; exit 1; }
for size in 8 64 512 4096 32768 65536; do
  # size count iters time bw lat p99 #wrong
  row=$(awk -v s="$size" '$1 == s && $2 == s' <<<"$out")
  [[ -n $row ]] || { echo "FAIL: no row for $size B"; exit 1; }
  [[ $(awk '{ print NF }' <<<"$row") -eq 8 ]] || { echo "FAIL: row for $size B has not 8 columns: $row"; exit 1; }
  [[ $(awk '{ print $8 }' <<<"$row") == 0 ]] || { echo "FAIL: wrong bytes at $size B: $row"; exit 1; }
  grep -q "\"mode\":\"p2p\",\"transport\":\"$transport\",.*\"bytes\":$size,.*\"wrong\":0}" "$work/rows.json" ||
    { echo "FAIL: no JSON line for $size B"; cat "$work/rows.json"; exit 1; }
done
[[ $(wc -l <"$work/rows.json") -eq 6 ]] || { echo "FAIL: expected 6 JSON lines"; cat "$work/rows.json"; exit 1; }
grep -q '^# wrong results: 0$' <<<"$out" || { echo "FAIL: no '# wrong results: 0' footer"; exit 1; }

# -c 0: no check, '#wrong' is N/A and the JSON says null.
out=$(timeout 60 "$run" -n 2 "$perf" p2p --transport "$transport" -b 4K -e 4K -n 10 -w 1 -c 0 \
  --json - 2>"$work/table")
rc=$?
cat "$work/table"
echo "$out"
[[ $rc -eq 0 ]] || { echo "FAIL: strata-perf p2p -c 0 exited $rc"; exit 1; }
awk '$1 == 4096 { print $8 }' "$work/table" | grep -qx 'N/A' || { echo "FAIL: -c 0 should print N/A"; exit 1; }
grep -q '"wrong":null' <<<"$out" || { echo "FAIL: -c 0 should give \"wrong\":null"; exit 1; }
echo ok
