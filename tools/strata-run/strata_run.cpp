// strata-run: starts N ranks of a program on this machine with the strata launcher contract.
// See docs/strata-run.md.

#include <CLI/CLI.hpp>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "job.hpp"

#ifndef STRATA_RUN_VERSION
#define STRATA_RUN_VERSION "unknown"
#endif

namespace {

using strata::run::kExitUsage;
using strata::run::Options;
using strata::run::OutputMode;

constexpr int kMaxRanks = 4096;
constexpr const char* kUsage = "strata-run -n N [OPTIONS] PROGRAM [ARGS...]";

// CLI11 cannot describe a trailing command in its usage line; say it ourselves.
class Formatter : public CLI::Formatter {
 public:
  std::string make_usage(const CLI::App*, std::string) const override {
    return std::string("Usage: ") + kUsage + "\n";
  }
};

// Returns the exit status to use when parsing ends the program (help, version, errors).
std::optional<int> parseCommandLine(int argc, char** argv, Options& options) {
  CLI::App app{
      "Starts N ranks of PROGRAM on this machine with the strata launcher contract\n"
      "(STRATA_RANK, STRATA_SIZE, STRATA_LOCAL_RANK, STRATA_LOCAL_SIZE, STRATA_ROOT,\n"
      "STRATA_SECRET; rank 0 also gets STRATA_ROOT_FD). Options end at PROGRAM: everything\n"
      "after it is passed to PROGRAM unchanged.",
      "strata-run"};
  app.formatter(std::make_shared<Formatter>());
  app.footer(
      "Exit status: 0 when every rank succeeds; else the first failing rank's status\n"
      "(128+signal if killed), 124 on --timeout, 127 if PROGRAM cannot be executed, 2 for\n"
      "usage or setup errors. See docs/strata-run.md.");
  // Options stop at the first word that is not one of ours, so PROGRAM's flags pass through.
  app.prefix_command();
  app.set_version_flag("--version", std::string("strata-run ") + STRATA_RUN_VERSION);

  app.add_option("-n,--np", options.np,
                 "number of ranks to start (1.." + std::to_string(kMaxRanks) + ")")
      ->required()
      ->check(CLI::Range(1, kMaxRanks));
  app.add_option("--root-host", options.rootHost,
                 "address of the root listener that rank 0 inherits")
      ->capture_default_str();
  app.add_option("--root-port", options.rootPort, "port of the root listener (0: any free port)")
      ->capture_default_str()
      ->check(CLI::Range(0, 65535));
  bool tagOutput = false;
  auto* tag =
      app.add_flag("--tag-output", tagOutput, "prefix every output line of rank r with '[r] '");
  auto* dir = app.add_option("--output-dir", options.outputDir,
                             "write rank r's output to DIR/rank-<r>.out and DIR/rank-<r>.err")
                  ->type_name("DIR");
  tag->excludes(dir);
  app.add_option("--grace", options.graceSeconds,
                 "seconds the other ranks get to finish after a rank fails, and again between "
                 "SIGTERM and SIGKILL")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 86400.0));
  app.add_flag("--keep-going", options.keepGoing,
               "a rank killed by a signal does not end the job: the others run on (programs that "
               "shrink their communicator, docs/fault-tolerance.md); the exit status is that of "
               "the first rank that exited non-zero, else 0 when a rank exited 0");
  double timeout = 0;
  auto* timeoutOpt =
      app.add_option("--timeout", timeout, "end the job after this many seconds (exit 124)")
          ->check(CLI::PositiveNumber);
  std::vector<std::string> env;
  app.add_option("--env", env, "set KEY=VALUE in every rank's environment (repeatable)")
      ->type_name("KEY=VALUE")
      ->allow_extra_args(false);  // one KEY=VALUE per --env, so PROGRAM is not swallowed
  std::string bindTo = "none";
  app.add_option("--bind-to", bindTo,
                 "core: pin rank r to the r-th CPU strata-run may use (round-robin when there "
                 "are more ranks than CPUs); none: ranks inherit strata-run's CPUs")
      ->capture_default_str()
      ->check(CLI::IsMember({"none", "core"}));
  app.add_flag("--torch", options.torch,
               "also set torch.distributed's env:// variables: RANK, WORLD_SIZE, LOCAL_RANK, "
               "LOCAL_WORLD_SIZE, MASTER_ADDR (--root-host) and MASTER_PORT (a free port); "
               "--env values for them win");
  app.add_flag("-v,--verbose", options.verbose, "describe what strata-run does on stderr");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    std::cerr << "strata-run: " << e.what() << "\nRun 'strata-run --help' for usage.\n";
    return kExitUsage;
  }

  options.bindToCore = bindTo == "core";
  options.command = app.remaining();
  // "strata-run -n 2 -- PROGRAM" is accepted too; CLI11 leaves the "--" in place.
  if (!options.command.empty() && options.command.front() == "--") {
    options.command.erase(options.command.begin());
  }
  if (options.command.empty()) {
    std::cerr << "strata-run: no PROGRAM given\nUsage: " << kUsage << "\n";
    return kExitUsage;
  }
  // A word before PROGRAM that looks like an option is a mistyped strata-run option, not a
  // program name.
  if (options.command.front().size() > 1 && options.command.front()[0] == '-') {
    std::cerr << "strata-run: unknown option '" << options.command.front()
              << "'\nRun 'strata-run --help' for usage.\n";
    return kExitUsage;
  }
  if (tag->count() > 0) options.output = OutputMode::Tag;
  if (dir->count() > 0) options.output = OutputMode::Directory;
  if (timeoutOpt->count() > 0) options.timeoutSeconds = timeout;
  for (const std::string& entry : env) {
    auto eq = entry.find('=');
    if (eq == std::string::npos || eq == 0) {
      std::cerr << "strata-run: --env needs KEY=VALUE, got '" << entry << "'\n";
      return kExitUsage;
    }
    options.env.emplace_back(entry.substr(0, eq), entry.substr(eq + 1));
  }
  return std::nullopt;
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  if (auto status = parseCommandLine(argc, argv, options)) return *status;
  return strata::run::runJob(options);
}
