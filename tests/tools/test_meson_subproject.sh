#!/usr/bin/env bash
# strata as a meson subproject: a parent project in a temporary directory with
# subprojects/strata -> this source tree gets the library from dependency('strata') (strata's
# meson.override_dependency): public headers only, no internals; strata's tests are not
# configured in the parent; the consumer builds with -Werror (only its target and the pmix module
# are built, to keep this short), runs as one rank, and, under mpirun, finds the pmix module in
# the parent's build tree with no STRATA_MODULE_PATH (skipped without mpirun or the module).
# strata is configured there without CUDA (-Dstrata:cuda=disabled): its strata-info must list
# every module it built as loaded (test_module_lookup.sh build) and nvlink and the cuda
# collectives as "not built", not as missing.
#
# Usage: test_meson_subproject.sh MESON SOURCE_ROOT CONSUMER_SOURCE RUN_MPIRUN
set -uo pipefail
fail() {
  echo "FAIL: $*"
  exit 1
}
# shellcheck source=consumer_checks.sh
. "$(dirname "${BASH_SOURCE[0]}")/consumer_checks.sh"
meson=$1 src=$2 consumer=$3 mpirun_wrapper=$4
unset STRATA_MODULE_PATH
export STRATA_CONFIG=/dev/null/none STRATA_BOOTSTRAP_TCP_INTERFACE=lo FI_TCP_IFACE=lo UCX_NET_DEVICES=lo

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/parent/subprojects"
ln -s "$src" "$work/parent/subprojects/strata"
cp "$consumer" "$work/parent/consumer.cpp"
cat >"$work/parent/meson.build" <<'MESON'
project('strata-parent', 'cpp',
  default_options: ['cpp_std=c++20', 'warning_level=2', 'werror=true'])
strata_proj = subproject('strata')
strata = dependency('strata')
executable('consumer', 'consumer.cpp', dependencies: strata)
# Must not compile: dependency('strata') gives the public headers only.
executable('internals', 'internals.cpp', dependencies: strata, build_by_default: false)
MESON
echo '#include "base/config_keys.hpp"' >"$work/parent/internals.cpp"

cd "$work/parent" || fail "cd"
"$meson" setup build -Dstrata:cuda=disabled >setup.log 2>&1 || { cat setup.log; fail "meson setup of the parent project failed"; }
grep -E 'tests \(Boost.Test\)|Subprojects|strata' setup.log
tests=$("$meson" test -C build --no-rebuild --list 2>&1)
[[ $tests == *"No tests defined."* ]] || { echo "$tests"; fail "the parent project got strata's tests"; }

targets=(consumer)
pmix_module=subprojects/strata/backends/bootstrap/pmix/strata-bootstrap-pmix.so
all_targets=$(ninja -C build -t targets all 2>/dev/null)
grep -q "strata-bootstrap-pmix.so:" <<<"$all_targets" && targets+=("$pmix_module")
# Every module this configuration makes, and strata-info (when CLI11 is there) to list them.
modules=()
while IFS= read -r m; do modules+=("$m"); done < <(grep -oE '^subprojects/strata/[^:]*/strata-(bootstrap|transport)-[a-z]+\.so:' <<<"$all_targets" | tr -d : | sort -u)
info=subprojects/strata/tools/strata-info/strata-info
grep -q "^$info:" <<<"$all_targets" || info=
ninja -C build -j "${STRATA_BUILD_JOBS:-2}" "${targets[@]}" "${modules[@]}" ${info:+"$info"} \
  >build.log 2>&1 || { tail -n 40 build.log; fail "building ${targets[*]} failed"; }

out=$(ninja -C build internals 2>&1) && fail "dependency('strata') reaches strata's internal headers"
grep -q 'base/config_keys.hpp: No such file' <<<"$out" || { echo "$out"; fail "the internals check failed for another reason"; }

consumer_one_rank build/consumer
if [[ -n $info ]]; then
  # A build without CUDA: what it built is loaded from its build tree, nothing it built is
  # missing, and what it could not build says so.
  paths=()
  for m in "${modules[@]}"; do paths+=("$PWD/build/$m"); done
  [[ ${#paths[@]} -eq 0 ]] || bash "$(dirname "${BASH_SOURCE[0]}")/test_module_lookup.sh" build "build/$info" "${paths[@]}" ||
    fail "module lookup in the subproject's build tree (no CUDA)"
  out=$("build/$info" 2>&1)
  for m in nvlink cuda; do
    grep -qE "^  $m +not built +this build found no CUDA" <<<"$out" ||
      { echo "$out"; fail "strata-info does not say that $m was not built"; }
    echo "ok: $m not built"
  done
fi
# The pmix module is the subproject's own (built above when pmix was found).
[[ ${#targets[@]} -gt 1 ]] && consumer_mpirun_pmix "$mpirun_wrapper" build/consumer
echo "ok"
