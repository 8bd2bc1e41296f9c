#!/usr/bin/env bash
# The exported internal headers (lib/<layer>/include/<layer>/*.hpp) refuse to compile outside
# strata, and the public headers need none of them:
#   1. the umbrella <strata/strata.hpp> and every public header compile without
#      STRATA_INTERNAL_HEADERS, as an application compiles them;
#   2. every exported internal header stops with its #error ("... is internal to strata")
#      without it;
#   3. with it, every exported internal header compiles on its own (it includes what it uses).
# The compilations run in parallel, one per CPU.
#
# Usage: test_internal_headers.sh SOURCE_ROOT BUILD_DIR [CXX...]   (CXX default: c++)
set -uo pipefail
src=$1 build=$2
shift 2
cxx=("$@")
[[ ${#cxx[@]} -gt 0 ]] || cxx=(c++)
public=(-std=c++20 -fsyntax-only -I"$src/lib/include" -I"$build/lib/include")
internal=("${public[@]}")
for inc in "$src"/lib/*/include; do
  [[ $inc == "$src/lib/include" ]] || internal+=(-I"$inc")
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

check() {  # WHAT EXPECT(ok | a text the compiler must print) SOURCE FLAGS...; prints one verdict
  local what=$1 expect=$2 source=$3 out rc
  shift 3
  out=$("${cxx[@]}" "$@" -x c++ - <<<"$source" 2>&1)
  rc=$?
  if [[ $expect == ok && $rc -ne 0 ]]; then
    printf 'FAIL: %s does not compile:\n%s\n' "$what" "$(head -20 <<<"$out")"
    return 1
  elif [[ $expect != ok && ($rc -eq 0 || $out != *"$expect"*) ]]; then
    printf 'FAIL: %s compiled, or failed without "%s" (status %s):\n%s\n' "$what" "$expect" \
      "$rc" "$(head -20 <<<"$out")"
    return 1
  fi
  echo "ok: $what"
}

n=0
spawn() {  # runs check in the background, at most nproc at a time
  while (($(jobs -rp | wc -l) >= $(nproc))); do wait -n; done
  check "$@" >"$work/$n.out" 2>&1 || touch "$work/$n.failed" &
  n=$((n + 1))
}

spawn "<strata/strata.hpp> without STRATA_INTERNAL_HEADERS" ok \
  $'#include <strata/strata.hpp>\nint main() { return 0; }' "${public[@]}"
while IFS= read -r h; do
  rel=${h#"$src/lib/include/"}
  spawn "<$rel> without STRATA_INTERNAL_HEADERS" ok "#include <$rel>" "${public[@]}"
done < <(find "$src/lib/include/strata" -name '*.hpp' | sort)
internals=0
while IFS= read -r h; do
  rel=${h#"$src"/lib/*/include/}
  spawn "\"$rel\" without STRATA_INTERNAL_HEADERS" "$rel is internal to strata" \
    "#include \"$rel\"" "${internal[@]}"
  spawn "\"$rel\" with STRATA_INTERNAL_HEADERS" ok "#include \"$rel\"" "${internal[@]}" \
    -DSTRATA_INTERNAL_HEADERS
  internals=$((internals + 1))
done < <(find "$src"/lib/*/include -path "$src/lib/include" -prune -o -name '*.hpp' -print | sort)
wait

fail=0
for ((i = 0; i < n; i++)); do cat "$work/$i.out"; done
compgen -G "$work/*.failed" >/dev/null && fail=1
if ((internals < 20)); then
  echo "FAIL: only $internals exported internal headers found under $src/lib/*/include"
  fail=1
fi
exit $fail
