#!/usr/bin/env bash
# Modules are found without STRATA_MODULE_PATH: strata-info run from the build tree lists every
# module that was built as loaded from its build directory, STRATA_MODULE_PATH still comes first
# (override), and an installed tree (meson install --destdir), also after it was moved, finds its
# modules in <libdir>/strata next to libstrata.
#
# Usage: test_module_lookup.sh build STRATA_INFO MODULE_FILE...
#        test_module_lookup.sh installed MESON BUILD_DIR MODULE_FILE...
#   MODULE_FILE: a built module's path in the build tree (build/backends/bootstrap/pmix/
#   strata-bootstrap-pmix.so); in `installed` mode only its file name is used.
set -uo pipefail
fail() {
  echo "FAIL: $*"
  exit 1
}
unset STRATA_MODULE_PATH
export STRATA_CONFIG=/dev/null/none STRATA_BOOTSTRAP_TCP_INTERFACE=lo

# The line strata-info prints for a module file: "  <name> module <path>", name from the file.
module_line() {  # FILE
  local f name
  f=$(basename "$1" .so)
  name=${f#strata-bootstrap-}
  name=${name#strata-transport-}
  echo "  $(printf '%-6s %-9s' "$name" module) $1"
}

expect_modules() {  # OUT DIR_OR_EMPTY FILE... (DIR: expect every file in DIR, else at its own path)
  local out=$1 dir=$2 f want
  shift 2
  for f in "$@"; do
    want=$(module_line "${dir:+$dir/}$([[ -n $dir ]] && basename "$f" || echo "$f")")
    grep -qxF -- "$want" <<<"$out" || fail "strata-info does not list '$want'"
    echo "ok: $want"
  done
}

mode=$1
shift
case $mode in
build)
  info=$1
  shift
  [[ $# -gt 0 ]] || { echo "SKIP: no module was built"; exit 77; }
  out=$("$info" 2>&1) || fail "strata-info failed: $out"
  echo "$out"
  grep -qE '^  .*/libstrata\.so[.0-9]* \(build tree\)$' <<<"$out" ||
    fail "strata-info does not say that its libstrata is the build tree's"
  grep -q '^  module\.path ' <<<"$out" && fail "module.path is listed although STRATA_MODULE_PATH is unset"
  expect_modules "$out" "" "$@"
  # Nothing is missing in the build tree.
  grep -E '^  [a-z]+ +missing ' <<<"$out" && fail "a module is listed as missing"

  # STRATA_MODULE_PATH still wins: a copy of the first module in another directory is taken.
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  cp "$1" "$work/" || fail "cannot copy $1"
  out=$(STRATA_MODULE_PATH=$work "$info" 2>&1) || fail "strata-info with STRATA_MODULE_PATH failed: $out"
  grep -qE "^  module\.path +$work\$" <<<"$out" || fail "STRATA_MODULE_PATH=$work is not listed"
  first=$(sed -n '/^Module path/{n;p;q}' <<<"$out")
  [[ $first == *"$work" ]] || fail "STRATA_MODULE_PATH is not searched first: '$first'"
  expect_modules "$out" "$work" "$1"
  ;;
installed)
  meson=$1 build=$2
  shift 2
  modules=("$@")
  [[ $# -gt 0 ]] || { echo "SKIP: no module was built"; exit 77; }
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  "$meson" install -C "$build" --no-rebuild --quiet --destdir "$work/dest" >"$work/install.log" 2>&1 ||
    fail "meson install --destdir failed: $(tail -n 20 "$work/install.log")"
  check_tree() {  # ROOT
    local lib libdir info out
    lib=$(find "$1" -name 'libstrata.so.*.*' -type f | head -n 1)
    [[ -n $lib ]] || fail "no libstrata.so under $1"
    libdir=$(dirname "$lib")
    info=$(find "$1" -path '*/bin/strata-info' -type f | head -n 1)
    [[ -n $info ]] || { echo "SKIP: strata-info is not installed (no CLI11)"; exit 77; }
    # Installed programs have no build-tree RUNPATH; the loader is told where libstrata is.
    out=$(LD_LIBRARY_PATH=$libdir "$info" 2>&1) || fail "installed strata-info failed: $out"
    echo "$out"
    grep -qF "  $libdir/$(basename "$lib")" <<<"$out" || fail "strata-info does not show $lib"
    grep -q '(build tree)' <<<"$out" && fail "the installed libstrata thinks it is the build tree's"
    grep -qE "^  next to libstrata +$libdir/strata\$" <<<"$out" || fail "$libdir/strata is not searched"
    expect_modules "$out" "$libdir/strata" "${modules[@]}"
  }
  check_tree "$work/dest"
  # Moved after installation: still found next to the library.
  mv "$work/dest" "$work/moved" || fail "cannot move the installed tree"
  check_tree "$work/moved"
  ;;
*)
  echo "usage: $0 build STRATA_INFO MODULE_FILE... | installed MESON BUILD_DIR MODULE_FILE..." >&2
  exit 2
  ;;
esac
echo "ok"
