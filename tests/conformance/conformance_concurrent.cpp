// Bootstrap conformance, cases 11-14: strangers at the listeners (tcp only), threads,
// collectives, and last the start-up agreement. Part of the suite in bootstrap_conformance.cpp.

#include <boost/test/unit_test.hpp>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "backends/bootstrap/tcp/tcp_bootstrap.hpp"
#include "bootstrap/watched.hpp"
#include "tests/conformance/conformance.hpp"

using namespace conformance;
using namespace std::chrono_literals;

namespace {

// Connections that a listener must survive: each kind is logged and closed by the listener
// without blocking the others. The stalled ones stay open until the caller closes them.
struct Strangers {
  std::vector<int> fds;
  int attempts = 0;
  int connected = 0;

  ~Strangers() { closeAll(); }
  void closeAll() {
    for (int fd : fds) close(fd);
    fds.clear();
  }

  // One round against `address`; returns false if nothing could connect (listener not up yet).
  bool visit(const std::string& address) {
    bool any = false;
    auto open = [&]() {
      ++attempts;
      int fd = strata::testing::connectLoopback(address);
      if (fd >= 0) {
        ++connected;
        any = true;
      }
      return fd;
    };
    // Garbage.
    if (int fd = open(); fd >= 0) {
      std::string junk = "GET / HTTP/1.1\r\nHost: strata\r\n\r\n";
      for (int i = 0; i < 200; ++i) junk.push_back(static_cast<char>(i * 37 + 11));
      strata::testing::writeAllIgnoringErrors(fd, junk.data(), junk.size());
      fds.push_back(fd);
    }
    // A handshake-looking record: "STRA" magic, version 1, kind 1, a body with a rank and a
    // 32-byte digest that no secret produced.
    if (int fd = open(); fd >= 0) {
      std::vector<uint8_t> blob = {'S', 'T', 'R', 'A', 1, 0, 1, 0, 40, 0, 0, 0};
      for (int i = 0; i < 8; ++i) blob.push_back(0);  // rank 0, size 0
      for (int i = 0; i < 32; ++i) blob.push_back(static_cast<uint8_t>(0xA5 ^ i));
      strata::testing::writeAllIgnoringErrors(fd, blob.data(), blob.size());
      fds.push_back(fd);
    }
    // A record header announcing 4 GiB: must not make the listener allocate or wait for it.
    if (int fd = open(); fd >= 0) {
      std::vector<uint8_t> blob = {'S', 'T', 'R', 'A', 1, 0, 1, 0, 0xFF, 0xFF, 0xFF, 0xFF};
      strata::testing::writeAllIgnoringErrors(fd, blob.data(), blob.size());
      fds.push_back(fd);
    }
    // Half a header, then nothing.
    if (int fd = open(); fd >= 0) {
      strata::testing::writeAllIgnoringErrors(fd, "STR", 3);
      fds.push_back(fd);
    }
    // Connects and stalls.
    if (int fd = open(); fd >= 0) fds.push_back(fd);
    if (int fd = open(); fd >= 0) fds.push_back(fd);
    // Connects and closes at once.
    if (int fd = open(); fd >= 0) close(fd);
    return any;
  }
};

// tcp is the backend when the config says so, or says auto outside a PMIx job.
bool expectTcp(const Config& cfg) {
  std::string backend = cfg.get("bootstrap.backend").value_or("auto");
  return backend == "tcp" || (backend == "auto" && std::getenv("PMIX_NAMESPACE") == nullptr);
}

void ringTraffic(Bootstrap& bs, int tag) {
  sendPattern(bs, nextRank(bs), tag, 4096, seedOf(bs.rank(), tag));
  recvPattern(bs, prevRank(bs), tag, 4096, seedOf(prevRank(bs), tag));
  std::vector<uint64_t> slots(bs.size(), 0);
  slots[bs.rank()] = seedOf(bs.rank(), tag);
  bs.allGather(slots.data(), sizeof(uint64_t));
  for (int r = 0; r < bs.size(); ++r) {
    BOOST_TEST(slots[r] == seedOf(r, tag), "allGather slot " << r);
  }
  bs.barrier();
}

}  // namespace

// 11a. strangers at the rendezvous (tcp only): bad connections to the root do not stop it.
BOOST_AUTO_TEST_CASE(strangers_during_rendezvous) {
  RANK_SCOPE();
  const auto& env = launchEnv();
  Config cfg = Config::load();
  std::string host;
  int port = 0;
  if (!expectTcp(cfg) || env.size < 2) {
    BOOST_TEST_MESSAGE("skipped: tcp only, with at least 2 ranks");
    return;
  }
  if (!strata::testing::splitHostPort(env.root, host, port) ||
      !strata::testing::isLoopbackHost(host)) {
    BOOST_TEST_MESSAGE("skipped: STRATA_ROOT '" << env.root << "' is not a loopback address");
    return;
  }

  Strangers strangers;
  std::atomic<bool> created{false};
  std::atomic<bool> firstRound{false};
  std::thread visitor;
  if (env.rank == 0) {
    visitor = std::thread([&] {
      // The root may only listen once create() runs: keep trying until it does.
      auto start = Clock::now();
      while (!strangers.visit(env.root) && !created && secondsSince(start) < 10) {
        firstRound = true;
        std::this_thread::sleep_for(10ms);
      }
      firstRound = true;
    });
    auto start = Clock::now();
    while (!firstRound && secondsSince(start) < 2) std::this_thread::sleep_for(1ms);
  }
  auto bs = Bootstrap::create(cfg);
  created = true;
  if (visitor.joinable()) visitor.join();
  BOOST_TEST(bs->backend() == "tcp");
  if (env.rank == 0) {
    BOOST_WARN_MESSAGE(strangers.connected > 0,
                       "no stranger reached " << env.root << ": the rendezvous went untested");
    BOOST_TEST_MESSAGE("rank 0: " << strangers.connected << " of " << strangers.attempts
                                  << " stranger connections reached the root");
  }
  ringTraffic(*bs, 1100);
  strangers.closeAll();
  bs->barrier();
}

// 11b. strangers after creation (tcp only): bad connections to a rank's listener do not
// disturb its traffic.
BOOST_AUTO_TEST_CASE(strangers_after_creation) {
  RANK_SCOPE();
  auto bs = Bootstrap::create(Config::load());
  REQUIRE_RANKS(2);
  auto* tcp = dynamic_cast<strata::tcp::TcpBootstrap*>(&strata::bootstrap::unwrap(*bs));
  if (tcp == nullptr) {
    BOOST_TEST_MESSAGE("skipped: tcp only, backend is " << bs->backend());
    return;
  }
  constexpr int kTag = 1111;
  Strangers strangers;
  if (bs->rank() == 1) {
    std::string address = tcp->listenAddress();
    uint32_t length = static_cast<uint32_t>(address.size());
    bs->send(0, kTag, &length, sizeof(length));
    bs->send(0, kTag, address.data(), address.size());
  }
  if (bs->rank() == 0) {
    uint32_t length = 0;
    bs->recv(1, kTag, &length, sizeof(length));
    BOOST_REQUIRE(length < 4096);
    std::string address(length, '\0');
    bs->recv(1, kTag, address.data(), length);
    std::string host;
    int port = 0;
    if (strata::testing::splitHostPort(address, host, port) &&
        strata::testing::isLoopbackHost(host)) {
      strangers.visit(address);
      BOOST_TEST(strangers.connected > 0, "no stranger could connect to rank 1 at " << address);
    } else {
      BOOST_TEST_MESSAGE("not visiting rank 1's listener " << address << ": not loopback");
    }
  }
  ringTraffic(*bs, 1200);
  ringTraffic(*bs, 1201);
  strangers.closeAll();
  bs->barrier();
}

// 12. threads: concurrent send/recv from 4 threads per rank, one tag each.
BOOST_AUTO_TEST_CASE(threads) {
  RANK_SCOPE();
  auto bs = Bootstrap::create(Config::load());
  REQUIRE_RANKS(2);
  constexpr int kThreads = 4, kMessages = 200;
  std::vector<std::string> failures(kThreads);
  std::vector<std::thread> workers;
  const int next = nextRank(*bs), prev = prevRank(*bs);
  for (int t = 0; t < kThreads; ++t) {
    workers.emplace_back([&, t] {
      const int tag = 100 + t;
      try {
        for (int i = 0; i < kMessages; ++i) {
          std::array<int32_t, 3> out = {bs->rank(), t, i}, in = {-1, -1, -1};
          bs->send(next, tag, out.data(), sizeof(out));
          bs->recv(prev, tag, in.data(), sizeof(in));
          if (in != std::array<int32_t, 3>{prev, t, i}) {
            std::ostringstream msg;
            msg << "thread " << t << " message " << i << ": got {" << in[0] << ", " << in[1] << ", "
                << in[2] << "}";
            failures[t] = msg.str();
            return;
          }
        }
      } catch (const Error& error) {
        failures[t] = "thread " + std::to_string(t) + ": " + describe(error);
      }
    });
  }
  for (auto& worker : workers) worker.join();
  for (const auto& failure : failures) BOOST_TEST(failure.empty(), failure);
  bs->barrier();
}

// 13. collectives: allGather and broadcast contents, repeated barriers.
BOOST_AUTO_TEST_CASE(collectives) {
  RANK_SCOPE();
  auto bs = Bootstrap::create(Config::load());
  const int n = bs->size(), me = bs->rank();
  std::vector<size_t> sizes = {1, 7, 64, 4096};
  if (n <= 4) sizes.push_back(size_t{1} << 20);
  for (size_t bytes : sizes) {
    std::vector<uint8_t> data(bytes * n, 0xEE);
    strata::testing::fillPattern(data.data() + bytes * me, bytes, seedOf(me, bytes, 13));
    bs->allGather(data.data(), bytes);
    for (int r = 0; r < n; ++r) {
      size_t bad =
          strata::testing::checkPattern(data.data() + bytes * r, bytes, seedOf(r, bytes, 13));
      BOOST_TEST(bad == bytes,
                 "allGather of " << bytes << " bytes: slot " << r << " differs at byte " << bad);
    }
  }

  std::vector<int> roots;
  if (n > 16) {
    roots = {0, 1, n - 1};
  } else {
    for (int r = 0; r < n; ++r) roots.push_back(r);
  }
  for (int root : roots) {
    for (size_t bytes : {size_t{0}, size_t{8}, size_t{100000}}) {
      std::vector<uint8_t> data(bytes + 1, 0xEE);
      if (me == root) strata::testing::fillPattern(data.data(), bytes, seedOf(root, bytes, 14));
      bs->broadcast(data.data(), bytes, root);
      size_t bad = strata::testing::checkPattern(data.data(), bytes, seedOf(root, bytes, 14));
      BOOST_TEST(bad == bytes, "broadcast of " << bytes << " bytes from root " << root
                                               << " differs at byte " << bad);
      BOOST_TEST(data[bytes] == 0xEE, "broadcast wrote past " << bytes << " bytes");
    }
  }
  for (int i = 0; i < 10; ++i) bs->barrier();
}

// 14. agreement: ranks that disagree on a must-match key all fail create() with InvalidConfig
// naming the odd rank and the key. Last, because it leaves no bootstrap behind.
BOOST_AUTO_TEST_CASE(agreement) {
  RANK_SCOPE();
  REQUIRE_RANKS(2);
  const auto& env = launchEnv();
  Config cfg = Config::load();
  cfg.set("bootstrap.max_message", env.rank == 1 ? "2G" : "1G");
  std::unique_ptr<Bootstrap> bs;
  auto error = catchError([&] { bs = Bootstrap::create(cfg); });
  BOOST_REQUIRE_MESSAGE(error,
                        "create succeeded although rank 1 set bootstrap.max_message to 2G "
                        "and the others to 1G");
  BOOST_TEST_INFO_SCOPE(describe(*error));
  BOOST_TEST((error->code() == ErrorCode::InvalidConfig));
  std::string what = error->what();
  BOOST_TEST(what.find("bootstrap.max_message") != std::string::npos, "message lacks the key");
  BOOST_TEST(namesRank(what, 1), "message does not name rank 1");
}
