// The bootstrap conformance suite: started N times by strata-run (or srun), Boost.Test runs the
// same cases in the same order in every rank, and every case creates and destroys its own
// Bootstrap, so create/destroy is exercised throughout. Backend-agnostic except the cases marked
// tcp only, which skip politely for other backends. See docs/testing.md.
//
// This file has the suite's main and cases 1-6 (identity and point-to-point messages);
// conformance_failures.cpp has 7-10, conformance_concurrent.cpp 11-14. The files are linked in
// that order, which is the order the cases run in.

#define BOOST_TEST_MODULE bootstrap_conformance
#define BOOST_TEST_NO_MAIN
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "tests/conformance/conformance.hpp"

using namespace conformance;
using namespace std::chrono_literals;

namespace {

constexpr size_t k64MiB = size_t{64} << 20;

// At N > 16 every rank talks to 8 peers only, so the case stays O(N) at N=64.
constexpr int kMaxOrderingPeers = 8;

std::vector<int> orderingSendPeers(int rank, int size) {
  std::vector<int> peers;
  if (size - 1 <= 16) {
    for (int p = 0; p < size; ++p) {
      if (p != rank) peers.push_back(p);
    }
  } else {
    for (int d = 1; d <= kMaxOrderingPeers; ++d) peers.push_back((rank + d) % size);
  }
  return peers;
}

std::vector<int> orderingRecvPeers(int rank, int size) {
  std::vector<int> peers;
  if (size - 1 <= 16) {
    for (int p = 0; p < size; ++p) {
      if (p != rank) peers.push_back(p);
    }
  } else {
    for (int d = 1; d <= kMaxOrderingPeers; ++d) peers.push_back((rank - d + size) % size);
    std::sort(peers.begin(), peers.end());
  }
  return peers;
}

struct OrderingHeader {
  uint32_t src, dst, tag, seq;
};

// Message sizes differ per (src, dst, tag, seq): a message taken for another one then fails the
// size check or the header check instead of passing by luck.
size_t orderingBytes(uint32_t src, uint32_t dst, uint32_t tag, uint32_t seq) {
  return sizeof(OrderingHeader) + (src * 131u + dst * 71u + tag * 7u + seq * 37u) % 512u;
}

}  // namespace

// 1. identity: what the bootstrap reports agrees with the launcher and across ranks.
BOOST_AUTO_TEST_CASE(identity) {
  RANK_SCOPE();
  Config cfg = Config::load();
  auto bs = Bootstrap::create(cfg);
  const auto& env = launchEnv();
  BOOST_TEST(bs->rank() == env.rank);
  BOOST_TEST(bs->size() == env.size);
  if (env.localRank >= 0) BOOST_TEST(bs->localRank() == env.localRank);
  if (env.localSize >= 0) BOOST_TEST(bs->localSize() == env.localSize);
  BOOST_TEST(bs->localRank() >= 0);
  BOOST_TEST(bs->localRank() < bs->localSize());

  std::string wanted = cfg.get("bootstrap.backend").value_or("auto");
  std::string got(bs->backend());
  if (wanted != "auto") {
    BOOST_TEST(got == wanted);
  } else {
    BOOST_TEST((got == "tcp" || got == "pmix" || got == "ucx"), "backend() is '" << got << "'");
  }
  // Set by the meson tests of bootstrap.backend=auto: which backend auto must have picked.
  if (const char* expected = std::getenv("STRATA_TEST_EXPECT_BACKEND"); expected && *expected) {
    BOOST_TEST(got == std::string(expected),
               "auto picked '" << got << "', expected '" << expected << "'");
  }

  // Across ranks: ranks are 0..N-1 and local ranks number the ranks of each host.
  struct Record {
    int32_t rank, localRank, localSize, pad;
    char host[64];
  };
  const int n = bs->size();
  std::vector<Record> all(n);
  Record mine{bs->rank(), bs->localRank(), bs->localSize(), 0, {}};
  gethostname(mine.host, sizeof(mine.host) - 1);
  all[bs->rank()] = mine;
  bs->allGather(all.data(), sizeof(Record));
  for (int r = 0; r < n; ++r) {
    BOOST_TEST(all[r].rank == r, "allGather slot " << r << " holds rank " << all[r].rank);
    int sameHost = 0;
    std::vector<bool> seen(n, false);
    for (int q = 0; q < n; ++q) {
      if (std::strncmp(all[q].host, all[r].host, sizeof(all[q].host)) != 0) continue;
      ++sameHost;
      if (all[q].localRank >= 0 && all[q].localRank < n) {
        BOOST_TEST(!seen[all[q].localRank],
                   "two ranks on " << all[r].host << " have local rank " << all[q].localRank);
        seen[all[q].localRank] = true;
      }
    }
    BOOST_TEST(all[r].localSize == sameHost, "rank " << r << " says localSize " << all[r].localSize
                                                     << " but " << sameHost << " ranks run on "
                                                     << all[r].host);
  }
  bs->barrier();
}

// 2. ordering: many messages per (peer, tag), received in reverse tag and peer order. This is
// the bug class strata exists to avoid (design.md): a message taken for another peer's or an
// earlier one's shows up as a wrong header or a size mismatch.
BOOST_AUTO_TEST_CASE(ordering) {
  RANK_SCOPE();
  auto bs = Bootstrap::create(Config::load());
  REQUIRE_RANKS(2);
  const uint32_t me = bs->rank();
  const int n = bs->size();
  constexpr int kMessages = 20;
  const std::array<int, 4> tags = {0, 7, 4242, 1000000};
  const auto sendTo = orderingSendPeers(me, n);
  const auto recvFrom = orderingRecvPeers(me, n);

  // Interleave the (peer, tag) streams on the sending side.
  std::vector<uint8_t> buf;
  for (uint32_t seq = 0; seq < kMessages; ++seq) {
    for (int tag : tags) {
      for (int peer : sendTo) {
        size_t bytes = orderingBytes(me, peer, tag, seq);
        buf.assign(bytes, 0);
        OrderingHeader h{me, static_cast<uint32_t>(peer), static_cast<uint32_t>(tag), seq};
        std::memcpy(buf.data(), &h, sizeof(h));
        strata::testing::fillPattern(buf.data() + sizeof(h), bytes - sizeof(h),
                                     seedOf(me, peer, tag, seq));
        bs->send(peer, tag, buf.data(), bytes);
      }
    }
  }

  int wrong = 0;
  for (auto tag = tags.rbegin(); tag != tags.rend(); ++tag) {
    for (auto peer = recvFrom.rbegin(); peer != recvFrom.rend(); ++peer) {
      for (uint32_t seq = 0; seq < kMessages; ++seq) {
        size_t bytes = orderingBytes(*peer, me, *tag, seq);
        buf.assign(bytes, 0);
        auto error = catchError([&] { bs->recv(*peer, *tag, buf.data(), bytes); });
        if (error) {
          BOOST_ERROR("recv #" << seq << " from rank " << *peer << " tag " << *tag << " (" << bytes
                               << " bytes) failed: " << describe(*error));
          return;  // the stream is out of step; further messages would only repeat this
        }
        OrderingHeader h;
        std::memcpy(&h, buf.data(), sizeof(h));
        size_t bad = strata::testing::checkPattern(buf.data() + sizeof(h), bytes - sizeof(h),
                                                   seedOf(*peer, me, *tag, seq));
        if (h.src != static_cast<uint32_t>(*peer) || h.dst != me ||
            h.tag != static_cast<uint32_t>(*tag) || h.seq != seq || bad != bytes - sizeof(h)) {
          if (++wrong <= 5) {
            BOOST_ERROR("expected message #"
                        << seq << " from rank " << *peer << " tag " << *tag << ", got #" << h.seq
                        << " from rank " << h.src << " to " << h.dst << " tag " << h.tag
                        << (bad != bytes - sizeof(h) ? " (payload differs)" : ""));
          }
        }
      }
    }
  }
  BOOST_TEST(wrong == 0, wrong << " messages arrived out of order or corrupted");
  bs->barrier();
}

// 3. early arrival: a message sent long before the receiver asks for it is kept.
BOOST_AUTO_TEST_CASE(early_arrival) {
  RANK_SCOPE();
  auto bs = Bootstrap::create(Config::load());
  REQUIRE_RANKS(2);
  sendPattern(*bs, nextRank(*bs), 3, 1000, seedOf(bs->rank(), 3));
  std::this_thread::sleep_for(500ms);
  recvPattern(*bs, prevRank(*bs), 3, 1000, seedOf(prevRank(*bs), 3));
  bs->barrier();
}

// 4. sizes: empty messages, odd sizes and one 64 MiB message, all pattern-checked.
BOOST_AUTO_TEST_CASE(sizes) {
  RANK_SCOPE();
  auto bs = Bootstrap::create(Config::load());
  REQUIRE_RANKS(2);
  const int next = nextRank(*bs), prev = prevRank(*bs);

  // 0 bytes, once with a null pointer and once with a real one.
  bs->send(next, 10, nullptr, 0);
  uint8_t dummy = 0x5A;
  bs->send(next, 11, &dummy, 0);
  bs->recv(prev, 10, nullptr, 0);
  uint8_t sink = 0xEE;
  bs->recv(prev, 11, &sink, 0);
  BOOST_TEST(sink == 0xEE, "a 0-byte recv wrote into the buffer");

  for (size_t bytes : {size_t{1}, size_t{4095}, (size_t{1} << 20) + 3}) {
    sendPattern(*bs, next, 12, bytes, seedOf(bs->rank(), bytes));
    recvPattern(*bs, prev, 12, bytes, seedOf(prev, bytes));
  }

  if (bs->rank() == 0) sendPattern(*bs, 1, 13, k64MiB, seedOf(0, 64));
  if (bs->rank() == 1) recvPattern(*bs, 0, 13, k64MiB, seedOf(0, 64));
  bs->barrier();
}

// 5. simultaneous 64 MiB exchange: send never deadlocks against the peer's send.
BOOST_AUTO_TEST_CASE(simultaneous_exchange) {
  RANK_SCOPE();
  auto bs = Bootstrap::create(Config::load());
  REQUIRE_RANKS(2);
  if (bs->rank() <= 1) {
    const int peer = 1 - bs->rank();
    sendPattern(*bs, peer, 20, k64MiB, seedOf(bs->rank(), 20));
    recvPattern(*bs, peer, 20, k64MiB, seedOf(peer, 20));
  }
  bs->barrier();
}

// 6. size mismatch: ProtocolError naming peer, tag and both sizes; the bootstrap stays usable.
BOOST_AUTO_TEST_CASE(size_mismatch) {
  RANK_SCOPE();
  auto bs = Bootstrap::create(Config::load());
  REQUIRE_RANKS(2);
  constexpr int kTag = 606;
  if (bs->rank() == 1) {
    std::vector<uint8_t> data(100, 1);
    bs->send(0, kTag, data.data(), data.size());
    sendPattern(*bs, 0, kTag + 1, 8, seedOf(1, kTag));
    recvPattern(*bs, 0, kTag + 1, 8, seedOf(0, kTag));
  }
  if (bs->rank() == 0) {
    std::vector<uint8_t> data(64);
    auto error = catchError([&] { bs->recv(1, kTag, data.data(), data.size()); });
    BOOST_REQUIRE_MESSAGE(error, "recv of 64 bytes when 100 were sent did not throw");
    BOOST_TEST_INFO_SCOPE(describe(*error));
    BOOST_TEST((error->code() == ErrorCode::ProtocolError));
    BOOST_TEST(error->peer() == 1);
    std::string what = error->what();
    BOOST_TEST(what.find(std::to_string(kTag)) != std::string::npos, "message lacks the tag");
    BOOST_TEST(what.find("100") != std::string::npos, "message lacks the sent size");
    BOOST_TEST(what.find("64") != std::string::npos, "message lacks the receive size");
    // Afterwards the same bootstrap still carries normal traffic, both ways.
    recvPattern(*bs, 1, kTag + 1, 8, seedOf(1, kTag));
    sendPattern(*bs, 1, kTag + 1, 8, seedOf(0, kTag));
  }
  bs->barrier();
}

int main(int argc, char** argv) {
  return strata::testing::multiProcessMain(
      argc, argv, "bootstrap-conformance: run under strata-run or srun (see docs/testing.md)",
      &init_unit_test);
}
