// The bootstrap collectives of mesh/p2p_collectives.hpp over an in-process message
// engine: one thread per rank, one FIFO per (sender, receiver, round).
#define BOOST_TEST_MODULE p2p_collectives
#include <boost/test/unit_test.hpp>

#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include <strata/error.hpp>

#include "mesh/p2p_collectives.hpp"
#include "tests/harness/in_process_ranks.hpp"

using namespace strata;

namespace {

class Fabric {
 public:
  explicit Fabric(int size) : size_(size) {}

  p2p::Messenger messenger(int rank) {
    return {rank, size_,
            [this, rank](int peer, uint32_t round, const void* data, size_t bytes) {
              auto* p = static_cast<const uint8_t*>(data);
              std::lock_guard lk(mu_);
              queues_[{rank, peer, round}].emplace_back(p, p + bytes);
              ++messages_;
              cv_.notify_all();
            },
            [this, rank](int peer, uint32_t round, void* data, size_t bytes) {
              std::unique_lock lk(mu_);
              auto& q = queues_[{peer, rank, round}];
              cv_.wait(lk, [&] { return !q.empty(); });
              auto m = std::move(q.front());
              q.pop_front();
              if (m.size() != bytes) {
                throw Error(ErrorCode::ProtocolError, "size mismatch", peer);
              }
              if (bytes) std::memcpy(data, m.data(), bytes);
            }};
  }

  /// Runs fn(rank) in one thread per rank; rethrows the first failure.
  void run(const std::function<void(int)>& fn) {
    testing::runRanks(size_, fn);
    for (auto& [key, q] : queues_) BOOST_TEST(q.empty());
  }

  int messages() const { return messages_; }

 private:
  int size_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::tuple<int, int, uint32_t>, std::deque<std::vector<uint8_t>>> queues_;
  int messages_ = 0;
};

const int kSizes[] = {2, 3, 5, 8};

using testing::expectInRank;

}  // namespace

BOOST_AUTO_TEST_CASE(all_gather_every_algorithm) {
  for (auto algorithm : {p2p::AllGatherAlgorithm::Bruck, p2p::AllGatherAlgorithm::Ring,
                         p2p::AllGatherAlgorithm::Star}) {
    for (int n : kSizes) {
      Fabric fabric(n);
      fabric.run([&](int r) {
        std::vector<uint32_t> table(static_cast<size_t>(n) * 2, 0);
        table[2 * r] = 1000u + static_cast<uint32_t>(r);
        table[2 * r + 1] = 2000u + static_cast<uint32_t>(r);
        p2p::allGather(fabric.messenger(r), algorithm, table.data(), 2 * sizeof(uint32_t));
        for (int q = 0; q < n; ++q) {
          expectInRank(table[2 * q] == 1000u + static_cast<uint32_t>(q), "slot word 0");
          expectInRank(table[2 * q + 1] == 2000u + static_cast<uint32_t>(q), "slot word 1");
        }
      });
    }
  }
}

BOOST_AUTO_TEST_CASE(broadcast_from_every_root) {
  for (bool star : {false, true}) {
    for (int n : kSizes) {
      for (int root = 0; root < n; ++root) {
        Fabric fabric(n);
        fabric.run([&](int r) {
          uint64_t value = r == root ? 0xfeed0000u + static_cast<uint64_t>(root) : 0;
          p2p::broadcast(fabric.messenger(r), star, &value, sizeof value, root);
          expectInRank(value == 0xfeed0000u + static_cast<uint64_t>(root), "broadcast value");
        });
        BOOST_TEST(fabric.messages() == n - 1);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(barrier_rounds) {
  for (bool star : {false, true}) {
    for (int n : kSizes) {
      Fabric fabric(n);
      fabric.run([&](int r) { p2p::barrier(fabric.messenger(r), star); });
      int rounds = 0;
      while ((1 << rounds) < n) ++rounds;
      BOOST_TEST(fabric.messages() == (star ? 2 * (n - 1) : n * rounds));
    }
  }
}

BOOST_AUTO_TEST_CASE(argument_checks) {
  int x = 0;
  BOOST_TEST(!p2p::allGatherNeeded(1, nullptr, 4));
  BOOST_TEST(!p2p::allGatherNeeded(4, nullptr, 0));
  BOOST_CHECK_THROW(p2p::allGatherNeeded(4, nullptr, 4), Error);
  BOOST_TEST(p2p::allGatherNeeded(4, &x, 4));
  BOOST_CHECK_THROW(p2p::broadcastNeeded(4, &x, 4, 4), Error);
  BOOST_CHECK_THROW(p2p::broadcastNeeded(1, &x, 4, -1), Error);
  BOOST_CHECK_THROW(p2p::broadcastNeeded(4, nullptr, 4, 0), Error);
  BOOST_TEST(!p2p::broadcastNeeded(1, &x, 4, 0));
  BOOST_TEST(p2p::broadcastNeeded(2, nullptr, 0, 1));
  BOOST_TEST(!p2p::barrierNeeded(1));
  BOOST_TEST(p2p::barrierNeeded(2));
  BOOST_CHECK_NO_THROW(p2p::checkPeer(1, 4, 3, "send"));
  for (int peer : {-1, 4, 1}) {
    try {
      p2p::checkPeer(1, 4, peer, "send");
      BOOST_FAIL("peer " << peer << " of rank 1 of 4 was accepted");
    } catch (const Error& e) {
      BOOST_TEST((e.code() == ErrorCode::InvalidArgument));
      BOOST_TEST(e.peer() == peer);
      BOOST_TEST(std::string(e.what()).rfind("send: peer " + std::to_string(peer), 0) == 0,
                 e.what());
    }
  }
}
