#include "dynload.hpp"

#include <dlfcn.h>

#include <fmt/format.h>

#include <strata/error.hpp>

namespace strata {

DynamicLibrary DynamicLibrary::open(const std::filesystem::path& path) {
  dlerror();
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char* err = dlerror();
    throw Error(ErrorCode::NotSupported,
                fmt::format("cannot load {}: {}", path.string(), err ? err : "unknown error"));
  }
  DynamicLibrary lib;
  lib.handle_ = h;
  lib.path_ = path;
  return lib;
}

void* DynamicLibrary::symbol(const char* name) const {
  if (!handle_) return nullptr;
  return dlsym(handle_, name);
}

}  // namespace strata
