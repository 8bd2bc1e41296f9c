#define BOOST_TEST_MODULE registry
#include <boost/test/unit_test.hpp>

#include <cstdlib>
#include <filesystem>
#include <string>

#include <strata/backend/module.hpp>
#include <strata/strata.hpp>

#include "bootstrap/registry.hpp"
#include "tests/harness/single_rank.hpp"

using strata::Config;
using strata::Error;
using strata::ErrorCode;
namespace reg = strata::bootstrap;
using strata::testing::expectError;

namespace {

Config withModules() {
  Config c;
  c.set("module.path", TEST_MODULE_DIR);
  return c;
}

// Runs in a process without any launcher environment: a single-rank job.
using strata::testing::SingleRankEnv;
BOOST_TEST_GLOBAL_FIXTURE(SingleRankEnv);

}  // namespace

BOOST_AUTO_TEST_CASE(lists_builtin_and_known_modules) {
  auto list = reg::listBackends(withModules());
  bool tcp = false, pmix = false, good = false, bad = false, noentry = false;
  for (const auto& b : list) {
    if (b.name == "tcp") tcp = b.kind == "built-in" && b.usable;
    if (b.name == "pmix") pmix = true;
    if (b.name == "testgood") good = b.kind == "module" && b.usable;
    if (b.name == "testbadabi") {
      bad = !b.usable &&
            b.error.find("module ABI " + std::to_string(STRATA_MODULE_ABI_VERSION + 998)) !=
                std::string::npos;
      BOOST_TEST_MESSAGE("testbadabi: " << b.error);
    }
    if (b.name == "testnoentry") {
      noentry = !b.usable && b.error.find("strata_module_info") != std::string::npos;
    }
  }
  BOOST_TEST(tcp);
  BOOST_TEST(pmix);  // always listed, usable or not
  BOOST_TEST(good);
  BOOST_TEST(bad);
  BOOST_TEST(noentry);
}

BOOST_AUTO_TEST_CASE(good_module_creates_a_backend) {
  Config c = withModules();
  auto b = reg::createBackend("testgood", c);
  BOOST_TEST(b->backend() == "testgood");
  BOOST_TEST(b->size() == 1);
}

BOOST_AUTO_TEST_CASE(abi_mismatch_is_refused_before_use) {
  Config c = withModules();
  auto e = expectError([&] { reg::createBackend("testbadabi", c); });
  BOOST_TEST(static_cast<int>(e.code()) == static_cast<int>(ErrorCode::NotSupported));
  BOOST_TEST(std::string(e.what()).find("rebuild the module") != std::string::npos);
}

// Modules call libstrata's functions: one built against another strata version is refused
// with the same "rebuild" advice, even when its ABI number matches.
BOOST_AUTO_TEST_CASE(version_mismatch_is_refused_before_use) {
  Config c = withModules();
  auto e = expectError([&] { reg::createBackend("testoldversion", c); });
  BOOST_TEST(static_cast<int>(e.code()) == static_cast<int>(ErrorCode::NotSupported));
  std::string msg = e.what();
  BOOST_TEST_MESSAGE(msg);
  BOOST_TEST(msg.find("built against strata 0.0.1-old") != std::string::npos);
  BOOST_TEST(msg.find("rebuild the module") != std::string::npos);
}

// The built-ins come from the one table (backends/builtin.cpp), found like modules.
BOOST_AUTO_TEST_CASE(builtins_are_found_by_kind_and_name) {
  Config c = withModules();
  using strata::backend::ModuleKind;
  auto tcp = reg::findModule(ModuleKind::Bootstrap, "tcp", c);
  auto shm = reg::findModule(ModuleKind::Transport, "shm", c);
  auto host = reg::findModule(ModuleKind::Collectives, "host", c);
  BOOST_TEST((tcp.info && tcp.info->createBootstrap && tcp.path.empty()));
  BOOST_TEST((shm.info && shm.info->createTransport));
  BOOST_TEST((host.info && host.info->createCollectives));
  // A name of another kind is not found as this kind.
  BOOST_TEST(!reg::findModule(ModuleKind::Transport, "tcp", c).info);
  auto cuda = reg::findModule(ModuleKind::Collectives, "nosuchcollectives", c);
  BOOST_TEST(!cuda.info);
  BOOST_TEST(cuda.error.find("strata-collectives-nosuchcollectives.so") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(missing_module_names_the_file_and_the_search_path) {
  Config c = withModules();
  auto e = expectError([&] { reg::createBackend("nosuchbackend", c); });
  BOOST_TEST(static_cast<int>(e.code()) == static_cast<int>(ErrorCode::NotSupported));
  std::string msg = e.what();
  BOOST_TEST(msg.find("strata-bootstrap-nosuchbackend.so") != std::string::npos);
  BOOST_TEST(msg.find(TEST_MODULE_DIR) != std::string::npos);
}

BOOST_AUTO_TEST_CASE(asking_for_a_missing_pmix_is_a_clear_error) {
  Config c;
  c.set("module.path", "/nonexistent-strata-modules");
  c.set("bootstrap.backend", "pmix");
  auto e = expectError([&] { strata::Bootstrap::create(c); });
  BOOST_TEST(static_cast<int>(e.code()) == static_cast<int>(ErrorCode::NotSupported));
  BOOST_TEST(std::string(e.what()).find("strata-bootstrap-pmix.so") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(auto_picks_tcp_without_a_pmix_server) {
  Config c = withModules();
  BOOST_TEST(reg::resolveBackendName(c) == "tcp");
  c.set("bootstrap.backend", "tcp");
  BOOST_TEST(reg::resolveBackendName(c) == "tcp");
}

BOOST_AUTO_TEST_CASE(single_rank_tcp_bootstrap) {
  Config c;
  auto b = strata::Bootstrap::create(c);
  BOOST_TEST(b->backend() == "tcp");
  BOOST_TEST(b->rank() == 0);
  BOOST_TEST(b->size() == 1);
  int v = 42;
  b->allGather(&v, sizeof v);
  b->broadcast(&v, sizeof v, 0);
  b->barrier();
  BOOST_TEST(v == 42);
  auto e = expectError([&] { b->send(0, 1, &v, sizeof v); });
  BOOST_TEST(static_cast<int>(e.code()) == static_cast<int>(ErrorCode::InvalidArgument));
  e = expectError([&] { b->recv(3, 1, &v, sizeof v); });
  BOOST_TEST(static_cast<int>(e.code()) == static_cast<int>(ErrorCode::InvalidArgument));
  e = expectError([&] { b->broadcast(&v, sizeof v, 1); });
  BOOST_TEST(static_cast<int>(e.code()) == static_cast<int>(ErrorCode::InvalidArgument));
}

BOOST_AUTO_TEST_CASE(module_path_comes_first_once_each) {
  Config c;
  c.set("module.path", std::string(TEST_MODULE_DIR) + "::/nonexistent-a:" + TEST_MODULE_DIR);
  auto dirs = reg::moduleSearchPath(c);
  BOOST_REQUIRE(dirs.size() >= 2u);
  BOOST_TEST(dirs[0].dir == TEST_MODULE_DIR);
  BOOST_TEST(dirs[0].origin == "module.path");
  BOOST_TEST(dirs[1].dir == "/nonexistent-a");
  size_t fromConfig = 0;
  for (const auto& d : dirs) {
    BOOST_TEST_MESSAGE(d.origin << ": " << d.dir);
    if (d.origin == "module.path") ++fromConfig;
    BOOST_TEST(!d.dir.empty());
  }
  BOOST_TEST(fromConfig == 2u);  // the repeated directory and the empty entry are dropped
  auto plain = reg::modulePath(c);
  BOOST_REQUIRE(plain.size() == dirs.size());
  for (size_t i = 0; i < dirs.size(); ++i) BOOST_TEST(plain[i] == dirs[i].dir);
}

// This program links strata's static archive: the code's file is the program itself, which is
// not a libstrata, so only module.path and the install's module directory are searched.
BOOST_AUTO_TEST_CASE(static_archive_program_is_not_the_build_tree_library) {
  std::error_code ec;
  auto self = std::filesystem::canonical("/proc/self/exe", ec);
  BOOST_REQUIRE(!ec);
  BOOST_TEST(reg::libraryFile() == self.string());
  BOOST_TEST(!reg::isBuildTreeLibrary());
  for (const auto& d : reg::moduleSearchPath(Config{})) {
    BOOST_TEST(d.origin == "install prefix", d.dir);
  }
}
