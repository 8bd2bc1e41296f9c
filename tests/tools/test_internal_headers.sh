#!/usr/bin/env bash
# The exported internal headers (lib/<layer>/include/<layer>/*.hpp) refuse to compile outside
# strata, and the public headers need none of them:
#   1. the umbrella <strata/strata.hpp> and every public header compile without
#      STRATA_INTERNAL_HEADERS, as an application compiles them;
#   2. every exported internal header stops with its #error ("... is internal to strata")
#      without it;
#   3. with it, every exported internal header compiles on its own (it includes what it uses).
#
# Usage: test_internal_headers.sh SOURCE_ROOT BUILD_DIR [CXX...]   (CXX default: c++)
set -uo pipefail
src=$1 build=$2
shift 2
cxx=("$@")
[[ ${#cxx[@]} -gt 0 ]] || cxx=(c++)
fail=0
public=(-std=c++20 -fsyntax-only -I"$src/lib/include" -I"$build/lib/include")
internal=("${public[@]}")
for inc in "$src"/lib/*/include; do
  [[ $inc == "$src/lib/include" ]] || internal+=(-I"$inc")
done

check() {  # what expect(ok|fail) flags... : compiles stdin
  local what=$1 expect=$2
  shift 2
  local out rc
  out=$("${cxx[@]}" "$@" -x c++ - 2>&1)
  rc=$?
  if [[ $expect == ok && $rc -ne 0 ]]; then
    echo "FAIL: $what does not compile:"
    echo "$out" | head -20
    fail=1
  elif [[ $expect != ok && ( $rc -eq 0 || $out != *"$expect"* ) ]]; then
    echo "FAIL: $what compiled, or failed without \"$expect\" (status $rc):"
    echo "$out" | head -20
    fail=1
  else
    echo "ok: $what"
  fi
}

check "<strata/strata.hpp> without STRATA_INTERNAL_HEADERS" ok "${public[@]}" \
  <<<'#include <strata/strata.hpp>
int main() { return 0; }'
while IFS= read -r h; do
  rel=${h#"$src/lib/include/"}
  check "<$rel> without STRATA_INTERNAL_HEADERS" ok "${public[@]}" <<<"#include <$rel>"
done < <(find "$src/lib/include/strata" -name '*.hpp' | sort)

n=0
while IFS= read -r h; do
  rel=${h#"$src"/lib/*/include/}
  check "\"$rel\" without STRATA_INTERNAL_HEADERS" "$rel is internal to strata" "${internal[@]}" \
    <<<"#include \"$rel\""
  check "\"$rel\" with STRATA_INTERNAL_HEADERS" ok "${internal[@]}" -DSTRATA_INTERNAL_HEADERS \
    <<<"#include \"$rel\""
  n=$((n + 1))
done < <(find "$src"/lib/*/include -path "$src/lib/include" -prune -o -name '*.hpp' -print | sort)
[[ $n -gt 20 ]] || { echo "FAIL: only $n exported internal headers found under $src/lib/*/include"; fail=1; }
exit $fail
