// Creating a bootstrap (lib/bootstrap/bootstrap.cpp): Bootstrap::create without a root says what
// to set; createTcpBootstrap with ranks given explicitly (as strata_torch does) and its
// RendezvousListener, in threads of this process.
#define BOOST_TEST_MODULE bootstrap_create
#include <boost/test/unit_test.hpp>

#include <chrono>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <strata/strata.hpp>

#include "bootstrap/subset.hpp"
#include "bootstrap/watched.hpp"
#include "tests/harness/single_rank.hpp"

using strata::Config;
using strata::Error;
using strata::ErrorCode;
using strata::testing::LauncherEnv;

BOOST_AUTO_TEST_CASE(tcp_bootstrap_without_root_says_what_to_set) {
  LauncherEnv env({{"STRATA_RANK", "1"}, {"STRATA_SIZE", "2"}});
  try {
    strata::Bootstrap::create(Config());
    BOOST_FAIL("expected InvalidConfig");
  } catch (const Error& e) {
    BOOST_TEST(static_cast<int>(e.code()) == static_cast<int>(ErrorCode::InvalidConfig));
    BOOST_TEST(std::string(e.what()).find("STRATA_ROOT") != std::string::npos);
  }
}

// createTcpBootstrap: ranks given explicitly (as strata_torch does from torch's store), the
// launcher environment ignored even when it says something else.
BOOST_AUTO_TEST_CASE(explicit_launch_ignores_the_environment) {
  LauncherEnv env({{"STRATA_RANK", "5"}, {"STRATA_SIZE", "9"}, {"STRATA_ROOT", "127.0.0.1:1"}});
  Config c;
  c.set("bootstrap.tcp.interface", "lo").set("bootstrap.timeout", "20");
  strata::RendezvousListener listener(c);
  BOOST_TEST(listener.fd() >= 0);
  BOOST_TEST(listener.address().rfind("127.0.0.1:", 0) == 0);
  constexpr int n = 3;
  std::vector<std::unique_ptr<strata::Bootstrap>> boots(n);
  std::vector<std::string> errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        strata::ExplicitLaunch launch{r, n, r, n, listener.address(), "explicit-secret", {}};
        auto b = strata::createTcpBootstrap(launch, c, r == 0 ? &listener : nullptr);
        std::vector<int> slots(n, -1);
        slots[static_cast<size_t>(r)] = r * 10;
        b->allGather(slots.data(), sizeof(int));
        for (int q = 0; q < n; ++q) {
          if (slots[static_cast<size_t>(q)] != q * 10) errors[static_cast<size_t>(r)] = "bad slot";
        }
        b->barrier();
        boots[static_cast<size_t>(r)] = std::move(b);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) {
    BOOST_TEST(errors[static_cast<size_t>(r)] == "", "rank " << r);
    if (!boots[static_cast<size_t>(r)]) continue;
    BOOST_TEST(boots[static_cast<size_t>(r)]->rank() == r);
    BOOST_TEST(boots[static_cast<size_t>(r)]->size() == n);
  }
  // A second group on a second listener, while the first is still alive.
  strata::RendezvousListener second(c);
  BOOST_TEST(second.address() != listener.address());
}

namespace {

/// The code createTcpBootstrap throws for this launch (Internal if it succeeds).
ErrorCode createFails(const strata::ExplicitLaunch& launch, const Config& c) {
  try {
    strata::createTcpBootstrap(launch, c, nullptr);
  } catch (const Error& e) {
    BOOST_TEST_MESSAGE(e.what());
    return e.code();
  }
  return ErrorCode::Internal;
}

}  // namespace

BOOST_AUTO_TEST_CASE(explicit_launch_rejects_bad_arguments) {
  Config c;
  c.set("bootstrap.tcp.interface", "lo");
  auto code = [&](const strata::ExplicitLaunch& l) { return createFails(l, c); };
  BOOST_TEST((code({2, 2, 0, 1, "127.0.0.1:1", "", {}}) == ErrorCode::InvalidArgument));
  BOOST_TEST((code({0, 0, 0, 1, "127.0.0.1:1", "", {}}) == ErrorCode::InvalidArgument));
  BOOST_TEST((code({1, 2, 1, 1, "127.0.0.1:1", "", {}}) == ErrorCode::InvalidArgument));
  BOOST_TEST((code({1, 2, 0, 1, "", "", {}}) == ErrorCode::InvalidArgument));
  BOOST_TEST(
      (code({0, 2, 0, 1, "127.0.0.1:1", "", {}}) == ErrorCode::InvalidArgument));  // no listener
  auto one = strata::createTcpBootstrap({0, 1, 0, 1, "", "", {}}, c);
  BOOST_TEST(one->size() == 1);
}

// Several rendezvous roots (ncclCommInitRankScalable): 7 ranks over 3 roots in NCCL's blocks
// (0-2, 3-4, 5-6); each root serves its block and roots 3 and 5 check in at rank 0 with theirs.
// Then every rank holds every address: an all-gather and a send from each rank to its
// farthest peer work.
namespace {

struct MultiRootRun {
  std::vector<std::string> errors;
  std::vector<std::unique_ptr<strata::Bootstrap>> boots;
};

MultiRootRun runMultiRoot(int n, int roots, const Config& c, int absent = -1) {
  std::vector<std::unique_ptr<strata::RendezvousListener>> listeners;
  strata::ExplicitLaunch base;
  base.size = n;
  base.secret = "multi-root-secret";
  for (int k = 0; k < roots; ++k) {
    listeners.push_back(std::make_unique<strata::RendezvousListener>(c));
    base.roots.push_back(listeners.back()->address());
  }
  MultiRootRun run;
  run.errors.assign(static_cast<size_t>(n), "");
  run.boots.resize(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    if (r == absent) continue;
    threads.emplace_back([&, r] {
      try {
        strata::ExplicitLaunch launch = base;
        launch.rank = r;
        launch.localRank = r;
        launch.localSize = n;
        const int k = strata::rendezvousBlockOf(r, n, roots);
        const bool serves = r == strata::rendezvousBlockStart(k, n, roots);
        auto b = strata::createTcpBootstrap(
            launch, c, serves ? listeners[static_cast<size_t>(k)].get() : nullptr);
        std::vector<int> slots(static_cast<size_t>(n), -1);
        slots[static_cast<size_t>(r)] = r * 10;
        b->allGather(slots.data(), sizeof(int));
        for (int q = 0; q < n; ++q) {
          if (slots[static_cast<size_t>(q)] != q * 10) {
            run.errors[static_cast<size_t>(r)] = "bad slot " + std::to_string(q);
          }
        }
        const int far = (r + n / 2) % n, from = (r - n / 2 + n) % n;
        int out = r, in = -1;
        b->send(far, 7, &out, sizeof out);
        b->recv(from, 7, &in, sizeof in);
        if (in != from) run.errors[static_cast<size_t>(r)] = "bad message";
        b->barrier();
        run.boots[static_cast<size_t>(r)] = std::move(b);
      } catch (const std::exception& e) {
        run.errors[static_cast<size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return run;
}

}  // namespace

BOOST_AUTO_TEST_CASE(several_rendezvous_roots_share_the_start_up) {
  BOOST_TEST(strata::rendezvousBlockStart(0, 7, 3) == 0);
  BOOST_TEST(strata::rendezvousBlockStart(1, 7, 3) == 3);
  BOOST_TEST(strata::rendezvousBlockStart(2, 7, 3) == 5);
  BOOST_TEST(strata::rendezvousBlockStart(3, 7, 3) == 7);
  for (int n : {1, 2, 5, 7, 16}) {
    for (int k = 1; k <= n; ++k) {
      for (int r = 0; r < n; ++r) {
        const int b = strata::rendezvousBlockOf(r, n, k);
        BOOST_TEST((strata::rendezvousBlockStart(b, n, k) <= r &&
                    r < strata::rendezvousBlockStart(b + 1, n, k)),
                   "rank " << r << " of " << n << ", " << k << " roots");
      }
    }
  }
  Config c;
  c.set("bootstrap.tcp.interface", "lo").set("bootstrap.timeout", "20");
  for (auto [n, roots] : {std::pair{7, 3}, std::pair{4, 4}, std::pair{5, 2}}) {
    auto run = runMultiRoot(n, roots, c);
    for (int r = 0; r < n; ++r) {
      BOOST_TEST(run.errors[static_cast<size_t>(r)] == "", n << " ranks, " << roots
                                                             << " roots: rank " << r << ": "
                                                             << run.errors[static_cast<size_t>(r)]);
      if (run.boots[static_cast<size_t>(r)]) {
        BOOST_TEST(run.boots[static_cast<size_t>(r)]->rank() == r);
      }
    }
  }
}

// A rank of block 1 never starts: its root times out naming it and rejects its block; rank 0
// then gives up on that root; nobody waits past the connect timeout and then some.
BOOST_AUTO_TEST_CASE(a_missing_rank_of_another_root_fails_every_rank_naming_it) {
  Config c;
  c.set("bootstrap.tcp.interface", "lo").set("bootstrap.connect_timeout", "2");
  auto start = std::chrono::steady_clock::now();
  auto run = runMultiRoot(6, 2, c, 4);
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  BOOST_TEST(took < 12.0, took);
  for (int r : {3, 5}) {  // rank 3 serves block 1 (3-5)
    BOOST_TEST(run.errors[static_cast<size_t>(r)].find("missing ranks: 4") != std::string::npos,
               run.errors[static_cast<size_t>(r)]);
  }
  for (int r : {0, 1, 2}) {
    BOOST_TEST(run.errors[static_cast<size_t>(r)] != "", "rank " << r);
  }
}

BOOST_AUTO_TEST_CASE(multi_root_launches_are_checked) {
  Config c;
  c.set("bootstrap.tcp.interface", "lo");
  auto code = [&](const strata::ExplicitLaunch& l) { return createFails(l, c); };
  const std::vector<std::string> two{"127.0.0.1:1", "127.0.0.1:2"};
  BOOST_TEST((code({0, 1, 0, 1, "", "", two}) == ErrorCode::InvalidArgument));  // 2 roots, 1 rank
  BOOST_TEST((code({1, 3, 0, 1, "", "", {"127.0.0.1:1", "127.0.0.1:1"}}) ==
              ErrorCode::InvalidArgument));  // same root twice
  BOOST_TEST(
      (code({2, 4, 0, 1, "", "", two}) == ErrorCode::InvalidArgument));  // serves, no listener
  BOOST_TEST((code({1, 4, 0, 1, "", "", {"127.0.0.1:1", ""}}) == ErrorCode::InvalidArgument));
  BOOST_TEST((code({1, 4, 0, 1, "127.0.0.1:9", "", two}) ==
              ErrorCode::InvalidArgument));  // root is not roots[0]
}

// Without bootstrap.tcp.interface, the host hint picks the interface (torch's MASTER_ADDR).
BOOST_AUTO_TEST_CASE(rendezvous_listener_follows_the_host_hint) {
  Config c;
  strata::RendezvousListener byHint(c, "127.0.0.1");
  BOOST_TEST(byHint.address().rfind("127.0.0.1:", 0) == 0, byHint.address());
  c.set("bootstrap.tcp.interface", "lo");
  strata::RendezvousListener byName(c, "");
  BOOST_TEST(byName.address().rfind("127.0.0.1:", 0) == 0, byName.address());
  BOOST_CHECK_THROW(strata::RendezvousListener(c, "no-such-host.invalid"), Error);
}

// Communicator::revoke ends a rank's bootstrap calls in progress (bootstrap::interruptCalls): a
// recv blocked on the tcp bootstrap, directly and through a subset of it, throws the given error
// at once; a call that begins after the interrupt is not affected, and the subset's messages stay
// in step. A bootstrap without the interface says it cannot.
BOOST_AUTO_TEST_CASE(an_interrupt_ends_the_calls_in_progress_only) {
  Config c;
  c.set("bootstrap.tcp.interface", "lo").set("bootstrap.timeout", "30");
  strata::RendezvousListener listener(c);
  constexpr int n = 2;
  std::vector<std::shared_ptr<strata::Bootstrap>> boots(n);
  {
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        strata::ExplicitLaunch launch{r, n, r, n, listener.address(), "interrupt-secret", {}};
        boots[static_cast<size_t>(r)] =
            strata::createTcpBootstrap(launch, c, r == 0 ? &listener : nullptr);
      });
    }
    for (auto& t : threads) t.join();
  }
  BOOST_REQUIRE(boots[0] && boots[1]);
  const Error why(strata::ErrorCode::Aborted, "communicator 0 was revoked by rank 1: a test", 1);
  // recv(): rank 0 waits for a message rank 1 never sends; the interrupt ends it.
  auto blocked = [&](strata::Bootstrap& b, int tag) {
    return std::async(std::launch::async, [&b, tag] {
      const auto start = std::chrono::steady_clock::now();
      int x = 0;
      try {
        b.recv(1, tag, &x, sizeof x);
      } catch (const Error& e) {
        const double s =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        return std::make_pair(std::optional<Error>(e), s);
      }
      return std::make_pair(std::optional<Error>(), 0.0);
    });
  };
  auto check = [&](auto& result, const char* what) {
    auto [e, s] = result.get();
    BOOST_TEST_INFO_SCOPE(what);
    BOOST_REQUIRE_MESSAGE(e.has_value(), "the recv returned normally");
    BOOST_TEST((e->code() == strata::ErrorCode::Aborted));
    BOOST_TEST(e->peer() == 1);
    BOOST_TEST(std::string(e->what()).find("interrupted") != std::string::npos, e->what());
    BOOST_TEST(std::string(e->what()).find("a test") != std::string::npos, e->what());
    BOOST_TEST(s < 10.0, "ended after " << s << " s");
  };
  {
    auto r = blocked(*boots[0], 5);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    BOOST_TEST(strata::bootstrap::interruptCalls(*boots[0], why));
    check(r, "tcp recv");
  }
  // A call after the interrupt waits as usual and gets its message.
  {
    std::thread later([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      const int v = 42;
      boots[1]->send(0, 5, &v, sizeof v);
    });
    int got = 0;
    boots[0]->recv(1, 5, &got, sizeof got);
    later.join();
    BOOST_TEST(got == 42);
  }
  // Through a subset of both ranks (what a shrunk communicator's bootstrap is).
  std::vector<std::unique_ptr<strata::Bootstrap>> subs(n);
  for (int r = 0; r < n; ++r) {
    strata::bootstrap::SubsetOptions o;
    o.members = {0, 1};
    o.tag = 9;
    o.localRank = r;
    o.localSize = n;
    subs[static_cast<size_t>(r)] = strata::bootstrap::subset(boots[static_cast<size_t>(r)], o);
  }
  {
    auto r = blocked(*subs[0], 6);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    BOOST_TEST(strata::bootstrap::interruptCalls(*subs[0], why));
    check(r, "subset recv");
  }
  std::vector<int> big(1 << 16, 7);
  std::thread sender([&] { subs[1]->send(0, 6, big.data(), big.size() * sizeof(int)); });
  std::vector<int> got(big.size(), 0);
  subs[0]->recv(1, 6, got.data(), got.size() * sizeof(int));
  sender.join();
  BOOST_TEST((got == big));
  // A bootstrap that is not a peer mesh (nor wraps one) cannot.
  struct Plain final : strata::Bootstrap {
    std::string_view backend() const noexcept override { return "plain"; }
    int rank() const noexcept override { return 0; }
    int size() const noexcept override { return 1; }
    int localRank() const noexcept override { return 0; }
    int localSize() const noexcept override { return 1; }
    void send(int, int, const void*, size_t) override {}
    void recv(int, int, void*, size_t) override {}
    void allGather(void*, size_t) override {}
    void broadcast(void*, size_t, int) override {}
    void barrier() override {}
    void abort(std::string_view) noexcept override {}
  } plain;
  BOOST_TEST(!strata::bootstrap::interruptCalls(plain, why));
  subs.clear();
}
