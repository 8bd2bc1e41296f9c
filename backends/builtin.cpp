// The backends compiled into libstrata, in one table. Each defines its ModuleInfo under its own
// name (a module's is the exported strata_module_info); the registry (lib/bootstrap) finds a
// built-in here before it searches the module path. Adding a built-in: one declaration and one
// line below, and its static library in the top-level meson.build's strata_layers.

#include <span>

#include <strata/backend/module.hpp>

#include "bootstrap/registry.hpp"

namespace strata {
namespace tcp {
const backend::ModuleInfo* builtinModuleInfo();
}
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

}  // namespace strata
