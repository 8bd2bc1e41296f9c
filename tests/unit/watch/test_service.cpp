// The status service in this process (lib/watch/service.cpp, scope.cpp): it answers local
// status, list and dump requests while another thread enters and leaves calls, stops with the
// last scope, and a forked child runs a service of its own. Part of the module `watch`
// (test_codec.cpp). Scopes are opened through watch/watch.hpp, as the watched bootstrap opens
// them (tests/unit/bootstrap/test_watched.cpp).
#include <boost/test/unit_test.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <strata/error.hpp>

#include "base/watch_calls.hpp"
#include "watch/watch.hpp"

using namespace strata;
using namespace strata::watch;

namespace {

/// The scope of rank 0 of a job of `size`, opened as lib/bootstrap's watched decorator opens it,
/// over an allGather that gives every other rank a copy of rank 0's record. Closed by reset() or
/// at the end of its scope.
class OpenScope {
 public:
  explicit OpenScope(int size) {
    OpenOptions options;
    options.rank = 0;
    options.size = size;
    options.interface = "lo";
    scope_ = open(options, [size](void* data, size_t bytesPerRank) {
      auto* p = static_cast<uint8_t*>(data);
      for (int r = 1; r < size; ++r) std::memcpy(p + bytesPerRank * r, p, bytesPerRank);
    });
  }
  ~OpenScope() { reset(); }
  OpenScope(const OpenScope&) = delete;
  OpenScope& operator=(const OpenScope&) = delete;

  const std::shared_ptr<Scope>& get() const { return scope_; }
  void reset() {
    if (scope_) close(*scope_);
    scope_.reset();
  }

 private:
  std::shared_ptr<Scope> scope_;
};

}  // namespace

// The status service answers (status, list, dump) while another thread enters and leaves calls
// and changes what it waits for; run under ThreadSanitizer as well (docs/testing.md).
BOOST_AUTO_TEST_CASE(service_answers_while_calls_change) {
  OpenScope opened(2);
  auto scope = opened.get();
  BOOST_REQUIRE(scope != nullptr);
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> calls{0};
  std::thread worker([&] {
    for (uint64_t i = 1; !stop; ++i) {
      Call c(scope, "communicator 0", "allReduce", i);
      for (int k = 0; k < 200; ++k) {
        waitingFor(1, k % 2 ? "0 of 2 pieces from it received" : "1 of 2 pieces from it");
        waitingFor(1, "1 of 2 pieces from it received", std::chrono::steady_clock::now());
        progressed();
      }
      ++calls;
    }
  });
  const int32_t pid = static_cast<int32_t>(::getpid());
  uint64_t jobId = 0;
  int seenWaiting = 0;  // answers caught while the worker waited (the racy moments)
  for (int i = 0; i < 200; ++i) {
    Reply list = askLocal(pid, makeRequest(RequestType::List, 0), 5);
    BOOST_REQUIRE(list.error.empty());
    BOOST_REQUIRE(!list.reports.empty());
    jobId = list.reports.front().jobId;
    Reply st = askLocal(pid, makeRequest(RequestType::Status, jobId), 5);
    BOOST_REQUIRE(st.reports.size() == 1u);
    BOOST_TEST(st.reports.front().rank == 0);
    for (const auto& c : st.reports.front().calls) {
      BOOST_TEST(c.op == "allReduce");
      BOOST_TEST((c.waitingFor == -1 || c.waitingFor == 1));
      if (c.waitingFor == 1) ++seenWaiting;
    }
  }
  Reply dump = askLocal(pid, makeRequest(RequestType::Dump, jobId), 10);
  BOOST_TEST(dump.error.empty(), dump.error);
  BOOST_TEST(dump.text.find("2 ranks, asked from rank 0") != std::string::npos, dump.text);
  Reply none = askLocal(pid, makeRequest(RequestType::Status, jobId + 1), 5);
  BOOST_TEST(none.error.find("has no job") != std::string::npos, none.error);
  stop = true;
  worker.join();
  BOOST_TEST(calls > 0u);
  BOOST_TEST_MESSAGE("worker calls " << calls << ", answers showing a wait " << seenWaiting);
  opened.reset();
  // The last scope closed: the service thread and its socket are gone.
  BOOST_CHECK_THROW(askLocal(pid, makeRequest(RequestType::List, 0), 1), Error);
}

// A revoke request reaches the scope's listener once (the first wins), a listener registered after
// it fires at once, and a revoke naming a rank outside the scope, or this rank, is refused.
BOOST_AUTO_TEST_CASE(revoke_request_reaches_the_listener) {
  OpenScope opened(4);
  auto scope = opened.get();
  const int32_t pid = static_cast<int32_t>(::getpid());
  const uint64_t jobId = scope->jobId();
  std::atomic<int> heard{0};
  std::atomic<int> origin{-1};
  scope->listenRevoke("communicator 0", [&](const Scope::Revoke& r) {
    origin = r.origin;
    ++heard;
  });
  Request q = makeRequest(RequestType::Revoke, jobId);
  q.domain = "communicator 0";
  q.origin = 2;
  q.reason = "the test";
  q.suspects = {3};
  q.code = static_cast<uint8_t>(ErrorCode::PeerLost);
  Reply r = askLocal(pid, q, 5);
  BOOST_TEST(r.error.empty(), r.error);
  BOOST_TEST(heard == 1);
  BOOST_TEST(origin == 2);
  auto first = scope->revokeOf("communicator 0");
  BOOST_REQUIRE(first.has_value());
  BOOST_TEST((first->code == ErrorCode::PeerLost));
  BOOST_TEST((first->suspects == std::vector<int>{3}));
  q.origin = 1;
  BOOST_TEST(askLocal(pid, q, 5).error.empty());
  BOOST_TEST(heard == 1);  // only the first counts
  std::atomic<int> late{0};
  scope->listenRevoke("communicator 0", [&](const Scope::Revoke&) { ++late; });
  BOOST_TEST(late == 1);
  for (int32_t bad : {-1, 0, 4}) {  // not a rank, this rank, past the size
    Request b = q;
    b.domain = "communicator 1";
    b.origin = bad;
    BOOST_TEST(!askLocal(pid, b, 5).error.empty(), "origin " << bad);
  }
  Request b = q;
  b.domain = "communicator 1";
  b.suspects = {9};
  BOOST_TEST(askLocal(pid, b, 5).error.find("rank 9") != std::string::npos);
  BOOST_TEST(!scope->revokeOf("communicator 1").has_value());
  // strata-info --job's text says it.
  Reply dump = askLocal(pid, makeRequest(RequestType::Dump, jobId), 10);
  BOOST_TEST(dump.text.find("\ncommunicator 0: revoked by rank 2: the test\n") != std::string::npos,
             dump.text);
  scope->unlistenRevoke("communicator 0");
}

// A process that forks while its status service runs (a PyTorch DataLoader worker, a test
// that forks a stand-in rank): the child starts a service of its own for a bootstrap it creates,
// and destroying what it inherited neither hangs nor touches the parent's.
BOOST_AUTO_TEST_CASE(a_forked_child_runs_its_own_service) {
#if defined(__SANITIZE_THREAD__)
  // ThreadSanitizer cannot start threads in the child of a multi-threaded fork.
  BOOST_TEST_MESSAGE("skipped under ThreadSanitizer (no threads after a multi-threaded fork)");
  return;
#endif
  OpenScope parent(2);
  BOOST_REQUIRE(parent.get() != nullptr);
  std::fflush(nullptr);
  pid_t child = ::fork();
  BOOST_REQUIRE(child >= 0);
  if (child == 0) {
    int rc = 0;
    try {
      OpenScope own(2);
      Reply r = askLocal(static_cast<int32_t>(::getpid()), makeRequest(RequestType::List, 0), 5);
      if (r.reports.size() != 1) rc = 2;
      own.reset();
      parent.reset();  // inherited: must not wait for the parent's thread
    } catch (...) {
      rc = 3;
    }
    ::_exit(rc);
  }
  int status = 0;
  while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  BOOST_TEST((WIFEXITED(status) && WEXITSTATUS(status) == 0), "child status " << status);
  Reply mine = askLocal(static_cast<int32_t>(::getpid()), makeRequest(RequestType::List, 0), 5);
  BOOST_TEST(mine.reports.size() == 1u);
}

// A call a peer's revoke ended (markFailed, no diagnosis of its own) stays reported as failed in
// that call after it returns, as a diagnosed one does; a call that ended well does not.
BOOST_AUTO_TEST_CASE(a_call_ended_by_a_revoke_stays_reported_in_that_call) {
  auto scope = std::make_shared<Scope>(1, 3, "h", 7);
  Slot slot(scope, "communicator 0");
  auto snapshot = [&] {
    std::vector<std::tuple<std::string, uint64_t, bool, bool>> out;
    scope->forEachCall([&](const CallRecord& c) {
      out.emplace_back(c.opName(), c.seq.load(), c.active.load(), c.failed.load());
    });
    return out;
  };
  { Slot::Active call(&slot, "allReduce", 1); }
  auto calm = snapshot();
  BOOST_REQUIRE(calm.size() == 1u);
  BOOST_TEST(!std::get<2>(calm[0]));  // between calls: not in any
  {
    Slot::Active call(&slot, "allReduce", 2);
    markFailed();
  }
  auto after = snapshot();
  BOOST_REQUIRE(after.size() == 1u);
  BOOST_TEST(std::get<0>(after[0]) == "allReduce");
  BOOST_TEST(std::get<1>(after[0]) == 2u);
  BOOST_TEST(std::get<2>(after[0]));  // still reported in allReduce #2
  BOOST_TEST(std::get<3>(after[0]));  // as failed
  // Outside any call it does nothing.
  markFailed();
  // The next call takes the record over.
  { Slot::Active call(&slot, "broadcast", 3); }
  auto next = snapshot();
  BOOST_TEST(!std::get<3>(next[0]));
  BOOST_TEST(!std::get<2>(next[0]));
}
