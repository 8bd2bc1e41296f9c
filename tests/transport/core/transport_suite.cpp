// The transport suite: started N times by strata-run (or srun, or in two network namespaces),
// Boost.Test runs the same cases in the same order in every rank. Every case creates its own
// Bootstrap and Context. The transport under test comes from the environment
// (STRATA_TRANSPORT_INTRA_NODE / _INTER_NODE, STRATA_TRANSPORT_FABRIC_PROVIDER); the expected
// choice from STRATA_TEST_EXPECT_INTRA and STRATA_TEST_EXPECT_INTER. See docs/testing.md.

#define BOOST_TEST_MODULE transport_suite
#define BOOST_TEST_NO_MAIN
#include <boost/test/unit_test.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tests/harness/fixtures.hpp"

namespace {

std::shared_ptr<Context> makeContext(const Config& cfg = Config::load()) {
  std::shared_ptr<Bootstrap> bs = Bootstrap::create(cfg);
  return Context::create(bs, cfg);
}

uint64_t seedOf(uint64_t a, uint64_t b = 0, uint64_t c = 0) {
  return ((a * 1000003 + b) * 1000003 + c) + 1;
}

std::string envOr(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

size_t countMaps() {
  std::ifstream in("/proc/self/maps");
  size_t n = 0;
  std::string line;
  while (std::getline(in, line)) ++n;
  return n;
}

// The ring neighbours, deduplicated (at N=2 both are the same rank).
std::vector<int> ringPeers(const Context& ctx) {
  int next = (ctx.rank() + 1) % ctx.size(), prev = (ctx.rank() + ctx.size() - 1) % ctx.size();
  std::vector<int> peers{next};
  if (prev != next) peers.push_back(prev);
  return peers;
}

// A ring set-up: one connection to next and prev, the peers' buffers, and two semaphores per
// connection (data, ack).
struct Ring {
  std::shared_ptr<Context> ctx;
  int next = -1, prev = -1;
  std::vector<std::shared_ptr<Connection>> conns;
  std::shared_ptr<Connection> toNext, toPrev;
  std::shared_ptr<HostSemaphore> dataNext, ackNext, dataPrev, ackPrev;
  RegisteredMemory nextDst;

  Ring(std::shared_ptr<Context> c, const RegisteredMemory& myDst) : ctx(std::move(c)) {
    next = (ctx->rank() + 1) % ctx->size();
    prev = (ctx->rank() + ctx->size() - 1) % ctx->size();
    auto peers = ringPeers(*ctx);
    conns = ctx->connect(peers);
    toNext = conns[0];
    toPrev = conns.size() > 1 ? conns[1] : conns[0];
    std::vector<std::shared_ptr<Connection>> semConns{toNext, toNext};
    if (toPrev != toNext) {
      semConns.push_back(toPrev);
      semConns.push_back(toPrev);
    }
    auto sems = ctx->createSemaphores(semConns);
    dataNext = sems[0];
    ackNext = sems[1];
    dataPrev = sems.size() > 2 ? sems[2] : sems[0];
    ackPrev = sems.size() > 2 ? sems[3] : sems[1];
    auto remote = ctx->exchange(myDst, peers);
    nextDst = remote[0];
  }
};

}  // namespace

// 1. Transport choice: by host identity and the preference lists, the same on both ends.
BOOST_AUTO_TEST_CASE(selection) {
  RANK_SCOPE();
  auto ctx = makeContext();
  REQUIRE_RANKS(2);
  std::string intra = envOr("STRATA_TEST_EXPECT_INTRA", "");
  std::string inter = envOr("STRATA_TEST_EXPECT_INTER", "");
  std::vector<int> peers;
  for (int p = 0; p < ctx->size(); ++p) {
    if (p != ctx->rank()) peers.push_back(p);
  }
  auto conns = ctx->connect(peers);
  for (size_t i = 0; i < peers.size(); ++i) {
    int p = peers[i];
    std::string expected = ctx->sameHost(p) ? intra : inter;
    BOOST_TEST_INFO_SCOPE("peer " << p << " on " << ctx->hostName(p)
                                  << (ctx->sameHost(p) ? " (same host)" : " (other host)"));
    if (!expected.empty()) {
      BOOST_TEST(ctx->transportFor(p) == expected);
      BOOST_TEST(std::string(conns[i]->transport()) == expected);
    }
    BOOST_TEST(conns[i]->peer() == p);
  }
  if (const char* hosts = std::getenv("STRATA_TEST_EXPECT_HOSTS")) {
    std::vector<std::string> names;
    for (int r = 0; r < ctx->size(); ++r) names.push_back(ctx->hostName(r));
    std::sort(names.begin(), names.end());
    names.erase(std::unique(names.begin(), names.end()), names.end());
    BOOST_TEST(names.size() == static_cast<size_t>(std::atoi(hosts)));
  }
  ctx->bootstrap().barrier();
}

// 2. Data integrity from 1 byte to 256 MiB at odd offsets, around the ring, strata-allocated
// and user memory.
BOOST_AUTO_TEST_CASE(integrity) {
  RANK_SCOPE();
  auto ctx = makeContext();
  REQUIRE_RANKS(2);
  const size_t kMax = size_t{256} << 20;
  const std::vector<size_t> sizes = {
      1, 3, 8, 63, 4095, 4097, 65537, (1 << 20) + 3, (16 << 20) + 5, kMax};
  auto dst = ctx->allocate(kMax + 4096);
  auto src = ctx->allocate(kMax + 4096);
  std::vector<uint8_t> userSrcStore((4 << 20) + 64);
  auto userSrc = ctx->registerMemory(userSrcStore.data(), userSrcStore.size());
  Ring ring(ctx, dst);
  auto* d = static_cast<uint8_t*>(dst.data());
  int round = 0;
  for (size_t n : sizes) {
    for (bool user : {false, true}) {
      if (user && n > (4u << 20)) continue;
      ++round;
      BOOST_TEST_INFO_SCOPE(n << " bytes, " << (user ? "user" : "strata") << " source");
      const uint64_t srcOff = 1 + 2 * (round % 5), dstOff = 3 + 2 * (round % 7);
      auto& s = user ? userSrc : src;
      uint8_t* sp = static_cast<uint8_t*>(s.data());
      strata::testing::fillPattern(sp + srcOff, n, seedOf(ctx->rank(), n, round));
      d[dstOff - 1] = 0xA5;
      d[dstOff + n] = 0x5A;
      ctx->bootstrap().barrier();  // guards are in place everywhere before anyone writes
      ring.toNext->write(ring.nextDst, dstOff, s, srcOff, n);
      ring.dataNext->signal();
      ring.dataPrev->wait();
      size_t bad = strata::testing::checkPattern(d + dstOff, n, seedOf(ring.prev, n, round));
      BOOST_TEST(bad == n, "data from rank " << ring.prev << " differs at byte " << bad);
      BOOST_TEST(d[dstOff - 1] == 0xA5, "the byte before the write changed");
      BOOST_TEST(d[dstOff + n] == 0x5A, "the byte after the write changed");
      ring.ackPrev->signal();
      ring.ackNext->wait();
      ring.toNext->flush();
    }
  }
  ctx->bootstrap().barrier();
}

// 3. Writes into memory the peer registered itself (not strata-allocated).
BOOST_AUTO_TEST_CASE(user_memory_destination) {
  RANK_SCOPE();
  auto ctx = makeContext();
  REQUIRE_RANKS(2);
  const size_t n = (1 << 20) + 3;
  std::vector<uint8_t> store(n + 16, 0);
  auto dst = ctx->registerMemory(store.data(), store.size());
  auto src = ctx->allocate(n + 16);
  strata::testing::fillPattern(static_cast<uint8_t*>(src.data()) + 1, n, seedOf(ctx->rank(), 77));
  Ring ring(ctx, dst);
  std::optional<Error> err;
  try {
    ring.toNext->write(ring.nextDst, 5, src, 1, n);
    ring.dataNext->signal();
  } catch (const Error& e) {
    err = e;
  }
  if (err) {
    // Allowed only as a clear NotSupported (e.g. a kernel that forbids cross-process access).
    BOOST_TEST_INFO_SCOPE(describe(*err));
    BOOST_TEST((err->code() == ErrorCode::NotSupported));
    ring.dataNext->signal();
    ring.dataPrev->wait();
    return;
  }
  ring.dataPrev->wait();
  size_t bad = strata::testing::checkPattern(store.data() + 5, n, seedOf(ring.prev, 77));
  BOOST_TEST(bad == n, "data from rank " << ring.prev << " differs at byte " << bad);
  ctx->bootstrap().barrier();
}

// 4. A signal is seen only after the data written before it: every rank talks to every other
// rank from its own thread, many rounds, each round's data stamped with the round.
BOOST_AUTO_TEST_CASE(signal_after_data_concurrent) {
  RANK_SCOPE();
  auto ctx = makeContext();
  REQUIRE_RANKS(2);
  const int n = ctx->size(), me = ctx->rank();
  const size_t kSlot = 64 * 1024;
  const int kRounds = n <= 2 ? 1000 : 200;
  std::vector<int> peers;
  for (int p = 0; p < n; ++p) {
    if (p != me) peers.push_back(p);
  }
  auto inbox = ctx->allocate(kSlot * n);   // slot p: what rank p writes here
  auto outbox = ctx->allocate(kSlot * n);  // slot p: what this rank writes to rank p
  auto conns = ctx->connect(peers);
  std::vector<std::shared_ptr<Connection>> semConns;
  for (auto& c : conns) {
    semConns.push_back(c);
    semConns.push_back(c);
  }
  auto sems = ctx->createSemaphores(semConns);
  auto remote = ctx->exchange(inbox, peers);
  std::atomic<int> failures{0};
  std::vector<std::string> firstError(peers.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < peers.size(); ++i) {
    threads.emplace_back([&, i] {
      int p = peers[i];
      auto* out = static_cast<uint64_t*>(outbox.data()) + p * kSlot / 8;
      const auto* in = static_cast<const uint64_t*>(inbox.data()) + p * kSlot / 8;
      try {
        for (int r = 1; r <= kRounds; ++r) {
          size_t words = (r % 8 == 0 ? kSlot : 256) / 8;
          for (size_t w = 0; w < words; ++w) out[w] = (uint64_t(r) << 32) | (me << 16) | w;
          conns[i]->write(remote[i], me * kSlot, outbox, p * kSlot, words * 8);
          sems[2 * i]->signal();
          sems[2 * i]->wait();
          for (size_t w = 0; w < words; ++w) {
            uint64_t want = (uint64_t(r) << 32) | (uint64_t(p) << 16) | w;
            if (in[w] != want) {
              if (failures++ == 0) {
                firstError[i] = "round " + std::to_string(r) + " from rank " + std::to_string(p) +
                                ": word " + std::to_string(w) + " is stale after the signal";
              }
              break;
            }
          }
          sems[2 * i + 1]->signal();  // done reading: the peer may overwrite
          sems[2 * i + 1]->wait();
        }
      } catch (const Error& e) {
        failures++;
        firstError[i] = describe(e);
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : firstError) BOOST_TEST(e.empty(), e);
  BOOST_TEST(failures.load() == 0);
  ctx->bootstrap().barrier();
}

// 5. A wait on a peer that never signals times out within generous bounds, naming the peer.
BOOST_AUTO_TEST_CASE(wait_deadline) {
  RANK_SCOPE();
  auto ctx = makeContext();
  REQUIRE_RANKS(2);
  auto peers = ringPeers(*ctx);
  auto conns = ctx->connect(peers);
  auto sems = ctx->createSemaphores(conns);
  if (ctx->rank() == 0) {
    auto start = Clock::now();
    auto err = catchError([&] { sems[0]->wait(1.0); });
    double elapsed = secondsSince(start);
    BOOST_REQUIRE_MESSAGE(err, "wait returned without a signal");
    BOOST_TEST_INFO_SCOPE(describe(*err));
    BOOST_TEST((err->code() == ErrorCode::Timeout));
    BOOST_TEST(err->peer() == peers[0]);
    BOOST_TEST(elapsed >= 1.0);
    BOOST_TEST(elapsed < 5.0);
    // flush with nothing outstanding returns at once
    conns[0]->flush(1.0);
    BOOST_TEST(!sems[0]->poll());
  }
  ctx->bootstrap().barrier();
}

// 6. A peer that dies: waits and writes to it throw PeerLost naming it, promptly.
BOOST_AUTO_TEST_CASE(peer_lost) {
  RANK_SCOPE();
  const auto& env = launchEnv();
  if (env.size < 2) return;
  const int victim = env.size - 1;  // never rank 0, which may serve the rendezvous
  Config cfg = Config::load();
  auto setup = [&](std::shared_ptr<Context>& ctx, std::vector<std::shared_ptr<Connection>>& conns,
                   std::vector<std::shared_ptr<HostSemaphore>>& sems,
                   std::vector<RegisteredMemory>& remote, RegisteredMemory& mine) {
    ctx = makeContext(cfg);
    std::vector<int> peers;
    if (ctx->rank() == victim) {
      for (int p = 0; p < ctx->size(); ++p) {
        if (p != victim) peers.push_back(p);
      }
    } else {
      peers.push_back(victim);
    }
    mine = ctx->allocate(4096);
    conns = ctx->connect(peers);
    sems = ctx->createSemaphores(conns);
    remote = ctx->exchange(mine, peers);
    for (auto& s : sems) s->signal();
    for (auto& s : sems) s->wait();
  };
  if (env.rank == victim) {
    std::fflush(nullptr);
    pid_t child = fork();
    BOOST_REQUIRE_MESSAGE(child >= 0, "fork failed: " << std::strerror(errno));
    if (child == 0) {
      try {
        std::shared_ptr<Context> ctx;
        std::vector<std::shared_ptr<Connection>> conns;
        std::vector<std::shared_ptr<HostSemaphore>> sems;
        std::vector<RegisteredMemory> remote;
        RegisteredMemory mine;
        setup(ctx, conns, sems, remote, mine);
        raise(SIGKILL);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "peer_lost child (rank %d): %s\n", victim, e.what());
      }
      _exit(3);
    }
    int status = 0;
    while (waitpid(child, &status, 0) < 0 && errno == EINTR) {
    }
    BOOST_TEST((WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL),
               "the victim child did not die by SIGKILL (status " << status << ")");
    return;
  }
  std::shared_ptr<Context> ctx;
  std::vector<std::shared_ptr<Connection>> conns;
  std::vector<std::shared_ptr<HostSemaphore>> sems;
  std::vector<RegisteredMemory> remote;
  RegisteredMemory mine;
  setup(ctx, conns, sems, remote, mine);
  auto start = Clock::now();
  auto err = catchError([&] { sems[0]->wait(30.0); });
  double elapsed = secondsSince(start);
  BOOST_REQUIRE_MESSAGE(err, "wait on the killed rank returned normally");
  BOOST_TEST_INFO_SCOPE(describe(*err));
  BOOST_TEST((err->code() == ErrorCode::PeerLost));
  BOOST_TEST(err->peer() == victim);
  BOOST_TEST(elapsed < 10.0, "PeerLost took " << elapsed << " s");
  // Later calls keep failing with PeerLost.
  auto again = catchError([&] {
    conns[0]->write(remote[0], 0, mine, 0, 64);
    conns[0]->flush(5.0);
  });
  BOOST_REQUIRE(again);
  BOOST_TEST((again->code() == ErrorCode::PeerLost), describe(*again));
}

// 7. Corrupt records are rejected with clear errors; random mutations never crash.
BOOST_AUTO_TEST_CASE(corrupt_records) {
  RANK_SCOPE();
  auto ctx = makeContext();
  REQUIRE_RANKS(2);
  auto& bs = ctx->bootstrap();
  int peer = (ctx->rank() + 1) % ctx->size();
  int from = (ctx->rank() + ctx->size() - 1) % ctx->size();
  auto conns = ctx->connect(ringPeers(*ctx));  // loads and agrees on the transports
  auto mine = ctx->allocate(4096);
  auto rec = mine.serialize();
  uint64_t n = rec.size();
  bs.send(peer, 900, &n, sizeof n);
  bs.send(peer, 900, rec.data(), rec.size());
  bs.recv(from, 900, &n, sizeof n);
  std::vector<uint8_t> good(n);
  bs.recv(from, 900, good.data(), good.size());

  auto expectCode = [&](std::vector<uint8_t> r, ErrorCode code, const char* what) {
    BOOST_TEST_INFO_SCOPE(what);
    auto err = catchError([&] { RegisteredMemory::deserialize(*ctx, r); });
    BOOST_REQUIRE_MESSAGE(err, "accepted");
    BOOST_TEST_INFO_SCOPE(describe(*err));
    BOOST_TEST((err->code() == code));
  };
  BOOST_TEST(RegisteredMemory::deserialize(*ctx, good, from).rank() == from);
  auto badVersion = good;
  badVersion[4] = 99;
  expectCode(badVersion, ErrorCode::ProtocolError, "unknown version");
  auto badMagic = good;
  badMagic[0] ^= 0xFF;
  expectCode(badMagic, ErrorCode::ProtocolError, "bad magic");
  for (size_t cut : {size_t{3}, size_t{12}, good.size() / 2, good.size() - 1}) {
    expectCode(std::vector<uint8_t>(good.begin(), good.begin() + cut), ErrorCode::ProtocolError,
               "truncated");
  }
  auto wrongHost = good;
  wrongHost[12 + 4] ^= 0x5A;  // first byte of the host id, after the header and the rank
  expectCode(wrongHost, ErrorCode::ProtocolError, "wrong host");
  auto wrongPid = good;
  wrongPid[12 + 12] ^= 0x01;  // the pid
  expectCode(wrongPid, ErrorCode::ProtocolError, "wrong pid");
  auto err = catchError([&] { RegisteredMemory::deserialize(*ctx, good, ctx->rank()); });
  BOOST_TEST((err && err->code() == ErrorCode::InvalidArgument), "wrong expected rank accepted");
  auto own = catchError([&] { RegisteredMemory::deserialize(*ctx, rec); });
  BOOST_TEST((own && own->code() == ErrorCode::InvalidArgument), "own record accepted");

  std::mt19937 gen(1234 + ctx->rank());
  int accepted = 0;
  for (int i = 0; i < 3000; ++i) {
    auto r = good;
    int flips = 1 + gen() % 4;
    for (int k = 0; k < flips; ++k) r[gen() % r.size()] = static_cast<uint8_t>(gen());
    if (gen() % 4 == 0) r.resize(gen() % r.size());
    try {
      RegisteredMemory::deserialize(*ctx, r);
      ++accepted;  // a flip in a field nobody checks (e.g. the registration id) is harmless
    } catch (const Error&) {
    }
  }
  BOOST_TEST_MESSAGE("rank " << ctx->rank() << ": " << accepted << " of 3000 mutations accepted");
  bs.barrier();
}

// 8. Bad arguments are InvalidArgument and change nothing.
BOOST_AUTO_TEST_CASE(bad_arguments) {
  RANK_SCOPE();
  auto ctx = makeContext();
  REQUIRE_RANKS(2);
  auto peers = ringPeers(*ctx);
  auto conns = ctx->connect(peers);
  auto mine = ctx->allocate(4096);
  auto remote = ctx->exchange(mine, peers);
  auto expectInvalid = [&](const std::function<void()>& fn, const char* what) {
    BOOST_TEST_INFO_SCOPE(what);
    auto err = catchError(fn);
    BOOST_REQUIRE_MESSAGE(err, "accepted");
    BOOST_TEST((err->code() == ErrorCode::InvalidArgument), describe(*err));
  };
  auto& c = conns[0];
  auto& r = remote[0];
  expectInvalid([&] { c->write(r, 4000, mine, 0, 200); }, "dst range");
  expectInvalid([&] { c->write(r, 0, mine, 4000, 200); }, "src range");
  expectInvalid([&] { c->write(r, UINT64_MAX, mine, 0, 2); }, "dst offset overflow");
  expectInvalid([&] { c->write(mine, 0, mine, 0, 8); }, "local dst");
  expectInvalid([&] { c->write(r, 0, r, 0, 8); }, "remote src");
  expectInvalid([&] { c->updateAndSync(r, 4, 1); }, "unaligned signal");
  expectInvalid([&] { c->updateAndSync(r, 4096, 1); }, "signal past the end");
  expectInvalid([&] { ctx->connect(std::vector<int>{ctx->rank()}); }, "connect to self");
  expectInvalid([&] { ctx->connect(std::vector<int>{ctx->size()}); }, "rank out of range");
  expectInvalid([&] { ctx->registerMemory(nullptr, 8); }, "null buffer");
  expectInvalid([&] { ctx->allocate(0); }, "zero bytes");
  expectInvalid([&] { (void)r.serialize(); }, "serialize a remote view");
  // The connection still works afterwards.
  c->write(r, 0, mine, 0, 64);
  c->flush();
  ctx->bootstrap().barrier();
}

// 9. Nothing leaks: 100 cycles of allocate/connect/exchange/semaphores/destroy in one Context,
// then 20 Contexts created and destroyed.
BOOST_AUTO_TEST_CASE(no_leaks) {
  RANK_SCOPE();
  Config cfg = Config::load();
  auto ctx = makeContext(cfg);
  REQUIRE_RANKS(2);
  auto peers = ringPeers(*ctx);
  auto cycle = [&](Context& c) {
    auto mem = c.allocate(1 << 20);
    std::vector<uint8_t> user(8192);
    auto userMem = c.registerMemory(user.data(), user.size());
    auto conns = c.connect(peers);
    auto sems = c.createSemaphores(conns);
    auto remote = c.exchange(mem, peers);
    conns[0]->write(remote[0], 1, userMem, 3, 5000);
    for (auto& s : sems) s->signal();
    for (auto& s : sems) s->wait();
  };
  cycle(*ctx);  // first use of every transport: lazy one-time state is not a leak
  auto usageBefore = ctx->usage();
  size_t fds = strata::testing::countOpenFds(), maps = countMaps();
  for (int i = 0; i < 100; ++i) cycle(*ctx);
  ctx->bootstrap().barrier();
  auto usageAfter = ctx->usage();
  BOOST_REQUIRE(usageAfter.size() == usageBefore.size());
  for (size_t i = 0; i < usageAfter.size(); ++i) {
    BOOST_TEST_INFO_SCOPE("transport " << usageAfter[i].name);
    BOOST_TEST(usageAfter[i].registrations == usageBefore[i].registrations);
    BOOST_TEST(usageAfter[i].imports == usageBefore[i].imports);
    BOOST_TEST(usageAfter[i].connections == usageBefore[i].connections);
  }
  // Fewer is fine (a provider may close an idle connection); more is a leak.
  BOOST_TEST(strata::testing::countOpenFds() <= fds,
             "open fds went from " << fds << " to " << strata::testing::countOpenFds());
  BOOST_TEST(countMaps() <= maps + 2, "mappings went from " << maps << " to " << countMaps());
  ctx.reset();
  size_t fds2 = strata::testing::countOpenFds();
  for (int i = 0; i < 20; ++i) {
    auto c = makeContext(cfg);
    cycle(*c);
  }
  BOOST_TEST(strata::testing::countOpenFds() <= fds2,
             "open fds went from " << fds2 << " to " << strata::testing::countOpenFds());
}

int main(int argc, char** argv) {
  return strata::testing::multiProcessMain(
      argc, argv, "transport_suite: needs a launcher (strata-run -n N, srun, mpirun)",
      [] { return true; });
}
