// The launch contract (lib/launch/contract.cpp): what detectLaunch() reads from strata-run's
// STRATA_* variables, from Slurm's (reserved ports, host lists) and from Open MPI's, and how it
// refuses bad values.
#define BOOST_TEST_MODULE launch_contract
#include <boost/test/unit_test.hpp>

#include <map>
#include <string>

#include <strata/strata.hpp>

#include "launch/contract.hpp"
#include "tests/harness/single_rank.hpp"

using strata::Config;
using strata::Error;
using strata::ErrorCode;
using strata::testing::LauncherEnv;

namespace {

ErrorCode codeOf(const std::map<std::string, std::string>& vars, const Config& c = Config()) {
  LauncherEnv env(vars);
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
  LauncherEnv env({});
  auto info = strata::detectLaunch(Config());
  BOOST_TEST(info.launcher == "none");
  BOOST_TEST(info.rank == 0);
  BOOST_TEST(info.size == 1);
}

BOOST_AUTO_TEST_CASE(strata_run_contract) {
  LauncherEnv env({{"STRATA_RANK", "2"},
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
  LauncherEnv env({{"SLURM_PROCID", "5"},
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
    LauncherEnv env({{"SLURM_PROCID", "0"},
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
  LauncherEnv env({{"OMPI_COMM_WORLD_RANK", "3"},
                   {"OMPI_COMM_WORLD_SIZE", "4"},
                   {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                   {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}});
  auto info = strata::detectLaunch(Config());
  BOOST_TEST(info.launcher == "mpirun");
  BOOST_TEST(info.rank == 3);
  BOOST_TEST(info.localRank == 1);
  BOOST_TEST(info.localSize == 2);
}
