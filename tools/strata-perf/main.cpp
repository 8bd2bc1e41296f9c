// strata-perf <mode> [options]: latency and bandwidth measurements, nccl-tests style.
// Exit status: 0 success, 1 a strata error or wrong results, 2 bad flags.

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <strata/error.hpp>
#include <strata/version.hpp>

#include "mode.hpp"

namespace {

constexpr int kExitError = 1;
constexpr int kExitUsage = 2;

// Every rank prints its own error; the launcher's rank variable tells them apart even when the
// bootstrap never came up.
std::string rankPrefix() {
  for (const char* name : {"STRATA_RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMIX_RANK"}) {
    if (const char* value = std::getenv(name)) return fmt::format("rank {}: ", value);
  }
  return {};
}

}  // namespace

int main(int argc, char** argv) {
  using namespace strata::perf;
  CLI::App app(
      "strata-perf: measures strata's bootstrap, transports and collectives; run it in "
      "every rank of a job",
      "strata-perf");
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string(STRATA_VERSION_STRING));
  std::vector<Mode> modes;
  modes.push_back(addBootstrapMode(app));
  modes.push_back(addP2pMode(app));
  for (Mode& mode : addCollModes(app)) modes.push_back(std::move(mode));

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    fmt::print(stderr,
               "strata-perf: {}\nRun 'strata-perf --help' or 'strata-perf <mode> --help'.\n",
               e.what());
    return kExitUsage;
  }

  std::vector<std::string> args(argv, argv + argc);
  args[0] = "strata-perf";
  for (const Mode& mode : modes) {
    if (!mode.command->parsed()) continue;
    try {
      return mode.run(args);
    } catch (const CLI::Error& e) {
      fmt::print(stderr, "strata-perf: {}\n", e.what());
      return kExitUsage;
    } catch (const strata::Error& e) {
      fmt::print(
          stderr, "strata-perf: {}error {}{}: {}\n", rankPrefix(), strata::toString(e.code()),
          e.peer() >= 0 ? fmt::format(" (peer rank {})", e.peer()) : std::string(), e.what());
      return kExitError;
    } catch (const std::exception& e) {
      fmt::print(stderr, "strata-perf: {}error: {}\n", rankPrefix(), e.what());
      return kExitError;
    }
  }
  return kExitUsage;  // require_subcommand(1) makes this unreachable
}
