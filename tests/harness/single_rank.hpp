#pragma once

// For one-process Boost.Test programs that create strata objects as a single-rank job
// (header-only: they link libstrata.so or the static archive).

#include <boost/test/unit_test.hpp>

#include <cstdlib>

#include <strata/error.hpp>

namespace strata::testing {

/// Global fixture: unsets every launcher variable strata reads, so that the process is a
/// single-rank job whatever launched the test.
struct SingleRankEnv {
  SingleRankEnv() {
    for (const char* v :
         {"STRATA_RANK", "STRATA_SIZE", "STRATA_ROOT", "STRATA_ROOT_FD", "SLURM_PROCID",
          "SLURM_STEP_ID", "OMPI_COMM_WORLD_RANK", "PMIX_NAMESPACE", "PMIX_SERVER_URI4",
          "PMIX_SERVER_URI41", "PMIX_SERVER_URI3", "PMIX_SERVER_URI2", "PMIX_SERVER_URI21"}) {
      unsetenv(v);
    }
  }
};

/// The strata::Error f throws (logged as the test's message); the test fails if it throws none.
template <typename F>
Error expectError(F f) {
  try {
    f();
  } catch (const Error& e) {
    BOOST_TEST_MESSAGE(e.what());
    return e;
  }
  BOOST_FAIL("expected a strata::Error");
  return Error(ErrorCode::Internal, "unreachable");
}

}  // namespace strata::testing
