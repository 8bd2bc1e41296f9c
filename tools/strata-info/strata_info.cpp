// strata-info: what this installation of strata has, and how it is configured.

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
    std::printf("  %-6s %-9s %s\n", "shm", "built-in",
                "host memory between processes of one host (memfd mappings, process_vm_writev)");
    for (const char* name : {"fabric", "nvlink"}) {
      auto m = strata::bootstrap::findModule(strata::backend::ModuleKind::Transport, name, config);
      std::printf("  %-6s %-9s %s\n", name, m.info ? "module" : "missing",
                  m.info ? m.path.c_str() : m.error.c_str());
    }
    std::printf("  transport.intra_node = %s, transport.inter_node = %s\n",
                config.get("transport.intra_node").value_or("").c_str(),
                config.get("transport.inter_node").value_or("").c_str());
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
  app.add_flag("--config", showConfig,
               "print the effective value of every configuration key and where it came from");
  app.add_flag("--version", version, "print the version only");
  CLI11_PARSE(app, argc, argv);
  try {
    if (version) {
      std::printf("strata %s\n", strata::versionString());
      return 0;
    }
    return run(showConfig, showConfig);
  } catch (const strata::Error& e) {
    std::fprintf(stderr, "strata-info: %s: %s\n", std::string(strata::toString(e.code())).c_str(),
                 e.what());
    return 1;
  }
}
