#pragma once

// What strata-run's command line asks for (strata_run.cpp parses it; docs/strata-run.md).

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace strata::run {

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
  /// --keep-going: a rank killed by a signal does not end the job (fault-tolerant programs that
  /// shrink and go on); the job ends when every rank has ended.
  bool keepGoing = false;
  std::vector<std::string> command;  ///< PROGRAM and its arguments
};

}  // namespace strata::run
