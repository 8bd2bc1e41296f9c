#!/usr/bin/env bash
# Ranks started with different bootstrap backends (or another setting that selects an algorithm)
# fail together with a message that names both values, instead of hanging until a timeout.
# Rank 0 gets FIRST, the others SECOND, in the environment variable VAR. LATE (root or others)
# starts that side 1.5 s after the other, so both orders of arrival are covered whatever the
# machine's speed.
#
# Usage: test_mixed_backends.sh STRATA_RUN STRATA_PERF FIRST SECOND [VAR] [LATE]
set -uo pipefail
run=$1 perf=$2 first=$3 second=$4 var=${5:-STRATA_BOOTSTRAP_BACKEND} late=${6:-}
case $late in
  '') rootDelay=0 othersDelay=0 ;;
  root) rootDelay=1.5 othersDelay=0 ;;
  others) rootDelay=0 othersDelay=1.5 ;;
  *) echo "test_mixed_backends.sh: LATE must be root or others, not '$late'" >&2; exit 2 ;;
esac
case $var in
  STRATA_BOOTSTRAP_BACKEND) what="bootstrap backend" ;;
  *) what=$(tr 'A-Z_' 'a-z.' <<<"${var#STRATA_}") ;;
esac
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat >"$work/rank.sh" <<EOS
#!/usr/bin/env bash
if [[ \$STRATA_RANK == 0 ]]; then export $var=$first; sleep $rootDelay; else export $var=$second; sleep $othersDelay; fi
exec "$perf" bootstrap --ops barrier -n 5 -w 1
EOS
chmod +x "$work/rank.sh"
start=$SECONDS
out=$(STRATA_BOOTSTRAP_CONNECT_TIMEOUT=30 UCX_TLS=${UCX_TLS:-tcp,self} timeout 60 "$run" -n 3 --grace 5 "$work/rank.sh" 2>&1)
rc=$?
echo "$out"
took=$((SECONDS - start))
[[ $rc -ne 0 && $rc -ne 124 ]] || { echo "FAIL: expected a clean failure, got exit $rc"; exit 1; }
grep -q "rank 0: error InvalidConfig.*disagree on $what: rank 0 has '$first', rank [12] has '$second'" <<<"$out" ||
  { echo "FAIL: rank 0 did not name the mismatch"; exit 1; }
grep -q "rank [12]: error InvalidConfig.*disagree on $what" <<<"$out" ||
  { echo "FAIL: the other ranks did not get the same message"; exit 1; }
(( took < 20 )) || { echo "FAIL: took ${took}s: the mismatch should fail at once"; exit 1; }
echo "ok (${took}s)"
