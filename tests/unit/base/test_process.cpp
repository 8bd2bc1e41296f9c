// lib/base/process.cpp: CPU lists and binding a thread (transport.proxy_cpus).

#define BOOST_TEST_MODULE process
#include <boost/test/unit_test.hpp>

#include <sched.h>

#include <thread>

#include <strata/error.hpp>

#include "base/process.hpp"

using namespace strata;

BOOST_AUTO_TEST_CASE(cpu_lists_parse_and_print) {
  BOOST_TEST(process::parseCpuList("0-3,8,10-11", "k") == (std::vector<int>{0, 1, 2, 3, 8, 10, 11}),
             boost::test_tools::per_element());
  BOOST_TEST(process::parseCpuList(" 5 , 1-2,2", "k") == (std::vector<int>{1, 2, 5}),
             boost::test_tools::per_element());
  BOOST_TEST(process::cpuListText({0, 1, 2, 3, 8, 10, 11}) == "0-3,8,10-11");
  BOOST_TEST(process::cpuListText({}) == "");
  for (const char* bad : {"", "a", "3-1", "1,,2", "-1", "1-", "70000", "1 2"}) {
    BOOST_TEST_CONTEXT(bad) {
      try {
        process::parseCpuList(bad, "transport.proxy_cpus");
        BOOST_TEST(false, "no error");
      } catch (const Error& e) {
        BOOST_TEST((e.code() == ErrorCode::InvalidConfig));
        BOOST_TEST(std::string(e.what()).find("transport.proxy_cpus") != std::string::npos);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(pinning_takes_the_allowed_cpus_only) {
  cpu_set_t mask;
  BOOST_REQUIRE(sched_getaffinity(0, sizeof mask, &mask) == 0);
  int first = -1;
  for (int c = 0; c < CPU_SETSIZE && first < 0; ++c) {
    if (CPU_ISSET(c, &mask)) first = c;
  }
  std::thread([&] {
    std::string why;
    // A CPU outside the mask is left out; the one inside is taken.
    BOOST_TEST(process::pinCurrentThread({first, CPU_SETSIZE + 5}, &why) == std::to_string(first));
    cpu_set_t now;
    BOOST_REQUIRE(sched_getaffinity(0, sizeof now, &now) == 0);
    BOOST_TEST(CPU_COUNT(&now) == 1);
    BOOST_TEST(CPU_ISSET(first, &now));
    // allowedCpus reads the thread's mask: now that one CPU.
    BOOST_TEST(process::allowedCpus() == std::vector<int>{first});
    // None inside: nothing bound, and why.
    BOOST_TEST(process::pinCurrentThread({CPU_SETSIZE + 5}, &why).empty());
    BOOST_TEST(why.find("mask") != std::string::npos, why);
    process::nameCurrentThread("a-name-longer-than-fifteen");
    char name[32] = {};
    pthread_getname_np(pthread_self(), name, sizeof name);
    BOOST_TEST(std::string(name) == "a-name-longer-t");
  }).join();
  // The calling thread kept its mask.
  cpu_set_t after;
  BOOST_REQUIRE(sched_getaffinity(0, sizeof after, &after) == 0);
  BOOST_TEST(CPU_EQUAL(&after, &mask));
  BOOST_TEST(static_cast<int>(process::allowedCpus().size()) == CPU_COUNT(&mask));
}
