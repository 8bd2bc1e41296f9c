#pragma once

// strata-perf is `strata-perf <mode> [options]`. Each mode adds one CLI11 subcommand and says
// how to run it: bootstrap, p2p, and the nccl-tests-like collective modes (allreduce, allgather,
// reducescatter, broadcast, alltoall, sendrecv).

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <strata/bootstrap.hpp>

namespace strata::perf {

struct Mode {
  CLI::App* command = nullptr;
  /// Runs the mode after a successful parse (argv: the command line, echoed in the output);
  /// returns the exit status. Throws CLI::Error for a bad combination of flags (exit 2),
  /// strata::Error (exit 1 with code and message) or std::exception (exit 1).
  std::function<int(const std::vector<std::string>& argv)> run;
};

/// Size sweep and iteration flags shared by the modes, nccl-tests style.
struct SweepOptions {
  std::string minBytes = "8";
  std::string maxBytes = "64K";
  size_t factor = 8;
  size_t iters = 1000;  ///< for sizes <= kLargeBytes unless -n was given
  size_t warmup = 50;   ///< likewise for -w
  std::string json;     ///< --json FILE or "-"
  CLI::Option* itersOption = nullptr;
  CLI::Option* warmupOption = nullptr;

  /// Above this size the default iteration counts shrink in proportion, so that a sweep to
  /// large sizes does not run for minutes; an explicit -n / -w applies to every size.
  static constexpr size_t kLargeBytes = 64 * 1024;

  void addTo(CLI::App& command);
  /// The sizes to sweep: -b .. -e by -f, plus maxBytes and 64 B (the size peers compare at).
  /// Throws std::invalid_argument for a malformed size.
  std::vector<size_t> sizes() const;
  /// sizes() for a run: a malformed size or -b larger than -e is a CLI::ValidationError (exit 2).
  /// onlyRequested drops the extra 64 B when it lies outside -b..-e.
  std::vector<size_t> checkedSizes(bool onlyRequested = false) const;
  size_t itersFor(size_t bytes) const;
  size_t warmupFor(size_t bytes) const;
};

/// Call from a catch (...) block around a mode's run: makes every other rank fail at once
/// (Bootstrap::abort with the error's text; an Aborted error is not aborted again), then
/// rethrows the current exception.
[[noreturn]] void abortJobAndRethrow(Bootstrap& boot);

Mode addBootstrapMode(CLI::App& app);
Mode addP2pMode(CLI::App& app);
/// allreduce, allgather, reducescatter, broadcast, alltoall, sendrecv (coll_mode.cpp).
std::vector<Mode> addCollModes(CLI::App& app);

}  // namespace strata::perf
