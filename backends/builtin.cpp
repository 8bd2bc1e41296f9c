// The backends compiled into libstrata, in one table. Each defines its ModuleInfo under its own
// name (a module's is the exported strata_module_info); the registry (lib/bootstrap) finds a
// built-in here before it searches the module path. Adding a built-in: one declaration and one
// line below, and its static library in the top-level meson.build's strata_layers. The tcp
// backend also serves createTcpBootstrap's explicit launches through createBuiltinTcp.

#include <span>

#include <strata/backend/module.hpp>

#include "bootstrap/registry.hpp"
#include "launch/contract.hpp"

namespace strata {
namespace tcp {
const backend::ModuleInfo* builtinModuleInfo();
std::unique_ptr<Bootstrap> createExplicit(const Config& config, const LaunchInfo& launch);
}  // namespace tcp
namespace shm {
const backend::ModuleInfo* builtinModuleInfo();
}
namespace collectives::host {
const backend::ModuleInfo* builtinModuleInfo();
}

std::span<const backend::ModuleInfo* const> bootstrap::builtinModules() {
  static const backend::ModuleInfo* const table[] = {
      tcp::builtinModuleInfo(),
      shm::builtinModuleInfo(),
      collectives::host::builtinModuleInfo(),
  };
  return table;
}

std::unique_ptr<Bootstrap> bootstrap::createBuiltinTcp(const Config& config,
                                                       const LaunchInfo& launch) {
  return tcp::createExplicit(config, launch);
}

}  // namespace strata
