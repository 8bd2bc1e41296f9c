// strata-info: what this installation of strata has, and how it is configured.

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <string>

#include <CLI/CLI.hpp>

#include <strata/strata.hpp>

#include "bootstrap/registry.hpp"
#include "strata_info_features.h"

namespace {

const char* yesNo(bool b) {
  return b ? "yes" : "no";
}

/// Built-ins and modules of one kind: built-in (description), module (path), or missing (why;
/// "absent" instead for a module this build cannot make yet).
void printModules(strata::backend::ModuleKind kind, std::initializer_list<const char*> names,
                  const strata::Config& config, std::initializer_list<const char*> notYet = {}) {
  for (const char* name : names) {
    auto m = strata::bootstrap::findModule(kind, name, config);
    bool later = std::find_if(notYet.begin(), notYet.end(), [&](const char* n) {
                   return std::string_view(n) == name;
                 }) != notYet.end();
    const char* what =
        m.info ? (m.path.empty() ? "built-in" : "module") : (later ? "absent" : "missing");
    std::printf("  %-6s %-9s %s\n", name, what,
                !m.info          ? m.error.c_str()
                : m.path.empty() ? m.info->description
                                 : m.path.c_str());
  }
}

/// Every algorithm of every collectives backend a communicator loads here (one rank unless
/// launched as a job), with what it accepts.
int listAlgorithms() {
  strata::Config config = strata::Config::load();
  auto comm = strata::Communicator::create(config);
  if (comm->rank() != 0) return 0;
  auto groups = comm->context().hostGroups();
  std::printf(
      "Collective algorithms (%d rank%s on %zu host%s; auto takes, per call, the first "
      "in this order that accepts it and prefers its size, else the first that accepts "
      "it)\n",
      comm->size(), comm->size() == 1 ? "" : "s", groups.size(), groups.size() == 1 ? "" : "s");
  for (const auto& a : comm->algorithms()) {
    std::string ops;
    for (const auto& op : a.ops) ops += (ops.empty() ? "" : ", ") + op;
    std::printf("\n  %s/%s\n    ops:    %s\n    memory: %s\n    %s\n", a.backend.c_str(),
                a.name.c_str(), ops.c_str(), a.memory.c_str(), a.description.c_str());
    if (!a.forcedFor.empty()) {
      std::string forced;
      for (const auto& op : a.forcedFor) forced += (forced.empty() ? "" : ", ") + op;
      std::printf("    forced by the configuration for: %s\n", forced.c_str());
    }
  }
  return 0;
}

int run(bool showConfig, bool onlyConfig) {
  strata::Config config = strata::Config::load();
  if (!onlyConfig) {
    std::printf("strata %s\n\n", strata::versionString());
    std::printf("Dependencies found at build time\n");
    std::printf("  libpmix          %s\n", yesNo(STRATA_HAVE_PMIX));
    std::printf("  UCX              %s\n", yesNo(STRATA_HAVE_UCX));
    std::printf("  libfabric        %s\n", yesNo(STRATA_HAVE_LIBFABRIC));
    std::printf("  cuda             %s\n\n", yesNo(STRATA_HAVE_CUDA));
    std::string self = strata::bootstrap::libraryFile();
    std::printf("Library\n  %s%s\n\n", self.empty() ? "(unknown)" : self.c_str(),
                strata::bootstrap::isBuildTreeLibrary() ? " (build tree)" : "");
    std::printf("Module path (searched in this order)\n");
    auto searchPath = strata::bootstrap::moduleSearchPath(config);
    if (searchPath.empty()) std::printf("  (none: no module was built and module.path is empty)\n");
    for (const auto& d : searchPath) {
      std::printf("  %-18s %s\n", d.origin.c_str(), d.dir.c_str());
    }
    std::printf("\nBootstrap backends\n");
    for (const auto& b : strata::bootstrap::listBackends(config)) {
      std::printf(
          "  %-6s %-9s %s\n", b.name.c_str(), b.kind.c_str(),
          b.usable ? (b.path.empty() ? b.description.c_str() : b.path.c_str()) : b.error.c_str());
    }
    std::printf("\nTransports\n");
    printModules(strata::backend::ModuleKind::Transport, {"shm", "fabric", "nvlink"}, config);
    std::printf("  transport.intra_node = %s, transport.inter_node = %s\n",
                config.get("transport.intra_node").value_or("").c_str(),
                config.get("transport.inter_node").value_or("").c_str());
    std::printf("\nCollectives backends (strata-info --algorithms lists their algorithms)\n");
    printModules(strata::backend::ModuleKind::Collectives, {"host", "cuda"}, config);
    std::printf("\nbootstrap.backend = %s resolves to '%s' here\n",
                config.get("bootstrap.backend").value_or("auto").c_str(),
                strata::bootstrap::resolveBackendName(config).c_str());
  }
  if (showConfig) {
    if (!onlyConfig) std::printf("\nConfiguration\n");
    std::cout << config.describe();
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"strata-info: version, build features, backends and configuration of strata"};
  bool showConfig = false;
  bool version = false;
  bool algorithms = false;
  app.add_flag("--algorithms", algorithms,
               "create a communicator (one rank, or the job's ranks under a launcher) and list "
               "every algorithm of every loaded collectives backend with what it accepts");
  app.add_flag("--config", showConfig,
               "print the effective value of every configuration key and where it came from");
  app.add_flag("--version", version, "print the version only");
  CLI11_PARSE(app, argc, argv);
  try {
    if (version) {
      std::printf("strata %s\n", strata::versionString());
      return 0;
    }
    if (algorithms) return listAlgorithms();
    return run(showConfig, showConfig);
  } catch (const strata::Error& e) {
    std::fprintf(stderr, "strata-info: %s: %s\n", std::string(strata::toString(e.code())).c_str(),
                 e.what());
    return 1;
  }
}
