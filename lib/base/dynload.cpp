#include "base/dynload.hpp"

#include <dlfcn.h>
#include <sys/auxv.h>

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

std::filesystem::path objectFileOf(const void* address) {
  Dl_info info{};
  if (dladdr(address, &info) == 0 || !info.dli_fname) return {};
  std::string file = info.dli_fname;
  // dladdr names the main program by its argv[0], which may be relative or a bare name found on
  // PATH: take /proc/self/exe for it. AT_PHDR points into the main program's mapping.
  Dl_info program{};
  auto phdr = getauxval(AT_PHDR);
  if (file.empty() || (phdr != 0 && dladdr(reinterpret_cast<const void*>(phdr), &program) != 0 &&
                       program.dli_fbase == info.dli_fbase)) {
    file = "/proc/self/exe";
  }
  std::error_code ec;
  auto path = std::filesystem::canonical(file, ec);
  return ec ? std::filesystem::path{} : path;
}

}  // namespace strata
