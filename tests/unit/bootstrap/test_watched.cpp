// The watched bootstrap (lib/bootstrap/watched.cpp): attachWatch() over an in-process bootstrap
// opens a watch scope and exchanges the status records, also with a job secret longer than a
// record holds.
#define BOOST_TEST_MODULE watched
#include <boost/test/unit_test.hpp>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>

#include <strata/bootstrap.hpp>
#include <strata/config.hpp>

#include "bootstrap/watched.hpp"
#include "launch/contract.hpp"

using namespace strata;
using strata::bootstrap::attachWatch;
using strata::bootstrap::scopeOf;
using strata::bootstrap::unwrap;

namespace {

/// Rank 0 of `size`; allGather gives every other rank a copy of rank 0's slot.
class FakeBootstrap final : public Bootstrap {
 public:
  explicit FakeBootstrap(int size) : size_(size) {}
  std::string_view backend() const noexcept override { return "fake"; }
  int rank() const noexcept override { return 0; }
  int size() const noexcept override { return size_; }
  int localRank() const noexcept override { return 0; }
  int localSize() const noexcept override { return size_; }
  void send(int, int, const void*, size_t) override {}
  void recv(int, int, void*, size_t) override {}
  void allGather(void* data, size_t bytesPerRank) override {
    auto* p = static_cast<uint8_t*>(data);
    for (int r = 1; r < size_; ++r) std::memcpy(p + bytesPerRank * r, p, bytesPerRank);
  }
  void broadcast(void*, size_t, int) override {}
  void barrier() override {}
  void abort(std::string_view) noexcept override {}

 private:
  int size_;
};

Config localConfig() {
  Config c = Config::load();
  c.set("bootstrap.tcp.interface", "lo");
  return c;
}

}  // namespace

BOOST_AUTO_TEST_CASE(attach_with_a_job_secret_longer_than_the_record_holds) {
  // The job secret has no length limit (STRATA_SECRET, bootstrap.secret_file). Rank 0 once sent
  // it in its exchange record: over 128 bytes every rank refused rank 0's record and the job
  // could not start. Now only a secret rank 0 made is sent.
  for (size_t n : {size_t(48), size_t(129), size_t(600)}) {
    BOOST_TEST_CONTEXT("secret of " << n << " bytes") {
      LaunchInfo launch;
      launch.secret = std::string(n, 's');
      auto b = attachWatch(std::make_unique<FakeBootstrap>(2), localConfig(), launch);
      BOOST_TEST(scopeOf(b.get()) != nullptr);
      BOOST_TEST(&unwrap(*b) != b.get());
    }
  }
  auto b = attachWatch(std::make_unique<FakeBootstrap>(3), localConfig(), LaunchInfo{});
  BOOST_TEST(scopeOf(b.get()) != nullptr);
}
