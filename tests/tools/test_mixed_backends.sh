#!/usr/bin/env bash
# Ranks started with different bootstrap backends fail together with a message that names both,
# instead of hanging until a timeout. Rank 0 runs FIRST, the others SECOND.
#
# Usage: test_mixed_backends.sh STRATA_RUN STRATA_PERF FIRST SECOND
set -uo pipefail
run=$1 perf=$2 first=$3 second=$4
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat >"$work/rank.sh" <<EOS
#!/usr/bin/env bash
if [[ \$STRATA_RANK == 0 ]]; then export STRATA_BOOTSTRAP_BACKEND=$first; else export STRATA_BOOTSTRAP_BACKEND=$second; fi
exec "$perf" bootstrap --ops barrier -n 5 -w 1
EOS
chmod +x "$work/rank.sh"
start=$SECONDS
out=$(STRATA_BOOTSTRAP_CONNECT_TIMEOUT=30 UCX_TLS=${UCX_TLS:-tcp,self} timeout 60 "$run" -n 3 --grace 5 "$work/rank.sh" 2>&1)
rc=$?
echo "$out"
took=$((SECONDS - start))
[[ $rc -ne 0 && $rc -ne 124 ]] || { echo "FAIL: expected a clean failure, got exit $rc"; exit 1; }
grep -q "rank 0: error InvalidConfig.*disagree on bootstrap backend: rank 0 has '$first', rank [12] has '$second'" <<<"$out" ||
  { echo "FAIL: rank 0 did not name the mismatch"; exit 1; }
grep -q "rank [12]: error InvalidConfig.*disagree on bootstrap backend" <<<"$out" ||
  { echo "FAIL: the other ranks did not get the same message"; exit 1; }
(( took < 20 )) || { echo "FAIL: took ${took}s: the mismatch should fail at once"; exit 1; }
echo "ok (${took}s)"
