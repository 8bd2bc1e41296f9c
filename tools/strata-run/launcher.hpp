#pragma once

// strata-run's process manager: starts the ranks, relays their output, forwards signals and
// ends the job when a rank fails. Standalone on purpose (no libstrata), so that it can launch
// even a broken build of the library.

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace strata::run {

/// Exit statuses of strata-run itself (a failing rank's own status is passed through).
inline constexpr int kExitUsage = 2;      ///< bad options or a setup failure in strata-run
inline constexpr int kExitTimeout = 124;  ///< --timeout expired
inline constexpr int kExitNoExec = 127;   ///< PROGRAM could not be executed

/// Where the ranks' stdout and stderr go.
enum class OutputMode { Inherit, Tag, Directory };

struct Options {
  int np = 0;
  std::string rootHost = "127.0.0.1";
  int rootPort = 0;
  OutputMode output = OutputMode::Inherit;
  std::string outputDir;
  double graceSeconds = 3.0;
  std::optional<double> timeoutSeconds;
  std::vector<std::pair<std::string, std::string>> env;  ///< --env KEY=VALUE, in order
  bool verbose = false;
  /// --bind-to core: rank r runs on the r-th (modulo their count) of the CPUs strata-run may
  /// use; false: ranks inherit strata-run's CPU set.
  bool bindToCore = false;
  /// --torch: also set the variables torch.distributed's env:// init method reads (RANK,
  /// WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT); --env values win.
  bool torch = false;
  std::vector<std::string> command;  ///< PROGRAM and its arguments
};

/// Runs the job and returns strata-run's exit status. Never throws: every failure is reported on
/// stderr with a "strata-run: " prefix.
int runJob(const Options& options) noexcept;

}  // namespace strata::run
