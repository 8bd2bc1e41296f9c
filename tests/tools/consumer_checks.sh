# Checks of tests/tools/pc_consumer.cpp built outside strata's own build (sourced by
# test_pkgconfig_consumer.sh and test_meson_subproject.sh, which define fail()).

# consumer_one_rank PROGRAM: runs alone (tcp, one rank) and reports a checked allReduce.
consumer_one_rank() {
  local out
  out=$("$1" 2>&1) || fail "one rank: $out"
  echo "$out"
  [[ $out == *"backend tcp, rank 0 of 1: allReduce ok"* ]] || fail "one rank: unexpected output"
}

# consumer_mpirun_pmix RUN_MPIRUN PROGRAM: 2 ranks under mpirun with bootstrap.backend=auto must
# both run on pmix (the module found without STRATA_MODULE_PATH); a skip (77) of the wrapper is
# reported and passes.
consumer_mpirun_pmix() {
  local out rc
  out=$(STRATA_BOOTSTRAP_BACKEND=auto bash "$1" 2 "$2" 2>&1)
  rc=$?
  echo "$out"
  if [[ $rc -eq 77 ]]; then
    echo "note: the mpirun part was skipped"
    return
  fi
  [[ $rc -eq 0 ]] || fail "mpirun -np 2 exited $rc"
  [[ $(grep -c 'backend pmix, rank . of 2: allReduce ok' <<<"$out") -eq 2 ]] ||
    fail "mpirun -np 2: not every rank ran on pmix"
}
