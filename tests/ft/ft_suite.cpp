// The fault-tolerance suite (docs/fault-tolerance.md): revoke, and shrink after ranks die, stop or
// leave during the shrink itself. Started N times by `strata-run --keep-going` (a rank killed by a
// signal does not end the job); each meson test runs one case (--run_test), because the victims of
// a case die in it. Every survivor checks the error it got, the new communicator's size and its
// rank in it, and runs checked collectives on it. Timings are printed, never asserted beyond
// bounds that only a hang would miss.

#define BOOST_TEST_MODULE ft_suite
#define BOOST_TEST_NO_MAIN
#include <boost/test/unit_test.hpp>

#include <signal.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "tests/harness/fixtures.hpp"

namespace {

const DataType kFloat = DataType::Float32;
const ReduceOp kSum = ReduceOp::Sum;

double nowSeconds() {
  return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
}

/// The job's seed: STRATA_FT_SEED, else rank 0's clock, told to every rank over `boot`.
uint64_t jobSeed(Bootstrap& boot) {
  std::vector<uint64_t> all(static_cast<size_t>(boot.size()), 0);
  if (const char* s = std::getenv("STRATA_FT_SEED")) {
    all[boot.rank()] = std::strtoull(s, nullptr, 10);
  } else {
    all[boot.rank()] = static_cast<uint64_t>(Clock::now().time_since_epoch().count());
  }
  boot.allGather(all.data(), sizeof(uint64_t));
  return all[0];
}

/// One collective of a random mix (the same on every rank for one rng state), checked against
/// the values every rank contributes. Throws the strata::Error of the call.
void randomCall(Communicator& comm, std::mt19937_64& rng, int iteration) {
  const int n = comm.size(), me = comm.rank();
  const size_t count = 1 + rng() % 5000;
  const int kind = static_cast<int>(rng() % 5);
  const int root = static_cast<int>(rng() % static_cast<uint64_t>(n));
  auto value = [&](int rank, size_t i) {
    return static_cast<float>((rank + 1) * 3 + static_cast<int>(i % 7) + iteration % 5);
  };
  std::vector<float> send, recv;
  size_t wrong = 0;
  switch (kind) {
    case 0: {  // allReduce
      send.resize(count);
      recv.assign(count, -1);
      for (size_t i = 0; i < count; ++i) send[i] = value(me, i);
      comm.allReduce(send.data(), recv.data(), count, kFloat, kSum);
      for (size_t i = 0; i < count; ++i) {
        float want = 0;
        for (int r = 0; r < n; ++r) want += value(r, i);
        wrong += recv[i] != want;
      }
      break;
    }
    case 1: {  // allGather
      send.resize(count);
      recv.assign(count * n, -1);
      for (size_t i = 0; i < count; ++i) send[i] = value(me, i);
      comm.allGather(send.data(), recv.data(), count, kFloat);
      for (int r = 0; r < n; ++r) {
        for (size_t i = 0; i < count; ++i) wrong += recv[r * count + i] != value(r, i);
      }
      break;
    }
    case 2: {  // reduceScatter
      send.resize(count * n);
      recv.assign(count, -1);
      for (size_t i = 0; i < send.size(); ++i) send[i] = value(me, i);
      comm.reduceScatter(send.data(), recv.data(), count, kFloat, kSum);
      for (size_t i = 0; i < count; ++i) {
        float want = 0;
        for (int r = 0; r < n; ++r) want += value(r, me * count + i);
        wrong += recv[i] != want;
      }
      break;
    }
    case 3: {  // broadcast
      send.resize(count);
      recv.assign(count, -1);
      for (size_t i = 0; i < count; ++i) send[i] = value(me, i);
      comm.broadcast(send.data(), recv.data(), count, kFloat, root);
      for (size_t i = 0; i < count; ++i) wrong += recv[i] != value(root, i);
      break;
    }
    default: {  // allToAll
      send.resize(count * n);
      recv.assign(count * n, -1);
      for (int r = 0; r < n; ++r) {
        for (size_t i = 0; i < count; ++i) send[r * count + i] = value(me, r * 1000 + i);
      }
      comm.allToAll(send.data(), recv.data(), count, kFloat);
      for (int r = 0; r < n; ++r) {
        for (size_t i = 0; i < count; ++i) {
          wrong += recv[r * count + i] != value(r, me * 1000 + i);
        }
      }
      break;
    }
  }
  BOOST_TEST(wrong == 0u, "call " << iteration << " (kind " << kind << ", count " << count
                                  << ") on " << n << " ranks: " << wrong << " wrong elements");
}

/// `calls` checked collectives of the random mix; every rank must use the same rng state.
void runChecked(Communicator& comm, std::mt19937_64& rng, int calls, const char* what) {
  for (int i = 0; i < calls; ++i) {
    auto e = catchError([&] { randomCall(comm, rng, i); });
    BOOST_REQUIRE_MESSAGE(!e, what << ": call " << i << " failed: " << errText(e));
  }
}

/// The error a survivor got for a loss: PeerLost or a diagnosed Timeout of its own, or Aborted
/// from another survivor's revoke; whichever, its text names one of `lost`.
void checkLossError(const Error& e, const std::set<int>& lost, const char* what) {
  BOOST_TEST_MESSAGE("rank " << launchEnv().rank << ": " << what << ": " << describe(e));
  BOOST_TEST_INFO_SCOPE(what << ": " << describe(e));
  BOOST_TEST((e.code() == ErrorCode::PeerLost || e.code() == ErrorCode::Aborted ||
              e.code() == ErrorCode::Timeout));
  bool named = false;
  for (int r : lost) named = named || namesRank(e.what(), r);
  BOOST_TEST(named, "the error names none of the lost ranks");
}

/// Runs the random mix until a call fails (a victim died); returns that error.
Error untilFailure(Communicator& comm, std::mt19937_64& rng, int limit, int first = 0) {
  for (int i = first; i < limit; ++i) {
    auto e = catchError([&] { randomCall(comm, rng, i); });
    if (e) return *e;
  }
  BOOST_FAIL("no call failed in " << limit << " calls although a rank died");
  throw std::logic_error("unreachable");
}

/// `calls` calls of the random mix, after which this rank dies when `dies`; a survivor then runs
/// on until a call fails and returns that error. A survivor may already fail in one of the first
/// `calls`: a call that returned on the victim has not necessarily delivered its last pieces (a
/// fabric send completes once the provider took it; the victim's death can still drop it), so
/// the victim's last call can fail on a survivor (or on another victim, which then dies at once).
/// `seconds`: from the end of the first `calls` to the failure (0 when it came among them).
Error lossAfter(Communicator& comm, std::mt19937_64& rng, int calls, bool dies,
                double* seconds = nullptr) {
  if (seconds) *seconds = 0;
  for (int i = 0; i < calls; ++i) {
    auto e = catchError([&] { randomCall(comm, rng, i); });
    if (e && dies) raise(SIGKILL);  // another victim went first
    if (e) return *e;
  }
  if (dies) raise(SIGKILL);
  const auto start = Clock::now();
  Error e = untilFailure(comm, rng, 1000 + calls, calls);
  if (seconds) *seconds = secondsSince(start);
  return e;
}

/// Shrinks and checks the new communicator: its size, and that this rank keeps its relative
/// order among the survivors of `comm` (its new rank is the number of survivors below it).
std::unique_ptr<Communicator> shrinkChecked(Communicator& comm, const std::set<int>& gone,
                                            double* seconds = nullptr) {
  const auto start = Clock::now();
  std::unique_ptr<Communicator> next;
  auto e = catchError([&] { next = comm.shrink(); });
  const double s = secondsSince(start);
  if (seconds) *seconds = s;
  BOOST_REQUIRE_MESSAGE(!e, "shrink failed after " << s << " s: " << errText(e));
  int below = 0;
  for (int r = 0; r < comm.rank(); ++r) below += !gone.count(r);
  BOOST_TEST(next->size() == comm.size() - static_cast<int>(gone.size()));
  BOOST_TEST(next->rank() == below);
  BOOST_TEST_MESSAGE("rank " << comm.rank() << " -> rank " << next->rank() << " of " << next->size()
                             << ": shrink took " << s << " s");
  return next;
}

}  // namespace

// Rank n-1 revokes while the others are in allReduce loops (rank 1 in no call at first): every
// call fails with Aborted naming rank n-1 and its reason, then shrink() without a loss gives a
// communicator of every rank. Prints each rank's time from the revoke to its error.
BOOST_AUTO_TEST_CASE(revoke_reaches_every_rank) {
  RANK_SCOPE();
  REQUIRE_RANKS(2);
  auto comm = makeComm();
  const int n = comm->size(), me = comm->rank(), revoker = n - 1;
  const std::string reason = "the test revokes";
  std::vector<double> stamps(static_cast<size_t>(n), 0);
  comm->bootstrap().barrier();
  std::optional<Error> err;
  if (me == revoker) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    stamps[me] = nowSeconds();
    comm->revoke(reason);
    err = catchError([&] {
      std::vector<float> a(16, 1.0f);
      comm->allReduce(a.data(), a.data(), a.size(), kFloat, kSum);
    });
  } else {
    if (me == 1 && n > 2) std::this_thread::sleep_for(std::chrono::milliseconds(800));
    std::vector<float> a(1000, 1.0f), b(1000);
    for (int i = 0; i < 1000000 && !err; ++i) {
      err = catchError([&] { comm->allReduce(a.data(), b.data(), a.size(), kFloat, kSum); });
    }
    stamps[me] = nowSeconds();
  }
  BOOST_REQUIRE_MESSAGE(err, "no call failed after the revoke");
  BOOST_TEST_INFO_SCOPE(describe(*err));
  BOOST_TEST((err->code() == ErrorCode::Aborted));
  BOOST_TEST(err->peer() == revoker);
  BOOST_TEST(namesRank(err->what(), revoker));
  BOOST_TEST(std::string(err->what()).find(reason) != std::string::npos);
  BOOST_TEST(comm->revoked().has_value());
  // The bootstrap is not revoked: the ranks compare their times over it.
  comm->bootstrap().allGather(stamps.data(), sizeof(double));
  if (me == 0) {
    std::vector<double> lat;
    for (int r = 0; r < n; ++r) {
      if (r != revoker && !(r == 1 && n > 2)) lat.push_back((stamps[r] - stamps[revoker]) * 1e3);
    }
    std::sort(lat.begin(), lat.end());
    if (!lat.empty()) {
      BOOST_TEST_MESSAGE("revoke to error, ranks in a call: median "
                         << lat[lat.size() / 2] << " ms, max " << lat.back() << " ms (N = " << n
                         << ")");
    }
  }
  for (int r = 0; r < n; ++r) {
    if (r != revoker) BOOST_TEST(stamps[r] - stamps[revoker] < 10.0, "rank " << r);
  }
  auto next = shrinkChecked(*comm, {});
  std::mt19937_64 rng(7);
  runChecked(*next, rng, 20, "after a shrink without a loss");
}

namespace {

/// Ranks 0..n-2 of comm wait in its bootstrap (rank 1 in a recv from the last rank, the others in
/// a barrier it never joins); the last rank revokes after 300 ms. Every wait must end with the
/// revoke's error (Aborted, naming the revoker in comm's numbering, and its reason) long before
/// bootstrap.timeout.
void revokeDuringBootstrapCalls(Communicator& comm, const std::string& reason) {
  const int n = comm.size(), me = comm.rank(), revoker = n - 1;
  comm.bootstrap().barrier();
  if (me == revoker) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    comm.revoke(reason);
    return;
  }
  const auto start = Clock::now();
  auto e = catchError([&] {
    if (me == 1) {
      int x = 0;
      comm.bootstrap().recv(revoker, 77, &x, sizeof x);
    } else {
      comm.bootstrap().barrier();
    }
  });
  const double s = secondsSince(start);
  BOOST_REQUIRE_MESSAGE(e, "the bootstrap call returned normally after " << s << " s");
  BOOST_TEST_MESSAGE("rank " << me << " of " << n << ": " << (me == 1 ? "recv" : "barrier")
                             << " ended after " << s
                             << " s (the revoke came at about 0.3 s): " << describe(*e));
  BOOST_TEST_INFO_SCOPE(describe(*e));
  BOOST_TEST((e->code() == ErrorCode::Aborted));
  BOOST_TEST(e->peer() == revoker);
  BOOST_TEST(std::string(e->what()).find(reason) != std::string::npos);
  BOOST_TEST(s < 30.0, "the call ended after " << s << " s, not at the revoke");
}

}  // namespace

// An explicit revoke ends the other ranks' bootstrap calls in progress (tcp, pmix: their peer
// mesh; ucx), with bootstrap.timeout at 120 s: on the communicator, then on the communicator that
// shrink made of it (a subset of its bootstrap, whose errors name its own ranks). After each, all
// shrink (no loss) and run on.
BOOST_AUTO_TEST_CASE(revoke_interrupts_bootstrap_calls) {
  RANK_SCOPE();
  REQUIRE_RANKS(3);
  auto comm = makeComm({{"bootstrap.timeout", "120"}});
  revokeDuringBootstrapCalls(*comm, "the test revokes during a bootstrap call");
  auto next = shrinkChecked(*comm, {});
  std::mt19937_64 rng(11);
  runChecked(*next, rng, 20, "after a revoke that interrupted bootstrap calls");
  revokeDuringBootstrapCalls(*next, "again, on the shrunk communicator");
  auto third = shrinkChecked(*next, {});
  runChecked(*third, rng, 20, "after the second revoke");
}

// Kills 1 or 2 random ranks (rank 0 among the candidates) during a random mix of collectives;
// every survivor gets an error naming a lost rank, shrinks, runs 100 checked collectives on the
// new communicator; then once more (lose another rank, shrink again, 100 more).
BOOST_AUTO_TEST_CASE(random_kills) {
  RANK_SCOPE();
  REQUIRE_RANKS(4);
  auto comm = makeComm();
  const int n = comm->size();
  const uint64_t seed = jobSeed(comm->bootstrap());
  BOOST_TEST_MESSAGE("rank " << comm->rank() << ": seed " << seed << " (STRATA_FT_SEED)");
  std::mt19937_64 pick(seed);
  std::set<int> victims;
  const int first = 1 + static_cast<int>(pick() % 2);
  while (static_cast<int>(victims.size()) < first) victims.insert(static_cast<int>(pick() % n));
  if (const char* v = std::getenv("STRATA_FT_VICTIMS")) {  // "0,5": these instead (benchmarks)
    victims.clear();
    for (const char* p = v; *p;) {
      char* end = nullptr;
      const long r = std::strtol(p, &end, 10);
      if (end == p) break;
      if (r >= 0 && r < n - 1) victims.insert(static_cast<int>(r));
      p = *end == ',' ? end + 1 : end;
    }
  }
  const int dieAt = 3 + static_cast<int>(pick() % 20);
  std::mt19937_64 rng(seed ^ 0x9e3779b97f4a7c15ull);
  double detect = 0;
  Error e = lossAfter(*comm, rng, dieAt, victims.count(comm->rank()) > 0, &detect);
  checkLossError(e, victims, "first loss");
  double took = 0;
  auto second = shrinkChecked(*comm, victims, &took);
  BOOST_TEST_MESSAGE("rank " << comm->rank() << ": failure to usable communicator " << detect + took
                             << " s (the failing call " << detect << " s, shrink " << took
                             << " s)");
  std::mt19937_64 rng2(seed + 1);
  runChecked(*second, rng2, 100, "after the first shrink");
  comm.reset();  // the revoked communicator goes without waiting for the dead
  // Lose one more (never the last survivor), shrink again.
  const int m = second->size();
  std::mt19937_64 pick2(seed + 2);
  const int victim2 = static_cast<int>(pick2() % m);
  std::mt19937_64 rng3(seed + 3);
  Error e2 = lossAfter(*second, rng3, 5, second->rank() == victim2);
  checkLossError(e2, {victim2}, "second loss");
  auto third = shrinkChecked(*second, {victim2});
  std::mt19937_64 rng4(seed + 4);
  runChecked(*third, rng4, 100, "after the second shrink");
}

// The last rank stops itself (SIGSTOP) between two calls: the others time out with the
// diagnosis naming it, revoke, shrink without it and run on; rank 0 then resumes it, and its next
// call on the old communicator fails with Aborted (revoked) instead of hanging.
BOOST_AUTO_TEST_CASE(stopped_rank) {
  RANK_SCOPE();
  REQUIRE_RANKS(3);
  auto comm = makeComm({{"transport.timeout", "3"}, {"bootstrap.timeout", "10"}});
  const int n = comm->size(), me = comm->rank(), stopped = n - 1;
  const int32_t stoppedPid = comm->context().pid(stopped);
  std::mt19937_64 rng(11);
  for (int i = 0; i < 5; ++i) randomCall(*comm, rng, i);
  if (me == stopped) {
    raise(SIGSTOP);
    // Resumed: the others have revoked and shrunk. The call it stopped before may still complete
    // (the peers' pieces are in its slots); a later one needs them and must fail, not hang.
    const auto start = Clock::now();
    std::optional<Error> e;
    for (int i = 5; i < 100 && !e; ++i) e = catchError([&] { randomCall(*comm, rng, i); });
    const double s = secondsSince(start);
    BOOST_REQUIRE_MESSAGE(e, "100 calls on the revoked communicator returned normally");
    BOOST_TEST_MESSAGE("rank " << me << " (resumed): " << errText(e) << " after " << s << " s");
    // The others revoked after their diagnosed timeout: that failure, naming this rank.
    BOOST_REQUIRE(comm->revoked().has_value());
    BOOST_TEST((e->code() == comm->revoked()->code()));
    BOOST_TEST((e->code() == ErrorCode::Timeout));
    BOOST_TEST(e->peer() == me);
    comm->bootstrap().barrier();  // the bootstrap is not revoked: the survivors wait here
    return;
  }
  Error e = untilFailure(*comm, rng, 1000);
  checkLossError(e, {stopped}, "stopped rank");
  std::vector<int> lost = comm->lostRanks();
  BOOST_TEST((std::find(lost.begin(), lost.end(), stopped) != lost.end()),
             "lostRanks() lacks the stopped rank " << stopped);
  auto next = shrinkChecked(*comm, {stopped});
  std::mt19937_64 rng2(12);
  runChecked(*next, rng2, 100, "after shrinking the stopped rank away");
  next->bootstrap().barrier();
  if (me == 0) ::kill(stoppedPid, SIGCONT);
  // Alive until the resumed rank has found the old communicator revoked (their revokes reach it
  // from these processes).
  comm->bootstrap().barrier();
}

// Survivors that saw different failures agree: rank n-1 is dead and rank n-2 stopped; rank 0
// names only n-1, rank 1 only n-2, the others nothing. Every survivor gets the same communicator
// of n - 2 ranks.
BOOST_AUTO_TEST_CASE(different_failures_agree) {
  RANK_SCOPE();
  REQUIRE_RANKS(4);
  auto comm = makeComm({{"collectives.revoke_on_error", "false"}, {"bootstrap.timeout", "20"}});
  const int n = comm->size(), me = comm->rank(), dead = n - 1, stopped = n - 2;
  const int32_t stoppedPid = comm->context().pid(stopped);
  comm->bootstrap().barrier();
  if (me == dead) raise(SIGKILL);
  if (me == stopped) {
    raise(SIGSTOP);
    // Resumed once the others went on: the old communicator was revoked by their shrink.
    for (int i = 0; i < 100 && !comm->revoked(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    BOOST_TEST(comm->revoked().has_value(), "the resumed rank never learnt of the revoke");
    char done = 1;
    comm->bootstrap().send(0, 77, &done, 1);  // rank 0 stays alive until here
    return;
  }
  std::vector<int> exclude;
  if (me == 0) exclude = {dead};
  if (me == 1) exclude = {stopped};
  const auto start = Clock::now();
  std::unique_ptr<Communicator> next;
  auto e = catchError([&] { next = comm->shrink(exclude); });
  BOOST_REQUIRE_MESSAGE(!e, "shrink: " << errText(e));
  BOOST_TEST_MESSAGE("rank " << me << ": shrink with different views took " << secondsSince(start)
                             << " s");
  BOOST_TEST(next->size() == n - 2);
  BOOST_TEST(next->rank() == me);
  std::mt19937_64 rng(21);
  runChecked(*next, rng, 20, "after agreeing");
  next->bootstrap().barrier();
  if (me == 0) {
    ::kill(stoppedPid, SIGCONT);
    char done = 0;
    comm->bootstrap().recv(stopped, 77, &done, 1);
  }
}

// A rank dies while the others (and it) are in shrink (a timer kills it a random 0-8 ms into its
// shrink): the survivors either finish without it, in another attempt, or with it when it died
// just after; then their next call fails and a second shrink goes on without it. Either way every
// survivor ends in the same communicator of the n - 2 others and runs checked collectives on it.
BOOST_AUTO_TEST_CASE(dies_during_shrink) {
  RANK_SCOPE();
  REQUIRE_RANKS(4);
  auto comm = makeComm();
  const int n = comm->size(), me = comm->rank();
  const int first = n - 1, second = 1;  // first dies before, second during the shrink
  const uint64_t seed = jobSeed(comm->bootstrap());
  std::mt19937_64 rng(seed);
  Error e = lossAfter(*comm, rng, 3, me == first);
  checkLossError(e, {first}, "before the shrink");
  if (me == second) {
    const int delayUs = static_cast<int>(seed % 8000);
    std::thread([delayUs] {
      std::this_thread::sleep_for(std::chrono::microseconds(delayUs));
      raise(SIGKILL);
    }).detach();
    auto ignored = catchError([&] { comm->shrink(); });
    raise(SIGKILL);
  }
  const auto start = Clock::now();
  std::unique_ptr<Communicator> next;
  auto err = catchError([&] { next = comm->shrink(); });
  BOOST_REQUIRE_MESSAGE(!err, "shrink: " << errText(err));
  BOOST_TEST_MESSAGE("rank " << me << ": shrink took " << secondsSince(start) << " s; "
                             << next->size() << " ranks");
  BOOST_REQUIRE((next->size() == n - 1 || next->size() == n - 2));
  if (next->size() == n - 1) {
    // The victim was still there at the end of the shrink: lose it in the new communicator.
    BOOST_TEST(next->rank() == me - (me > first));
    std::mt19937_64 rng1(seed + 5);
    Error e1 = untilFailure(*next, rng1, 1000);
    checkLossError(e1, {second}, "after a shrink the victim survived");
    next = shrinkChecked(*next, {second});
  }
  BOOST_TEST(next->size() == n - 2);
  BOOST_TEST(next->rank() == me - (me > second) - (me > first));
  std::mt19937_64 rng2(seed + 1);
  runChecked(*next, rng2, 100, "after a rank died in the shrink");
}

namespace {

/// Where the grow case's rank 0 leaves the invitation for the replacement: one file per job
/// (strata-run gives each job its own root address).
std::string invitationPath() {
  std::string root = std::getenv("STRATA_ROOT") ? std::getenv("STRATA_ROOT") : "none";
  for (char& c : root) {
    if (c == ':' || c == '/' || c == '[' || c == ']') c = '_';
  }
  const char* tmp = std::getenv("TMPDIR");
  return std::string(tmp && *tmp ? tmp : "/tmp") + "/strata-ft-grow-" + root;
}

}  // namespace

// Grow: rank 2 of N dies; the survivors shrink to N - 1; the replacement (a process the dead
// rank forked before it died, standing in for one the launcher starts) joins with the invitation
// the new rank 0 wrote to a file, and the communicator has N ranks again: the survivors keep their
// ranks, the newcomer takes N - 1. Then 100 checked collectives on it (the newcomer's part checked
// by the survivors' results).
BOOST_AUTO_TEST_CASE(grow_after_shrink) {
  RANK_SCOPE();
  REQUIRE_RANKS(3);
  const int n = launchEnv().size, victim = 2;
  const std::string path = invitationPath();
  if (launchEnv().rank == victim) {
    std::fflush(nullptr);
    pid_t child = fork();
    BOOST_REQUIRE(child >= 0);
    if (child == 0) {
      // The replacement: waits for the invitation, joins, runs the survivors' calls.
      int failures = 0;
      try {
        std::string invitation;
        for (int i = 0; i < 1200 && invitation.empty(); ++i) {
          if (FILE* f = std::fopen(path.c_str(), "r")) {
            char buf[512] = {0};
            if (std::fgets(buf, sizeof buf, f)) invitation = buf;
            std::fclose(f);
          }
          if (invitation.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
        if (invitation.empty()) throw std::runtime_error("no invitation in " + path);
        auto comm = Communicator::join(invitation, 0);
        if (comm->rank() != n - 1 || comm->size() != n) ++failures;
        std::mt19937_64 rng(99);
        for (int i = 0; i < 100; ++i) randomCall(*comm, rng, i);
        std::printf("replacement: joined as rank %d of %d and ran 100 calls\n", comm->rank(),
                    comm->size());
      } catch (const std::exception& e) {
        std::printf("replacement: FAILED: %s\n", e.what());
        ++failures;
      }
      std::fflush(nullptr);
      _exit(failures ? 1 : 0);
    }
  }
  auto comm = makeComm();
  const int me = comm->rank();
  std::mt19937_64 rng(5);
  Error e = lossAfter(*comm, rng, 3, me == victim);
  checkLossError(e, {victim}, "before the grow");
  auto shrunk = shrinkChecked(*comm, {victim});
  comm.reset();
  if (shrunk->rank() == 0) {
    const std::string invitation = shrunk->growInvitation(n);
    const std::string tmp = path + ".tmp";
    FILE* f = std::fopen(tmp.c_str(), "w");
    BOOST_REQUIRE(f != nullptr);
    std::fprintf(f, "%s\n", invitation.c_str());
    std::fclose(f);
    BOOST_REQUIRE(std::rename(tmp.c_str(), path.c_str()) == 0);
  }
  const auto start = Clock::now();
  std::unique_ptr<Communicator> grown;
  auto err = catchError([&] { grown = shrunk->grow(n); });
  if (shrunk->rank() == 0) std::remove(path.c_str());
  BOOST_REQUIRE_MESSAGE(!err, "grow: " << errText(err));
  BOOST_TEST_MESSAGE("rank " << me << ": grow took " << secondsSince(start) << " s");
  BOOST_TEST(grown->size() == n);
  BOOST_TEST(grown->rank() == shrunk->rank());
  std::mt19937_64 rng2(99);
  runChecked(*grown, rng2, 100, "after the grow");
}

int main(int argc, char** argv) {
  return strata::testing::multiProcessMain(
      argc, argv, "ft_suite: needs a launcher (strata-run --keep-going -n N, srun)",
      [] { return true; });
}
