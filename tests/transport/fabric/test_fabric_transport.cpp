// Tests of the fabric transport module through the transport SDK only (the core is not used):
// two transports in this process, or this process and a peer process (this binary re-executed
// with --peer) that passes its endpoint and descriptor through a pipe.
//
// Run with the provider in STRATA_TRANSPORT_FABRIC_PROVIDER (the config key's environment
// mirror) and the module path as the first argument. Exits 77 when the provider is missing.
//
// This file has the main and the data path (integrity, signal after data, blocking waits, a
// sleeping target); test_fabric_failures.cpp and test_fabric_shm_regions.cpp have the rest (run
// in the order of the files); fabric_fixtures.hpp what they share.

#define BOOST_TEST_MODULE fabric_transport
#define BOOST_TEST_NO_MAIN
#include <boost/test/unit_test.hpp>
#include <boost/test/unit_test_monitor.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <string>
#include <thread>

#include "tests/transport/fabric/fabric_fixtures.hpp"

using namespace std::chrono_literals;

BOOST_AUTO_TEST_CASE(module_entry_point) {
  BOOST_TEST(g_info->abiVersion == STRATA_MODULE_ABI_VERSION);
  BOOST_TEST((g_info->kind == backend::ModuleKind::Transport));
  BOOST_TEST(std::string(g_info->name) == "fabric");
  BOOST_TEST(g_info->createBootstrap == nullptr);
  BOOST_TEST(g_info->createTransport != nullptr);
  auto t = makeTransport(0);
  BOOST_TEST(t->name() == "fabric");
  BOOST_TEST(t->supportsMemory(MemoryKind::Host));
}

BOOST_AUTO_TEST_CASE(integrity_at_odd_offsets) {
  constexpr size_t kMax = size_t{256} << 20;
  constexpr size_t kSrcOff = 3, kDstOff = 5;
  Pair p(kMax + 8, kMax + 8);
  fillPattern(p.src.data + kSrcOff, kMax, 42);
  std::memset(p.dst.data, 0xEE, p.dst.size);
  const size_t sizes[] = {1,
                          3,
                          7,
                          63,
                          64,
                          65,
                          4095,
                          4097,
                          65537,
                          (1u << 20) + 3,
                          16u << 20,
                          (16u << 20) + 1,
                          (64u << 20) + 7,
                          kMax};
  for (size_t n : sizes) {
    p.conn->write(p.remoteRef(), kDstOff, p.local(), kSrcOff, n);
    p.conn->flush(20);
    BOOST_TEST_CONTEXT("size " << n) {
      BOOST_TEST(std::memcmp(p.dst.data + kDstOff, p.src.data + kSrcOff, n) == 0);
      BOOST_TEST(p.dst.data[kDstOff - 1] == 0xEE);
      BOOST_TEST(p.dst.data[kDstOff + n] == 0xEE);
    }
  }
}

BOOST_AUTO_TEST_CASE(signal_after_data_in_many_rounds) {
  // Data region [0, 1 MiB), the signal word at 1 MiB. B's thread never calls the transport: it
  // sees the signal, then checks that the data of that round is complete.
  constexpr size_t kData = 1u << 20;
  Pair p(kData, kData + 64);
  std::memset(p.dst.data, 0, p.dst.size);
  LocalRef signalRef{p.dst.data, p.dst.size, MemoryKind::Host, p.dstMem.get()};
  for (uint64_t round = 1; round <= 200; ++round) {
    size_t n = 1 + (round * 7919) % kData;  // varying sizes, several chunks each
    fillPattern(p.src.data, n, round);
    // Two writes per round: a tail and the head, then the signal.
    size_t half = n / 2;
    p.conn->write(p.remoteRef(), half, p.local(), half, n - half);
    if (half) p.conn->write(p.remoteRef(), 0, p.local(), 0, half);
    p.conn->updateAndSync(p.remoteRef(), kData, round);
    auto end = std::chrono::steady_clock::now() + 20s;
    while (p.b->loadSignal(signalRef, kData) != round && std::chrono::steady_clock::now() < end) {
      std::this_thread::yield();
    }
    BOOST_REQUIRE_MESSAGE(p.b->loadSignal(signalRef, kData) == round,
                          "signal of round " << round << " did not arrive");
    BOOST_REQUIRE_MESSAGE(checkPattern(p.dst.data, n, round) == n,
                          "round " << round << ": signal visible before its data");
    // The next round rewrites the source: its writes must have completed.
    p.conn->flush(20);
  }
}

BOOST_AUTO_TEST_CASE(blocking_wait_wakes_on_signal) {
  // A waiter that blocks in waitSignal() (what HostSemaphore::wait does after its polling
  // phase) is woken by the progress thread when the signal lands, without polling itself.
  constexpr size_t kData = 4u << 20;
  Pair p(kData, kData + 64);
  std::memset(p.dst.data, 0, p.dst.size);
  LocalRef signalRef{p.dst.data, p.dst.size, MemoryKind::Host, p.dstMem.get()};
  const bool supported = p.b->blockingWaitSupported();
  // tcp has a wait fd (the progress thread sleeps on it); the shm provider of 1.17 has none.
  if (provider().find("tcp") != std::string::npos) BOOST_TEST(supported);
  if (!supported) {
    BOOST_TEST_MESSAGE("provider " << provider() << " has no wait fd: waiters poll");
    return;
  }
  // Nothing arrives: the wait ends after its time, false.
  auto t0 = std::chrono::steady_clock::now();
  BOOST_TEST(!p.b->waitSignal(signalRef, kData, 0, 0.2));
  double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  BOOST_TEST(waited >= 0.15);
  BOOST_TEST(waited < 5.0);
  // Several rounds: B's thread blocks, A writes 4 MiB and then the signal.
  for (uint64_t round = 1; round <= 5; ++round) {
    std::atomic<bool> woke{false}, dataOk{false};
    std::thread waiter([&] {
      auto end = std::chrono::steady_clock::now() + 20s;
      while (std::chrono::steady_clock::now() < end) {
        if (p.b->waitSignal(signalRef, kData, round - 1, 1.0)) {
          woke = true;
          dataOk = checkPattern(p.dst.data, kData, round) == kData;
          return;
        }
      }
    });
    std::this_thread::sleep_for(20ms);  // let the waiter block first
    fillPattern(p.src.data, kData, round);
    p.conn->write(p.remoteRef(), 0, p.local(), 0, kData);
    p.conn->updateAndSync(p.remoteRef(), kData, round);
    waiter.join();
    BOOST_REQUIRE_MESSAGE(woke.load(), "round " << round << ": the blocked waiter never woke");
    BOOST_TEST(dataOk.load(), "round " << round << ": woken before the data landed");
    BOOST_TEST(p.b->loadSignal(signalRef, kData) == round);
    p.conn->flush(20);
  }
}

BOOST_AUTO_TEST_CASE(write_lands_while_target_sleeps) {
  constexpr size_t kBytes = 8u << 20;
  PeerLink link(kBytes);
  for (uint64_t seed = 1; seed <= 3; ++seed) {
    fillPattern(link.src.data, kBytes, seed);
    link.conn->write(link.dst(), 0, link.local(), 0, kBytes);
    // Delivery completion needs the target's progress; the target only sleeps.
    link.conn->flush(20);
    BOOST_TEST(link.peer.verify(seed, 0, kBytes));
  }
  // Without flushing: the peer polls its memory while we only wait on the pipe.
  fillPattern(link.src.data, 4096, 99);
  link.conn->write(link.dst(), 1, link.local(), 0, 4096);
  BOOST_TEST(link.peer.verify(99, 1, 4096));
  link.conn->flush(20);
}

int main(int argc, char** argv) {
  g_self = std::filesystem::read_symlink("/proc/self/exe").string();
  const char* moduleEnv = std::getenv("STRATA_FABRIC_MODULE");
  if (argc >= 5 && std::string(argv[1]) == "--peer") {
    if (!moduleEnv) return 2;
    std::string error;
    g_info = loadModule(moduleEnv, error);
    if (!g_info) return 2;
    return peerMain(std::atoi(argv[2]), std::atoi(argv[3]), std::strtoull(argv[4], nullptr, 10));
  }
  if (!moduleEnv) {
    std::cout << "STRATA_FABRIC_MODULE is not set (path of strata-transport-fabric.so)"
              << std::endl;
    return 77;
  }
  std::string error;
  g_info = loadModule(moduleEnv, error);
  if (!g_info) {
    std::cout << "cannot load " << moduleEnv << ": " << error << std::endl;
    return 1;
  }
  try {
    makeTransport(0);
  } catch (const Error& e) {
    if (e.code() == ErrorCode::NotSupported) {
      std::cout << "skipped: " << e.what() << std::endl;
      return 77;
    }
    throw;
  }
  boost::unit_test::unit_test_monitor.register_exception_translator<Error>([](const Error& e) {
    BOOST_ERROR("uncaught strata::Error " << toString(e.code()) << " (peer " << e.peer()
                                          << "): " << e.what());
  });
  return boost::unit_test::unit_test_main(&init_unit_test, argc, argv);
}
