// A collectives module for the unit tests (strata-collectives-testcoll.so): one algorithm,
// "testcopy", that serves allGather on host memory of a one-rank job by copying, registered
// through the same entry point as a CUDA module would be.

#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <strata/backend/collectives.hpp>
#include <strata/backend/module.hpp>
#include <strata/version.hpp>

namespace {

using strata::backend::BufferKind;
using strata::backend::CollectiveOp;
using strata::backend::CollectiveRequest;

class TestCopy final : public strata::backend::Algorithm {
 public:
  explicit TestCopy(int size) : size_(size) {}
  std::string_view name() const noexcept override { return "testcopy"; }
  std::vector<CollectiveOp> ops() const override { return {CollectiveOp::AllGather}; }
  std::string describe() const override { return "test module: allGather of one rank by copy"; }
  std::string unsuitable(const CollectiveRequest&) const override {
    return size_ == 1 ? "" : "one rank only";
  }
  bool prefers(const CollectiveRequest&) const override { return false; }
  void run(const CollectiveRequest& r) override {
    if (r.send != r.recv) std::memmove(r.recv, r.send, r.bytes());
    ++runs;
  }
  int runs = 0;

 private:
  int size_;
};

class TestBackend final : public strata::backend::CollectivesBackend {
 public:
  explicit TestBackend(const strata::backend::CollectivesInit& init) : algo_(init.topology.size) {}
  std::string_view name() const noexcept override { return "testcoll"; }
  std::vector<BufferKind> memoryKinds() const override { return {BufferKind::Host}; }
  std::vector<strata::backend::Algorithm*> algorithms() override { return {&algo_}; }
  /// STRATA_TESTCOLL_ASYNC_ERROR set: an asynchronous Timeout from rank 0 (Communicator's
  /// asyncError() plumbing).
  std::optional<strata::Error> asyncError() const override {
    if (std::getenv("STRATA_TESTCOLL_ASYNC_ERROR") == nullptr) return std::nullopt;
    return strata::Error(strata::ErrorCode::Timeout,
                         "testcoll: a kernel gave up waiting for rank 0", 0);
  }
  /// STRATA_TESTCOLL_TUNING set: its value, as is (Communicator::tuningReport's joining);
  /// otherwise the SDK's default, nothing tuned.
  std::string tuningReport() const override {
    const char* text = std::getenv("STRATA_TESTCOLL_TUNING");
    return text != nullptr ? text : CollectivesBackend::tuningReport();
  }

 private:
  TestCopy algo_;
};

std::unique_ptr<strata::backend::CollectivesBackend> create(
    const strata::backend::CollectivesInit& init) {
  return std::make_unique<TestBackend>(init);
}

}  // namespace

extern "C" __attribute__((visibility("default"))) const strata::backend::ModuleInfo*
strata_module_info() {
  static const strata::backend::ModuleInfo info{
      STRATA_MODULE_ABI_VERSION,
      strata::backend::ModuleKind::Collectives,
      "testcoll",
      STRATA_VERSION_STRING,
      "test collectives module",
      nullptr,
      nullptr,
      nullptr,
      &create,
      nullptr,
  };
  return &info;
}
