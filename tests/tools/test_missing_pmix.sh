#!/usr/bin/env bash
# With libpmix absent at run time, tcp still works and asking for pmix is a clear error that
# names the missing library. libpmix is hidden from this test only, by bind-mounting an empty
# directory over its directory inside a private mount namespace (needs root and unshare).
#
# Usage: test_missing_pmix.sh STRATA_INFO STRATA_RUN STRATA_PERF PMIX_MODULE_DIR
set -uo pipefail
info=$1 run=$2 perf=$3 moddir=$4

skip() { echo "SKIP: $*"; exit 77; }
[[ -e $moddir/strata-bootstrap-pmix.so ]] || skip "the pmix module was not built"
[[ $(id -u) -eq 0 ]] || skip "needs root for a private mount namespace"
command -v unshare >/dev/null || skip "unshare not found"
libdir=$(ldd "$moddir/strata-bootstrap-pmix.so" | sed -n 's/.*libpmix[^ ]* => \(.*\)\/libpmix[^/]*(.*/\1/p' | head -n1)
[[ -n $libdir && -d $libdir ]] || skip "cannot find libpmix's directory from ldd"
unshare -m true 2>/dev/null || skip "unshare -m is not permitted here"

empty=$(mktemp -d)
trap 'rmdir "$empty"' EXIT
export STRATA_MODULE_PATH=$moddir STRATA_BOOTSTRAP_TCP_INTERFACE=lo

# Everything below runs with libpmix hidden.
unshare -m bash -s "$empty" "$libdir" "$info" "$run" "$perf" <<'EOS'
set -uo pipefail
empty=$1 libdir=$2 info=$3 run=$4 perf=$5
mount --make-rprivate / 2>/dev/null
mount --bind "$empty" "$libdir" || { echo "SKIP: bind mount failed"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }

out=$("$info" 2>&1) || fail "strata-info failed: $out"
line=$(grep -E '^ +pmix ' <<<"$out")
echo "strata-info: $line"
[[ $line == *missing* && $line == *libpmix* ]] || fail "pmix is not listed as missing with the library named"

# tcp still works.
STRATA_BOOTSTRAP_BACKEND=tcp "$run" -n 2 "$perf" bootstrap --ops barrier -n 20 -w 2 >/dev/null 2>&1 ||
  fail "tcp bootstrap failed with libpmix absent"

# pmix: a clear error naming the missing library, on every rank, and no hang.
err=$(STRATA_BOOTSTRAP_BACKEND=pmix timeout 60 "$run" -n 2 "$perf" bootstrap --ops barrier -n 2 2>&1)
rc=$?
echo "$err" | head -n 3
[[ $rc -ne 0 && $rc -ne 124 ]] || fail "asking for pmix did not fail cleanly (exit $rc)"
grep -q 'NotSupported' <<<"$err" || fail "the error is not NotSupported"
grep -q 'libpmix' <<<"$err" || fail "the error does not name libpmix"
echo "ok"
EOS
