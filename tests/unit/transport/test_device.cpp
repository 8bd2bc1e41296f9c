// The channel layer in one process, with no transport behind it. Every wait is bounded by a
// deadline, so a broken channel fails a test instead of hanging it. The main of the module
// `channels`; this file: device::copySplit (<strata/device.hpp>) at every size, misalignment and
// thread split. test_memory_channel.cpp runs MemoryChannel between two host threads,
// test_proxy.cpp the proxy FIFO and ProxyService.
#define BOOST_TEST_MODULE channels
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include <strata/device.hpp>

#include "tests/harness/pattern.hpp"
#include "tests/unit/transport/channel_fixtures.hpp"

using channels_test::AlignedBuffer;
using channels_test::kGuard;
using strata::testing::fillPattern;

namespace {

// Calls copySplit once per simulated thread, in order, like numThreads cooperating GPU threads.
void copyAllThreads(char* dst, const char* src, size_t bytes, uint32_t numThreads) {
  for (uint32_t t = 0; t < numThreads; ++t) {
    strata::device::copySplit(dst, src, bytes, t, numThreads);
  }
}

}  // namespace

// device::copySplit

BOOST_AUTO_TEST_SUITE(copy_split)

// Every size 0..300 and a few large ones, every src and dst misalignment 0..15, numThreads 1, 3,
// 4, 32 (every threadId called in turn): the range is copied, the guard bytes around it are not.
BOOST_AUTO_TEST_CASE(every_size_alignment_and_split) {
  std::vector<size_t> sizes;
  for (size_t n = 0; n <= 300; ++n) sizes.push_back(n);
  for (size_t n : {size_t{1000}, size_t{4096}, size_t{4099}, size_t{65536 + 13}}) {
    sizes.push_back(n);
  }
  const size_t maxSize = sizes.back();
  constexpr size_t kPad = 64;  // guard bytes before the largest misalignment and after the end
  AlignedBuffer src(maxSize + 2 * kPad), dst(maxSize + 2 * kPad);
  fillPattern(src.data, src.size, 7);
  std::memset(dst.data, kGuard, dst.size);
  size_t cases = 0, failures = 0;
  for (uint32_t numThreads : {1u, 3u, 4u, 32u}) {
    for (size_t n : sizes) {
      for (size_t sa = 0; sa < 16; ++sa) {
        for (size_t da = 0; da < 16; ++da) {
          char* d = dst.data + kPad + da;
          const char* s = src.data + kPad + sa;
          copyAllThreads(d, s, n, numThreads);
          ++cases;
          bool ok = std::memcmp(d, s, n) == 0;
          // Only the bytes around the range can have been hit by a wrong head or tail.
          for (size_t i = 0; ok && i < kPad + da; ++i) ok = dst.data[i] == kGuard;
          for (size_t i = kPad + da + n; ok && i < dst.size; ++i) ok = dst.data[i] == kGuard;
          if (!ok && ++failures <= 5) {
            BOOST_ERROR("copySplit wrong for bytes=" << n << " src%16=" << sa << " dst%16=" << da
                                                     << " numThreads=" << numThreads);
          }
          std::memset(d, kGuard, n);
        }
      }
    }
  }
  BOOST_TEST(failures == 0u);
  BOOST_TEST_MESSAGE(cases << " copySplit cases");
}

// The threads' shares partition the range: every byte is written by exactly one threadId (on the
// GPU the threads run at once, so an overlap would be a race and a gap a lost byte).
BOOST_AUTO_TEST_CASE(thread_shares_partition_the_range) {
  constexpr size_t kMax = 300, kPad = 64;
  AlignedBuffer src(kMax + 2 * kPad), dst(kMax + 2 * kPad);
  // Source bytes never equal the guard, so "changed" means "written".
  for (size_t i = 0; i < src.size; ++i) src.data[i] = static_cast<char>(1 + i % 100);
  std::vector<int> writes(dst.size);
  size_t failures = 0;
  const std::pair<size_t, size_t> alignments[] = {{0, 0}, {1, 1}, {3, 3}, {15, 15},
                                                  {8, 8}, {0, 8}, {5, 9}, {15, 0}};
  for (uint32_t numThreads : {2u, 3u, 4u, 32u}) {
    for (size_t n = 0; n <= kMax; ++n) {
      for (auto [sa, da] : alignments) {
        std::fill(writes.begin(), writes.end(), 0);
        for (uint32_t t = 0; t < numThreads; ++t) {
          std::memset(dst.data, kGuard, dst.size);
          strata::device::copySplit(dst.data + kPad + da, src.data + kPad + sa, n, t, numThreads);
          for (size_t i = 0; i < dst.size; ++i) writes[i] += dst.data[i] != kGuard;
        }
        bool ok = true;
        for (size_t i = 0; i < dst.size; ++i) {
          bool inside = i >= kPad + da && i < kPad + da + n;
          ok = ok && writes[i] == (inside ? 1 : 0);
        }
        if (!ok && ++failures <= 5) {
          BOOST_ERROR("copySplit shares overlap or leave gaps for bytes="
                      << n << " src%16=" << sa << " dst%16=" << da << " numThreads=" << numThreads);
        }
      }
    }
  }
  BOOST_TEST(failures == 0u);
}

BOOST_AUTO_TEST_SUITE_END()
