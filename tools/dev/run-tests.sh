#!/usr/bin/env bash
# Configures (if needed), builds and tests strata, with a local Slurm for the `slurm` suite.
#
# Usage: tools/dev/run-tests.sh [BUILD_DIR] [MESON_TEST_ARGS...]
#   BUILD_DIR defaults to `build`; the remaining arguments go to `meson test`, e.g.
#   tools/dev/run-tests.sh build --suite unit
#
# Environment:
#   MESON_SETUP_ARGS   extra `meson setup` arguments, used only when BUILD_DIR is not configured
#                      yet (e.g. "-Dwerror=true")
#   STRATA_BUILD_JOBS  parallel build jobs (default: nproc)
#   CI=true            a local Slurm that fails to start is an error (otherwise a warning, and the
#                      `slurm` tests skip)
#
# The local Slurm runs in BUILD_DIR/slurm (tools/dev/slurm-up.sh) and is stopped on exit, also on
# failure or Ctrl-C, unless it was already running before this script started. The exit status is
# meson test's.
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
state=$(cd "$build" && pwd)/slurm
stop_slurm=0
# shellcheck disable=SC2317  # called from the EXIT trap
cleanup() {
  if [[ $stop_slurm -eq 1 ]]; then
    stop_slurm=0
    "$here/slurm-down.sh" "$state" || echo "run-tests: warning: slurm-down failed for $state" >&2
  fi
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

if out=$("$here/slurm-up.sh" "$state" 2>&1); then
  echo "$out"
  [[ $out == *"already up"* ]] || stop_slurm=1
  # shellcheck disable=SC1091
  . "$state/env"
else
  # slurm-up stops whatever it started when it fails.
  echo "$out" >&2
  if [[ $ci -eq 1 ]]; then
    die "the local Slurm did not start (CI=true makes this fatal)"
  fi
  echo "run-tests: warning: no local Slurm; the slurm suite will be skipped" >&2
  unset STRATA_SLURM_STATE
fi

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
