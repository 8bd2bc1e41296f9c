// MemoryChannel (<strata/channel.hpp>) between two host threads over plain buffers: ping-pong,
// poll and wait, get, getTo and putFrom. Part of the module `channels` (test_device.cpp).
#include <boost/test/unit_test.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>

#include <fmt/format.h>

#include <strata/channel.hpp>

#include "tests/harness/pattern.hpp"
#include "tests/unit/transport/channel_fixtures.hpp"

using channels_test::AlignedBuffer;
using channels_test::FirstFailure;
using channels_test::kGuard;
using strata::MemoryChannel;
using strata::testing::checkPattern;
using strata::testing::fillPattern;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

namespace {

// Polls a channel until a signal arrives, the deadline passes or the peer gave up.
template <typename Channel>
bool waitSignal(Channel& ch, Clock::time_point deadline, const std::atomic<bool>& abort) {
  for (;;) {
    if (ch.wait(256)) return true;
    if (abort.load(std::memory_order_relaxed) || Clock::now() > deadline) return false;
    std::this_thread::yield();  // two cores, other builds: let the peer thread run
  }
}

// Two ranks' worth of buffers and counters in one process, and the channel each side holds:
// a's remote is b's buffer and a's remoteInbound is b's inbound word, and the other way round.
struct ChannelPair {
  static constexpr size_t kBytes = 1 << 14;
  AlignedBuffer bufA{kBytes}, bufB{kBytes};
  alignas(64) uint64_t inA = 0;
  alignas(64) uint64_t inB = 0;
  alignas(64) uint64_t consumedA = 0;  // the channels' expected words
  alignas(64) uint64_t consumedB = 0;
  MemoryChannel a, b;
  ChannelPair() {
    std::memset(bufA.data, 0, kBytes);
    std::memset(bufB.data, 0, kBytes);
    a.remote = bufB.data;
    a.local = bufA.data;
    a.inbound = &inA;
    a.remoteInbound = &inB;
    a.expected = &consumedA;
    b.remote = bufA.data;
    b.local = bufB.data;
    b.inbound = &inB;
    b.remoteInbound = &inA;
    b.expected = &consumedB;
  }
};

}  // namespace

BOOST_AUTO_TEST_SUITE(memory_channel)

// 10000 rounds: A puts a round-specific pattern (size, offset and thread split vary) and
// signals; B waits, checks, puts a reply into A's buffer and signals back; A checks the reply.
// The data must be complete whenever the signal is seen.
BOOST_AUTO_TEST_CASE(ping_pong_between_threads) {
  constexpr int kRounds = 10000;
  constexpr size_t kReplyBase = 8192;  // replies land in A's upper half, requests in B's lower
  ChannelPair pair;
  FirstFailure failure;
  const auto deadline = Clock::now() + 120s;

  auto requestShape = [](int r, size_t& offset, size_t& bytes, uint32_t& threads) {
    bytes = 1 + (static_cast<size_t>(r) * 37) % 4096;
    offset = static_cast<size_t>(r) % 17;
    threads = r % 3 == 0 ? 4 : (r % 3 == 1 ? 1 : 3);
  };
  auto replyBytes = [](int r) { return 1 + (static_cast<size_t>(r) * 53) % 2048; };

  std::thread sideB([&] {
    MemoryChannel& ch = pair.b;
    for (int r = 0; r < kRounds; ++r) {
      if (!waitSignal(ch, deadline, failure.failed)) {
        failure.set(fmt::format("B: no request signal in round {}", r));
        return;
      }
      size_t offset, bytes;
      uint32_t threads;
      requestShape(r, offset, bytes, threads);
      size_t bad = checkPattern(pair.bufB.data + offset, bytes, r);
      if (bad != bytes) {
        failure.set(fmt::format("B: round {} request byte {} of {} not visible after the signal", r,
                                bad, bytes));
        return;
      }
      size_t reply = replyBytes(r);
      fillPattern(pair.bufB.data + kReplyBase, reply, r + 1000000);
      for (uint32_t t = 0; t < threads; ++t) ch.put(kReplyBase, kReplyBase, reply, t, threads);
      ch.signal();
    }
  });

  MemoryChannel& ch = pair.a;
  for (int r = 0; r < kRounds && !failure.failed; ++r) {
    size_t offset, bytes;
    uint32_t threads;
    requestShape(r, offset, bytes, threads);
    fillPattern(pair.bufA.data + offset, bytes, r);
    for (uint32_t t = 0; t < threads; ++t) ch.put(offset, offset, bytes, t, threads);
    ch.signal();
    if (!waitSignal(ch, deadline, failure.failed)) {
      failure.set(fmt::format("A: no reply signal in round {}", r));
      break;
    }
    size_t reply = replyBytes(r);
    size_t bad = checkPattern(pair.bufA.data + kReplyBase, reply, r + 1000000);
    if (bad != reply) {
      failure.set(fmt::format("A: round {} reply byte {} of {} not visible after the signal", r,
                              bad, reply));
    }
  }
  sideB.join();
  BOOST_TEST(failure.message == "");
  if (!failure.failed) {
    // Exactly one signal per round each way, all consumed.
    BOOST_TEST(pair.consumedA == uint64_t{kRounds});
    BOOST_TEST(pair.consumedB == uint64_t{kRounds});
    BOOST_TEST(strata::device::loadAcquire(&pair.inA) == uint64_t{kRounds});
    BOOST_TEST(strata::device::loadAcquire(&pair.inB) == uint64_t{kRounds});
    BOOST_TEST(!pair.a.poll());
    BOOST_TEST(!pair.b.poll());
  }
}

// poll() consumes exactly one pending signal per call and never blocks; wait(maxSpins) gives up.
BOOST_AUTO_TEST_CASE(poll_consumes_one_signal) {
  ChannelPair pair;
  BOOST_TEST(!pair.b.poll());
  BOOST_TEST(!pair.b.wait(100));
  for (int i = 0; i < 3; ++i) pair.a.signal();
  BOOST_TEST(pair.inB == 3u);
  BOOST_TEST(pair.b.poll());
  BOOST_TEST(pair.consumedB == 1u);
  BOOST_TEST(pair.b.poll());
  BOOST_TEST(pair.b.poll());
  BOOST_TEST(pair.consumedB == 3u);
  BOOST_TEST(!pair.b.poll());
  BOOST_TEST(!pair.b.wait(100));
  BOOST_TEST(pair.consumedB == 3u);
  // Signals in the other direction are independent.
  BOOST_TEST(!pair.a.poll());
  pair.b.signal();
  BOOST_TEST(pair.a.wait(1));
  BOOST_TEST(!pair.a.poll());
  // A pending signal ends an unbounded wait at once.
  pair.a.signal();
  BOOST_TEST(pair.b.wait(-1));
  BOOST_TEST(pair.consumedB == 4u);
}

// A signal from another thread ends a blocked wait (bounded here by a deadline).
BOOST_AUTO_TEST_CASE(wait_wakes_on_signal_from_another_thread) {
  ChannelPair pair;
  std::atomic<bool> abort{false};
  std::thread signaller([&] {
    std::this_thread::sleep_for(20ms);
    pair.a.signal();
  });
  bool got = waitSignal(pair.b, Clock::now() + 30s, abort);
  signaller.join();
  BOOST_TEST(got);
  BOOST_TEST(!pair.b.poll());
}

// get() and getTo() read the peer's buffer; putFrom() writes it from any address. Sizes,
// offsets and thread splits vary; bytes outside the range stay untouched.
BOOST_AUTO_TEST_CASE(get_get_to_and_put_from) {
  ChannelPair pair;
  fillPattern(pair.bufB.data, ChannelPair::kBytes, 42);  // the peer's data
  AlignedBuffer outside(ChannelPair::kBytes);
  size_t failures = 0;
  for (uint32_t threads : {1u, 3u, 4u, 32u}) {
    for (size_t bytes : {size_t{0}, size_t{1}, size_t{15}, size_t{16}, size_t{17}, size_t{255},
                         size_t{4096}, size_t{5000}}) {
      for (size_t srcOff : {size_t{0}, size_t{1}, size_t{9}, size_t{16}}) {
        for (size_t dstOff : {size_t{0}, size_t{3}, size_t{16}}) {
          std::memset(pair.bufA.data, kGuard, ChannelPair::kBytes);
          for (uint32_t t = 0; t < threads; ++t) pair.a.get(srcOff, dstOff, bytes, t, threads);
          bool ok = std::memcmp(pair.bufA.data + dstOff, pair.bufB.data + srcOff, bytes) == 0;
          for (size_t i = 0; i < ChannelPair::kBytes; ++i) {
            if (i < dstOff || i >= dstOff + bytes) ok = ok && pair.bufA.data[i] == kGuard;
          }
          std::memset(outside.data, kGuard, outside.size);
          for (uint32_t t = 0; t < threads; ++t) {
            pair.a.getTo(outside.data + dstOff, srcOff, bytes, t, threads);
          }
          ok = ok && std::memcmp(outside.data + dstOff, pair.bufB.data + srcOff, bytes) == 0;
          for (size_t i = 0; i < outside.size; ++i) {
            if (i < dstOff || i >= dstOff + bytes) ok = ok && outside.data[i] == kGuard;
          }
          if (!ok && ++failures <= 5) {
            BOOST_ERROR("get/getTo wrong for bytes=" << bytes << " srcOffset=" << srcOff
                                                     << " dstOffset=" << dstOff
                                                     << " numThreads=" << threads);
          }
        }
      }
    }
  }
  // putFrom: from a buffer that is neither channel buffer, into the peer's.
  fillPattern(outside.data, outside.size, 99);
  std::memset(pair.bufB.data, kGuard, ChannelPair::kBytes);
  for (uint32_t t = 0; t < 4; ++t) pair.a.putFrom(100, outside.data + 5, 3000, t, 4);
  BOOST_TEST(std::memcmp(pair.bufB.data + 100, outside.data + 5, 3000) == 0);
  BOOST_TEST(pair.bufB.data[99] == kGuard);
  BOOST_TEST(pair.bufB.data[3100] == kGuard);
  BOOST_TEST(failures == 0u);
}

namespace {
// What a kernel launch does with a channel: gets its own copy of the handle (a by-value kernel
// argument), signals or consumes once, and the copy is gone at the end of the launch.
void launchSignal(MemoryChannel ch) {
  ch.signal();
}
bool launchPoll(MemoryChannel ch) {
  return ch.poll();
}
}  // namespace

// Defect 10 of the GPU readiness issue: handles passed by value to every launch must keep their
// counts across launches (they live in memory now). With counts inside the handle, the second
// launch's copy of b started from 0 consumed signals and saw launch one's signal again, and a's
// copies each stored "1" into b's counter, so launch two's signal never counted.
BOOST_AUTO_TEST_CASE(handles_copied_into_every_launch_keep_their_counts) {
  ChannelPair pair;
  for (uint64_t launch = 1; launch <= 5; ++launch) {
    BOOST_TEST(!launchPoll(pair.b));  // nothing new before this launch's signal
    launchSignal(pair.a);
    BOOST_TEST(strata::device::loadAcquire(&pair.inB) == launch);
    BOOST_TEST(launchPoll(pair.b));
    BOOST_TEST(pair.consumedB == launch);
  }
  BOOST_TEST(!launchPoll(pair.b));
}

BOOST_AUTO_TEST_SUITE_END()
