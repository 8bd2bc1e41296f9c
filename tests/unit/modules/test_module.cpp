// Test bootstrap modules for the registry tests. One source, three builds:
//   TEST_MODULE_GOOD     a working single-rank backend named "testgood"
//   TEST_MODULE_BAD_ABI  claims a module ABI this library does not have
//   TEST_MODULE_NO_ENTRY exports no entry point at all

#include <strata/backend/module.hpp>
#include <strata/error.hpp>
#include <strata/version.hpp>

namespace {

class SingleRank final : public strata::Bootstrap {
 public:
  std::string_view backend() const noexcept override { return "testgood"; }
  int rank() const noexcept override { return 0; }
  int size() const noexcept override { return 1; }
  int localRank() const noexcept override { return 0; }
  int localSize() const noexcept override { return 1; }
  void send(int, int, const void*, size_t) override { fail(); }
  void recv(int, int, void*, size_t) override { fail(); }
  void allGather(void*, size_t) override {}
  void broadcast(void*, size_t, int) override {}
  void barrier() override {}
  void abort(std::string_view) noexcept override {}

 private:
  [[noreturn]] static void fail() {
    throw strata::Error(strata::ErrorCode::InvalidArgument, "testgood has no peers");
  }
};

}  // namespace

#ifndef TEST_MODULE_NO_ENTRY
extern "C" __attribute__((visibility("default"))) const strata::backend::ModuleInfo*
strata_module_info() {
  static const strata::backend::ModuleInfo info = {
#ifdef TEST_MODULE_BAD_ABI
      STRATA_MODULE_ABI_VERSION + 998,
#else
      STRATA_MODULE_ABI_VERSION,
#endif
      strata::backend::ModuleKind::Bootstrap,
      TEST_MODULE_NAME,
#ifdef TEST_MODULE_OLD_VERSION
      "0.0.1-old",
#else
      STRATA_VERSION_STRING,
#endif
      "test module",
      []() noexcept { return true; },
      [](const strata::Config&) -> std::unique_ptr<strata::Bootstrap> {
        return std::make_unique<SingleRank>();
      },
      nullptr,
      nullptr,
      nullptr,
  };
  return &info;
}
#endif
