#pragma once

// For one-process Boost.Test programs that create strata objects as a single-rank job
// (header-only: they link libstrata.so or the static archive).

#include <boost/test/unit_test.hpp>

#include <cstdlib>
#include <map>
#include <string>

#include <strata/error.hpp>

namespace strata::testing {

/// The launcher variables strata reads (launch/contract.cpp) and those of a PMIx server, which
/// `bootstrap.backend = auto` looks for.
inline constexpr const char* kLauncherVariables[] = {"STRATA_RANK",
                                                     "STRATA_SIZE",
                                                     "STRATA_LOCAL_RANK",
                                                     "STRATA_LOCAL_SIZE",
                                                     "STRATA_ROOT",
                                                     "STRATA_ROOT_FD",
                                                     "STRATA_SECRET",
                                                     "SLURM_PROCID",
                                                     "SLURM_STEP_ID",
                                                     "SLURM_STEP_NUM_TASKS",
                                                     "SLURM_NTASKS",
                                                     "SLURM_LOCALID",
                                                     "SLURM_NODEID",
                                                     "SLURM_STEP_NODELIST",
                                                     "SLURM_STEP_TASKS_PER_NODE",
                                                     "SLURM_STEP_RESV_PORTS",
                                                     "OMPI_COMM_WORLD_RANK",
                                                     "OMPI_COMM_WORLD_SIZE",
                                                     "OMPI_COMM_WORLD_LOCAL_RANK",
                                                     "OMPI_COMM_WORLD_LOCAL_SIZE",
                                                     "PMIX_NAMESPACE",
                                                     "PMIX_SERVER_URI4",
                                                     "PMIX_SERVER_URI41",
                                                     "PMIX_SERVER_URI3",
                                                     "PMIX_SERVER_URI2",
                                                     "PMIX_SERVER_URI21"};

/// Global fixture: unsets every launcher variable, so that the process is a single-rank job
/// whatever launched the test.
struct SingleRankEnv {
  SingleRankEnv() {
    for (const char* v : kLauncherVariables) unsetenv(v);
  }
};

/// Exactly the given launcher variables for one scope (a test of the launch contract); none
/// before and after.
struct LauncherEnv {
  explicit LauncherEnv(const std::map<std::string, std::string>& vars) {
    for (const char* v : kLauncherVariables) unsetenv(v);
    for (const auto& [k, v] : vars) setenv(k.c_str(), v.c_str(), 1);
  }
  ~LauncherEnv() {
    for (const char* v : kLauncherVariables) unsetenv(v);
  }
  LauncherEnv(const LauncherEnv&) = delete;
  LauncherEnv& operator=(const LauncherEnv&) = delete;
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

/// For checks on expectError(): `is(expectError(...), ErrorCode::Timeout)`.
inline bool is(const Error& e, ErrorCode code) {
  return e.code() == code;
}

}  // namespace strata::testing
