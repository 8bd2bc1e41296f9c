#!/usr/bin/env bash
# Configures (if needed), builds and tests strata, with the local Slurms for the `slurm` and
# `slurm-multinode` suites.
#
# Usage: tools/dev/run-tests.sh [BUILD_DIR] [MESON_TEST_ARGS...]
#   BUILD_DIR defaults to `build`; the remaining arguments go to `meson test`, e.g.
#   tools/dev/run-tests.sh build --suite unit
#
# Environment:
#   MESON_SETUP_ARGS   extra `meson setup` arguments, used only when BUILD_DIR is not configured
#                      yet (e.g. "-Dwerror=true")
#   STRATA_BUILD_JOBS  parallel build jobs (default: nproc)
#   CI=true            a local Slurm that fails to start is an error (otherwise a warning, and its
#                      suite's tests skip)
#
# The local Slurms run in BUILD_DIR/slurm (one node) and BUILD_DIR/slurm-nodes (two namespace
# nodes: tools/dev/slurm-up.sh --nodes 2) and are stopped on exit, also on failure or Ctrl-C,
# unless they were already running before this script started. The exit status is meson test's.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
cd "$repo" || exit 1

build=build
if [[ $# -gt 0 && $1 != -* ]]; then
  build=$1
  shift
fi
ci=0
[[ ${CI:-} == true || ${CI:-} == 1 ]] && ci=1

say() { echo "run-tests: $*"; }
die() {
  echo "run-tests: error: $*" >&2
  exit 1
}

# --- configure and build --------------------------------------------------------------------------
if [[ ! -f $build/build.ninja ]]; then
  # shellcheck disable=SC2086  # MESON_SETUP_ARGS is a list of words
  say "configuring $build: meson setup $build ${MESON_SETUP_ARGS:-}"
  # shellcheck disable=SC2086
  meson setup "$build" ${MESON_SETUP_ARGS:-} || die "meson setup $build failed"
elif [[ -n ${MESON_SETUP_ARGS:-} ]]; then
  # An existing build dir keeps its options unless they are reapplied.
  # shellcheck disable=SC2086
  meson configure "$build" ${MESON_SETUP_ARGS:-} >/dev/null || die "meson configure $build failed"
fi
say "building $build"
ninja -C "$build" -j "${STRATA_BUILD_JOBS:-$(nproc)}" || die "build failed in $build"

# --- local Slurm ----------------------------------------------------------------------------------
# Two instances: one node in BUILD_DIR/slurm (suite slurm) and two namespace nodes in
# BUILD_DIR/slurm-nodes (suite slurm-multinode).
state=$(cd "$build" && pwd)/slurm
nodes_state=$(cd "$build" && pwd)/slurm-nodes
to_stop=()
# shellcheck disable=SC2317  # called from the EXIT trap
cleanup() {
  local s
  for s in "${to_stop[@]}"; do
    "$here/slurm-down.sh" "$s" || echo "run-tests: warning: slurm-down failed for $s" >&2
  done
  to_stop=()
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
meson_pid=""
# shellcheck disable=SC2317  # called from the INT/TERM traps
on_signal() {
  if [[ -n $meson_pid ]]; then
    # SIGTERM makes meson stop every running test; SIGINT would only skip the current one.
    kill -TERM "$meson_pid" 2>/dev/null
    wait "$meson_pid" 2>/dev/null
  fi
  exit "$1"
}

# start_slurm STATE SUITE [SLURM_UP_ARGS...]: starts it (or finds it up); 1 when it did not start.
start_slurm() {
  local st=$1 suite=$2 out
  shift 2
  if out=$("$here/slurm-up.sh" "$@" "$st" 2>&1); then
    echo "$out"
    [[ $out == *"already up"* ]] || to_stop+=("$st")
    return 0
  fi
  # slurm-up stops whatever it started when it fails.
  echo "$out" >&2
  if [[ $ci -eq 1 ]]; then
    die "the local Slurm in $st did not start (CI=true makes this fatal)"
  fi
  echo "run-tests: warning: no local Slurm in $st; the $suite suite will be skipped" >&2
  return 1
}
if start_slurm "$state" slurm; then
  # shellcheck disable=SC1091
  . "$state/env"
else
  unset STRATA_SLURM_STATE
fi
start_slurm "$nodes_state" slurm-multinode --nodes 2 || true

# --- test -----------------------------------------------------------------------------------------
say "meson test -C $build --print-errorlogs $*"
# In the background so that INT/TERM reach this script at once (bash runs traps only after a
# foreground child exits) and are passed on to meson.
trap 'on_signal 130' INT
trap 'on_signal 143' TERM
meson test -C "$build" --print-errorlogs "$@" </dev/null &
meson_pid=$!
wait "$meson_pid"
rc=$?
meson_pid=""
if [[ $rc -eq 0 ]]; then
  say "all tests passed (or skipped) in $build"
else
  say "meson test failed with status $rc; logs: $build/meson-logs/testlog.txt" >&2
fi
exit "$rc"
