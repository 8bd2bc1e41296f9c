#!/usr/bin/env bash
# The fuzz step of .ci/run, also runnable alone: configures a clang build directory with only
# what the fuzz targets need, builds them (`ninja fuzz-targets`: the decoder sources and the
# targets, nothing else), and runs each for a bounded time (run-fuzzers.sh).
#
# Usage: tests/fuzz/ci-fuzz.sh [BUILD_DIR [SECONDS_PER_TARGET]]   (default build-fuzz 20)
# Environment: FUZZ_JOBS (targets at a time, default one per CPU: each target is one
# single-threaded libFuzzer process that runs for its seconds whatever else runs), FUZZ_KEEP
# (see run-fuzzers.sh).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."
build=${1:-build-fuzz}
seconds=${2:-20}

for tool in clang clang++; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "ci-fuzz: $tool not found; install clang and libclang-rt-14-dev (tools/dev/install-deps.sh)" >&2
    exit 1
  fi
done

t=$SECONDS
if [[ ! -f $build/build.ninja ]]; then
  # Only the fuzz targets are built, so the optional dependencies are switched off: the fuzz
  # build needs fmt, toml++ and libcrypto, like the core.
  CC=clang CXX=clang++ meson setup "$build" -Dfuzz=enabled -Dcuda=disabled -Dtorch=disabled \
    -Dpmix=disabled -Ducx=disabled -Dlibfabric=disabled >"$build.setup.log" 2>&1 || {
    cat "$build.setup.log" >&2
    exit 1
  }
  rm -f "$build.setup.log"
fi
ninja -C "$build" fuzz-targets
echo "ci-fuzz: configured and built in $((SECONDS - t)) s"

if [[ -z ${FUZZ_JOBS:-} ]]; then
  FUZZ_JOBS=$(nproc)
  ((FUZZ_JOBS >= 1)) || FUZZ_JOBS=1
  export FUZZ_JOBS
fi
t=$SECONDS
tests/fuzz/run-fuzzers.sh "$build" "$seconds"
echo "ci-fuzz: fuzzed in $((SECONDS - t)) s ($FUZZ_JOBS at a time)"
