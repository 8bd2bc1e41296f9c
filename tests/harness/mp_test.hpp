#pragma once

// Shared fixtures for multi-process tests: the binary is started N times (strata-run, srun,
// mpirun) and Boost.Test runs the same cases in the same order inside every rank.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>

#include <strata/bootstrap.hpp>
#include <strata/config.hpp>
#include <strata/error.hpp>

#include "tests/harness/pattern.hpp"

namespace strata::testing {

/// What the launcher told this process, read from STRATA_* or else SLURM_* variables. The
/// suite compares it with what the bootstrap reports, so it never asks the library.
struct LaunchEnv {
  int rank = -1;
  int size = -1;
  int localRank = -1;    ///< -1 when the launcher did not say
  int localSize = -1;    ///< -1 when the launcher did not say
  std::string launcher;  ///< "strata-run", "slurm" or "" (not launched)
  std::string root;      ///< STRATA_ROOT or ""
};

const LaunchEnv& launchEnv();

/// The custom main of every multi-process Boost.Test binary: exits 77 (skip) with `skipReason`
/// on stdout when no launcher started it, else runs Boost.Test with `init`.
int multiProcessMain(int argc, char** argv, std::string_view skipReason, bool (*init)());

/// Runs fn and returns the strata::Error it threw, or nullopt if it returned normally. Other
/// exceptions propagate (they are failures of the test itself).
std::optional<Error> catchError(const std::function<void()>& fn);

/// "Timeout (peer 1): recv from rank 1 ..." for failure messages.
std::string describe(const Error& error);

/// True if `message` names rank `rank` ("rank 1", "ranks 0 and 1", "rank=1", ...).
bool namesRank(std::string_view message, int rank);

double secondsSince(std::chrono::steady_clock::time_point start);

/// Open file descriptors of this process (entries of /proc/self/fd, minus the one used to list).
size_t countOpenFds();
/// Socket inodes of this process's fds that are listening TCP sockets (/proc/net/tcp{,6}).
std::set<unsigned long> listeningSocketInodes();

/// Splits "host:port" or "[::1]:port". Returns false for a malformed address.
bool splitHostPort(std::string_view address, std::string& host, int& port);
/// True for 127.0.0.0/8, ::1 and "localhost": tests may only talk to those.
bool isLoopbackHost(std::string_view host);
/// Connects a blocking TCP socket to a loopback address; returns the fd or -1 (errno kept).
/// Refuses (returns -1, errno EPERM) any address that is not loopback.
int connectLoopback(std::string_view address);
/// Writes all bytes, ignoring errors (strangers do not care whether the peer hung up).
void writeAllIgnoringErrors(int fd, const void* data, size_t bytes);

}  // namespace strata::testing

// Every failure message says which rank saw it: all ranks write to the same output. For
// Boost.Test cases; expands where it is used, so this header needs no Boost include.
#define RANK_SCOPE()                                                             \
  BOOST_TEST_INFO_SCOPE("rank " << ::strata::testing::launchEnv().rank << " of " \
                                << ::strata::testing::launchEnv().size)

// Ends a case early, as a pass with a message, when the job has fewer than `n` ranks. Every rank
// sees the same size, so all ranks skip alike and stay in step for the next case.
#define REQUIRE_RANKS(n)                                                                     \
  do {                                                                                       \
    if (::strata::testing::launchEnv().size < (n)) {                                         \
      BOOST_TEST_MESSAGE("skipped: needs at least " << (n) << " ranks, job has "             \
                                                    << ::strata::testing::launchEnv().size); \
      return;                                                                                \
    }                                                                                        \
  } while (false)
