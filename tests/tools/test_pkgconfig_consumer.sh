#!/usr/bin/env bash
# A program compiled against the build tree through meson-uninstalled/strata-uninstalled.pc
# alone: the flags must reach <strata/bootstrap.hpp>, <strata/communicator.hpp> and the generated
# <strata/version.hpp>, and link libstrata. It runs as one rank, as 2 ranks under strata-run, and
# as 2 ranks under mpirun with bootstrap.backend=auto, where it must find the build tree's pmix
# module with no STRATA_MODULE_PATH (the mpirun part is skipped without mpirun).
#
# Usage: test_pkgconfig_consumer.sh BUILD_DIR SOURCE STRATA_RUN RUN_MPIRUN [CXX...]
#   CXX: the compiler command (default g++).
set -uo pipefail
fail() {
  echo "FAIL: $*"
  exit 1
}
# shellcheck source=consumer_checks.sh
. "$(dirname "${BASH_SOURCE[0]}")/consumer_checks.sh"
build=$1 src=$2 run=$3 mpirun_wrapper=$4
shift 4
cxx=("$@")
[[ ${#cxx[@]} -gt 0 ]] || cxx=(g++)
command -v pkg-config >/dev/null || { echo "SKIP: pkg-config not found"; exit 77; }
unset STRATA_MODULE_PATH
export STRATA_CONFIG=/dev/null/none STRATA_BOOTSTRAP_TCP_INTERFACE=lo FI_TCP_IFACE=lo UCX_NET_DEVICES=lo

[[ -r $build/meson-uninstalled/strata-uninstalled.pc ]] || fail "no $build/meson-uninstalled/strata-uninstalled.pc"
flags=$(PKG_CONFIG_PATH=$build/meson-uninstalled pkg-config --cflags --libs strata-uninstalled) ||
  fail "pkg-config --cflags --libs strata-uninstalled failed"
echo "pkg-config: $flags"
read -r libdir _ < <(PKG_CONFIG_PATH=$build/meson-uninstalled pkg-config --libs-only-L strata-uninstalled)
libdir=${libdir#-L}
[[ -e $libdir/libstrata.so ]] || fail "-L$libdir does not hold libstrata.so"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# shellcheck disable=SC2086  # flags is a list of words
"${cxx[@]}" -std=c++20 -Wall -Wextra -Werror "$src" $flags -Wl,-rpath,"$libdir" -o "$work/consumer" ||
  fail "the consumer does not compile or link with the flags of strata-uninstalled.pc"

consumer_one_rank "$work/consumer"

out=$(STRATA_BOOTSTRAP_BACKEND=tcp timeout 120 "$run" -n 2 --grace 10 "$work/consumer" 2>&1) ||
  fail "strata-run -n 2: $out"
echo "$out"
[[ $(grep -c 'backend tcp, rank . of 2: allReduce ok' <<<"$out") -eq 2 ]] || fail "strata-run -n 2: not every rank ok"

consumer_mpirun_pmix "$mpirun_wrapper" "$work/consumer"
echo "ok"
