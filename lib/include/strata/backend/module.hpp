#pragma once

// The plugin SDK's one entry point. A module (strata-bootstrap-<name>.so,
// strata-transport-<name>.so or strata-collectives-<name>.so) exports
//   extern "C" const strata::backend::ModuleInfo* strata_module_info();
// The loader reads abiVersion (always the first field) before touching anything else and
// refuses a module built for another ABI or another strata version (modules call STRATA_API
// functions of libstrata, whose behaviour may change between versions). Built-in backends
// (tcp, shm, host) fill the same struct (backends/builtin.cpp lists them).

#include <cstdint>
#include <memory>
#include <vector>

#include <strata/backend/check.hpp>
#include <strata/backend/collectives.hpp>
#include <strata/backend/transport.hpp>
#include <strata/bootstrap.hpp>
#include <strata/config.hpp>

/// Bumped whenever ModuleInfo or any interface a module implements changes.
#define STRATA_MODULE_ABI_VERSION 9u
#define STRATA_MODULE_ENTRY_POINT "strata_module_info"

namespace strata::backend {

enum class ModuleKind : uint32_t { Bootstrap = 1, Transport = 2, Collectives = 3 };

struct ModuleInfo {
  uint32_t abiVersion;  ///< STRATA_MODULE_ABI_VERSION the module was built with
  ModuleKind kind;
  const char* name;           ///< "pmix": must match the file name strata-bootstrap-pmix.so
  const char* strataVersion;  ///< STRATA_VERSION_STRING the module was built with
  const char* description;
  /// Bootstrap modules: is this backend's environment present (for bootstrap.backend=auto)?
  /// Must be cheap and must not throw.
  bool (*detect)() noexcept;
  /// Bootstrap modules: creates a connected backend. Throws strata::Error.
  std::unique_ptr<Bootstrap> (*createBootstrap)(const Config& config);
  /// Transport modules: creates the transport, or throws NotSupported saying why this process
  /// cannot use it (no device, no provider). Bootstrap modules leave it null.
  std::unique_ptr<Transport> (*createTransport)(const TransportInit& init);
  /// Collectives modules: creates the backend on init.context (collective over its ranks), or
  /// throws NotSupported saying why this process cannot use it. Others leave it null.
  std::unique_ptr<CollectivesBackend> (*createCollectives)(const CollectivesInit& init);
  /// Transport and collectives modules, optional (null: nothing to add): what this node can and
  /// cannot do for this backend, one line each with the fallback strata takes (strata-info
  /// --check). Runs outside any job (no bootstrap, no peers) and must not need a device to be
  /// present: a missing driver or device is a line, not an exception.
  std::vector<CheckLine> (*preflight)(const Config& config);
};

}  // namespace strata::backend

extern "C" {
using strata_module_info_fn = const strata::backend::ModuleInfo* (*)();
}
