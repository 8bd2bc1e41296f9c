#pragma once
#ifndef STRATA_INTERNAL_HEADERS
#error "bootstrap/registry.hpp is internal to strata: applications include <strata/...> only"
#endif

// Backend registry: built-ins from one table (backends/builtin.cpp), modules (bootstrap,
// transport and collectives) found on the module path: module.path (STRATA_MODULE_PATH), then,
// for the libstrata of a build tree, that build tree's module directories, else <directory of
// libstrata>/strata and the configured install's module directory (docs/backends.md).

#include <memory>
#include <span>
#include <string>
#include <vector>

#include <strata/backend/module.hpp>
#include <strata/bootstrap.hpp>
#include <strata/config.hpp>
#include <strata/export.hpp>

namespace strata {
struct LaunchInfo;  // launch/contract.hpp
}

namespace strata::bootstrap {

/// The backends compiled into libstrata (tcp, shm, the host collectives): defined by the one
/// table in backends/builtin.cpp, looked up before the module path.
std::span<const backend::ModuleInfo* const> builtinModules();
/// The built-in tcp backend for a launch given explicitly (createTcpBootstrap), without the
/// environment's launcher contract; defined beside the table, in backends/builtin.cpp.
std::unique_ptr<Bootstrap> createBuiltinTcp(const Config& config, const LaunchInfo& launch);

struct BackendStatus {
  std::string name;     ///< "tcp", "pmix", "ucx"
  std::string kind;     ///< "built-in", "module" or "missing"
  std::string path;     ///< module file, empty for built-ins
  bool usable = false;  ///< could be created (module loaded and ABI matched)
  std::string error;    ///< why a module is missing or did not load
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
/// The built-in backend of that kind and name, else the module strata-<kind>-<name>.so loaded
/// (once per file) and checked (ABI, strata version, kind, name); never throws.
STRATA_API ModuleLookup findModule(backend::ModuleKind kind, const std::string& name,
                                   const Config& config);
/// The pre-flight lines (strata-info --check) of the module of that kind and name: none when it
/// is absent, unusable or has nothing to add (ModuleInfo::preflight null); one Unknown line
/// naming it when its check throws.
STRATA_API std::vector<backend::CheckLine> modulePreflight(backend::ModuleKind kind,
                                                           const std::string& name,
                                                           const Config& config);
/// modulePreflight of every transport transport.intra_node, then transport.inter_node, lists,
/// each once.
STRATA_API std::vector<backend::CheckLine> transportPreflight(const Config& config);

/// A directory on the module path and where it comes from.
struct ModuleDir {
  std::string dir;
  std::string origin;  ///< "module.path", "build tree", "next to libstrata" or "install prefix"
};
/// Directories searched for modules, in order, each once, with their origin.
STRATA_API std::vector<ModuleDir> moduleSearchPath(const Config& config);
/// Directories searched for modules, in order, each once.
STRATA_API std::vector<std::string> modulePath(const Config& config);
/// The file this code was loaded from (libstrata.so, or a program that linked strata's static
/// archive), symbolic links resolved; empty when it cannot be told.
STRATA_API std::string libraryFile();
/// Whether this is the libstrata.so of the build tree it was built in (then the module path is
/// that build tree's module directories, not the installed ones).
STRATA_API bool isBuildTreeLibrary();
/// The name bootstrap.backend resolves to ("auto" resolved), without creating anything.
STRATA_API std::string resolveBackendName(const Config& config);
/// Creates the named backend (no agreement check). Throws NotSupported / InvalidConfig with
/// the reason when it cannot be loaded.
STRATA_API std::unique_ptr<Bootstrap> createBackend(const std::string& name, const Config& config);

}  // namespace strata::bootstrap
