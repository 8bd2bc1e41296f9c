#include "bootstrap/registry.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>

#include <fmt/format.h>

#include <strata/backend/module.hpp>
#include <strata/error.hpp>
#include <strata/version.hpp>

#include "base/config_keys.hpp"
#include "base/dynload.hpp"
#include "base/log.hpp"
#include "base/strings.hpp"
#include "strata_build_paths.h"

#ifndef STRATA_MODULE_DIR
#define STRATA_MODULE_DIR "/usr/local/lib/strata"
#endif

extern char** environ;

namespace strata::bootstrap {
namespace {

/// The built-in backends of one kind (backends/builtin.cpp lists them all).
std::vector<const backend::ModuleInfo*> builtins(backend::ModuleKind kind) {
  std::vector<const backend::ModuleInfo*> out;
  for (const backend::ModuleInfo* info : builtinModules()) {
    if (info->kind == kind) out.push_back(info);
  }
  return out;
}

// Names the registry always reports, even when their module is absent.
const std::vector<std::string> kKnownModules = {"pmix", "ucx"};

struct LoadedModule {
  std::string path;
  const backend::ModuleInfo* info = nullptr;
  std::string error;
};

std::mutex gModuleMu;

// The non-empty entries of a ':'-separated directory list.
std::vector<std::string> pathList(std::string_view s) {
  std::vector<std::string> out;
  for (auto dir : strings::split(s, ':')) {
    if (!dir.empty()) out.emplace_back(dir);
  }
  return out;
}

const char* kindName(backend::ModuleKind kind) {
  switch (kind) {
    case backend::ModuleKind::Bootstrap:
      return "bootstrap";
    case backend::ModuleKind::Transport:
      return "transport";
    case backend::ModuleKind::Collectives:
      return "collectives";
  }
  return "unknown";
}

std::string moduleFile(const std::string& name, backend::ModuleKind kind) {
  return fmt::format("strata-{}-{}.so", kindName(kind), name);
}

/// Whether info has the entry for its kind.
bool hasFactory(const backend::ModuleInfo& info) {
  switch (info.kind) {
    case backend::ModuleKind::Bootstrap:
      return info.createBootstrap != nullptr;
    case backend::ModuleKind::Transport:
      return info.createTransport != nullptr;
    case backend::ModuleKind::Collectives:
      return info.createCollectives != nullptr;
  }
  return false;
}

/// Loads (once per path) and checks a module; never throws.
LoadedModule loadModule(const std::string& name, const Config& config,
                        backend::ModuleKind kind = backend::ModuleKind::Bootstrap) {
  for (const backend::ModuleInfo* info : builtins(kind)) {
    if (name == info->name) return {"", info, ""};
  }
  static std::map<std::string, LoadedModule> cache;
  std::lock_guard lk(gModuleMu);
  std::vector<std::string> tried;
  for (const auto& dir : modulePath(config)) {
    std::filesystem::path p = std::filesystem::path(dir) / moduleFile(name, kind);
    std::error_code ec;
    if (!std::filesystem::exists(p, ec)) {
      tried.push_back(dir);
      continue;
    }
    auto key = p.string();
    if (auto it = cache.find(key); it != cache.end()) return it->second;
    LoadedModule m;
    m.path = key;
    try {
      auto lib = DynamicLibrary::open(p);
      auto entry = reinterpret_cast<strata_module_info_fn>(lib.symbol(STRATA_MODULE_ENTRY_POINT));
      if (!entry) {
        m.error = fmt::format("{} has no {} entry point (not a strata module?)", key,
                              STRATA_MODULE_ENTRY_POINT);
      } else {
        const backend::ModuleInfo* info = entry();
        if (!info) {
          m.error = fmt::format("{}: {} returned nothing", key, STRATA_MODULE_ENTRY_POINT);
        } else if (info->abiVersion != STRATA_MODULE_ABI_VERSION) {
          m.error = fmt::format(
              "{} was built for module ABI {}, this libstrata {} has ABI {}: rebuild the module "
              "against this strata",
              key, info->abiVersion, STRATA_VERSION_STRING, STRATA_MODULE_ABI_VERSION);
        } else if (!info->strataVersion ||
                   std::string_view(info->strataVersion) != STRATA_VERSION_STRING) {
          m.error = fmt::format(
              "{} was built against strata {}, this libstrata is {}: rebuild the module against "
              "this strata (modules call libstrata's functions, which may change between "
              "versions)",
              key, info->strataVersion ? info->strataVersion : "(unknown)", STRATA_VERSION_STRING);
        } else if (info->kind != kind || !info->name || name != info->name || !hasFactory(*info)) {
          m.error = fmt::format("{} is not the {} module '{}'", key, kindName(kind), name);
        } else {
          m.info = info;
        }
      }
    } catch (const Error& e) {
      m.error = e.what();
    }
    cache[key] = m;
    return m;
  }
  LoadedModule m;
  std::string dirs;
  for (auto& d : tried) dirs += (dirs.empty() ? "" : ", ") + d;
  m.error = fmt::format("{} not found (searched: {})", moduleFile(name, kind),
                        dirs.empty() ? "no directories" : dirs);
  return m;
}

struct DefaultModuleDirs {
  std::filesystem::path self;  // this code's file
  bool buildTree = false;
  std::vector<ModuleDir> dirs;
};

// Found once: where this code was loaded from decides where its modules are, so that neither a
// build tree nor an installed (or moved) tree needs STRATA_MODULE_PATH.
const DefaultModuleDirs& defaultModuleDirs() {
  static const DefaultModuleDirs found = [] {
    namespace fs = std::filesystem;
    static const char anchor = 0;  // any address inside this object file
    DefaultModuleDirs d;
    d.self = objectFileOf(&anchor);
    // A program that linked the static archive (strata's unit tests) is not libstrata: it gets
    // only the install's module directory, and module.path.
    bool isLibrary = d.self.filename().string().rfind("libstrata.so", 0) == 0;
    std::error_code ec;
    if (isLibrary && fs::equivalent(d.self.parent_path(), STRATA_BUILD_LIBDIR, ec)) {
      // The build tree's library takes the build tree's modules only: an installed strata of
      // another version must not fill in for a module this build did not build.
      d.buildTree = true;
      for (auto& dir : pathList(STRATA_BUILD_MODULE_DIRS)) d.dirs.push_back({dir, "build tree"});
      return d;
    }
    // Installed: the modules are in <libdir>/strata, also when the tree was moved after install.
    if (isLibrary)
      d.dirs.push_back({(d.self.parent_path() / "strata").string(), "next to libstrata"});
    fs::path installed = STRATA_MODULE_DIR;
    if (d.dirs.empty() ||
        (d.dirs[0].dir != installed.string() && !fs::equivalent(d.dirs[0].dir, installed, ec))) {
      d.dirs.push_back({installed.string(), "install prefix"});
    }
    return d;
  }();
  return found;
}

bool envPresent(const char* prefix) {
  size_t n = std::strlen(prefix);
  for (char** e = environ; e && *e; ++e) {
    if (std::strncmp(*e, prefix, n) == 0) return true;
  }
  return false;
}

}  // namespace

ModuleLookup findModule(backend::ModuleKind kind, const std::string& name, const Config& config) {
  auto m = loadModule(name, config, kind);
  return {m.path, m.info, m.error};
}

std::vector<backend::CheckLine> modulePreflight(backend::ModuleKind kind, const std::string& name,
                                                const Config& config) {
  const ModuleLookup m = findModule(kind, name, config);
  if (!m.info || !m.info->preflight) return {};
  try {
    return m.info->preflight(config);
  } catch (const std::exception& e) {
    return {{name, backend::CheckLine::State::Unknown,
             fmt::format("the {} {}'s check failed: {}", name, kindName(kind), e.what()), ""}};
  }
}

std::vector<backend::CheckLine> transportPreflight(const Config& config) {
  std::vector<std::string> names;
  for (const char* key : {"transport.intra_node", "transport.inter_node"}) {
    const std::string list = config::getString(config, key);
    for (std::string_view n : strings::split(list)) {
      const std::string name(strings::trim(n));
      if (!name.empty() && std::find(names.begin(), names.end(), name) == names.end()) {
        names.push_back(name);
      }
    }
  }
  std::vector<backend::CheckLine> out;
  for (const std::string& name : names) {
    for (auto& l : modulePreflight(backend::ModuleKind::Transport, name, config)) {
      out.push_back(std::move(l));
    }
  }
  return out;
}

std::vector<ModuleDir> moduleSearchPath(const Config& config) {
  std::vector<ModuleDir> dirs;
  auto add = [&](const ModuleDir& d) {
    auto same = [&](const ModuleDir& o) { return o.dir == d.dir; };
    if (std::none_of(dirs.begin(), dirs.end(), same)) dirs.push_back(d);
  };
  for (auto& dir : pathList(config::getString(config, "module.path"))) add({dir, "module.path"});
  for (const auto& d : defaultModuleDirs().dirs) add(d);
  return dirs;
}

std::vector<std::string> modulePath(const Config& config) {
  std::vector<std::string> dirs;
  for (auto& d : moduleSearchPath(config)) dirs.push_back(std::move(d.dir));
  return dirs;
}

std::string libraryFile() {
  return defaultModuleDirs().self.string();
}

bool isBuildTreeLibrary() {
  return defaultModuleDirs().buildTree;
}

std::vector<BackendStatus> listBackends(const Config& config) {
  std::vector<BackendStatus> out;
  for (const backend::ModuleInfo* b : builtins(backend::ModuleKind::Bootstrap)) {
    out.push_back({b->name, "built-in", "", true, "", b->description});
  }
  std::vector<std::string> names = kKnownModules;
  for (const auto& dir : modulePath(config)) {
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
      auto f = entry.path().filename().string();
      const std::string prefix = "strata-bootstrap-", suffix = ".so";
      if (f.size() > prefix.size() + suffix.size() && f.rfind(prefix, 0) == 0 &&
          f.compare(f.size() - suffix.size(), suffix.size(), suffix) == 0) {
        auto n = f.substr(prefix.size(), f.size() - prefix.size() - suffix.size());
        if (std::find(names.begin(), names.end(), n) == names.end()) names.push_back(n);
      }
    }
  }
  for (const auto& n : names) {
    auto m = loadModule(n, config);
    BackendStatus s;
    s.name = n;
    s.path = m.path;
    s.usable = m.info != nullptr;
    s.kind = s.usable ? "module" : "missing";
    s.error = m.error;
    s.description = m.info && m.info->description ? m.info->description : "";
    out.push_back(s);
  }
  return out;
}

std::string resolveBackendName(const Config& config) {
  std::string name = config::getString(config, "bootstrap.backend");
  if (name != "auto") return name;
  // PMIx servers (srun --mpi=pmix, mpirun) export these; only then is the module worth loading.
  if (envPresent("PMIX_SERVER_URI") || envPresent("PMIX_NAMESPACE=")) {
    auto m = loadModule("pmix", config);
    if (m.info && (!m.info->detect || m.info->detect())) return "pmix";
    STRATA_LOG(Info, "bootstrap",
               "a PMIx server is present but the pmix backend is not usable "
               "({}); using tcp",
               m.error.empty() ? "its detect() said no" : m.error);
  }
  return "tcp";
}

std::unique_ptr<Bootstrap> createBackend(const std::string& name, const Config& config) {
  auto m = loadModule(name, config);
  if (!m.info) {
    throw Error(ErrorCode::NotSupported,
                fmt::format("bootstrap.backend={} is not available: {}. Build strata with the "
                            "backend's development package installed, set STRATA_MODULE_PATH to "
                            "where the module is, or choose another bootstrap.backend "
                            "(strata-info lists what this installation has)",
                            name, m.error));
  }
  return m.info->createBootstrap(config);
}

}  // namespace strata::bootstrap
