// The fabric transport, part of test_fabric_transport.cpp's suite: libfabric's shm regions in
// /dev/shm and their sweep (fabric_shm_regions.cpp), no leaks after 100 cycles, and last a write
// bandwidth report (printed, never a pass/fail check).

#include <boost/test/unit_test.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>

#include "backends/transport/fabric/fabric_records.hpp"
#include "backends/transport/fabric/fabric_shm_regions.hpp"
#include "tests/transport/fabric/fabric_fixtures.hpp"

namespace fabric = strata::fabric;

// ---- libfabric shm regions in /dev/shm and their sweep (fabric_shm_regions.cpp) ----

namespace {

// A pid that no process of this namespace has now: a child that has exited and been reaped.
pid_t deadPid() {
  pid_t pid = fork();
  BOOST_REQUIRE(pid >= 0);
  if (pid == 0) _exit(0);
  int status = 0;
  BOOST_REQUIRE(waitpid(pid, &status, 0) == pid);
  return pid;
}

void touch(const std::string& path) {
  int fd = ::open(path.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
  BOOST_REQUIRE_MESSAGE(fd >= 0, path << ": " << std::strerror(errno));
  ::close(fd);
}

std::string legacyShmName(pid_t pid) {  // libfabric's own "<pid>:<uid>:<n>"
  return std::to_string(pid) + ":" + std::to_string(geteuid()) + ":0";
}

}  // namespace

BOOST_AUTO_TEST_CASE(shm_region_names) {
  using fabric::parseShmRegionName;
  auto name = fabric::shmRegionName(4026531836u, 1234, 7);
  BOOST_TEST(name == "strata-fabric-4026531836-1234-7");
  auto parsed = parseShmRegionName(name);
  BOOST_TEST_REQUIRE(parsed.has_value());
  BOOST_TEST(parsed->pidns == 4026531836u);
  BOOST_TEST(parsed->pid == 1234);
  BOOST_TEST(parsed->index == 7u);
  for (const char* bad :
       {"1234:1000:0", "strata-fabric-1-2", "strata-fabric-1-2-3x", "strata-fabric-0-2-3",
        "strata-fabric-1-0-3", "strata-fabric--1-2-3", "strata-fabric-1-2--3",
        "strata-fabric-1-9999999999-3", "strata-1-2-3", ""}) {
    BOOST_TEST(!parseShmRegionName(bad).has_value(), bad);
  }
  BOOST_TEST(fabric::pidNamespace() != 0u);
}

// Containers may share /dev/shm across PID namespaces: a pid from another namespace says
// nothing about the process here, so only files of this namespace may be swept.
BOOST_AUTO_TEST_CASE(sweep_judges_only_its_own_pid_namespace) {
  char tmpl[] = "/tmp/strata-fabric-sweep-XXXXXX";
  BOOST_REQUIRE(mkdtemp(tmpl));
  const std::string dir = tmpl;
  const uint64_t ns = fabric::pidNamespace();
  const pid_t dead = deadPid();
  const std::string deadHere = fabric::shmRegionName(ns, dead, 0);
  const std::string aliveHere = fabric::shmRegionName(ns, getpid(), 1);
  const std::string deadElsewhere = fabric::shmRegionName(ns + 1, dead, 0);
  const std::string legacy = legacyShmName(dead);
  const std::string notAFile = fabric::shmRegionName(ns, dead, 2);
  for (const auto& n : {deadHere, aliveHere, deadElsewhere, legacy}) touch(dir + "/" + n);
  BOOST_REQUIRE(::mkdir((dir + "/" + notAFile).c_str(), 0700) == 0);

  BOOST_TEST(fabric::sweepStaleShmRegions(dir, ns) == 1u);
  BOOST_TEST(!std::filesystem::exists(dir + "/" + deadHere));
  BOOST_TEST(std::filesystem::exists(dir + "/" + aliveHere));
  BOOST_TEST(std::filesystem::exists(dir + "/" + deadElsewhere));
  BOOST_TEST(std::filesystem::exists(dir + "/" + legacy));
  BOOST_TEST(std::filesystem::exists(dir + "/" + notAFile));
  BOOST_TEST(fabric::sweepStaleShmRegions(dir, 0) == 0u);  // namespace unknown: nothing
  std::filesystem::remove_all(dir);
}

// The same through the module on /dev/shm (shm provider, which sweeps at start-up), and the
// name the module gives its own endpoint. Before the namespace was recorded, the module removed
// every "<pid>:<n>:<n>" file whose pid it could not see, a live one of another namespace too.
BOOST_AUTO_TEST_CASE(shm_provider_sweeps_only_its_own_namespace) {
  if (provider() != "shm") {
    BOOST_TEST_MESSAGE("only with the shm provider");
    return;
  }
  const std::string dir = "/dev/shm/";
  const uint64_t ns = fabric::pidNamespace();
  const pid_t dead = deadPid();
  const std::string deadHere = fabric::shmRegionName(ns, dead, 0);
  const std::string deadElsewhere = fabric::shmRegionName(ns + 1, dead, 0);
  const std::string legacy = legacyShmName(dead);
  for (const auto& n : {deadHere, deadElsewhere, legacy}) touch(dir + n);

  auto t = makeTransport(0);
  bool deadHereGone = !std::filesystem::exists(dir + deadHere);
  bool deadElsewhereKept = std::filesystem::exists(dir + deadElsewhere);
  bool legacyKept = std::filesystem::exists(dir + legacy);
  for (const auto& n : {deadHere, deadElsewhere, legacy}) std::filesystem::remove(dir + n);
  BOOST_TEST(deadHereGone);
  BOOST_TEST(deadElsewhereKept);
  BOOST_TEST(legacyKept);

  auto record = fabric::decodeEndpoint(t->endpoint(), 0);
  std::string own(record.address.begin(), record.address.end());
  own = own.c_str();  // the address is the NUL-terminated endpoint name
  auto parsed = fabric::parseShmRegionName(own);
  BOOST_TEST_REQUIRE(parsed.has_value(), "endpoint name " << own);
  BOOST_TEST(parsed->pidns == ns);
  BOOST_TEST(parsed->pid == getpid());
  BOOST_TEST(std::filesystem::exists(dir + own));
}

BOOST_AUTO_TEST_CASE(no_leaks_after_100_cycles) {
  auto cycle = [] {
    Pair p(8192, 8192);
    fillPattern(p.src.data, 8192, 5);
    p.conn->write(p.remoteRef(), 0, p.local(), 0, 8192);
    p.conn->updateAndSync(p.remoteRef(), 8184, 1);
    p.conn->flush(20);
    BOOST_REQUIRE(checkPattern(p.dst.data, 8184, 5) == 8184u);
    BOOST_REQUIRE(p.a->stats().registrations == 1u);
    BOOST_REQUIRE(p.a->stats().imports == 1u);
    BOOST_REQUIRE(p.a->stats().connections == 1u);
    p.conn.reset();
    p.remote.reset();
    p.srcMem.reset();
    BOOST_REQUIRE(p.a->stats().registrations == 0u);
    BOOST_REQUIRE(p.a->stats().imports == 0u);
    BOOST_REQUIRE(p.a->stats().connections == 0u);
  };
  cycle();  // libfabric keeps some process-wide state after its first use
  size_t before = countOpenFds();
  for (int i = 0; i < 100; ++i) cycle();
  size_t after = countOpenFds();
  BOOST_TEST(after == before, "open fds " << before << " -> " << after);
}

BOOST_AUTO_TEST_CASE(write_bandwidth) {
  // Measured, printed, never asserted (design.md: timings belong in benchmarks).
  constexpr size_t kTotal = size_t{512} << 20;
  for (size_t size : {size_t{1} << 20, size_t{16} << 20}) {
    Pair p(size, size);
    std::memset(p.src.data, 7, size);
    p.conn->write(p.remoteRef(), 0, p.local(), 0, size);  // warm-up, connection set-up
    p.conn->flush(20);
    size_t iters = kTotal / size;
    auto start = std::chrono::steady_clock::now();
    for (size_t i = 0; i < iters; ++i) {
      p.conn->write(p.remoteRef(), 0, p.local(), 0, size);
      if (i % 8 == 7) p.conn->flush(60);
    }
    p.conn->flush(60);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("fabric write bandwidth, provider %s, %zu MiB writes: %.2f GB/s (%zu writes)\n",
                provider().c_str(), size >> 20, static_cast<double>(size * iters) / s / 1e9, iters);
  }
}
