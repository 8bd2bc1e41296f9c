// The proxy FIFO and ProxyService (lib/transport/proxy.cpp): back-pressure, sticky errors,
// clean shutdown, argument checks, an error that fails one connection only, many producers,
// sleeping and waking. Part of the module `channels` (test_device.cpp).
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
#include <strata/error.hpp>

// Stand-in Connections and RegisteredMemory (no transport behind them), to build argument-check
// fixtures for ProxyService::addChannel without a second rank.
#include "tests/unit/transport/channel_fixtures.hpp"
#include "transport/testing.hpp"

using channels_test::FirstFailure;
using strata::Error;
using strata::ErrorCode;
using strata::FifoDeviceHandle;
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
  t.channel = 1000;  // fits an entry; no proxy here has that many channels
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
  BOOST_TEST(mem.size() >= 2 * 16 * sizeof(strata::PackedTrigger));
  BOOST_TEST(sizeof(strata::PackedTrigger) == 16u);
  const FifoDeviceHandle h = proxy.fifo();
  auto inside = [&](const void* p, size_t bytes) {
    auto* c = static_cast<const std::byte*>(p);
    return c >= mem.data() && c + bytes <= mem.data() + mem.size();
  };
  // The host ring: everything in the block (host producers' memory is host memory).
  BOOST_TEST(inside(h.triggers, 16 * sizeof(strata::PackedTrigger)));
  BOOST_TEST(inside(h.head, 8));
  BOOST_TEST(inside(h.tailCache, 8));
  BOOST_TEST(inside(h.tail, 8));
  BOOST_TEST(inside(h.wake, 4));
  BOOST_TEST(inside(h.sleeping, 4));
  // A kernel's ring: entries and tail in the block, at the device's view of it; head and tail
  // cache in the words the module gives (device memory), no futex; a ring of its own.
  char* device = reinterpret_cast<char*>(uintptr_t{1} << 40);
  alignas(8) uint64_t words[2] = {0, 0};
  const FifoDeviceHandle d = proxy.fifo(device, words);
  auto offset = [](const void* p, const void* base) {
    return static_cast<const char*>(p) - static_cast<const char*>(base);
  };
  const auto dTriggers = offset(d.triggers, device);
  const auto dTail = offset(d.tail, device);
  BOOST_TEST((dTriggers >= 0 && static_cast<size_t>(dTriggers) + 16 * 16 <= mem.size()));
  BOOST_TEST((dTail >= 0 && static_cast<size_t>(dTail) + 8 <= mem.size()));
  BOOST_TEST(dTriggers != offset(h.triggers, mem.data()));
  BOOST_TEST(dTail != offset(h.tail, mem.data()));
  BOOST_TEST(d.head == &words[0]);
  BOOST_TEST(d.tailCache == &words[1]);
  BOOST_TEST(d.wake == nullptr);
  BOOST_TEST(d.sleeping == nullptr);
  BOOST_TEST(d.size == h.size);
  BOOST_CHECK_EXCEPTION(proxy.fifo(device, nullptr), Error, hasCode(ErrorCode::InvalidArgument));
  BOOST_CHECK_EXCEPTION(proxy.fifo(nullptr, words), Error, hasCode(ErrorCode::InvalidArgument));
  BOOST_CHECK_EXCEPTION(proxy.fifo(device, reinterpret_cast<uint64_t*>(device + 4)), Error,
                        hasCode(ErrorCode::InvalidArgument));
}

// The 16-byte entry: every field round-trips at its limits; what does not fit becomes an
// Invalid trigger (for the same channel, or for none); an entry with one half published is
// not taken.
BOOST_AUTO_TEST_CASE(trigger_entry_packs_and_checks_its_limits) {
  using strata::kTriggerMaxBytes;
  using strata::kTriggerMaxOffset;
  using strata::kTriggerNoChannel;
  using strata::PackedTrigger;
  auto roundTrip = [](const ProxyTrigger& t) {
    ProxyTrigger u;
    const PackedTrigger p = strata::packTrigger(t);
    BOOST_TEST_REQUIRE(strata::unpackTrigger(p, &u));
    return u;
  };
  for (TriggerType type :
       {TriggerType::Put, TriggerType::Signal, TriggerType::PutWithSignal, TriggerType::Flush}) {
    for (uint64_t bytes : {uint64_t{0}, uint64_t{1}, uint64_t{0x7fffff}, uint64_t{0x800000},
                           uint64_t{123456789}, kTriggerMaxBytes}) {
      const ProxyTrigger t{kTriggerMaxOffset - bytes, bytes * 3 % kTriggerMaxOffset, bytes,
                           static_cast<uint32_t>(bytes % kTriggerNoChannel), type};
      const ProxyTrigger u = roundTrip(t);
      BOOST_TEST(u.dstOffset == t.dstOffset);
      BOOST_TEST(u.srcOffset == t.srcOffset);
      BOOST_TEST(u.bytes == t.bytes);
      BOOST_TEST(u.channel == t.channel);
      BOOST_TEST((u.type == t.type));
    }
  }
  // Out of range: Invalid, for the channel when it fits.
  const ProxyTrigger tooBig{0, 0, kTriggerMaxBytes + 1, 5, TriggerType::Put};
  const ProxyTrigger farDst{kTriggerMaxOffset + 1, 0, 8, 6, TriggerType::PutWithSignal};
  const ProxyTrigger farSrc{0, kTriggerMaxOffset + 1, 8, 7, TriggerType::Put};
  const ProxyTrigger badType{0, 0, 8, 8, static_cast<TriggerType>(5)};
  uint32_t channel = 5;
  for (const ProxyTrigger& t : {tooBig, farDst, farSrc, badType}) {
    const ProxyTrigger u = roundTrip(t);
    BOOST_TEST((u.type == TriggerType::Invalid));
    BOOST_TEST(u.channel == channel++);
    BOOST_TEST(u.bytes == 0u);
  }
  const ProxyTrigger noChannel{0, 0, 8, kTriggerNoChannel + 7, TriggerType::Put};
  const ProxyTrigger u = roundTrip(noChannel);
  BOOST_TEST((u.type == TriggerType::Invalid));
  BOOST_TEST(u.channel == kTriggerNoChannel);
  // Half an entry (the other 8-byte write not landed yet) is not a trigger.
  const PackedTrigger full = strata::packTrigger(tooBig);
  ProxyTrigger v;
  BOOST_TEST(!strata::unpackTrigger(PackedTrigger{full.fst, 0}, &v));
  BOOST_TEST(!strata::unpackTrigger(PackedTrigger{0, full.snd}, &v));
  BOOST_TEST(!strata::unpackTrigger(PackedTrigger{}, &v));
}

// The proxy waits for both halves of an entry; a kernel's ring (head in "device" words) is
// consumed beside the host ring; an entry that did not fit fails its channel's Connection
// with a message that says so.
BOOST_AUTO_TEST_CASE(proxy_takes_whole_entries_from_both_rings) {
  const auto deadline = Clock::now() + 60s;
  ProxyService proxy(4);
  alignas(8) uint64_t words[2] = {0, 0};
  FifoDeviceHandle kernel = proxy.fifo(proxy.fifoMemory().data(), words);
  FifoDeviceHandle host = proxy.fifo();
  proxy.beginDeviceWork();
  proxy.start();
  // A torn publication: the second half lands 20 ms after the first.
  const strata::PackedTrigger e = strata::packTrigger(bogusTrigger(3));
  __atomic_store_n(words, 1, __ATOMIC_RELEASE);  // slot 0 reserved, as tryPush would
  __atomic_store_n(&kernel.triggers[0].snd, e.snd, __ATOMIC_RELEASE);
  std::this_thread::sleep_for(20ms);
  BOOST_TEST(proxy.executed() == 0u);
  BOOST_TEST(!kernel.done(0));
  __atomic_store_n(&kernel.triggers[0].fst, e.fst, __ATOMIC_RELEASE);
  BOOST_TEST_REQUIRE(doneBy(kernel, 0, deadline));
  BOOST_TEST(kernel.triggers[0].fst == 0u);  // zeroed for the next lap
  BOOST_TEST(kernel.triggers[0].snd == 0u);
  // Both rings, several laps each (4 slots), interleaved; ids count per ring.
  uint64_t id = 0;
  for (uint64_t i = 0; i < 20; ++i) {
    BOOST_TEST_REQUIRE(pushUntil(kernel, bogusTrigger(i), &id, deadline));
    BOOST_TEST(id == i + 1);
    BOOST_TEST_REQUIRE(pushUntil(host, bogusTrigger(i), &id, deadline));
    BOOST_TEST(id == i);
  }
  BOOST_TEST(doneBy(kernel, 20, deadline));
  BOOST_TEST(doneBy(host, 19, deadline));
  BOOST_TEST(proxy.executed() == 41u);
  BOOST_TEST(loadWord(&words[1]) <= loadWord(kernel.tail));  // the cache never runs ahead
  proxy.endDeviceWork();
  proxy.stop();
}

BOOST_AUTO_TEST_CASE(an_entry_that_did_not_fit_fails_its_channel) {
  const auto deadline = Clock::now() + 60s;
  ProxyService proxy(8);
  FifoDeviceHandle fifo = proxy.fifo();
  proxy.start();
  uint64_t id = 0;
  BOOST_TEST_REQUIRE(pushUntil(
      fifo, ProxyTrigger{0, 0, strata::kTriggerMaxBytes + 1, 3, TriggerType::Put}, &id, deadline));
  BOOST_TEST(doneBy(fifo, id, deadline));
  BOOST_CHECK_EXCEPTION(proxy.check(), Error, [](const Error& err) {
    return err.code() == ErrorCode::InvalidArgument &&
           std::string(err.what()).find("did not fit a FIFO entry") != std::string::npos;
  });
  proxy.stop();
}

// A blocking put larger than one entry holds is split; the signal rides on the last piece.
BOOST_AUTO_TEST_CASE(large_blocking_put_is_split_into_entries) {
  ProxyService proxy(8);  // never started: the entries stay in the ring to be read back
  FifoDeviceHandle fifo = proxy.fifo();
  alignas(8) uint64_t inbound = 0, expected = 0;
  PortChannel port;
  port.fifo = fifo;
  port.channel = 9;
  port.inbound = &inbound;
  port.expected = &expected;
  const uint64_t total = 2 * strata::kTriggerMaxBytes + 100;
  BOOST_TEST(port.putWithSignal(1000, 2000, total) == 2u);
  ProxyTrigger t[3];
  for (int i = 0; i < 3; ++i) BOOST_TEST_REQUIRE(strata::unpackTrigger(fifo.triggers[i], &t[i]));
  BOOST_TEST((t[0].type == TriggerType::Put && t[1].type == TriggerType::Put &&
              t[2].type == TriggerType::PutWithSignal));
  BOOST_TEST(t[0].bytes + t[1].bytes + t[2].bytes == total);
  BOOST_TEST(t[1].dstOffset == 1000 + strata::kTriggerMaxBytes);
  BOOST_TEST(t[2].srcOffset == 2000 + 2 * strata::kTriggerMaxBytes);
  BOOST_TEST(t[2].channel == 9u);
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
  alignas(8) uint64_t words[2] = {0, 0};
  FifoDeviceHandle h = proxy.fifo(proxy.fifoMemory().data(), words);
  const uint64_t id = __atomic_fetch_add(h.head, 1, __ATOMIC_ACQ_REL);
  strata::publishTrigger(&h.triggers[id % h.size], strata::packTrigger(bogusTrigger(1)));
  BOOST_TEST(doneBy(h, id, deadline));
  std::this_thread::sleep_for(50ms);
  // At most the sleep it was in when the work began (begin wakes it): no long sleep, but once
  // 2 ms passed without an entry it naps, and a kernel's push (no wake) is still taken.
  BOOST_TEST(proxy.sleeps() <= s0 + 1);
  const uint64_t n0 = proxy.naps();
  BOOST_TEST(n0 > 0u);
  const uint64_t id2 = __atomic_fetch_add(h.head, 1, __ATOMIC_ACQ_REL);
  strata::publishTrigger(&h.triggers[id2 % h.size], strata::packTrigger(bogusTrigger(2)));
  BOOST_TEST(doneBy(h, id2, deadline));
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
           std::string(e.what()).find("channel 1000") != std::string::npos;
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
  alignas(8) uint64_t consumed = 5;
  BOOST_CHECK_EXCEPTION(proxy.portChannel(0, nullptr, &consumed), Error, invalid);

  // A valid channel gets id 0 and a handle; unknown ids are still refused.
  uint32_t ch = proxy.addChannel(conn, remote, local, flags, 8);
  BOOST_TEST(ch == 0u);
  alignas(8) uint64_t inbound = 5;
  BOOST_CHECK_EXCEPTION(proxy.portChannel(ch, &inbound, nullptr), Error, invalid);
  PortChannel port = proxy.portChannel(ch, &inbound, &consumed);
  BOOST_TEST(port.channel == ch);
  BOOST_TEST(port.inbound == &inbound);
  BOOST_TEST(port.expected == &consumed);  // the caller's word: 5 signals already consumed
  BOOST_TEST(!port.poll());
  __atomic_store_n(&inbound, 6, __ATOMIC_RELEASE);
  BOOST_TEST(port.wait(100));
  BOOST_TEST(!port.poll());
  BOOST_TEST(consumed == 6u);
  BOOST_TEST(port.fifo.triggers == proxy.fifo().triggers);
  BOOST_CHECK_EXCEPTION(proxy.portChannel(1, &inbound, &consumed), Error, invalid);
  BOOST_CHECK_EXCEPTION(proxy.portChannel(~0u, &inbound, &consumed), Error, invalid);

  // The thread running does not change the checks (channels may be added while it runs).
  proxy.start();
  BOOST_CHECK_EXCEPTION(proxy.addChannel(conn, local, local, flags, 0), Error, invalid);
  BOOST_TEST(proxy.addChannel(conn, remote, local, flags, 0) == 1u);
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
  alignas(8) uint64_t consumed[3] = {0, 0, 0};
  PortChannel toGone = proxy.portChannel(goneData, &inbound[0], &consumed[0]);
  PortChannel toLive = proxy.portChannel(liveData, &inbound[1], &consumed[1]);
  PortChannel toGoneAck = proxy.portChannel(goneAck, &inbound[2], &consumed[2]);
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

// Channels added while the proxy runs (a communicator connects a peer on its first send/recv)
// while a producer keeps signalling on the first one: each new channel works as soon as
// addChannel returns, shares its Connection's failure state with its siblings, and the first
// channel's signals all arrive in order.
BOOST_AUTO_TEST_CASE(channels_added_while_the_proxy_runs) {
  const auto deadline = Clock::now() + 60s;
  std::vector<char> buffer(4096);
  auto local = fakeMemory(true, buffer.data(), buffer.size());
  std::atomic<int> firstCalls{0}, laterCalls{0}, lostCalls{0};
  std::atomic<uint64_t> firstLast{0}, laterLast{0}, lostLast{0};
  auto first = scriptedConnection(1, false, &firstCalls, &firstLast);
  ProxyService proxy(16);
  alignas(8) uint64_t inbound[64] = {};
  alignas(8) uint64_t consumed[64] = {};
  const uint32_t ch0 = proxy.addChannel(first, peerMemory(1, 4096), local, peerMemory(1, 64), 0);
  PortChannel p0 = proxy.portChannel(ch0, &inbound[0], &consumed[0]);
  proxy.start();

  constexpr int kSignals = 20000;
  std::thread producer([&] {
    uint64_t id = 0;
    for (int i = 0; i < kSignals; ++i) {
      while (!p0.trySignal(&id)) std::this_thread::yield();
    }
  });
  // Meanwhile: 30 channels on new connections, each used at once.
  FifoDeviceHandle fifo = proxy.fifo();
  std::vector<std::shared_ptr<strata::Connection>> conns;
  for (int i = 1; i <= 30; ++i) {
    conns.push_back(scriptedConnection(2, false, &laterCalls, &laterLast));
    const uint32_t ch =
        proxy.addChannel(conns.back(), peerMemory(2, 4096), local, peerMemory(2, 64), 8);
    BOOST_TEST(ch == static_cast<uint32_t>(i));
    PortChannel p = proxy.portChannel(ch, &inbound[i], &consumed[i]);
    uint64_t id = 0;
    BOOST_TEST_REQUIRE(pushUntil(fifo, {0, 0, 0, p.channel, TriggerType::Signal}, &id, deadline));
    BOOST_TEST_REQUIRE(doneBy(fifo, id, deadline));
    BOOST_TEST(laterCalls.load() == i);
    BOOST_TEST(laterLast.load() == 1u);  // a fresh channel's first signal
  }
  // A failing connection added late, with a sibling channel added later still: both fail.
  auto gone = scriptedConnection(3, true, &lostCalls, &lostLast);
  const uint32_t g1 = proxy.addChannel(gone, peerMemory(3, 4096), local, peerMemory(3, 64), 0);
  uint64_t id = 0;
  BOOST_TEST_REQUIRE(pushUntil(fifo, {0, 0, 0, g1, TriggerType::Signal}, &id, deadline));
  BOOST_TEST_REQUIRE(doneBy(fifo, id, deadline));
  const uint32_t g2 = proxy.addChannel(gone, peerMemory(3, 4096), local, peerMemory(3, 64), 8);
  BOOST_TEST_REQUIRE(pushUntil(fifo, {0, 0, 0, g2, TriggerType::Signal}, &id, deadline));
  BOOST_TEST_REQUIRE(doneBy(fifo, id, deadline));
  BOOST_TEST(lostCalls.load() == 1);  // the sibling is not called: its Connection failed
  BOOST_CHECK_EXCEPTION(proxy.check(g2), Error, hasCode(ErrorCode::PeerLost));
  BOOST_CHECK_NO_THROW(proxy.check(ch0));
  producer.join();
  while (firstLast.load() < static_cast<uint64_t>(kSignals) && Clock::now() < deadline) {
    std::this_thread::yield();
  }
  BOOST_TEST(firstCalls.load() == kSignals);
  BOOST_TEST(firstLast.load() == static_cast<uint64_t>(kSignals));
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
