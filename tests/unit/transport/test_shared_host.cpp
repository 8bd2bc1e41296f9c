// The process-wide registry of allocHost memory (lib/transport/shared_host.cpp): lookups by
// address, errors, ids never reused, the free count, and lookups racing allocations and frees
// (run under ThreadSanitizer too, docs/testing.md).

#define BOOST_TEST_MODULE shared_host
#include <boost/test/unit_test.hpp>

#include <unistd.h>

#include <atomic>
#include <cstring>
#include <set>
#include <thread>
#include <vector>

#include <strata/backend/host_memory.hpp>
#include <strata/error.hpp>

using namespace strata;
using namespace strata::backend;

namespace {

ErrorCode codeOf(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.code();
  }
  BOOST_FAIL("no strata::Error thrown");
  return ErrorCode::Internal;
}

}  // namespace

BOOST_AUTO_TEST_CASE(lookup_covers_exactly_the_allocation) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  char* p = static_cast<char*>(allocSharedHost(100));
  std::memset(p, 7, page);  // rounded up to a whole page, writable
  auto r = findSharedHost(p + 10, 20);
  BOOST_TEST_REQUIRE(r.has_value());
  BOOST_TEST(r->offset == 10u);
  BOOST_TEST(r->bytes == page);
  BOOST_TEST(r->id != 0u);
  BOOST_TEST(r->fd >= 0);
  BOOST_TEST(findSharedHost(p, page).has_value());
  BOOST_TEST(!findSharedHost(p, page + 1).has_value());   // runs past the end
  BOOST_TEST(!findSharedHost(p + page, 1).has_value());   // just past it
  BOOST_TEST(!findSharedHost(p - 1, 1).has_value());      // just before it
  int onStack = 0;
  BOOST_TEST(!findSharedHost(&onStack, sizeof onStack).has_value());
  BOOST_TEST(!findSharedHost(nullptr, 1).has_value());
  freeSharedHost(p);
  BOOST_TEST(!findSharedHost(p, 1).has_value());
}

BOOST_AUTO_TEST_CASE(errors) {
  BOOST_TEST((codeOf([] { allocSharedHost(0); }) == ErrorCode::InvalidArgument));
  BOOST_TEST((codeOf([] { allocSharedHost(SIZE_MAX - 10); }) == ErrorCode::InvalidArgument));
  char* p = static_cast<char*>(allocSharedHost(4096));
  BOOST_TEST((codeOf([&] { freeSharedHost(p + 1); }) == ErrorCode::InvalidArgument));
  freeSharedHost(p);
  BOOST_TEST((codeOf([&] { freeSharedHost(p); }) == ErrorCode::InvalidArgument));
  freeSharedHost(nullptr);  // nothing
}

BOOST_AUTO_TEST_CASE(ids_are_never_reused_and_frees_are_counted) {
  std::set<uint64_t> ids;
  const uint64_t frees = sharedHostFrees();
  for (int i = 0; i < 50; ++i) {
    void* p = allocSharedHost(8192);  // the same address comes back often
    auto r = findSharedHost(p, 8192);
    BOOST_TEST_REQUIRE(r.has_value());
    BOOST_TEST(ids.insert(r->id).second, "id " << r->id << " given twice");
    freeSharedHost(p);
  }
  BOOST_TEST(sharedHostFrees() == frees + 50);
}

BOOST_AUTO_TEST_CASE(lookups_race_allocations_and_frees) {
  std::atomic<bool> stop{false};
  char* stable = static_cast<char*>(allocSharedHost(1 << 16));
  std::vector<std::thread> threads;
  std::atomic<int> misses{0};
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 2000; ++i) {
        void* p = allocSharedHost(4096 * (1 + i % 3));
        static_cast<char*>(p)[0] = 1;
        if (!findSharedHost(p, 1)) misses++;
        freeSharedHost(p);
      }
    });
  }
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&] {
      while (!stop.load()) {
        auto r = findSharedHost(stable + 100, 1000);
        if (!r || r->offset != 100) misses++;
      }
    });
  }
  threads[0].join();
  threads[1].join();
  stop = true;
  threads[2].join();
  threads[3].join();
  BOOST_TEST(misses.load() == 0);
  freeSharedHost(stable);
}
