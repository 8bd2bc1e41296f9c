#pragma once
#ifndef STRATA_INTERNAL_HEADERS
#error "base/dynload.hpp is internal to strata: applications include <strata/...> only"
#endif

// dlopen wrapper. Modules are opened RTLD_NOW | RTLD_LOCAL and never unloaded (a backend's
// threads or atexit handlers may outlive the object that used it).

#include <filesystem>
#include <string>

#include <strata/export.hpp>

namespace strata {

class STRATA_API DynamicLibrary {
 public:
  /// Throws Error(NotSupported) with dlerror()'s text (which names a missing dependency).
  static DynamicLibrary open(const std::filesystem::path& path);
  /// nullptr when absent.
  void* symbol(const char* name) const;
  const std::filesystem::path& path() const { return path_; }

 private:
  void* handle_ = nullptr;
  std::filesystem::path path_;
};

/// The file of the loaded object (shared library or program) whose code or data holds
/// `address`, with symbolic links resolved; empty when it cannot be told.
STRATA_API std::filesystem::path objectFileOf(const void* address);

}  // namespace strata
