#define BOOST_TEST_MODULE launcher
#include <boost/test/unit_test.hpp>

#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <strata/strata.hpp>

#include "launch/contract.hpp"

using strata::Config;
using strata::Error;
using strata::ErrorCode;

namespace {

const char* kVars[] = {"STRATA_RANK",
                       "STRATA_SIZE",
                       "STRATA_LOCAL_RANK",
                       "STRATA_LOCAL_SIZE",
                       "STRATA_ROOT",
                       "STRATA_ROOT_FD",
                       "STRATA_SECRET",
                       "SLURM_PROCID",
                       "SLURM_STEP_ID",
                       "SLURM_STEP_NUM_TASKS",
                       "SLURM_NTASKS",
                       "SLURM_LOCALID",
                       "SLURM_NODEID",
                       "SLURM_STEP_NODELIST",
                       "SLURM_STEP_TASKS_PER_NODE",
                       "SLURM_STEP_RESV_PORTS",
                       "OMPI_COMM_WORLD_RANK",
                       "OMPI_COMM_WORLD_SIZE",
                       "OMPI_COMM_WORLD_LOCAL_RANK",
                       "OMPI_COMM_WORLD_LOCAL_SIZE"};

// Sets exactly the given launcher variables for one test.
struct Env {
  explicit Env(const std::map<std::string, std::string>& vars) {
    for (const char* v : kVars) unsetenv(v);
    for (auto& [k, v] : vars) setenv(k.c_str(), v.c_str(), 1);
  }
  ~Env() {
    for (const char* v : kVars) unsetenv(v);
  }
};

ErrorCode codeOf(const std::map<std::string, std::string>& vars, const Config& c = Config()) {
  Env env(vars);
  try {
    strata::detectLaunch(c);
  } catch (const Error& e) {
    BOOST_TEST_MESSAGE(e.what());
    return e.code();
  }
  return ErrorCode::Internal;
}

}  // namespace

BOOST_AUTO_TEST_CASE(no_launcher_is_a_single_rank) {
  Env env({});
  auto info = strata::detectLaunch(Config());
  BOOST_TEST(info.launcher == "none");
  BOOST_TEST(info.rank == 0);
  BOOST_TEST(info.size == 1);
}

BOOST_AUTO_TEST_CASE(strata_run_contract) {
  Env env({{"STRATA_RANK", "2"},
           {"STRATA_SIZE", "4"},
           {"STRATA_LOCAL_RANK", "0"},
           {"STRATA_LOCAL_SIZE", "2"},
           {"STRATA_ROOT", "127.0.0.1:5000"},
           {"STRATA_SECRET", "abc"}});
  auto info = strata::detectLaunch(Config());
  BOOST_TEST(info.launcher == "strata-run");
  BOOST_TEST(info.rank == 2);
  BOOST_TEST(info.size == 4);
  BOOST_TEST(info.localRank == 0);
  BOOST_TEST(info.localSize == 2);
  BOOST_TEST(info.root == "127.0.0.1:5000");
  BOOST_TEST(info.secret == "abc");
  BOOST_TEST(info.rootFd == -1);
}

BOOST_AUTO_TEST_CASE(bad_strata_variables) {
  auto invalid = [](ErrorCode c) { return c == ErrorCode::InvalidConfig; };
  BOOST_TEST(invalid(codeOf({{"STRATA_RANK", "4"}, {"STRATA_SIZE", "4"}})));
  BOOST_TEST(invalid(codeOf({{"STRATA_RANK", "-1"}, {"STRATA_SIZE", "4"}})));
  BOOST_TEST(invalid(codeOf({{"STRATA_RANK", "1x"}, {"STRATA_SIZE", "4"}})));
  BOOST_TEST(invalid(codeOf({{"STRATA_RANK", "1"}})));
  BOOST_TEST(invalid(codeOf({{"STRATA_RANK", "1"}, {"STRATA_SIZE", "0"}})));
  BOOST_TEST(invalid(codeOf({{"STRATA_RANK", "1"},
                             {"STRATA_SIZE", "4"},
                             {"STRATA_LOCAL_SIZE", "2"},
                             {"STRATA_LOCAL_RANK", "2"}})));
}

BOOST_AUTO_TEST_CASE(srun_with_reserved_ports) {
  Env env({{"SLURM_PROCID", "5"},
           {"SLURM_STEP_ID", "0"},
           {"SLURM_STEP_NUM_TASKS", "7"},
           {"SLURM_LOCALID", "1"},
           {"SLURM_NODEID", "2"},
           {"SLURM_STEP_NODELIST", "gpu[007-009],login"},
           {"SLURM_STEP_TASKS_PER_NODE", "2(x3),1"},
           {"SLURM_STEP_RESV_PORTS", "20001-20007"}});
  auto info = strata::detectLaunch(Config());
  BOOST_TEST(info.launcher == "slurm");
  BOOST_TEST(info.rank == 5);
  BOOST_TEST(info.size == 7);
  BOOST_TEST(info.localRank == 1);
  BOOST_TEST(info.localSize == 2);
  BOOST_TEST(info.root == "gpu007:20001");
}

BOOST_AUTO_TEST_CASE(srun_port_from_config_and_explicit_root) {
  {
    Env env({{"SLURM_PROCID", "0"},
             {"SLURM_STEP_ID", "3"},
             {"SLURM_NTASKS", "2"},
             {"SLURM_STEP_NODELIST", "n[1-2]"},
             {"SLURM_STEP_TASKS_PER_NODE", "1(x2)"}});
    Config c;
    c.set("bootstrap.tcp.port", "29500");
    auto info = strata::detectLaunch(c);
    BOOST_TEST(info.root == "n1:29500");
    c.set("bootstrap.tcp.root", "10.1.2.3:4000");
    BOOST_TEST(strata::detectLaunch(c).root == "10.1.2.3:4000");
    BOOST_TEST(strata::detectLaunch(Config()).root.empty());  // no port: no root
  }
  auto invalid = [](ErrorCode c) { return c == ErrorCode::InvalidConfig; };
  BOOST_TEST(invalid(codeOf({{"SLURM_PROCID", "0"},
                             {"SLURM_STEP_ID", "0"},
                             {"SLURM_NTASKS", "2"},
                             {"SLURM_NODEID", "5"},
                             {"SLURM_STEP_TASKS_PER_NODE", "1(x2)"}})));
  // A malformed host list is rejected by the host-list parser, naming the text.
  BOOST_TEST((codeOf({{"SLURM_PROCID", "0"},
                      {"SLURM_STEP_ID", "0"},
                      {"SLURM_NTASKS", "2"},
                      {"SLURM_STEP_NODELIST", "n[1-"}}) == ErrorCode::InvalidArgument));
}

BOOST_AUTO_TEST_CASE(mpirun_variables) {
  Env env({{"OMPI_COMM_WORLD_RANK", "3"},
           {"OMPI_COMM_WORLD_SIZE", "4"},
           {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
           {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}});
  auto info = strata::detectLaunch(Config());
  BOOST_TEST(info.launcher == "mpirun");
  BOOST_TEST(info.rank == 3);
  BOOST_TEST(info.localRank == 1);
  BOOST_TEST(info.localSize == 2);
}

BOOST_AUTO_TEST_CASE(tcp_bootstrap_without_root_says_what_to_set) {
  Env env({{"STRATA_RANK", "1"}, {"STRATA_SIZE", "2"}});
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
  Env env({{"STRATA_RANK", "5"}, {"STRATA_SIZE", "9"}, {"STRATA_ROOT", "127.0.0.1:1"}});
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
