#pragma once

// Bootstrap backend registry: built-ins from an explicit list, modules found on the module
// path (STRATA_MODULE_PATH / module.path, then the install's module directory).

#include <memory>
#include <string>
#include <vector>

#include <strata/backend/module.hpp>
#include <strata/bootstrap.hpp>
#include <strata/config.hpp>
#include <strata/export.hpp>

namespace strata::bootstrap {

struct BackendStatus {
  std::string name;         ///< "tcp", "pmix", "ucx"
  std::string kind;         ///< "built-in", "module" or "missing"
  std::string path;         ///< module file, empty for built-ins
  bool usable = false;      ///< could be created (module loaded and ABI matched)
  std::string error;        ///< why a module is missing or did not load
  std::string description;
};

/// Every known backend name (tcp, pmix, ucx, plus any other module found), with its status.
STRATA_API std::vector<BackendStatus> listBackends(const Config& config);
/// A module found on the module path (info null, error set, when absent or unusable).
struct ModuleLookup {
  std::string path;
  const backend::ModuleInfo* info = nullptr;
  std::string error;
};
/// Loads (once per file) and checks strata-bootstrap-<name>.so or strata-transport-<name>.so;
/// never throws.
STRATA_API ModuleLookup findModule(backend::ModuleKind kind, const std::string& name,
                                   const Config& config);

/// Directories searched for modules, in order.
STRATA_API std::vector<std::string> modulePath(const Config& config);
/// The name bootstrap.backend resolves to ("auto" resolved), without creating anything.
STRATA_API std::string resolveBackendName(const Config& config);
/// Creates the named backend (no agreement check). Throws NotSupported / InvalidConfig with
/// the reason when it cannot be loaded.
STRATA_API std::unique_ptr<Bootstrap> createBackend(const std::string& name, const Config& config);

}  // namespace strata::bootstrap
