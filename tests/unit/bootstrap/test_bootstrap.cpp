// Creating a bootstrap (lib/bootstrap/bootstrap.cpp): Bootstrap::create without a root says what
// to set; createTcpBootstrap with ranks given explicitly (as strata_torch does) and its
// RendezvousListener, in threads of this process.
#define BOOST_TEST_MODULE bootstrap_create
#include <boost/test/unit_test.hpp>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <strata/strata.hpp>

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
        strata::ExplicitLaunch launch{r, n, r, n, listener.address(), "explicit-secret"};
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

BOOST_AUTO_TEST_CASE(explicit_launch_rejects_bad_arguments) {
  Config c;
  c.set("bootstrap.tcp.interface", "lo");
  auto code = [&](strata::ExplicitLaunch l, const strata::RendezvousListener* li = nullptr) {
    try {
      strata::createTcpBootstrap(l, c, li);
    } catch (const Error& e) {
      BOOST_TEST_MESSAGE(e.what());
      return e.code();
    }
    return ErrorCode::Internal;
  };
  BOOST_TEST((code({2, 2, 0, 1, "127.0.0.1:1", ""}) == ErrorCode::InvalidArgument));
  BOOST_TEST((code({0, 0, 0, 1, "127.0.0.1:1", ""}) == ErrorCode::InvalidArgument));
  BOOST_TEST((code({1, 2, 1, 1, "127.0.0.1:1", ""}) == ErrorCode::InvalidArgument));
  BOOST_TEST((code({1, 2, 0, 1, "", ""}) == ErrorCode::InvalidArgument));
  BOOST_TEST((code({0, 2, 0, 1, "127.0.0.1:1", ""}) == ErrorCode::InvalidArgument));  // no listener
  auto one = strata::createTcpBootstrap({0, 1, 0, 1, "", ""}, c);
  BOOST_TEST(one->size() == 1);
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
