#!/usr/bin/env bash
# The GPU bundle without a GPU (docs/testing.md, "GPU check"): tools/dev/gpu-bundle.sh packs this
# build's GPU programs; the bundle must be under 64 MiB, every library its programs and modules
# load must resolve inside it or be glibc's (checked with a search path of the bundle only: none
# of this machine's -dev libraries may be needed), and tools/dev/gpu-check.sh --bundle must run
# from it up to its first GPU step and stop there with exit 77 and the reason.
# Usage: bundle_check.sh SOURCE_ROOT BUILD_ROOT
set -uo pipefail
src=$1 build=$2
tmp=$(mktemp -d "${TMPDIR:-/tmp}/strata-bundle.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$src/tools/dev/gpu-bundle.sh" --build "$build" --no-build "$tmp/bundle" || fail "gpu-bundle.sh failed"
b=$tmp/bundle
size=$(du -sb "$b" | cut -f1)
echo "bundle: $size bytes"
[ "$size" -lt $((64 * 1024 * 1024)) ] || fail "the bundle is $size bytes, over 64 MiB"

# Every dependency of every program and module, with the bundle's lib/ as the only search path
# (env -i: no LD_LIBRARY_PATH of the test environment, no build-tree RPATH helps: the copies
# are stripped of nothing but symbols, so check what the RPATH would find too).
bad=0
while read -r f; do
  while read -r line; do
    case $line in
      *"not found"*) echo "$f: $line"; bad=1 ;;
      *"=> /"*)
        path=$(awk '{print $3}' <<<"$line")
        name=$(basename "$path")
        case $name in
          libc.so.*|libm.so.*|libdl.so.*|libpthread.so.*|librt.so.*|libresolv.so.*|libutil.so.*|ld-linux*) ;;
          *) case $path in "$b"/lib/*) ;; *) echo "$f: $name resolves outside the bundle ($path)"; bad=1 ;; esac ;;
        esac ;;
    esac
  done < <(env -i LD_LIBRARY_PATH="$b/lib" ldd "$f" 2>&1)
done < <(find "$b/bin" "$b/lib" -type f \( -perm -u+x -o -name '*.so*' \))
[ $bad = 0 ] || fail "the bundle does not carry every library its files load"

# Up to the first step that needs a GPU: exit 77 with the reason (this machine has no GPU; a
# machine with one would run the check instead, which is not this test's business).
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  echo "a GPU is visible here: the check itself is not run by this test"
  exit 0
fi
out=$(env -i PATH=/usr/bin:/bin HOME="$tmp" "$src/tools/dev/gpu-check.sh" --bundle "$b" 2>&1)
rc=$?
echo "$out"
[ $rc -eq 77 ] || fail "gpu-check.sh --bundle exited $rc, expected 77 (no GPU)"
grep -q "no NVIDIA GPU here\|no usable CUDA device" <<<"$out" || fail "gpu-check.sh gave no reason"
# strata-info --check ran from the bundle before that: the topology and the nvlink module's line.
logs=$(find "$tmp" -name preflight.log 2>/dev/null | head -1)
pre=$( [ -n "$logs" ] && cat "$logs"; echo "$out")
grep -q "topology: this machine" <<<"$pre" || fail "strata-info --check did not run from the bundle"
grep -q " CUDA: " <<<"$pre" || fail "strata-info --check printed no line of the bundle's nvlink module"
echo "PASS: bundle of $size bytes, every library inside, gpu-check stops at preflight (77)"
