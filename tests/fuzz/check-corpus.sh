#!/usr/bin/env bash
# Unit test fuzz-corpus-current: the committed seeds (tests/fuzz/corpus) are what
# make-fuzz-corpus writes today, so a changed record format cannot leave the fuzzers starting
# from stale seeds. Files in the corpus that the generator does not write are allowed.
# Usage: check-corpus.sh MAKE_FUZZ_CORPUS CORPUS_DIR
set -u -o pipefail
gen=$1
corpus=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "case fuzz-corpus-current"
"$gen" "$tmp" >/dev/null || { echo "FAIL: $gen exited with status $?"; exit 1; }
bad=0
while IFS= read -r f; do
  rel=${f#"$tmp"/}
  if ! cmp -s "$f" "$corpus/$rel"; then
    echo "FAIL: $corpus/$rel differs from what make-fuzz-corpus writes (run" \
         "build/tests/fuzz/make-fuzz-corpus tests/fuzz/corpus and commit)"
    bad=1
  fi
done < <(find "$tmp" -type f | sort)
[[ $bad -eq 0 ]] && echo "ok: $(find "$tmp" -type f | wc -l) generated seeds match the corpus"
exit $bad
