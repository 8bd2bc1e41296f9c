#!/usr/bin/env bash
# Runs every libFuzzer target of a fuzz build for a bounded time, each from a copy of its seed
# corpus (the repository is never modified), and fails if any target finds a crash, a failed
# check, a leak or a timeout. Prints per target: runs, exec/s, coverage and corpus size; for a
# failure, the libFuzzer report and the crashing input as hex.
#
# Usage: tests/fuzz/run-fuzzers.sh BUILD_DIR SECONDS_PER_TARGET [TARGET...]
#   BUILD_DIR   a build configured with CC=clang CXX=clang++ -Dfuzz=enabled, after
#               `ninja -C BUILD_DIR fuzz-targets`
#   TARGET      e.g. fuzz-hostlist (default: every tests/fuzz/fuzz-* binary of BUILD_DIR)
# Environment: FUZZ_KEEP=DIR keeps the work directories (grown corpora, crash inputs) in DIR;
# FUZZ_JOBS=N runs N targets at a time (default 1).
set -u -o pipefail

if [[ $# -lt 2 ]]; then
  echo "usage: $0 BUILD_DIR SECONDS_PER_TARGET [TARGET...]" >&2
  exit 2
fi
build=$1
seconds=$2
shift 2
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

targets=("$@")
if [[ ${#targets[@]} -eq 0 ]]; then
  for bin in "$build"/tests/fuzz/fuzz-*; do
    [[ -x $bin && -f $bin ]] || continue
    targets+=("$(basename "$bin")")
  done
fi
if [[ ${#targets[@]} -eq 0 ]]; then
  echo "run-fuzzers: no fuzz targets in $build/tests/fuzz (configure with CC=clang CXX=clang++" \
       "-Dfuzz=enabled, then ninja -C $build fuzz-targets)" >&2
  exit 2
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/strata-fuzz.XXXXXX")
cleanup() {
  if [[ -n ${FUZZ_KEEP:-} ]]; then
    mkdir -p "$FUZZ_KEEP" && cp -r "$work"/. "$FUZZ_KEEP"/ && echo "run-fuzzers: kept in $FUZZ_KEEP"
  fi
  rm -rf "$work"
}
trap cleanup EXIT

# UBSan reports must fail the run; ASan's leak check is on (a decoder must not leak).
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}

run_one() {  # target -> writes $work/<target>.status
  local t=$1
  local name=${t#fuzz-}
  local dir=$work/$t
  mkdir -p "$dir/corpus" "$dir/artifacts"
  if [[ -d $here/corpus/$name ]]; then
    cp -r "$here/corpus/$name"/. "$dir/corpus"/
  fi
  if [[ -d $here/regressions/$name ]]; then
    cp -r "$here/regressions/$name"/. "$dir/corpus"/
  fi
  local rc=0
  # -timeout: one input taking 10 s is a hang; the outer timeout bounds the whole run.
  timeout --kill-after=10 $((seconds + 60)) "$build/tests/fuzz/$t" \
    -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=4096 \
    -print_final_stats=1 -artifact_prefix="$dir/artifacts/" "$dir/corpus" \
    >"$dir/log" 2>&1 || rc=$?
  echo "$rc" >"$dir/status"
}

failed=()
jobs_max=${FUZZ_JOBS:-1}
for t in "${targets[@]}"; do
  if [[ ! -x $build/tests/fuzz/$t ]]; then
    echo "run-fuzzers: $build/tests/fuzz/$t is missing" >&2
    failed+=("$t")
    continue
  fi
  run_one "$t" &
  while [[ $(jobs -rp | wc -l) -ge $jobs_max ]]; do wait -n; done
done
wait

printf '%-24s %-6s %10s %8s %7s %6s %7s\n' target result runs exec/s cov ft corpus
for t in "${targets[@]}"; do
  dir=$work/$t
  [[ -f $dir/status ]] || continue
  rc=$(cat "$dir/status")
  log=$dir/log
  fstat() { sed -n "s/^stat::$1: *//p" "$log" | tail -1; }
  runs=$(fstat number_of_executed_units)
  eps=$(fstat average_exec_per_sec)
  # The last status line: "#N DONE cov: C ft: F corp: K/..."
  last=$(grep -E '^#[0-9]+' "$log" | tail -1)
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
  corp=$(sed -n 's/.* corp: \([0-9]*\).*/\1/p' <<<"$last")
  result=ok
  [[ $rc -ne 0 ]] && result=FAILED
  printf '%-24s %-6s %10s %8s %7s %6s %7s\n' "$t" "$result" "${runs:-?}" "${eps:-?}" \
    "${cov:-?}" "${ft:-?}" "${corp:-?}"
  if [[ $rc -ne 0 ]]; then
    failed+=("$t")
  fi
done

for t in "${failed[@]}"; do
  dir=$work/$t
  echo
  echo "==================== $t FAILED (exit status $(cat "$dir/status" 2>/dev/null || echo ?)) ===================="
  if [[ -f $dir/log ]]; then
    # The report: from the first sanitizer/libFuzzer error line to the end (bounded).
    start=$(grep -nE '^==[0-9]+==|ERROR: libFuzzer|fuzz check failed|runtime error|deadly signal|Test unit written' "$dir/log" | head -1 | cut -d: -f1)
    tail -n +"${start:-1}" "$dir/log" | head -n 80
  fi
  for a in "$dir"/artifacts/*; do
    [[ -f $a ]] || continue
    echo "--- input $(basename "$a") ($(stat -c %s "$a") bytes), as hex:"
    od -An -tx1 -v "$a" | head -n 64
    echo "--- to reproduce: $build/tests/fuzz/$t <file>; to keep it as a regression input:" \
         "cp it to tests/fuzz/regressions/${t#fuzz-}/"
  done
done

echo
if [[ ${#failed[@]} -ne 0 ]]; then
  echo "run-fuzzers: FAILED: ${failed[*]}"
  exit 1
fi
echo "run-fuzzers: ${#targets[@]} targets, ${seconds} s each, no failure"
