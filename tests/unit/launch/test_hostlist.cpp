// Slurm host lists, tasks-per-node and reserved-port syntaxes.
#define BOOST_TEST_MODULE hostlist
#include <boost/test/unit_test.hpp>

#include <chrono>
#include <string>
#include <vector>

#include <strata/error.hpp>

#include "launch/hostlist.hpp"

using namespace strata;
using Hosts = std::vector<std::string>;

namespace {

template <typename Fn>
void expectInvalid(Fn&& fn, std::string_view fragment = {}) {
  try {
    fn();
    BOOST_ERROR("no exception thrown");
  } catch (const Error& e) {
    BOOST_TEST(static_cast<int>(e.code()) == static_cast<int>(ErrorCode::InvalidArgument),
               toString(e.code()) << ": " << e.what());
    BOOST_TEST(std::string(e.what()).find(fragment) != std::string::npos,
               "'" << fragment << "' missing from: " << e.what());
  }
}

}  // namespace

BOOST_AUTO_TEST_SUITE(expand)

BOOST_AUTO_TEST_CASE(ranges_and_singles) {
  BOOST_TEST(hostlist::expand("n[01-03,07]") == (Hosts{"n01", "n02", "n03", "n07"}),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(plain_names) {
  BOOST_TEST(hostlist::expand("node1,node2") == (Hosts{"node1", "node2"}),
             boost::test_tools::per_element());
  BOOST_TEST(hostlist::expand("localhost") == (Hosts{"localhost"}),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(several_groups_first_is_outermost) {
  BOOST_TEST(hostlist::expand("rack[1-2]-n[1-2]") ==
                 (Hosts{"rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"}),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(zero_padding_kept) {
  BOOST_TEST(hostlist::expand("gpu[009-011]") == (Hosts{"gpu009", "gpu010", "gpu011"}),
             boost::test_tools::per_element());
  // Width comes from the lower bound; wider numbers are not cut.
  BOOST_TEST(hostlist::expand("n[8-10]") == (Hosts{"n8", "n9", "n10"}),
             boost::test_tools::per_element());
  BOOST_TEST(hostlist::expand("n[98-100]") == (Hosts{"n98", "n99", "n100"}),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(mixed_list) {
  BOOST_TEST(hostlist::expand("a[1-3],b") == (Hosts{"a1", "a2", "a3", "b"}),
             boost::test_tools::per_element());
  BOOST_TEST(hostlist::expand("n[01-03,07],gpu-a[1-2]-ib,login") ==
                 (Hosts{"n01", "n02", "n03", "n07", "gpu-a1-ib", "gpu-a2-ib", "login"}),
             boost::test_tools::per_element());
  BOOST_TEST(hostlist::expand("n[5]") == (Hosts{"n5"}), boost::test_tools::per_element());
  BOOST_TEST(hostlist::expand("[1-2]x") == (Hosts{"1x", "2x"}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(errors) {
  expectInvalid([] { hostlist::expand("n[1-"); }, "no matching ']'");
  expectInvalid([] { hostlist::expand("n[3-1]"); }, "reversed range '3-1'");
  expectInvalid([] { hostlist::expand("n[]"); }, "empty brackets");
  expectInvalid([] { hostlist::expand("n]"); }, "no matching '['");
  expectInvalid([] { hostlist::expand("n[a-b]"); }, "'a-b' is not a number");
  expectInvalid([] { hostlist::expand(""); }, "empty");
  expectInvalid([] { hostlist::expand("n[1,,2]"); }, "empty range");
  expectInvalid([] { hostlist::expand("n[1-2-3]"); }, "not a number");
  expectInvalid([] { hostlist::expand("n[-1]"); }, "not a number");
  expectInvalid([] { hostlist::expand("n[[1]]"); }, "no matching");
  expectInvalid([] { hostlist::expand("a,,b"); }, "empty host name");
  expectInvalid([] { hostlist::expand("a,"); }, "empty host name");
  expectInvalid([] { hostlist::expand("a b"); }, "whitespace");
  expectInvalid([] { hostlist::expand("n[99999999999999999999999]"); }, "not a number");
}

BOOST_AUTO_TEST_CASE(max_hosts) {
  BOOST_TEST(hostlist::expand("n[1-4]", 4).size() == 4u);
  expectInvalid([] { hostlist::expand("n[1-5]", 4); }, "more than 4 hosts");
  expectInvalid([] { hostlist::expand("n[1-3],m[1-2]", 4); }, "more than 4 hosts");
  expectInvalid([] { hostlist::expand("a[1-100000]b[1-100000]c[1-100000]"); }, "more than");
  expectInvalid([] { hostlist::expand("n[0-18446744073709551615]"); }, "more than");
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(first)

BOOST_AUTO_TEST_CASE(first_host) {
  BOOST_TEST(hostlist::first("n[01-03,07]") == "n01");
  BOOST_TEST(hostlist::first("rack[2-3]-n[5-6],x") == "rack2-n5");
  BOOST_TEST(hostlist::first("localhost") == "localhost");
  BOOST_TEST(hostlist::first("gpu[009-011]") == "gpu009");
}

BOOST_AUTO_TEST_CASE(huge_list_not_expanded) {
  auto start = std::chrono::steady_clock::now();
  BOOST_TEST(hostlist::first("n[1-1000000000]") == "n1");
  BOOST_TEST(hostlist::first("a[1-1000000000]b[1-1000000000]") == "a1b1");
  // Generous: expanding would take minutes and gigabytes.
  std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
  BOOST_TEST(took.count() < 5.0);
}

BOOST_AUTO_TEST_CASE(errors) {
  expectInvalid([] { hostlist::first(""); }, "empty");
  expectInvalid([] { hostlist::first("n[1-"); }, "no matching");
  // The rest of the list is checked too, so first() and expand() agree on what is valid.
  expectInvalid([] { hostlist::first("n1,m[3-1]"); }, "reversed");
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(tasks_per_node)

BOOST_AUTO_TEST_CASE(valid) {
  BOOST_TEST(hostlist::tasksPerNode("2(x3),1") == (std::vector<int>{2, 2, 2, 1}),
             boost::test_tools::per_element());
  BOOST_TEST(hostlist::tasksPerNode("4") == (std::vector<int>{4}),
             boost::test_tools::per_element());
  BOOST_TEST(hostlist::tasksPerNode("1,3(x2)") == (std::vector<int>{1, 3, 3}),
             boost::test_tools::per_element());
  BOOST_TEST(hostlist::tasksPerNode("8(x1)") == (std::vector<int>{8}),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(garbage) {
  for (const char* bad : {"", "x", "2(3)", "2(x)", "2(x0)", "2(x3", "(x3)", "2,", ",2", "2,,1",
                          "-1", "2(x-1)", "2 (x3)", "2(x3)1", "99999999999", "1(x4000000000)"}) {
    BOOST_TEST_CONTEXT("input '" << bad << "'") {
      expectInvalid([&] { hostlist::tasksPerNode(bad); }, "tasks-per-node");
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(ports)

BOOST_AUTO_TEST_CASE(valid) {
  BOOST_TEST(
      hostlist::ports("12000-12003,12010") == (std::vector<int>{12000, 12001, 12002, 12003, 12010}),
      boost::test_tools::per_element());
  BOOST_TEST(hostlist::ports("1") == (std::vector<int>{1}), boost::test_tools::per_element());
  BOOST_TEST(hostlist::ports("65535") == (std::vector<int>{65535}),
             boost::test_tools::per_element());
  BOOST_TEST(hostlist::ports("20001-20002") == (std::vector<int>{20001, 20002}),
             boost::test_tools::per_element());
  BOOST_TEST(hostlist::ports("1-65535").size() == 65535u);
}

BOOST_AUTO_TEST_CASE(errors) {
  expectInvalid([] { hostlist::ports("12003-12000"); }, "reversed");
  expectInvalid([] { hostlist::ports("0"); }, "outside 1..65535");
  expectInvalid([] { hostlist::ports("65536"); }, "outside 1..65535");
  expectInvalid([] { hostlist::ports("65530-70000"); }, "outside 1..65535");
  for (const char* bad : {"", "abc", "12000-", "-12000", "12000,,12001", "12000,", "1 2",
                          "12000-12001-12002", "+80", "1-65535,1-65535"}) {
    BOOST_TEST_CONTEXT("input '" << bad << "'") {
      expectInvalid([&] { hostlist::ports(bad); }, "port list");
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()
