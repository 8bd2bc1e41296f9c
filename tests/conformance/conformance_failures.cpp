// Bootstrap conformance, cases 7-10: timeouts, a killed peer, a peer whose own call failed,
// abort, create/destroy cycles. Part of the suite in bootstrap_conformance.cpp.

#include <boost/test/unit_test.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <thread>

#include "tests/conformance/conformance.hpp"

using namespace conformance;
using namespace std::chrono_literals;

// 7. timeout bounds: a 1 s timeout fires between 1 s and 5 s and names the call and the peer.
BOOST_AUTO_TEST_CASE(timeout_bounds) {
  RANK_SCOPE();
  {
    // All ranks leave this barrier together, so the 1 s rendezvous below is not eaten up by
    // ranks still finishing the previous case.
    auto sync = Bootstrap::create(Config::load());
    REQUIRE_RANKS(2);
    sync->barrier();
  }
  Config cfg = Config::load();
  cfg.set("bootstrap.timeout", "1");
  auto bs = Bootstrap::create(cfg);
  if (bs->rank() == 0) {
    uint64_t value = 0;
    auto start = Clock::now();
    auto error = catchError([&] { bs->recv(1, 7777, &value, sizeof(value)); });
    double elapsed = secondsSince(start);
    BOOST_REQUIRE_MESSAGE(error, "recv on a tag nobody sends returned after " << elapsed << " s");
    BOOST_TEST_INFO_SCOPE(describe(*error));
    BOOST_TEST((error->code() == ErrorCode::Timeout));
    BOOST_TEST(error->peer() == 1);
    BOOST_TEST(elapsed >= 1.0, "timeout fired after " << elapsed << " s");
    BOOST_TEST(elapsed <= 5.0, "timeout fired after " << elapsed << " s");
    std::string what = error->what();
    BOOST_TEST(what.find("recv") != std::string::npos, "message does not name the operation");
    BOOST_TEST(namesRank(what, 1), "message does not name rank 1");
    BOOST_TEST_MESSAGE("rank 0: 1 s timeout fired after " << elapsed << " s");
  } else {
    std::this_thread::sleep_for(6s);
  }
}

// 8. peer killed: a rank that dies with open connections gives PeerLost well before the timeout.
BOOST_AUTO_TEST_CASE(peer_killed) {
  RANK_SCOPE();
  REQUIRE_RANKS(2);
  const auto& env = launchEnv();
  const int victim = env.size - 1;  // never rank 0, which may serve the rendezvous
  constexpr int kTag = 800, kUnusedTag = 801, kAckTag = 802;
  Config cfg = Config::load();
  cfg.set("bootstrap.timeout", "30");
  if (Bootstrap::create(cfg)->backend() == "pmix") {
    // The victim is a forked child, which cannot act as a PMIx rank (it would share its
    // parent's PMIx connection), and under a PMIx server a rank that dies without
    // PMIx_Finalize ends the whole job (Slurm cancels the step), so PeerLost is not observable.
    BOOST_TEST_MESSAGE(
        "skipped: pmix (a PMIx client cannot fork a stand-in rank, and a dead "
        "rank ends the job)");
    return;
  }

  if (env.rank == victim) {
    std::fflush(nullptr);  // the child must not repeat buffered output
    pid_t child = fork();
    BOOST_REQUIRE_MESSAGE(child >= 0, "fork failed: " << std::strerror(errno));
    if (child == 0) {
      // The child is rank `victim`. It never returns into Boost.Test: it either kills itself as
      // planned or reports and exits 3, which the parent turns into a failure.
      try {
        auto bs = Bootstrap::create(cfg);
        for (int p = 0; p < bs->size(); ++p) {
          if (p == victim) continue;
          int32_t me = victim;
          bs->send(p, kTag, &me, sizeof(me));
        }
        for (int p = 0; p < bs->size(); ++p) {
          if (p == victim) continue;
          int32_t value = -1;
          bs->recv(p, kTag, &value, sizeof(value));
          if (value != p) {
            std::fprintf(stderr, "peer_killed child: rank %d sent %d\n", p, value);
            _exit(3);
          }
        }
        // Every peer has its message before the victim dies (a UCX send may complete before
        // its bytes leave the process, and a killed process loses them).
        for (int p = 0; p < bs->size(); ++p) {
          if (p == victim) continue;
          int32_t ack = -1;
          bs->recv(p, kAckTag, &ack, sizeof(ack));
        }
        raise(SIGKILL);
      } catch (const Error& error) {
        std::fprintf(stderr, "peer_killed child (rank %d): %s\n", victim, describe(error).c_str());
      } catch (const std::exception& error) {
        std::fprintf(stderr, "peer_killed child (rank %d): %s\n", victim, error.what());
      } catch (...) {
      }
      _exit(3);
    }
    int status = 0;
    while (waitpid(child, &status, 0) < 0 && errno == EINTR) {
    }
    BOOST_TEST((WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL),
               "the victim child did not die by SIGKILL (status " << status << "): see its stderr");
    return;
  }

  auto bs = Bootstrap::create(cfg);
  int32_t me = bs->rank();
  bs->send(victim, kTag, &me, sizeof(me));
  int32_t value = -1;
  bs->recv(victim, kTag, &value, sizeof(value));
  BOOST_TEST(value == victim);
  bs->send(victim, kAckTag, &me, sizeof(me));

  auto start = Clock::now();
  auto error = catchError([&] { bs->recv(victim, kUnusedTag, &value, sizeof(value)); });
  double elapsed = secondsSince(start);
  BOOST_REQUIRE_MESSAGE(error, "recv from the killed rank returned normally");
  BOOST_TEST_INFO_SCOPE(describe(*error));
  BOOST_TEST((error->code() == ErrorCode::PeerLost));
  BOOST_TEST(error->peer() == victim);
  BOOST_TEST(elapsed < 5.0, "PeerLost took " << elapsed << " s");
}

// 8b. a rank whose own call failed says why when it leaves: rank 1 times out waiting for rank 2
// and destroys its bootstrap; rank 0, waiting for rank 1, must learn that rank 1 failed and on
// what (rank 2), not that it "finished" (found by tests/stress/net_faults.sh down-allgather:
// a rank of the healthy host named its neighbour, which had timed out on the broken link).
BOOST_AUTO_TEST_CASE(failed_peer_says_why) {
  RANK_SCOPE();
  {
    auto sync = Bootstrap::create(Config::load());
    REQUIRE_RANKS(2);
    if (sync->size() < 3 || sync->backend() != "tcp") {
      BOOST_TEST_MESSAGE("skipped: needs 3 ranks and the tcp backend (its peer mesh)");
      return;
    }
    sync->barrier();
  }
  constexpr int kSilentTag = 850, kDoneTag = 851;
  Config cfg = Config::load();
  cfg.set("bootstrap.timeout", "10");
  if (launchEnv().rank == 1) {
    Config quick = Config::load();
    quick.set("bootstrap.timeout", "2");
    auto bs = Bootstrap::create(quick);
    uint64_t value = 0;
    auto error = catchError([&] { bs->recv(2, kSilentTag, &value, sizeof(value)); });
    BOOST_TEST((error && error->code() == ErrorCode::Timeout));
    return;  // destroys the bootstrap: its goodbye carries the timeout
  }
  auto bs = Bootstrap::create(cfg);
  if (bs->rank() == 0) {
    uint64_t value = 0;
    auto start = Clock::now();
    auto error = catchError([&] { bs->recv(1, kSilentTag, &value, sizeof(value)); });
    double elapsed = secondsSince(start);
    BOOST_REQUIRE_MESSAGE(error, "recv from rank 1 returned normally");
    BOOST_TEST_INFO_SCOPE(describe(*error));
    BOOST_TEST((error->code() == ErrorCode::PeerLost));
    BOOST_TEST(error->peer() == 1);
    std::string what = error->what();
    BOOST_TEST(what.find("after a call of its own failed") != std::string::npos);
    BOOST_TEST(namesRank(what, 2), "the message does not name rank 2, behind rank 1's failure");
    BOOST_TEST(elapsed < 8.0, "PeerLost took " << elapsed << " s");
    for (int p = 2; p < bs->size(); ++p) bs->send(p, kDoneTag, &value, sizeof(value));
  } else {
    // Rank 2 stays silent (and present) until rank 0 has its answer.
    uint64_t value = 0;
    bs->recv(0, kDoneTag, &value, sizeof(value));
  }
}

// 9. abort: pending and later calls on the other ranks throw Aborted with origin and reason.
BOOST_AUTO_TEST_CASE(abort_propagates) {
  RANK_SCOPE();
  auto bs = Bootstrap::create(Config::load());
  REQUIRE_RANKS(2);
  if (bs->backend() == "pmix" && std::getenv("STRATA_TEST_PMIX_ABORT") == nullptr) {
    // pmix's abort() also calls PMIx_Abort, which ends the whole job: the launcher kills the
    // other ranks instead of letting them see Aborted. A separate meson test
    // (slurm-pmix-abort-n2, with STRATA_TEST_PMIX_ABORT=1) checks that the job ends promptly.
    BOOST_TEST_MESSAGE("skipped: pmix (PMIx_Abort ends the job)");
    return;
  }
  bs->barrier();  // everybody is connected before rank 1 aborts
  constexpr int kTag = 900;
  const std::string reason = "conformance abort test";
  if (bs->rank() == 1) {
    std::this_thread::sleep_for(300ms);
    bs->abort(reason);
    return;  // the aborting rank leaves at once, as a real one would
  }
  auto check = [&](const std::optional<Error>& error, const char* what) {
    BOOST_REQUIRE_MESSAGE(error, what << " returned normally after rank 1 aborted");
    BOOST_TEST_INFO_SCOPE(what << ": " << describe(*error));
    BOOST_TEST((error->code() == ErrorCode::Aborted));
    BOOST_TEST(error->peer() == 1);
    BOOST_TEST(std::string(error->what()).find(reason) != std::string::npos,
               "message lacks the reason");
  };
  uint64_t value = 0;
  check(catchError([&] { bs->recv(1, kTag, &value, sizeof(value)); }), "pending recv(1)");
  check(catchError([&] { bs->recv(1, kTag, &value, sizeof(value)); }), "later recv(1)");
}

// 10. create/destroy cycles leak no descriptors and no listening sockets.
BOOST_AUTO_TEST_CASE(create_destroy_cycles) {
  RANK_SCOPE();
  const auto& env = launchEnv();
  // 200 cycles at every N (64 ranks on 2 cores take about a minute).
  const int cycles = 200;
  Config cfg = Config::load();
  {
    auto warm = Bootstrap::create(cfg);  // one-time lazy initialisation is not a leak
    warm->barrier();
  }
  const size_t fdsBefore = strata::testing::countOpenFds();
  const auto listenBefore = strata::testing::listeningSocketInodes();
  for (int i = 0; i < cycles; ++i) {
    auto bs = Bootstrap::create(cfg);
    bs->barrier();
  }
  const size_t fdsAfter = strata::testing::countOpenFds();
  const auto listenAfter = strata::testing::listeningSocketInodes();
  BOOST_TEST(fdsAfter == fdsBefore, "open fds went from " << fdsBefore << " to " << fdsAfter
                                                          << " over " << cycles << " cycles");
  BOOST_TEST(listenAfter.size() == listenBefore.size(),
             "listening sockets went from " << listenBefore.size() << " to " << listenAfter.size());
  BOOST_TEST_MESSAGE("rank " << env.rank << ": " << cycles << " cycles, " << fdsAfter << " fds");
}
