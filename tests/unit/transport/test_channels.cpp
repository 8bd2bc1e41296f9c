// The channel layer in one process: device::copySplit (every size, misalignment and thread split),
// MemoryChannel between two host threads over plain buffers (ping-pong, poll/wait, get), and the
// proxy FIFO (back-pressure, sticky errors, clean shutdown, many producers, sleeping and waking).
// Every wait is bounded by a deadline, so a broken channel fails a test instead of hanging it.
#define BOOST_TEST_MODULE channels
#include <boost/test/unit_test.hpp>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include <strata/channel.hpp>
#include <strata/device.hpp>
#include <strata/error.hpp>

// Stand-in Connections and RegisteredMemory (no transport behind them), to build argument-check
// fixtures for ProxyService::addChannel without a second rank.
#include "transport/testing.hpp"

using strata::Error;
using strata::ErrorCode;
using strata::FifoDeviceHandle;
using strata::MemoryChannel;
using strata::PortChannel;
using strata::ProxyService;
using strata::ProxyTrigger;
using strata::TriggerType;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

namespace {

auto hasCode(ErrorCode code) {
  return [code](const Error& e) { return e.code() == code; };
}

uint8_t patternByte(uint64_t seed, size_t i) {
  return static_cast<uint8_t>((seed * 131 + i * 7 + 1) & 0xff);
}

void fillPattern(char* p, size_t n, uint64_t seed) {
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<char>(patternByte(seed, i));
}

// Index of the first byte that differs from the pattern, or n.
size_t firstMismatch(const char* p, size_t n, uint64_t seed) {
  for (size_t i = 0; i < n; ++i) {
    if (static_cast<uint8_t>(p[i]) != patternByte(seed, i)) return i;
  }
  return n;
}

// Buffers with a known base alignment (so "misalignment k" means address % 16 == k).
struct AlignedBuffer {
  explicit AlignedBuffer(size_t bytes)
      : data(new (std::align_val_t{64}) char[bytes]), size(bytes) {}
  ~AlignedBuffer() { ::operator delete[](data, std::align_val_t{64}); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  char* data;
  size_t size;
};

// The first failure seen by a worker thread (Boost.Test assertions are not thread-safe), reported
// by the main thread after join.
struct FirstFailure {
  std::mutex mu;
  std::string message;
  std::atomic<bool> failed{false};
  void set(std::string m) {
    std::lock_guard<std::mutex> lock(mu);
    if (message.empty()) message = std::move(m);
    failed.store(true);
  }
};

// Polls a channel until a signal arrives, the deadline passes or the peer gave up.
template <typename Channel>
bool waitSignal(Channel& ch, Clock::time_point deadline, const std::atomic<bool>& abort) {
  for (;;) {
    if (ch.wait(256)) return true;
    if (abort.load(std::memory_order_relaxed) || Clock::now() > deadline) return false;
    std::this_thread::yield();  // two cores, other builds: let the peer thread run
  }
}

// Calls copySplit once per simulated thread, in order, like numThreads cooperating GPU threads.
void copyAllThreads(char* dst, const char* src, size_t bytes, uint32_t numThreads) {
  for (uint32_t t = 0; t < numThreads; ++t) {
    strata::device::copySplit(dst, src, bytes, t, numThreads);
  }
}

constexpr char kGuard = static_cast<char>(0xA5);

}  // namespace

// ---------------------------------------------------------------------------------------------
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

// ---------------------------------------------------------------------------------------------
// MemoryChannel between two threads

namespace {

// Two ranks' worth of buffers and counters in one process, and the channel each side holds:
// a's remote is b's buffer and a's remoteInbound is b's inbound word, and the other way round.
struct ChannelPair {
  static constexpr size_t kBytes = 1 << 14;
  AlignedBuffer bufA{kBytes}, bufB{kBytes};
  alignas(64) uint64_t inA = 0;
  alignas(64) uint64_t inB = 0;
  MemoryChannel a, b;
  ChannelPair() {
    std::memset(bufA.data, 0, kBytes);
    std::memset(bufB.data, 0, kBytes);
    a.remote = bufB.data;
    a.local = bufA.data;
    a.inbound = &inA;
    a.remoteInbound = &inB;
    b.remote = bufA.data;
    b.local = bufB.data;
    b.inbound = &inB;
    b.remoteInbound = &inA;
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
      size_t bad = firstMismatch(pair.bufB.data + offset, bytes, r);
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
    size_t bad = firstMismatch(pair.bufA.data + kReplyBase, reply, r + 1000000);
    if (bad != reply) {
      failure.set(fmt::format("A: round {} reply byte {} of {} not visible after the signal", r,
                              bad, reply));
    }
  }
  sideB.join();
  BOOST_TEST(failure.message == "");
  if (!failure.failed) {
    // Exactly one signal per round each way, all consumed.
    BOOST_TEST(pair.a.outbound == uint64_t{kRounds});
    BOOST_TEST(pair.b.outbound == uint64_t{kRounds});
    BOOST_TEST(pair.a.expected == uint64_t{kRounds});
    BOOST_TEST(pair.b.expected == uint64_t{kRounds});
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
  BOOST_TEST(pair.b.expected == 1u);
  BOOST_TEST(pair.b.poll());
  BOOST_TEST(pair.b.poll());
  BOOST_TEST(pair.b.expected == 3u);
  BOOST_TEST(!pair.b.poll());
  BOOST_TEST(!pair.b.wait(100));
  BOOST_TEST(pair.b.expected == 3u);
  // Signals in the other direction are independent.
  BOOST_TEST(!pair.a.poll());
  pair.b.signal();
  BOOST_TEST(pair.a.wait(1));
  BOOST_TEST(!pair.a.poll());
  // A pending signal ends an unbounded wait at once.
  pair.a.signal();
  BOOST_TEST(pair.b.wait(-1));
  BOOST_TEST(pair.b.expected == 4u);
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

BOOST_AUTO_TEST_SUITE_END()

// ---------------------------------------------------------------------------------------------
// FIFO and ProxyService

namespace {

// Pushes until accepted or the deadline passes.
bool pushUntil(FifoDeviceHandle& fifo, const ProxyTrigger& t, uint64_t* id,
               Clock::time_point deadline) {
  for (;;) {
    if (fifo.tryPush(t, id)) return true;
    if (Clock::now() > deadline) return false;
    std::this_thread::yield();
  }
}

bool doneBy(const FifoDeviceHandle& fifo, uint64_t id, Clock::time_point deadline) {
  for (;;) {
    if (fifo.sync(id, 1024)) return true;
    if (Clock::now() > deadline) return false;
    std::this_thread::yield();
  }
}

// A trigger for a channel the proxy does not have: executing it records InvalidArgument.
ProxyTrigger bogusTrigger(uint64_t n) {
  ProxyTrigger t;
  t.dstOffset = n;
  t.srcOffset = n;
  t.bytes = 8;
  t.channel = 12345;
  t.type = TriggerType::Put;
  return t;
}

uint64_t loadWord(const uint64_t* w) {
  return __atomic_load_n(w, __ATOMIC_ACQUIRE);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(proxy)

BOOST_AUTO_TEST_CASE(fifo_memory_is_one_page_aligned_block_a_device_can_map) {
  ProxyService proxy(16);
  const std::span<std::byte> mem = proxy.fifoMemory();
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  BOOST_TEST(reinterpret_cast<uintptr_t>(mem.data()) % page == 0u);
  BOOST_TEST(mem.size() % page == 0u);
  BOOST_TEST(mem.size() >= 16 * sizeof(strata::FifoSlot));
  const FifoDeviceHandle h = proxy.fifo();
  auto inside = [&](const void* p, size_t bytes) {
    auto* c = static_cast<const std::byte*>(p);
    return c >= mem.data() && c + bytes <= mem.data() + mem.size();
  };
  BOOST_TEST(inside(h.slots, 16 * sizeof(strata::FifoSlot)));
  BOOST_TEST(inside(h.head, 8));
  BOOST_TEST(inside(h.tail, 8));
  BOOST_TEST(inside(h.wake, 4));
  BOOST_TEST(inside(h.sleeping, 4));
  // The handle a kernel gets: the same offsets from the device's view of the block.
  char* device = reinterpret_cast<char*>(uintptr_t{1} << 40);
  const FifoDeviceHandle d = proxy.fifo(device);
  auto offset = [](const void* p, const void* base) {
    return static_cast<const char*>(p) - static_cast<const char*>(base);
  };
  BOOST_TEST(offset(d.slots, device) == offset(h.slots, mem.data()));
  BOOST_TEST(offset(d.head, device) == offset(h.head, mem.data()));
  BOOST_TEST(offset(d.tail, device) == offset(h.tail, mem.data()));
  BOOST_TEST(offset(d.wake, device) == offset(h.wake, mem.data()));
  BOOST_TEST(offset(d.sleeping, device) == offset(h.sleeping, mem.data()));
  BOOST_TEST(d.size == h.size);
  BOOST_TEST(proxy.fifo(mem.data()).head == h.head);
}

BOOST_AUTO_TEST_CASE(device_work_keeps_the_proxy_polling) {
  ProxyService proxy(16);
  proxy.start();
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  // Idle without device work: it sleeps (1 ms at a time).
  while (proxy.sleeps() < 3 && Clock::now() < deadline) std::this_thread::sleep_for(1ms);
  BOOST_TEST_REQUIRE(proxy.sleeps() >= 3u);
  proxy.beginDeviceWork();
  const uint64_t s0 = proxy.sleeps();
  // A producer that cannot wake the proxy (a kernel): reserve, write, publish; no wakeProxy().
  FifoDeviceHandle h = proxy.fifo();
  const uint64_t id = __atomic_fetch_add(h.head, 1, __ATOMIC_ACQ_REL);
  h.slots[id % h.size].trigger = bogusTrigger(1);
  __atomic_store_n(&h.slots[id % h.size].seq, id + 1, __ATOMIC_RELEASE);
  BOOST_TEST(doneBy(h, id, deadline));
  std::this_thread::sleep_for(50ms);
  // At most the sleep it was in when the work began (begin wakes it).
  BOOST_TEST(proxy.sleeps() <= s0 + 1);
  proxy.endDeviceWork();
  const uint64_t s1 = proxy.sleeps();
  while (proxy.sleeps() <= s1 && Clock::now() < deadline) std::this_thread::sleep_for(1ms);
  BOOST_TEST(proxy.sleeps() > s1);  // idle again: back to sleeping
  proxy.stop();
}

BOOST_AUTO_TEST_CASE(fifo_size_zero_is_rejected) {
  BOOST_CHECK_EXCEPTION(ProxyService(0), Error, hasCode(ErrorCode::InvalidArgument));
}

// Without start() nobody consumes: 8 pushes fit a FIFO of 8, the 9th is refused (back-pressure).
// After start() the proxy consumes them all; the first (a channel that does not exist) is a
// sticky InvalidArgument, the rest are consumed without effect so that producers never block.
BOOST_AUTO_TEST_CASE(back_pressure_then_sticky_error_then_drain) {
  const auto deadline = Clock::now() + 60s;
  ProxyService proxy(8);
  FifoDeviceHandle fifo = proxy.fifo();
  BOOST_TEST(fifo.size == 8u);
  // A hand-made PortChannel on the same FIFO (portChannel() needs a real channel): its
  // non-blocking forms push the same triggers as a real one.
  PortChannel port;
  port.fifo = fifo;
  port.channel = 77;
  std::vector<uint64_t> ids;
  uint64_t id = ~uint64_t{0};
  for (int i = 0; i < 4; ++i) {
    BOOST_TEST_REQUIRE(fifo.tryPush(bogusTrigger(i), &id));
    ids.push_back(id);
  }
  BOOST_TEST_REQUIRE(port.tryPut(0, 0, 64, &id));
  ids.push_back(id);
  BOOST_TEST_REQUIRE(port.trySignal(&id));
  ids.push_back(id);
  BOOST_TEST_REQUIRE(port.tryPutWithSignal(64, 64, 64, &id));
  ids.push_back(id);
  BOOST_TEST_REQUIRE(port.tryFlush(&id));
  ids.push_back(id);
  for (size_t i = 0; i < ids.size(); ++i) BOOST_TEST(ids[i] == i);

  uint64_t refused = 12345;
  BOOST_TEST(!fifo.tryPush(bogusTrigger(8), &refused));
  BOOST_TEST(refused == 12345u);  // untouched when nothing was pushed
  BOOST_TEST(!port.trySignal(&refused));
  BOOST_TEST(loadWord(fifo.head) == 8u);
  for (uint64_t i : ids) BOOST_TEST(!fifo.done(i));
  BOOST_TEST(!fifo.sync(0, 100));
  BOOST_TEST(proxy.executed() == 0u);
  BOOST_CHECK_NO_THROW(proxy.check());

  proxy.start();
  BOOST_TEST_REQUIRE(doneBy(fifo, ids.back(), deadline));
  for (uint64_t i : ids) BOOST_TEST(fifo.done(i));
  BOOST_TEST(proxy.executed() == 8u);
  BOOST_CHECK_EXCEPTION(proxy.check(), Error, hasCode(ErrorCode::InvalidArgument));

  // A failed proxy keeps consuming: 1000 more pushes through a FIFO of 8 all complete.
  uint64_t last = 0;
  for (int i = 0; i < 1000; ++i) {
    BOOST_TEST_REQUIRE(pushUntil(fifo, bogusTrigger(i), &last, deadline));
  }
  BOOST_TEST(last == 1007u);
  BOOST_TEST_REQUIRE(doneBy(fifo, last, deadline));
  BOOST_TEST(proxy.executed() == 1008u);
  // The blocking forms of PortChannel return once the proxy took the trigger.
  uint64_t sig = port.signal();
  BOOST_TEST(sig == 1008u);
  BOOST_TEST(doneBy(fifo, sig, deadline));
  // flush() spins at most maxSpins, which a descheduled proxy thread (two loaded cores) can
  // outlast; each retry queues one more flush, so retry until the deadline.
  bool flushed = false;
  while (!flushed && Clock::now() < deadline) {
    flushed = port.flush(1 << 14);
    if (!flushed) std::this_thread::yield();
  }
  BOOST_TEST(flushed);

  // After the proxy went to sleep (idle > 1 ms), a push still wakes it.
  std::this_thread::sleep_for(20ms);
  const auto woke = Clock::now();
  BOOST_TEST_REQUIRE(fifo.tryPush(bogusTrigger(0), &id));
  BOOST_TEST(doneBy(fifo, id, deadline));
  const double wakeUs = std::chrono::duration<double, std::micro>(Clock::now() - woke).count();
  BOOST_TEST_MESSAGE("consumed a push to a sleeping proxy after " << wakeUs << " us");
  // Still the first error.
  BOOST_CHECK_EXCEPTION(proxy.check(), Error, [](const Error& e) {
    return e.code() == ErrorCode::InvalidArgument &&
           std::string(e.what()).find("channel 12345") != std::string::npos;
  });

  const uint64_t before = proxy.executed();
  proxy.stop();
  proxy.stop();  // idempotent
  BOOST_TEST(proxy.executed() == before);
  BOOST_TEST(loadWord(fifo.tail) == loadWord(fifo.head));
}  // the destructor after stop()

// stop() executes what is queued before the thread ends.
BOOST_AUTO_TEST_CASE(stop_drains_the_fifo) {
  const auto deadline = Clock::now() + 60s;
  ProxyService proxy(64);
  FifoDeviceHandle fifo = proxy.fifo();
  proxy.start();
  uint64_t id = 0;
  for (int i = 0; i < 64; ++i) BOOST_TEST_REQUIRE(pushUntil(fifo, bogusTrigger(i), &id, deadline));
  proxy.stop();
  BOOST_TEST(proxy.executed() == 64u);
  BOOST_TEST(fifo.done(id));
  proxy.stop();
}

// Destruction without start(), and stop() without start(), are harmless.
BOOST_AUTO_TEST_CASE(stop_and_destroy_without_start) {
  {
    ProxyService proxy(4);
    proxy.stop();
    proxy.stop();
    BOOST_TEST(proxy.executed() == 0u);
  }
  {
    ProxyService proxy(4);
    uint64_t id = 0;
    FifoDeviceHandle fifo = proxy.fifo();
    BOOST_TEST(fifo.tryPush(bogusTrigger(0), &id));
  }  // never started, one trigger queued: the destructor must not hang
  {
    ProxyService proxy;  // defaults
    BOOST_TEST(proxy.fifo().size == 1024u);
    proxy.start();
    proxy.start();  // a second start() is a no-op
  }
}

namespace {

// addChannel only checks its arguments and stores them, so stand-in handles (no transport,
// never used for I/O) are enough.
std::shared_ptr<strata::Connection> fakeConnection() {
  return strata::transport::testing::connectionOver(1, "fake", nullptr);
}

strata::RegisteredMemory fakeMemory(bool local, void* data, size_t bytes) {
  return strata::transport::testing::fakeMemory(local, data, bytes);
}

}  // namespace

BOOST_AUTO_TEST_CASE(add_channel_argument_checks) {
  std::vector<char> buffer(4096);
  auto conn = fakeConnection();
  auto local = fakeMemory(true, buffer.data(), buffer.size());
  auto remote = fakeMemory(false, nullptr, buffer.size());
  auto flags = fakeMemory(false, nullptr, 64);
  const auto invalid = hasCode(ErrorCode::InvalidArgument);

  ProxyService proxy(16);
  // Null connection or memory.
  BOOST_CHECK_EXCEPTION(proxy.addChannel(nullptr, remote, local, flags, 0), Error, invalid);
  BOOST_CHECK_EXCEPTION(proxy.addChannel(conn, {}, local, flags, 0), Error, invalid);
  BOOST_CHECK_EXCEPTION(proxy.addChannel(conn, remote, {}, flags, 0), Error, invalid);
  BOOST_CHECK_EXCEPTION(proxy.addChannel(conn, remote, local, {}, 0), Error, invalid);
  // Local and remote mixed up: dst and peerFlags must be remote views, src local.
  BOOST_CHECK_EXCEPTION(proxy.addChannel(conn, local, local, flags, 0), Error, invalid);
  BOOST_CHECK_EXCEPTION(proxy.addChannel(conn, remote, remote, flags, 0), Error, invalid);
  BOOST_CHECK_EXCEPTION(proxy.addChannel(conn, remote, local, local, 0), Error, invalid);
  BOOST_CHECK_EXCEPTION(proxy.addChannel(conn, local, remote, flags, 0), Error, invalid);
  // No channel was added by the failed calls.
  BOOST_CHECK_EXCEPTION(proxy.portChannel(0, nullptr), Error, invalid);

  // A valid channel gets id 0 and a handle; unknown ids are still refused.
  uint32_t ch = proxy.addChannel(conn, remote, local, flags, 8);
  BOOST_TEST(ch == 0u);
  alignas(8) uint64_t inbound = 5;
  PortChannel port = proxy.portChannel(ch, &inbound);
  BOOST_TEST(port.channel == ch);
  BOOST_TEST(port.inbound == &inbound);
  BOOST_TEST(port.expected == 5u);  // signals that arrived before are not pending
  BOOST_TEST(!port.poll());
  __atomic_store_n(&inbound, 6, __ATOMIC_RELEASE);
  BOOST_TEST(port.wait(100));
  BOOST_TEST(!port.poll());
  BOOST_TEST(port.fifo.slots == proxy.fifo().slots);
  BOOST_CHECK_EXCEPTION(proxy.portChannel(1, &inbound), Error, invalid);
  BOOST_CHECK_EXCEPTION(proxy.portChannel(~0u, &inbound), Error, invalid);

  // Channels are fixed once the thread runs.
  proxy.start();
  BOOST_CHECK_EXCEPTION(proxy.addChannel(conn, remote, local, flags, 0), Error, invalid);
  proxy.stop();  // nothing was pushed: the fake connection is never used
}

namespace {

// A connection that fails every signal with PeerLost (its peer has gone), or records them.
class ScriptedConnection final : public strata::backend::TransportConnection {
 public:
  ScriptedConnection(int peer, bool lost, std::atomic<int>* calls, std::atomic<uint64_t>* last)
      : peer_(peer), lost_(lost), calls_(calls), last_(last) {}
  void write(const strata::backend::RemoteRef&, uint64_t, const strata::backend::LocalRef&,
             uint64_t, size_t) override {}
  void updateAndSync(const strata::backend::RemoteRef&, uint64_t, uint64_t value) override {
    calls_->fetch_add(1);
    if (lost_) throw Error(ErrorCode::PeerLost, fmt::format("rank {} has gone", peer_), peer_);
    last_->store(value);
  }
  void flush(double) override {}

 private:
  int peer_;
  bool lost_;
  std::atomic<int>* calls_;
  std::atomic<uint64_t>* last_;
};

std::shared_ptr<strata::Connection> scriptedConnection(int peer, bool lost, std::atomic<int>* calls,
                                                       std::atomic<uint64_t>* last) {
  return strata::transport::testing::connectionOver(
      peer, "fake", std::make_unique<ScriptedConnection>(peer, lost, calls, last));
}

strata::RegisteredMemory peerMemory(int peer, size_t bytes) {
  return strata::transport::testing::fakeMemory(false, nullptr, bytes, peer, "fake");
}

}  // namespace

// An error fails only the Connection it happened on: rank 1 has gone, so its channels' triggers
// are consumed without effect, while signals to rank 2 still go out. check() reports the first
// error, check(channel) only the one of that channel's Connection.
BOOST_AUTO_TEST_CASE(an_error_fails_one_connection_only) {
  const auto deadline = Clock::now() + 60s;
  std::vector<char> buffer(4096);
  auto local = fakeMemory(true, buffer.data(), buffer.size());
  std::atomic<int> lostCalls{0}, liveCalls{0};
  std::atomic<uint64_t> lostLast{0}, liveLast{0};
  auto gone = scriptedConnection(1, true, &lostCalls, &lostLast);
  auto live = scriptedConnection(2, false, &liveCalls, &liveLast);

  ProxyService proxy(16);
  uint32_t goneData = proxy.addChannel(gone, peerMemory(1, 4096), local, peerMemory(1, 64), 0);
  uint32_t liveData = proxy.addChannel(live, peerMemory(2, 4096), local, peerMemory(2, 64), 0);
  uint32_t goneAck = proxy.addChannel(gone, peerMemory(1, 4096), local, peerMemory(1, 64), 8);
  alignas(8) uint64_t inbound[3] = {};
  PortChannel toGone = proxy.portChannel(goneData, &inbound[0]);
  PortChannel toLive = proxy.portChannel(liveData, &inbound[1]);
  PortChannel toGoneAck = proxy.portChannel(goneAck, &inbound[2]);
  proxy.start();

  FifoDeviceHandle fifo = proxy.fifo();
  uint64_t id = 0;
  BOOST_CHECK_NO_THROW(proxy.check());
  BOOST_TEST_REQUIRE(toGone.trySignal(&id));
  BOOST_TEST_REQUIRE(doneBy(fifo, id, deadline));
  BOOST_TEST(lostCalls.load() == 1);
  // The live connection goes on, and so does the FIFO; the gone one is not called again.
  for (int i = 0; i < 3; ++i) {
    BOOST_TEST_REQUIRE(toLive.trySignal(&id));
    BOOST_TEST_REQUIRE(toGoneAck.trySignal(&id));
    BOOST_TEST_REQUIRE(toGone.tryPutWithSignal(0, 0, 64, &id));
  }
  BOOST_TEST_REQUIRE(doneBy(fifo, id, deadline));
  BOOST_TEST(liveCalls.load() == 3);
  BOOST_TEST(liveLast.load() == 3u);
  BOOST_TEST(lostCalls.load() == 1);
  BOOST_TEST(proxy.executed() == 10u);

  auto lost = [](const Error& e) {
    return e.code() == ErrorCode::PeerLost && e.peer() == 1 &&
           std::string(e.what()).find("rank 1 has gone") != std::string::npos;
  };
  BOOST_CHECK_EXCEPTION(proxy.check(), Error, lost);
  BOOST_CHECK_EXCEPTION(proxy.check(goneData), Error, lost);
  BOOST_CHECK_EXCEPTION(proxy.check(goneAck), Error, lost);  // same Connection
  BOOST_CHECK_NO_THROW(proxy.check(liveData));
  BOOST_CHECK_EXCEPTION(proxy.check(3), Error, hasCode(ErrorCode::InvalidArgument));

  // A trigger that names no channel still stops everything after it.
  BOOST_TEST_REQUIRE(pushUntil(fifo, bogusTrigger(0), &id, deadline));
  BOOST_TEST_REQUIRE(toLive.trySignal(&id));
  BOOST_TEST_REQUIRE(doneBy(fifo, id, deadline));
  BOOST_TEST(liveCalls.load() == 3);
  BOOST_CHECK_EXCEPTION(proxy.check(liveData), Error, hasCode(ErrorCode::InvalidArgument));
  BOOST_CHECK_EXCEPTION(proxy.check(), Error, lost);  // still the first error
  proxy.stop();
}

// 4 producer threads push 100000 triggers in total through a FIFO of 16, in bursts with pauses
// long enough for the proxy to go to sleep on its futex (observed through the FIFO's sleeping
// word) and be woken by the next push. Every id is unique, none is lost, all are done.
BOOST_AUTO_TEST_CASE(many_producers_small_fifo_sleep_and_wake) {
  constexpr int kProducers = 4;
  constexpr int kTotal = 100000;
  constexpr int kPerProducer = kTotal / kProducers;
  constexpr int kBursts = 20;
  constexpr int kPerBurst = kPerProducer / kBursts;
  static_assert(kPerBurst * kBursts * kProducers == kTotal);
  const auto deadline = Clock::now() + 120s;

  ProxyService proxy(16);
  FifoDeviceHandle fifo = proxy.fifo();
  proxy.start();
  FirstFailure failure;
  std::vector<std::vector<uint64_t>> ids(kProducers);
  std::atomic<uint64_t> pushed{0};
  int sleepsSeen = 0;
  uint64_t fullRefusals = 0;
  std::mutex refusalsMu;

  // Between bursts (all producers idle): wait until everything pushed is done, then until the
  // proxy reports that it sleeps. Bounded; a miss is a failure, not a hang.
  auto betweenBursts = [&]() noexcept {
    const uint64_t n = pushed.load();
    if (n > 0 && !doneBy(fifo, n - 1, deadline)) {
      failure.set(fmt::format("the proxy did not finish {} pushed triggers", n));
      return;
    }
    const auto until = std::min(deadline, Clock::now() + 5s);
    while (__atomic_load_n(fifo.sleeping, __ATOMIC_SEQ_CST) == 0 && Clock::now() < until) {
      std::this_thread::sleep_for(100us);
    }
    if (__atomic_load_n(fifo.sleeping, __ATOMIC_SEQ_CST) != 0) ++sleepsSeen;
    std::this_thread::sleep_for(2ms);  // > the proxy's 1 ms futex timeout
  };
  std::barrier sync(kProducers, betweenBursts);

  std::vector<std::thread> producers;
  for (int p = 0; p < kProducers; ++p) {
    producers.emplace_back([&, p] {
      uint64_t refusals = 0;
      ids[p].reserve(kPerProducer);
      for (int b = 0; b < kBursts; ++b) {
        for (int i = 0; i < kPerBurst && !failure.failed; ++i) {
          uint64_t id = 0;
          ProxyTrigger t = bogusTrigger(static_cast<uint64_t>(p) << 32 | ids[p].size());
          for (;;) {
            if (fifo.tryPush(t, &id)) break;
            ++refusals;
            if (Clock::now() > deadline) {
              failure.set(fmt::format("producer {}: FIFO stayed full past the deadline", p));
              break;
            }
            std::this_thread::yield();
          }
          if (failure.failed) break;
          ids[p].push_back(id);
          pushed.fetch_add(1);
        }
        sync.arrive_and_wait();  // every producer arrives every time, even after a failure
      }
      std::lock_guard<std::mutex> lock(refusalsMu);
      fullRefusals += refusals;
    });
  }
  for (auto& t : producers) t.join();
  BOOST_TEST(failure.message == "");

  std::vector<uint64_t> all;
  for (const auto& v : ids) {
    BOOST_TEST(std::is_sorted(v.begin(), v.end()));  // one producer's ids increase
    all.insert(all.end(), v.begin(), v.end());
  }
  std::sort(all.begin(), all.end());
  BOOST_TEST(all.size() == size_t{kTotal});
  BOOST_TEST((std::adjacent_find(all.begin(), all.end()) == all.end()));  // unique
  BOOST_TEST((!all.empty() && all.front() == 0u && all.back() == uint64_t{kTotal - 1}));
  BOOST_TEST(doneBy(fifo, kTotal - 1, deadline));
  BOOST_TEST(proxy.executed() == uint64_t{kTotal});
  BOOST_TEST(loadWord(fifo.head) == uint64_t{kTotal});
  BOOST_TEST(loadWord(fifo.tail) == uint64_t{kTotal});
  BOOST_TEST(sleepsSeen == kBursts);
  BOOST_TEST_MESSAGE("full-FIFO refusals: " << fullRefusals << ", sleeps seen: " << sleepsSeen);
  BOOST_CHECK_EXCEPTION(proxy.check(), Error, hasCode(ErrorCode::InvalidArgument));
  proxy.stop();
}

BOOST_AUTO_TEST_SUITE_END()
