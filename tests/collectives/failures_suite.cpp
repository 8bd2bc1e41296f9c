// The collective failures suite: what users hit when a job goes wrong. Started N times by
// strata-run; Boost.Test runs the same cases in the same order in every rank. Every case makes
// its own Communicator(s) (so a broken one never leaks into the next case) and checks the error
// code, the peer it names, that no rank hangs, and that the communicator refuses later calls.
// See docs/testing.md.

#define BOOST_TEST_MODULE failures_suite
#define BOOST_TEST_NO_MAIN
#include <boost/test/unit_test.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "tests/harness/fixtures.hpp"

namespace {

const DataType kFloat = DataType::Float32;
const ReduceOp kSum = ReduceOp::Sum;

struct Outcome {
  std::optional<Error> error;
  double seconds = 0;
};

Outcome timed(const std::function<void()>& fn) {
  auto start = Clock::now();
  Outcome o;
  o.error = catchError(fn);
  o.seconds = secondsSince(start);
  return o;
}

// Destroys a communicator and reports how long that took. A broken communicator must go away
// without hanging (it may wait up to transport.timeout for buffered sends).
void destroy(std::unique_ptr<Communicator>& comm, double bound, const char* what) {
  auto start = Clock::now();
  comm.reset();
  double s = secondsSince(start);
  BOOST_TEST_MESSAGE("rank " << launchEnv().rank << ": destroying the communicator (" << what
                             << ") took " << s << " s");
  BOOST_TEST(s < bound, what << ": destroying the communicator took " << s << " s");
}

// After an error, the next call must fail at once with the same code.
void expectBroken(Communicator& comm, ErrorCode code, const char* what) {
  std::vector<float> a(16, 1.0f), b(16, 0.0f);
  auto again = timed([&] { comm.allReduce(a.data(), b.data(), a.size(), kFloat, kSum); });
  BOOST_REQUIRE_MESSAGE(again.error, what << ": a call after the error returned normally");
  BOOST_TEST_INFO_SCOPE(what << ": later call: " << describe(*again.error));
  BOOST_TEST((again.error->code() == code));
  BOOST_TEST(again.seconds < 1.0, "a later call took " << again.seconds << " s to fail");
}

// allReduce(sum) of rank + 1 on a fresh communicator: the job recovers from a failed one.
void expectWorks(Communicator& comm, const char* what) {
  const int n = comm.size();
  std::vector<float> a(1000, static_cast<float>(comm.rank() + 1)), b(1000, -1.0f);
  auto o = timed([&] { comm.allReduce(a.data(), b.data(), a.size(), kFloat, kSum); });
  BOOST_REQUIRE_MESSAGE(!o.error, what << ": " << errText(o.error));
  const float expected = static_cast<float>(n * (n + 1) / 2);
  size_t wrong = 0;
  for (float v : b) wrong += v != expected;
  BOOST_TEST(wrong == 0u, what << ": " << wrong << " wrong elements (expected " << expected << ")");
}

// A ProtocolError for a mismatched call: names another rank (peer() and the message).
void checkProtocolError(const Outcome& o, int rank, int size, const char* what) {
  BOOST_REQUIRE_MESSAGE(
      o.error, what << ": the mismatched call returned normally after " << o.seconds << " s");
  const Error& e = *o.error;
  BOOST_TEST_MESSAGE("rank " << rank << ": " << what << ": " << describe(e) << " after "
                             << o.seconds << " s");
  BOOST_TEST_INFO_SCOPE(what << ": " << describe(e) << " after " << o.seconds << " s");
  BOOST_TEST((e.code() == ErrorCode::ProtocolError));
  BOOST_TEST((e.peer() >= 0 && e.peer() < size && e.peer() != rank));
  BOOST_TEST(namesRank(e.what(), e.peer()), "the message does not name rank " << e.peer());
}

}  // namespace

// 1. Rank 0 runs allReduce, the others allGather: every rank gets ProtocolError naming both
// calls and the peer, not a timeout; the communicator then refuses every call; a new one works.
BOOST_AUTO_TEST_CASE(mismatched_ops) {
  RANK_SCOPE();
  REQUIRE_RANKS(2);
  const int me = launchEnv().rank, n = launchEnv().size;
  auto comm = makeComm({{"transport.timeout", "10"}});
  std::vector<float> send(10, 1.0f), recv(10 * n, 0.0f);
  auto o = timed([&] {
    if (me == 0) {
      comm->allReduce(send.data(), recv.data(), 10, kFloat, kSum);
    } else {
      comm->allGather(send.data(), recv.data(), 10, kFloat);
    }
  });
  checkProtocolError(o, me, n, "allReduce vs allGather");
  if (o.error) {
    std::string msg = o.error->what();
    BOOST_TEST(msg.find("allReduce") != std::string::npos, "message lacks allReduce: " << msg);
    BOOST_TEST(msg.find("allGather") != std::string::npos, "message lacks allGather: " << msg);
    BOOST_TEST(o.seconds < 10.0, "detected after " << o.seconds << " s");
  }
  expectBroken(*comm, ErrorCode::ProtocolError, "allReduce vs allGather");
  destroy(comm, 30.0, "after ProtocolError");
  auto fresh = makeComm();
  expectWorks(*fresh, "new communicator after a ProtocolError");
}

// 2. allReduce with different counts on rank 0 and the rest: one-shot (100 vs 200 floats),
// one-shot against two-shot (10000 vs 20000: 40 KB vs 80 KB straddles the 64 KiB switch), and
// both large (40000 vs 50000) with single copy (the default on one host) and through the slots.
// Every rank must throw ProtocolError well within transport.timeout, never hang. Then a
// broadcast whose root cannot notice the mismatch.
BOOST_AUTO_TEST_CASE(mismatched_counts) {
  RANK_SCOPE();
  REQUIRE_RANKS(2);
  const int me = launchEnv().rank, n = launchEnv().size;
  struct Variant {
    size_t mine, others;
    const char* singleCopy;
    const char* name;
  };
  const Variant variants[] = {{100, 200, "auto", "100 vs 200 (one-shot)"},
                              {10000, 20000, "auto", "10000 vs 20000 (one-shot vs two-shot)"},
                              {40000, 50000, "auto", "40000 vs 50000 (single copy)"},
                              {40000, 50000, "off", "40000 vs 50000 (two-shot, slots)"}};
  for (const Variant& v : variants) {
    BOOST_TEST_INFO_SCOPE(v.name);
    auto comm = makeComm({{"transport.timeout", "5"}, {"collectives.single_copy", v.singleCopy}});
    size_t count = me == 0 ? v.mine : v.others;
    std::vector<float> send(count, 1.0f), recv(count, 0.0f);
    auto o = timed([&] { comm->allReduce(send.data(), recv.data(), count, kFloat, kSum); });
    checkProtocolError(o, me, n, v.name);
    if (o.error) {
      std::string msg = o.error->what();
      BOOST_TEST(msg.find(std::to_string(v.mine)) != std::string::npos,
                 "message lacks count " << v.mine << ": " << msg);
      BOOST_TEST(msg.find(std::to_string(v.others)) != std::string::npos,
                 "message lacks count " << v.others << ": " << msg);
      BOOST_TEST(o.seconds < 5.0, "detected after " << o.seconds << " s");
    }
    expectBroken(*comm, ErrorCode::ProtocolError, v.name);
    destroy(comm, 30.0, v.name);
  }
  // broadcast of 100 floats from rank 0 while the others expect 200: the root's one chunk per
  // peer lands in their slots at once and it expects nothing back, so it may legitimately
  // return; the others must throw ProtocolError. Nobody may hang.
  {
    const char* name = "broadcast 100 vs 200 from rank 0";
    BOOST_TEST_INFO_SCOPE(name);
    auto comm = makeComm({{"transport.timeout", "5"}});
    size_t count = me == 0 ? 100 : 200;
    std::vector<float> buf(count, 1.0f);
    auto o = timed([&] { comm->broadcast(buf.data(), buf.data(), count, kFloat, 0); });
    if (me == 0) {
      BOOST_TEST_MESSAGE("rank 0: " << name << ": " << errText(o.error) << " after " << o.seconds
                                    << " s");
      BOOST_TEST(o.seconds < 8.0, "the root took " << o.seconds << " s");
    } else {
      checkProtocolError(o, me, n, name);
      expectBroken(*comm, ErrorCode::ProtocolError, name);
    }
    destroy(comm, 30.0, name);
  }
}

// 2b. Every other field of a call's signature (issue 27, item 7): rank 0 calls with one type,
// reduce op, count or root, the others with another, through the slots and through single copy.
// Every rank throws ProtocolError naming a peer and both calls, well within transport.timeout,
// and returns no data. Except a broadcast whose ranks disagree on the root: a rank that thinks
// itself the root only sends, and ranks that agree with one root take its data without waiting
// for the others, so the call may return (no rank can know without hearing from every rank,
// which a broadcast does not do); the stray data is caught by the next call, which fails on every
// rank that received it, naming the broadcast.
BOOST_AUTO_TEST_CASE(mismatched_signatures) {
  RANK_SCOPE();
  REQUIRE_RANKS(2);
  const int me = launchEnv().rank, n = launchEnv().size;
  struct Variant {
    std::string name;
    std::function<void(Communicator&, bool)> call;  ///< (comm, this rank is the odd one)
    std::vector<std::string> mention;               ///< words the error must contain
    bool rootMismatch = false;
  };
  const size_t big = 40000;  // 160 KB of floats: single copy where it is on
  std::vector<Variant> variants;
  for (size_t count : {size_t{1000}, big}) {
    const std::string at = " (" + std::to_string(count) + " elements)";
    variants.push_back({"allReduce float vs int32" + at,
                        [count](Communicator& c, bool odd) {
                          std::vector<int32_t> a(count, 1), b(count, 0);
                          c.allReduce(a.data(), b.data(), count, odd ? DataType::Int32 : kFloat,
                                      kSum);
                        },
                        {"int32", "float"}});
    variants.push_back({"allReduce max vs sum" + at,
                        [count](Communicator& c, bool odd) {
                          std::vector<float> a(count, 1.0f), b(count, 0.0f);
                          c.allReduce(a.data(), b.data(), count, kFloat,
                                      odd ? ReduceOp::Max : kSum);
                        },
                        {"max", "sum"}});
    variants.push_back({"reduceScatter count off by one" + at,
                        [count, n](Communicator& c, bool odd) {
                          const size_t k = count + (odd ? 1 : 0);
                          std::vector<float> a((count + 1) * n, 1.0f), b(count + 1, 0.0f);
                          c.reduceScatter(a.data(), b.data(), k, kFloat, kSum);
                        },
                        {std::to_string(count), std::to_string(count + 1)}});
    variants.push_back({"allGather count off by one" + at,
                        [count, n](Communicator& c, bool odd) {
                          const size_t k = count + (odd ? 1 : 0);
                          std::vector<float> a(count + 1, 1.0f), b((count + 1) * n, 0.0f);
                          c.allGather(a.data(), b.data(), k, kFloat);
                        },
                        {std::to_string(count), std::to_string(count + 1)}});
    variants.push_back({"allToAll count off by one" + at,
                        [count, n](Communicator& c, bool odd) {
                          const size_t k = count / 4 + (odd ? 1 : 0);
                          std::vector<float> a((count / 4 + 1) * n, 1.0f),
                              b((count / 4 + 1) * n, 0.0f);
                          c.allToAll(a.data(), b.data(), k, kFloat);
                        },
                        {std::to_string(count / 4), std::to_string(count / 4 + 1)}});
    // Rank 0 thinks it is the root; the others that rank 1 is: rank 0 only sends.
    variants.push_back({"broadcast root 0 vs 1" + at,
                        [count](Communicator& c, bool odd) {
                          std::vector<float> a(count, 1.0f);
                          c.broadcast(a.data(), a.data(), count, kFloat, odd ? 0 : 1);
                        },
                        {"root 0", "root 1"},
                        true});  // rootMismatch
  }
  for (const char* singleCopy : {"auto", "off"}) {
    for (const Variant& v : variants) {
      const std::string what = v.name + ", single copy " + singleCopy;
      BOOST_TEST_INFO_SCOPE(what);
      auto comm = makeComm({{"transport.timeout", "5"}, {"collectives.single_copy", singleCopy}});
      auto o = timed([&] { v.call(*comm, me == 0); });
      if (v.rootMismatch && !o.error) {
        BOOST_TEST_MESSAGE("rank " << me << ": " << what << ": returned after " << o.seconds
                                   << " s");
        // The next call: every rank fails (or finds the communicator broken), none hangs; a rank
        // that received stray broadcast data names it.
        std::vector<float> a(16, 1.0f), b(16, 0.0f);
        auto next = timed([&] { comm->allReduce(a.data(), b.data(), 16, kFloat, kSum); });
        BOOST_TEST_MESSAGE("rank " << me << ": the call after it: " << errText(next.error)
                                   << " after " << next.seconds << " s");
        BOOST_TEST(next.error.has_value(), what << ": the call after it returned normally");
        BOOST_TEST(next.seconds < 15.0, what << ": the call after it took " << next.seconds);
        if (next.error && me != 1) {
          BOOST_TEST((next.error->code() == ErrorCode::ProtocolError), errText(next.error));
          BOOST_TEST(std::string(next.error->what()).find("broadcast") != std::string::npos,
                     "the error does not name the broadcast: " << next.error->what());
        }
      } else {
        checkProtocolError(o, me, n, what.c_str());
        if (o.error) {
          const std::string msg = o.error->what();
          for (const std::string& word : v.mention) {
            BOOST_TEST(msg.find(word) != std::string::npos,
                       "the message lacks \"" << word << "\": " << msg);
          }
          BOOST_TEST(o.seconds < 5.0, "detected after " << o.seconds << " s");
        }
      }
      destroy(comm, 30.0, what.c_str());
    }
  }
}

// 3. The last rank never calls allReduce (it waits in a bootstrap barrier): the others throw
// Timeout after transport.timeout (2 s), naming the last rank; then everyone meets at the barrier.
BOOST_AUTO_TEST_CASE(missing_rank) {
  RANK_SCOPE();
  REQUIRE_RANKS(2);
  const int me = launchEnv().rank, n = launchEnv().size;
  const int missing = n - 1;
  // Small (one-shot through the slots) and large (single copy on one host).
  for (size_t count : {size_t{1000}, size_t{1} << 18}) {
    BOOST_TEST_INFO_SCOPE("allReduce of " << count << " floats");
    auto comm = makeComm({{"transport.timeout", "2"}});
    if (me != missing) {
      std::vector<float> send(count, 1.0f), recv(count, 0.0f);
      auto o = timed([&] { comm->allReduce(send.data(), recv.data(), count, kFloat, kSum); });
      BOOST_REQUIRE_MESSAGE(o.error, "allReduce without rank " << missing << " returned normally");
      const Error& e = *o.error;
      BOOST_TEST_MESSAGE("rank " << me << ": " << describe(e) << " after " << o.seconds << " s");
      BOOST_TEST_INFO_SCOPE(describe(e) << " after " << o.seconds << " s");
      BOOST_TEST((e.code() == ErrorCode::Timeout));
      BOOST_TEST(o.seconds >= 2.0, "Timeout after " << o.seconds << " s, before 2 s");
      BOOST_TEST(o.seconds < 10.0, "Timeout after " << o.seconds << " s");
      BOOST_TEST(e.peer() == missing, "names rank " << e.peer() << ", not the missing one");
      BOOST_TEST(namesRank(e.what(), missing), "the message does not name rank " << missing);
      expectBroken(*comm, ErrorCode::Timeout, "missing rank");
    }
    auto b = timed([&] { comm->bootstrap().barrier(); });
    BOOST_TEST(!b.error, "barrier: " << errText(b.error));
    destroy(comm, 30.0, "after Timeout");
  }
}

namespace {

// 4. The last rank's stand-in (a forked child, as in the transport suite's peer_lost: it makes
// its own bootstrap from the launcher's environment) joins a communicator and dies by SIGKILL
// after 5 of 1000 allReduces. The survivors must get PeerLost naming it from the peer check
// well before transport.timeout (30 s), and then fail every call at once.
void peerKilled(size_t bytes) {
  const auto& env = launchEnv();
  const int victim = env.size - 1;  // never rank 0, which may serve the rendezvous
  const size_t count = bytes / sizeof(float);
  const int kIterations = 1000, kDieAfter = 5;
  const std::pair<const char*, const char*> timeout{"transport.timeout", "30"};
  if (env.rank == victim) {
    std::fflush(nullptr);
    pid_t child = fork();
    BOOST_REQUIRE_MESSAGE(child >= 0, "fork failed: " << std::strerror(errno));
    if (child == 0) {
      try {
        auto comm = makeComm({timeout});
        std::vector<float> send(count, 1.0f), recv(count, 0.0f);
        for (int i = 0; i < kDieAfter; ++i) {
          comm->allReduce(send.data(), recv.data(), count, kFloat, kSum);
        }
        raise(SIGKILL);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "peer_killed child (rank %d): %s\n", victim, e.what());
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
  auto comm = makeComm({timeout});
  std::vector<float> send(count, 1.0f), recv(count, 0.0f);
  std::optional<Error> err;
  double failedCall = 0;
  int done = 0;
  for (; done < kIterations; ++done) {
    auto o = timed([&] { comm->allReduce(send.data(), recv.data(), count, kFloat, kSum); });
    if (o.error) {
      err = o.error;
      failedCall = o.seconds;
      break;
    }
  }
  BOOST_REQUIRE_MESSAGE(err, "all " << kIterations << " allReduces succeeded without the victim");
  BOOST_TEST_MESSAGE("rank " << env.rank << ": " << describe(*err) << " in call " << done
                             << " after " << failedCall << " s");
  BOOST_TEST_INFO_SCOPE(describe(*err) << " in call " << done << " after " << failedCall << " s");
  BOOST_TEST(done >= kDieAfter, "failed in call " << done << ", before the victim died");
  BOOST_TEST((err->code() == ErrorCode::PeerLost));
  BOOST_TEST(err->peer() == victim);
  BOOST_TEST(namesRank(err->what(), victim), "the message does not name rank " << victim);
  BOOST_TEST(failedCall < 10.0, "PeerLost took " << failedCall << " s");
  expectBroken(*comm, ErrorCode::PeerLost, "after PeerLost");
  destroy(comm, 30.0, "after PeerLost");
}

}  // namespace

BOOST_AUTO_TEST_CASE(peer_killed_small) {
  RANK_SCOPE();
  REQUIRE_RANKS(2);
  peerKilled(8 * 1024);
}

BOOST_AUTO_TEST_CASE(peer_killed_large) {
  RANK_SCOPE();
  REQUIRE_RANKS(2);
  peerKilled(1024 * 1024);
}

// 4b. The last rank's stand-in (a forked child) runs three allReduces (one-shot and single
// copy), destroys its communicator and exits at once. That is no error for calls that do not
// need it: ranks 0 and 1 exchange 65537 doubles afterwards (N >= 3). A later allReduce needs it
// and fails with PeerLost naming it and the call, long before transport.timeout.
BOOST_AUTO_TEST_CASE(finished_peer_exits) {
  RANK_SCOPE();
  REQUIRE_RANKS(2);
  const auto& env = launchEnv();
  const int victim = env.size - 1;  // never rank 0, which may serve the rendezvous
  const std::pair<const char*, const char*> timeout{"transport.timeout", "30"};
  auto threeAllReduces = [](Communicator& comm) {
    for (size_t count : {size_t{100}, size_t{1} << 18, size_t{1000}}) {
      std::vector<float> send(count, 1.0f), recv(count, 0.0f);
      comm.allReduce(send.data(), recv.data(), count, kFloat, kSum);
    }
  };
  if (env.rank == victim) {
    std::fflush(nullptr);
    pid_t child = fork();
    BOOST_REQUIRE_MESSAGE(child >= 0, "fork failed: " << std::strerror(errno));
    if (child == 0) {
      int code = 0;
      try {
        auto comm = makeComm({timeout});
        threeAllReduces(*comm);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "finished_peer_exits child (rank %d): %s\n", victim, e.what());
        code = 3;
      }
      _exit(code);
    }
    int status = 0;
    while (waitpid(child, &status, 0) < 0 && errno == EINTR) {
    }
    BOOST_TEST((WIFEXITED(status) && WEXITSTATUS(status) == 0),
               "the finished child did not exit 0 (status " << status << ")");
    return;
  }
  auto comm = makeComm({timeout});
  auto o = timed([&] { threeAllReduces(*comm); });
  BOOST_REQUIRE_MESSAGE(!o.error, "allReduce: " << errText(o.error));
  // Long enough for the child to destroy its communicator and exit.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  if (env.size >= 3 && env.rank < 2) {
    const size_t count = 65537;
    std::vector<double> out(count, env.rank + 1.0), in(count, 0.0);
    const int partner = 1 - env.rank;
    auto p = timed([&] {
      comm->send(out.data(), count, DataType::Float64, partner);
      comm->recv(in.data(), count, DataType::Float64, partner);
    });
    BOOST_REQUIRE_MESSAGE(!p.error,
                          "send/recv after rank " << victim << " exited: " << errText(p.error));
    size_t wrong = 0;
    for (double v : in) wrong += v != partner + 1.0;
    BOOST_TEST(wrong == 0u);
  }
  std::vector<float> send(1000, 1.0f), recv(1000, 0.0f);
  auto a = timed([&] { comm->allReduce(send.data(), recv.data(), send.size(), kFloat, kSum); });
  BOOST_REQUIRE_MESSAGE(a.error, "allReduce without rank " << victim << " returned normally");
  BOOST_TEST_MESSAGE("rank " << env.rank << ": " << describe(*a.error) << " after " << a.seconds
                             << " s");
  BOOST_TEST_INFO_SCOPE(describe(*a.error) << " after " << a.seconds << " s");
  BOOST_TEST((a.error->code() == ErrorCode::PeerLost));
  BOOST_TEST(a.error->peer() == victim);
  BOOST_TEST(namesRank(a.error->what(), victim), "the message does not name rank " << victim);
  BOOST_TEST(std::string(a.error->what()).find("allReduce(count 1000") != std::string::npos,
             "the message does not name the call");
  BOOST_TEST(a.seconds < 10.0, "PeerLost took " << a.seconds << " s");
  expectBroken(*comm, ErrorCode::PeerLost, "after PeerLost");
  destroy(comm, 30.0, "after PeerLost");
}

// 5. Rank 0 sends 16 MiB to rank 1 and destroys its communicator at once; rank 1 receives
// 200 ms later and must get all of it: the destructor delivers buffered sends.
BOOST_AUTO_TEST_CASE(send_then_exit) {
  RANK_SCOPE();
  REQUIRE_RANKS(2);
  const int me = launchEnv().rank;
  const size_t bytes = size_t{16} << 20;
  const uint64_t seed = 0x5E9D;
  auto comm = makeComm();
  if (me == 0) {
    {
      std::vector<uint8_t> data(bytes);
      fillPattern(data.data(), bytes, seed);
      auto o = timed([&] { comm->send(data.data(), bytes, DataType::Uint8, 1); });
      BOOST_REQUIRE_MESSAGE(!o.error, "send: " << errText(o.error));
      BOOST_TEST_MESSAGE("rank 0: send of 16 MiB returned after " << o.seconds << " s");
    }  // the caller's buffer is gone: what was not delivered yet must have been copied
    destroy(comm, 30.0, "right after send");
  } else if (me == 1) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    std::vector<uint8_t> data(bytes, 0);
    auto o = timed([&] { comm->recv(data.data(), bytes, DataType::Uint8, 0); });
    BOOST_REQUIRE_MESSAGE(!o.error, "recv: " << errText(o.error));
    size_t bad = checkPattern(data.data(), bytes, seed);
    BOOST_TEST(bad == bytes, "received data differs from byte " << bad);
    destroy(comm, 30.0, "after recv");
  } else {
    destroy(comm, 30.0, "not in the pair");
  }
}

// 6. A ProtocolError in an allGather whose send buffer is freed right after (the vector goes
// out of scope), then the communicator is destroyed: nothing may read the freed buffer (run
// under ASan too). Through the slots (single copy off), 16 MiB per rank, so that most chunks
// are still queued when the error strikes. At N >= 3 rank 1 joins 300 ms late with the same
// call as rank 0, so it takes (and acknowledges) some of rank 0's chunks after rank 0 threw
// and freed its buffer: a destructor that kept delivering rank 0's queued chunks would then
// read freed memory. The last rank calls with half the count, which is what everyone trips on.
BOOST_AUTO_TEST_CASE(abandon_after_error) {
  RANK_SCOPE();
  REQUIRE_RANKS(2);
  const int me = launchEnv().rank, n = launchEnv().size;
  const size_t count = size_t{4} << 20;  // floats: 16 MiB
  auto comm = makeComm({{"transport.timeout", "2"}, {"collectives.single_copy", "off"}});
  {
    size_t mine = me == n - 1 ? count / 2 : count;
    auto send = std::make_unique<std::vector<float>>(mine, static_cast<float>(me));
    auto recv = std::make_unique<std::vector<float>>(mine * n, 0.0f);
    if (n >= 3 && me == 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    auto o = timed([&] { comm->allGather(send->data(), recv->data(), mine, kFloat); });
    checkProtocolError(o, me, n, "allGather 4 Mi vs 2 Mi floats");
    // Scribble, then free both buffers: a later read of them sees garbage (or faults, or ASan
    // reports a heap-use-after-free).
    std::fill(send->begin(), send->end(), -7.0f);
    send.reset();
    recv.reset();
  }
  if (n >= 3 && me == 0) {
    // Give the late rank time to take rank 0's chunks before the destructor gives up.
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  expectBroken(*comm, ErrorCode::ProtocolError, "abandoned");
  destroy(comm, 30.0, "after abandoning buffers");
  auto fresh = makeComm();
  expectWorks(*fresh, "new communicator after abandoned buffers");
}

// 7. Ranks share a bootstrap made from one config, but the last rank gives
// Communicator::create another collectives.buffer_bytes (then collectives.chunk_bytes). Its
// slots are then cut differently, and a sender sizes its writes into a peer's slots from its
// own geometry (issue 23: a 4 MiB all_reduce killed the rank with the larger buffer). Nothing
// before the engine checks a Config given to create, so the engine must: every rank gets
// InvalidConfig at create naming the key, both ranks and both values, at once, and the
// bootstrap stays usable for a communicator whose ranks agree.
BOOST_AUTO_TEST_CASE(mismatched_slot_geometry) {
  RANK_SCOPE();
  REQUIRE_RANKS(2);
  const int me = launchEnv().rank;
  const int odd = launchEnv().size - 1;
  struct Variant {
    const char* key;
    const char* oddValue;
  };
  const Variant variants[] = {{"collectives.buffer_bytes", "1048576"},
                              {"collectives.chunk_bytes", "65536"}};
  std::shared_ptr<strata::Bootstrap> bootstrap = strata::Bootstrap::create(Config::load());
  for (const Variant& v : variants) {
    BOOST_TEST_INFO_SCOPE(v.key << " = " << v.oddValue << " on rank " << odd);
    Config config = Config::load();
    config.set("transport.timeout", "10");
    const std::string usual = config.get(v.key).value_or("");
    if (me == odd) config.set(v.key, v.oddValue);
    auto o = timed([&] { Communicator::create(bootstrap, config); });
    BOOST_REQUIRE_MESSAGE(o.error, "Communicator::create returned normally");
    const Error& e = *o.error;
    const std::string msg = e.what();
    BOOST_TEST_MESSAGE("rank " << me << ": " << describe(e) << " after " << o.seconds << " s");
    BOOST_TEST_INFO_SCOPE(describe(e));
    BOOST_TEST((e.code() == ErrorCode::InvalidConfig));
    BOOST_TEST(msg.find(v.key) != std::string::npos, "the message does not name the key");
    BOOST_TEST(namesRank(msg, 0), "the message does not name rank 0");
    BOOST_TEST(namesRank(msg, odd), "the message does not name rank " << odd);
    BOOST_TEST(msg.find(usual) != std::string::npos, "the message lacks " << usual);
    BOOST_TEST(msg.find(v.oddValue) != std::string::npos, "the message lacks " << v.oddValue);
    BOOST_TEST(o.seconds < 10.0, "refused after " << o.seconds << " s");
  }
  auto comm = Communicator::create(bootstrap, Config::load());
  expectWorks(*comm, "a communicator of agreeing ranks on the same bootstrap");
}

int main(int argc, char** argv) {
  return strata::testing::multiProcessMain(
      argc, argv, "failures_suite: needs a launcher (strata-run -n N, srun, mpirun)",
      [] { return true; });
}
