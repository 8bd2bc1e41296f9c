#pragma once

// strata-run's process manager: starts the ranks, relays their output, forwards signals and
// ends the job when a rank fails. Standalone on purpose (no libstrata), so that it can launch
// even a broken build of the library.

#include "options.hpp"

namespace strata::run {

/// Exit statuses of strata-run itself (a failing rank's own status is passed through).
inline constexpr int kExitUsage = 2;      ///< bad options or a setup failure in strata-run
inline constexpr int kExitTimeout = 124;  ///< --timeout expired
inline constexpr int kExitNoExec = 127;   ///< PROGRAM could not be executed

/// Runs the job and returns strata-run's exit status. Never throws: every failure is reported on
/// stderr with a "strata-run: " prefix.
int runJob(const Options& options) noexcept;

}  // namespace strata::run
