// The peer mesh (lib/mesh) on its own, without a backend around it: several PeerMesh instances
// in this process (one thread each, every one with its own listener on 127.0.0.1 and the same
// secret), or one of them in a forked child where a rank must die. What the conformance suite
// cannot reach cheaply: the order of delivery per (peer, tag), two ranks sending 64 MiB to each
// other, the exact errors and whom they name, the LOST relay, a refused handshake, and the
// collectives at several sizes.
#define BOOST_TEST_MODULE peer_mesh
#include <boost/test/unit_test.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <future>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <strata/error.hpp>

#include "mesh/peer_mesh.hpp"
#include "net/socket.hpp"
#include "tests/harness/in_process_ranks.hpp"
#include "tests/harness/single_rank.hpp"

using namespace strata;
using testing::expectError;
using testing::expectInRank;

namespace {

/// Deadline of the calls that must succeed: generous, so a loaded machine never fails them.
constexpr double kPatient = 30;

/// The ranks of one job in this process. Each rank's listener exists from the start (every
/// rank knows every address); its PeerMesh is made by start(), in this process or in a child.
class Job {
 public:
  explicit Job(int size, double timeout = kPatient) : size_(size), timeout_(timeout) {
    meshes_.resize(static_cast<size_t>(size));
    if (size == 1) {
      listeners_.emplace_back();  // a single rank listens for nobody (as the tcp backend does)
      addresses_.emplace_back();
      return;
    }
    for (int r = 0; r < size; ++r) {
      testing::LoopbackListener l;
      addresses_.push_back(l.addr.toString());
      listeners_.push_back(std::move(l.fd));
    }
  }

  /// Makes rank r's mesh; `adjust` may change its options first (a wrong secret).
  mesh::PeerMesh& start(int r, const std::function<void(mesh::Options&)>& adjust = {}) {
    mesh::Options o;
    o.rank = r;
    o.size = size_;
    o.secret = "the job's secret";
    o.timeout = timeout_;
    if (adjust) adjust(o);
    auto& m = meshes_[static_cast<size_t>(r)];
    m = std::make_unique<mesh::PeerMesh>(o, std::move(listeners_[static_cast<size_t>(r)]));
    m->setPeerAddresses(addresses_);
    return *m;
  }
  void startAll() {
    for (int r = 0; r < size_; ++r) start(r);
  }

  /// Runs rank r in a child process: it makes its mesh there, runs fn and exits without
  /// closing anything, the way a process dies (0 when fn returned, 1 when it threw). This
  /// process keeps no descriptor of that rank, so its connections close when the child exits.
  pid_t fork(int r, const std::function<void(mesh::PeerMesh&)>& fn) {
    pid_t pid = ::fork();
    BOOST_REQUIRE(pid >= 0);
    if (pid == 0) {
      for (auto& l : listeners_) {
        if (&l != &listeners_[static_cast<size_t>(r)]) l.reset();
      }
      int status = 0;
      try {
        fn(start(r));
      } catch (...) {
        status = 1;
      }
      ::_exit(status);
    }
    listeners_[static_cast<size_t>(r)].reset();
    return pid;
  }

  mesh::PeerMesh& operator[](int r) { return *meshes_[static_cast<size_t>(r)]; }
  int size() const { return size_; }

 private:
  int size_;
  double timeout_;
  std::vector<net::Fd> listeners_;
  std::vector<std::string> addresses_;
  std::vector<std::unique_ptr<mesh::PeerMesh>> meshes_;
};

/// The exit status of a child of Job::fork (-1 when it did not exit normally).
int exitStatus(pid_t pid) {
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/// Runs fn on a thread of its own; the future holds the strata::Error that fn threw (and
/// throws when fn returned, or threw something else).
std::future<Error> errorOnThread(std::function<void()> fn) {
  return std::async(std::launch::async, [fn = std::move(fn)]() -> Error {
    try {
      fn();
    } catch (const Error& e) {
      return e;
    }
    throw std::runtime_error("the call returned; a strata::Error was expected");
  });
}

bool contains(const Error& e, const std::string& text) {
  return std::string(e.what()).find(text) != std::string::npos;
}

// Messages whose size and bytes follow from (sender, tag, index), so that the receiver knows
// what to expect and can tell one message from another.
size_t messageSize(int sender, int tag, int i) {
  if (i == 7) return 0;
  if (i == 11) return (1u << 20) + 3;  // larger than the mesh's staging buffer
  return 4 + static_cast<size_t>((i * 997 + sender * 31 + tag) % 3000);
}
uint8_t messageByte(int sender, int tag, int i, size_t k) {
  return static_cast<uint8_t>(k * 131 + static_cast<size_t>(i * 7 + sender * 3 + tag));
}
std::vector<uint8_t> message(int sender, int tag, int i) {
  std::vector<uint8_t> m(messageSize(sender, tag, i));
  for (size_t k = 0; k < m.size(); ++k) m[k] = messageByte(sender, tag, i, k);
  return m;
}

}  // namespace

BOOST_AUTO_TEST_CASE(delivery_is_in_order_per_peer_and_tag_and_tags_are_independent) {
  constexpr int kMessages = 24;
  Job job(3);
  job.startAll();
  std::atomic<int> received{0};
  testing::runRanks(3, [&](int r) {
    auto& m = job[r];
    if (r != 1) {
      // Ranks 0 and 2 interleave tags 3 and 7 to rank 1, which takes them in another order.
      for (int i = 0; i < kMessages; ++i) {
        for (int tag : {3, 7}) {
          auto bytes = message(r, tag, i);
          m.send(1, tag, bytes.data(), bytes.size(), Deadline::after(kPatient));
        }
      }
      return;
    }
    for (int tag : {7, 3}) {
      for (int sender : {2, 0}) {
        for (int i = 0; i < kMessages; ++i) {
          std::vector<uint8_t> got(messageSize(sender, tag, i));
          m.recv(sender, tag, got.data(), got.size(), Deadline::after(kPatient));
          expectInRank(got == message(sender, tag, i),
                       "message " + std::to_string(i) + " from rank " + std::to_string(sender) +
                           " with tag " + std::to_string(tag) + " is not the one sent i-th");
          ++received;
        }
      }
    }
  });
  BOOST_TEST(received == 2 * 2 * kMessages);
}

BOOST_AUTO_TEST_CASE(threads_of_one_rank_take_turns_driving) {
  constexpr int kThreads = 4;
  constexpr uint64_t kMessages = 200;
  Job job(2);
  job.startAll();
  std::atomic<uint64_t> received{0};
  testing::runRanks(2, [&](int r) {
    testing::runRanks(kThreads, [&](int tag) {
      for (uint64_t i = 0; i < kMessages; ++i) {
        uint64_t v = i;
        if (r == 0) {
          job[0].send(1, tag, &v, sizeof v, Deadline::after(kPatient));
        } else {
          job[1].recv(0, tag, &v, sizeof v, Deadline::after(kPatient));
          expectInRank(v == i, "tag " + std::to_string(tag) + ": message out of order");
          ++received;
        }
      }
    });
  });
  BOOST_TEST(received == kThreads * kMessages);
}

BOOST_AUTO_TEST_CASE(two_ranks_send_64_MiB_to_each_other_before_receiving) {
  constexpr size_t kBytes = 64u << 20;
  Job job(2);
  job.startAll();
  std::atomic<int> verified{0};
  testing::runRanks(2, [&](int r) {
    const int peer = 1 - r;
    std::vector<uint8_t> out(kBytes), in(kBytes);
    for (size_t k = 0; k < kBytes; ++k) out[k] = static_cast<uint8_t>(k * 131 + r);
    job[r].send(peer, 1, out.data(), kBytes, Deadline::after(kPatient));
    job[r].recv(peer, 1, in.data(), kBytes, Deadline::after(kPatient));
    for (size_t k = 0; k < kBytes; ++k) {
      if (in[k] != static_cast<uint8_t>(k * 131 + peer)) {
        expectInRank(false, "byte " + std::to_string(k) + " from rank " + std::to_string(peer));
      }
    }
    ++verified;
  });
  BOOST_TEST(verified == 2);
}

BOOST_AUTO_TEST_CASE(a_recv_of_the_wrong_size_names_peer_tag_and_both_sizes) {
  Job job(2);
  job.startAll();
  auto sender = std::async(std::launch::async, [&] {
    uint8_t sixteen[16] = {}, eight[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    job[0].send(1, 5, sixteen, sizeof sixteen, Deadline::after(kPatient));
    job[0].send(1, 5, eight, sizeof eight, Deadline::after(kPatient));
  });
  uint8_t buf[8] = {};
  Error e = expectError([&] { job[1].recv(0, 5, buf, sizeof buf, Deadline::after(kPatient)); });
  BOOST_TEST((e.code() == ErrorCode::ProtocolError));
  BOOST_TEST(e.peer() == 0);
  BOOST_TEST(contains(e, "recv from rank 0 (tag 5): expected 8 bytes but rank 0 sent 16 bytes"),
             e.what());
  // The wrong message was discarded; the next one with that tag is delivered.
  job[1].recv(0, 5, buf, sizeof buf, Deadline::after(kPatient));
  BOOST_TEST(buf[7] == 8);
  sender.get();
}

BOOST_AUTO_TEST_CASE(calls_past_their_deadline_throw_Timeout_naming_peer_and_operation) {
  Job job(2, 1.0);
  job.startAll();
  // A recv nobody sends to.
  uint64_t v = 0;
  auto t0 = std::chrono::steady_clock::now();
  Error e = expectError([&] { job[1].recv(0, 4, &v, sizeof v, job[1].callDeadline()); });
  double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  BOOST_TEST((e.code() == ErrorCode::Timeout));
  BOOST_TEST(e.peer() == 0);
  BOOST_TEST(contains(e, "recv from rank 0 (tag 4, 8 bytes) timed out after 1 s"), e.what());
  BOOST_TEST(took >= 1.0);
  BOOST_TEST(took < 5.0);

  // A send to a rank that does not read: connected first, then more than the sockets hold.
  // Separate buffers: the reader thread writes its own while this thread's send reads v.
  uint64_t got = 1;
  auto reader = std::async(std::launch::async,
                           [&] { job[0].recv(1, 1, &got, sizeof got, Deadline::after(kPatient)); });
  job[1].send(0, 1, &v, sizeof v, Deadline::after(kPatient));
  reader.get();
  BOOST_TEST(got == v);
  std::vector<uint8_t> big(64u << 20);
  t0 = std::chrono::steady_clock::now();
  e = expectError([&] { job[1].send(0, 2, big.data(), big.size(), job[1].callDeadline()); });
  took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  BOOST_TEST((e.code() == ErrorCode::Timeout));
  BOOST_TEST(e.peer() == 0);
  BOOST_TEST(contains(e,
                      "send to rank 0 (tag 2, 67108864 bytes) timed out after 1 s: rank 0 is "
                      "not reading"),
             e.what());
  BOOST_TEST(took >= 1.0);
  BOOST_TEST(took < 5.0);
}

BOOST_AUTO_TEST_CASE(a_peer_that_closes_gives_PeerLost_before_the_timeout) {
  Job job(2);
  job.startAll();
  const uint64_t sent = 1;  // the closer's own buffer: this thread receives into v meanwhile
  uint64_t v = 0;
  auto closer = std::async(std::launch::async, [&] {
    job[0].send(1, 1, &sent, sizeof sent, Deadline::after(kPatient));
    job[0].close();
  });
  job[1].recv(0, 1, &v, sizeof v, Deadline::after(kPatient));
  BOOST_TEST(v == sent);
  Error e = expectError([&] { job[1].recv(0, 2, &v, sizeof v, job[1].callDeadline()); });
  closer.get();
  BOOST_TEST((e.code() == ErrorCode::PeerLost));
  BOOST_TEST(e.peer() == 0);
  BOOST_TEST(contains(e, "rank 0 has already closed its bootstrap"), e.what());
}

BOOST_AUTO_TEST_CASE(a_peer_that_dies_gives_PeerLost_and_its_loss_is_relayed) {
  // Rank 2 (a child process) talks to rank 0 only and dies. Rank 0 sees its connection close;
  // rank 1, which never connected to rank 2, learns it from rank 0's LOST.
  Job job(3);
  pid_t child = job.fork(2, [](mesh::PeerMesh& m) {
    uint64_t v = 2;
    m.send(0, 1, &v, sizeof v, Deadline::after(kPatient));
    m.recv(0, 1, &v, sizeof v, Deadline::after(kPatient));
  });
  job.start(0);
  job.start(1);
  auto rank1 = errorOnThread([&] {
    uint64_t v = 1;
    job[1].recv(0, 1, &v, sizeof v, Deadline::after(kPatient));
    job[1].recv(2, 2, &v, sizeof v, job[1].callDeadline());
  });
  uint64_t v = 0;
  job[0].send(1, 1, &v, sizeof v, Deadline::after(kPatient));  // rank 0 -> 1 carries the LOST
  job[0].recv(2, 1, &v, sizeof v, Deadline::after(kPatient));
  job[0].send(2, 1, &v, sizeof v, Deadline::after(kPatient));
  Error direct = expectError([&] { job[0].recv(2, 2, &v, sizeof v, job[0].callDeadline()); });
  BOOST_TEST((direct.code() == ErrorCode::PeerLost));
  BOOST_TEST(direct.peer() == 2);
  BOOST_TEST(contains(direct, "failed: the connection with rank 2"), direct.what());
  // Rank 0 keeps driving (its LOST to rank 1 goes out) until rank 1 has its answer.
  auto drive = std::async(std::launch::async, [&] {
    uint64_t done = 0;
    job[0].recv(1, 3, &done, sizeof done, Deadline::after(kPatient));
  });
  Error relayed = rank1.get();
  uint64_t done = 0;
  job[1].send(0, 3, &done, sizeof done, Deadline::after(kPatient));
  drive.get();
  BOOST_TEST((relayed.code() == ErrorCode::PeerLost));
  BOOST_TEST(relayed.peer() == 2);
  BOOST_TEST(contains(relayed, "rank 0 reported that its connection to rank 2 broke"),
             relayed.what());
  BOOST_TEST(exitStatus(child) == 0);
}

BOOST_AUTO_TEST_CASE(abort_makes_the_others_calls_throw_Aborted_with_origin_and_reason) {
  Job job(3);
  job.startAll();
  testing::runRanks(3, [&](int r) { job[r].barrier(); });  // every pair connected
  std::atomic<int> waiting{0};
  auto waitForEachOther = [&](int r) {
    return errorOnThread([&, r] {
      uint64_t v = 0;
      ++waiting;
      job[r].recv(3 - r, 1, &v, sizeof v, Deadline::after(kPatient));
    });
  };
  auto rank1 = waitForEachOther(1);
  auto rank2 = waitForEachOther(2);
  while (waiting < 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  job[0].abort("the test aborts");
  for (auto* f : {&rank1, &rank2}) {
    Error pending = f->get();
    BOOST_TEST((pending.code() == ErrorCode::Aborted));
    BOOST_TEST(pending.peer() == 0);
    BOOST_TEST(contains(pending, "rank 0 aborted the job: the test aborts"), pending.what());
  }
  uint64_t v = 0;
  Error later = expectError([&] { job[1].send(2, 1, &v, sizeof v, Deadline::after(kPatient)); });
  BOOST_TEST((later.code() == ErrorCode::Aborted));
  BOOST_TEST(later.peer() == 0);
  Error own = expectError([&] { job[0].send(1, 1, &v, sizeof v, Deadline::after(kPatient)); });
  BOOST_TEST((own.code() == ErrorCode::Aborted));
  BOOST_TEST(contains(own, "this rank called abort(): the test aborts"), own.what());
}

BOOST_AUTO_TEST_CASE(a_connection_that_fails_the_handshake_is_refused_without_disturbing_others) {
  Job job(3);
  job.start(0);
  job.start(1);
  job.start(2, [](mesh::Options& o) { o.secret = "a wrong secret"; });
  // Strangers at rank 0's listener as well: one sends garbage, one connects and says nothing.
  auto rank0 = net::SockAddr::parseNumeric(job[0].listenAddress());
  net::Fd garbage = net::connectWithRetry({rank0}, Deadline::after(kPatient), "garbage");
  const char junk[] = "GET / HTTP/1.0\r\n\r\n";
  net::writeFull(garbage.get(), junk, sizeof junk, Deadline::after(kPatient), "garbage");
  net::Fd silent = net::connectWithRetry({rank0}, Deadline::after(kPatient), "silent");

  std::atomic<bool> refused{false};
  auto wrongSecret = errorOnThread([&] {
    uint64_t v = 2;
    try {
      job[2].send(0, 1, &v, sizeof v, Deadline::after(kPatient));
    } catch (...) {
      refused = true;
      throw;
    }
    refused = true;
  });
  auto rank1 = std::async(std::launch::async, [&] {
    while (!refused) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    uint64_t v = 1;
    job[1].send(0, 1, &v, sizeof v, Deadline::after(kPatient));
    job[1].recv(0, 2, &v, sizeof v, Deadline::after(kPatient));
    return v;
  });
  // Rank 0 drives its listener (the three connections above) while it waits for rank 1.
  uint64_t v = 0;
  job[0].recv(1, 1, &v, sizeof v, Deadline::after(kPatient));
  BOOST_TEST(v == 1u);
  v = 42;
  job[0].send(1, 2, &v, sizeof v, Deadline::after(kPatient));
  BOOST_TEST(rank1.get() == 42u);
  Error e = wrongSecret.get();
  BOOST_TEST((e.code() == ErrorCode::AuthFailed), e.what());
  BOOST_TEST(e.peer() == 0);
  BOOST_TEST(contains(e, "send to rank 0 (tag 1) failed: cannot connect to rank 0"), e.what());
}

BOOST_AUTO_TEST_CASE(collectives_at_1_2_3_and_5_ranks) {
  for (int n : {1, 2, 3, 5}) {
    for (bool star : {false, true}) {
      BOOST_TEST_CONTEXT(n << " ranks, " << (star ? "star" : "logarithmic") << " collectives") {
        Job job(n);
        job.startAll();
        for (int r = 0; r < n; ++r) job[r].setStarCollectives(star);
        std::atomic<int> finished{0};
        testing::runRanks(n, [&](int r) {
          auto& m = job[r];
          // Small (through rank 0 with the star) and large (always Bruck's) allGathers.
          for (size_t words : {size_t{1}, size_t{10000}}) {
            std::vector<uint64_t> table(words * static_cast<size_t>(n), 0);
            for (size_t w = 0; w < words; ++w) table[words * r + w] = 1000u * r + w;
            m.allGather(table.data(), words * sizeof(uint64_t));
            for (int q = 0; q < n; ++q) {
              for (size_t w = 0; w < words; ++w) {
                expectInRank(table[words * q + w] == 1000u * q + w,
                             "allGather slot " + std::to_string(q));
              }
            }
          }
          for (int root = 0; root < n; ++root) {
            std::vector<uint64_t> value(root == n - 1 ? 20000 : 1, 0);
            if (r == root) value.assign(value.size(), 0xfeed0000u + root);
            m.broadcast(value.data(), value.size() * sizeof(uint64_t), root);
            expectInRank(value == std::vector<uint64_t>(value.size(), 0xfeed0000u + root),
                         "broadcast from root " + std::to_string(root));
          }
          for (int i = 0; i < 3; ++i) m.barrier();
          ++finished;
        });
        BOOST_TEST(finished == n);
      }
    }
  }
}
