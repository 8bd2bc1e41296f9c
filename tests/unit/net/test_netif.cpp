// Interface selection: NCCL_SOCKET_IFNAME grammar, select() on hand-built candidate lists
// (default order, hint rule, families), and the real machine's loopback.
#define BOOST_TEST_MODULE netif
#include <boost/test/unit_test.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cstring>
#include <string>
#include <vector>

#include <strata/error.hpp>

#include "net/netif.hpp"

using namespace strata;
using netif::Interface;

namespace {

Interface make(const std::string& name, const std::string& addr, unsigned prefix) {
  Interface itf;
  itf.name = name;
  itf.prefixLen = prefix;
  itf.loopback = name == "lo";
  if (addr.find(':') == std::string::npos) {
    sockaddr_in sin{};
    sin.sin_family = AF_INET;
    BOOST_REQUIRE(inet_pton(AF_INET, addr.c_str(), &sin.sin_addr) == 1);
    std::memcpy(&itf.addr, &sin, sizeof sin);
    itf.addrLen = sizeof sin;
    itf.family = AF_INET;
  } else {
    sockaddr_in6 sin6{};
    sin6.sin6_family = AF_INET6;
    BOOST_REQUIRE(inet_pton(AF_INET6, addr.c_str(), &sin6.sin6_addr) == 1);
    std::memcpy(&itf.addr, &sin6, sizeof sin6);
    itf.addrLen = sizeof sin6;
    itf.family = AF_INET6;
  }
  return itf;
}

sockaddr_storage sockaddrOf(const std::string& addr) {
  return make("hint", addr, 0).addr;
}

const sockaddr* sa(const sockaddr_storage& s) {
  return reinterpret_cast<const sockaddr*>(&s);
}

std::string pick(std::string_view spec, const std::vector<Interface>& c, int family = AF_UNSPEC,
                 const sockaddr* hint = nullptr) {
  auto itf = netif::select(spec, family, hint, c);
  return itf.name + " " + itf.address();
}

template <typename Fn>
std::string expectError(ErrorCode code, Fn&& fn) {
  try {
    fn();
    BOOST_ERROR("no exception thrown");
  } catch (const Error& e) {
    BOOST_TEST(static_cast<int>(e.code()) == static_cast<int>(code), toString(e.code())
                                                                         << ": " << e.what());
    return e.what();
  }
  return {};
}

// A typical node: loopback, docker bridge, Ethernet (v6 listed before v4), InfiniBand, libvirt.
std::vector<Interface> node() {
  return {make("lo", "127.0.0.1", 8),         make("lo", "::1", 128),
          make("docker0", "172.17.0.1", 16),  make("eth0", "2001:db8::5", 64),
          make("eth0", "10.0.0.5", 24),       make("ib0", "192.168.10.2", 24),
          make("virbr0", "192.168.122.1", 24)};
}

}  // namespace

BOOST_AUTO_TEST_SUITE(grammar)

BOOST_AUTO_TEST_CASE(prefix_list) {
  auto s = netif::parseSpec("eth,ib");
  BOOST_TEST(!s.negate);
  BOOST_TEST(!s.exact);
  BOOST_TEST(s.names == (std::vector<std::string>{"eth", "ib"}), boost::test_tools::per_element());
  BOOST_TEST(netif::matches(s, "eth0"));
  BOOST_TEST(netif::matches(s, "ib1"));
  BOOST_TEST(!netif::matches(s, "veth0"));
  BOOST_TEST(!netif::matches(s, "lo"));
}

BOOST_AUTO_TEST_CASE(negated) {
  auto s = netif::parseSpec("^docker");
  BOOST_TEST(s.negate);
  BOOST_TEST(!s.exact);
  BOOST_TEST(!netif::matches(s, "docker0"));
  BOOST_TEST(netif::matches(s, "eth0"));
}

BOOST_AUTO_TEST_CASE(exact) {
  auto s = netif::parseSpec("=eth0");
  BOOST_TEST(s.exact);
  BOOST_TEST(!s.negate);
  BOOST_TEST(netif::matches(s, "eth0"));
  BOOST_TEST(!netif::matches(s, "eth01"));
  BOOST_TEST(!netif::matches(s, "eth"));
}

BOOST_AUTO_TEST_CASE(negated_exact) {
  auto s = netif::parseSpec("^=docker0,lo");
  BOOST_TEST(s.negate);
  BOOST_TEST(s.exact);
  BOOST_TEST(!netif::matches(s, "docker0"));
  BOOST_TEST(!netif::matches(s, "lo"));
  BOOST_TEST(netif::matches(s, "docker01"));
  BOOST_TEST(netif::matches(s, "eth0"));
}

BOOST_AUTO_TEST_CASE(spaces_around_names) {
  auto s = netif::parseSpec(" eth , ib ");
  BOOST_TEST(s.names == (std::vector<std::string>{"eth", "ib"}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(empty_spec_is_no_preference) {
  auto s = netif::parseSpec("");
  BOOST_TEST(s.names.empty());
  BOOST_TEST(!s.negate);
}

BOOST_AUTO_TEST_CASE(errors) {
  for (const char* bad : {"eth,,ib", "^", "=", "^=", ",", "eth,", ",eth", "=^eth", "eth=0"}) {
    BOOST_TEST_CONTEXT("spec '" << bad << "'") {
      auto msg = expectError(ErrorCode::InvalidConfig, [&] { netif::parseSpec(bad); });
      BOOST_TEST(msg.find("interface spec") != std::string::npos, msg);
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(select_synthetic)

BOOST_AUTO_TEST_CASE(spec_ipv4_first) {
  auto c = node();
  BOOST_TEST(pick("eth", c) == "eth0 10.0.0.5");
  BOOST_TEST(pick("eth", c, AF_INET6) == "eth0 2001:db8::5");
  BOOST_TEST(pick("=lo", c) == "lo 127.0.0.1");
  BOOST_TEST(pick("lo", c, AF_INET6) == "lo ::1");
  BOOST_TEST(pick("ib,eth", c) == "eth0 10.0.0.5");  // candidate order, not spec order
  BOOST_TEST(pick("^docker,lo,eth", c) == "ib0 192.168.10.2");
  BOOST_TEST(pick("^=lo", c) == "docker0 172.17.0.1");
}

BOOST_AUTO_TEST_CASE(spec_matches_nothing) {
  auto c = node();
  auto msg = expectError(ErrorCode::InvalidConfig, [&] { netif::select("eth9", 0, nullptr, c); });
  for (const char* f : {"bootstrap.tcp.interface 'eth9' matches no interface",
                        "present: lo "
                        "(127.0.0.1, ::1), docker0 (172.17.0.1), eth0 (2001:db8::5, 10.0.0.5)",
                        "STRATA_BOOTSTRAP_TCP_INTERFACE"}) {
    BOOST_TEST(msg.find(f) != std::string::npos, "'" << f << "' missing from: " << msg);
  }
  msg =
      expectError(ErrorCode::InvalidConfig, [&] { netif::select("docker", AF_INET6, nullptr, c); });
  BOOST_TEST(msg.find("matches no IPv6 interface") != std::string::npos, msg);
  expectError(ErrorCode::InvalidConfig,
              [&] { netif::select("^eth,lo,ib,docker,virbr", 0, nullptr, c); });
  expectError(ErrorCode::InvalidConfig, [&] { netif::select("eth,,", 0, nullptr, c); });
}

BOOST_AUTO_TEST_CASE(default_order) {
  auto c = node();
  BOOST_TEST(pick("", c) == "ib0 192.168.10.2");
  std::erase_if(c, [](const Interface& i) { return i.name == "ib0"; });
  BOOST_TEST(pick("", c) == "eth0 10.0.0.5");
  BOOST_TEST(pick("", c, AF_INET6) == "eth0 2001:db8::5");
  std::erase_if(c, [](const Interface& i) { return i.name == "eth0"; });
  BOOST_TEST(pick("", c) == "docker0 172.17.0.1");
  BOOST_TEST(pick("", c, AF_INET6) == "lo ::1");
  std::erase_if(c, [](const Interface& i) { return i.name == "docker0"; });
  BOOST_TEST(pick("", c) == "lo 127.0.0.1");
  std::erase_if(c, [](const Interface& i) { return i.name == "lo"; });
  BOOST_TEST(pick("", c) == "virbr0 192.168.122.1");
  // A name that fits none of NCCL's prefixes is an ordinary interface, ahead of docker.
  BOOST_TEST(pick("", {make("docker0", "172.17.0.1", 16), make("enp3s0", "10.1.0.2", 16)}) ==
             "enp3s0 10.1.0.2");
  BOOST_TEST(pick("  ", {make("lo", "127.0.0.1", 8), make("virbr0", "192.168.122.1", 24)}) ==
             "lo 127.0.0.1");
}

BOOST_AUTO_TEST_CASE(hint_subnet_rule) {
  auto c = node();
  auto root = sockaddrOf("127.0.0.1");
  BOOST_TEST(pick("", c, AF_UNSPEC, sa(root)) == "lo 127.0.0.1");
  auto ethPeer = sockaddrOf("10.0.0.77");
  BOOST_TEST(pick("", c, AF_UNSPEC, sa(ethPeer)) == "eth0 10.0.0.5");
  auto mapped = sockaddrOf("::ffff:10.0.0.77");
  BOOST_TEST(pick("", c, AF_UNSPEC, sa(mapped)) == "eth0 10.0.0.5");
  auto v6 = sockaddrOf("2001:db8::1234");
  BOOST_TEST(pick("", c, AF_UNSPEC, sa(v6)) == "eth0 2001:db8::5");
  auto loop6 = sockaddrOf("::1");
  BOOST_TEST(pick("", c, AF_UNSPEC, sa(loop6)) == "lo ::1");
  // Outside every subnet: the default order applies.
  auto elsewhere = sockaddrOf("10.0.1.1");
  BOOST_TEST(pick("", c, AF_UNSPEC, sa(elsewhere)) == "ib0 192.168.10.2");
  // An IPv4 hint cannot choose among IPv6 addresses.
  BOOST_TEST(pick("", c, AF_INET6, sa(root)) == "eth0 2001:db8::5");
  // A spec wins over the hint.
  BOOST_TEST(pick("eth", c, AF_UNSPEC, sa(root)) == "eth0 10.0.0.5");
  // A netmask of 0 (unknown) claims nothing.
  BOOST_TEST(pick("", {make("ib0", "192.168.10.2", 24), make("eth0", "10.0.0.5", 0)}, AF_UNSPEC,
                  sa(ethPeer)) == "ib0 192.168.10.2");
}

BOOST_AUTO_TEST_CASE(bad_family_and_empty_candidates) {
  expectError(ErrorCode::InvalidArgument, [] { netif::select("", AF_UNIX, nullptr, {}); });
  auto msg = expectError(ErrorCode::SystemError, [] { netif::select("", 0, nullptr, {}); });
  BOOST_TEST(msg.find("present: none") != std::string::npos, msg);
  expectError(ErrorCode::InvalidConfig, [] { netif::select("lo", 0, nullptr, {}); });
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(real_machine)

BOOST_AUTO_TEST_CASE(list_has_loopback) {
  auto all = netif::list();
  bool sawLo = false;
  for (const auto& i : all) {
    BOOST_TEST((i.family == AF_INET || i.family == AF_INET6));
    if (i.family == AF_INET6) {
      auto* a6 = reinterpret_cast<const sockaddr_in6*>(&i.addr);
      BOOST_TEST(!IN6_IS_ADDR_LINKLOCAL(&a6->sin6_addr), i.name << " " << i.address());
    }
    if (i.name == "lo" && i.address() == "127.0.0.1") {
      sawLo = true;
      BOOST_TEST(i.loopback);
      BOOST_TEST(i.prefixLen == 8u);
      BOOST_TEST(i.addrLen == sizeof(sockaddr_in));
    }
  }
  BOOST_TEST(sawLo);
}

BOOST_AUTO_TEST_CASE(select_lo) {
  BOOST_TEST(netif::select("lo").address() == "127.0.0.1");
  BOOST_TEST(netif::select("=lo", AF_INET).address() == "127.0.0.1");
  auto root = sockaddrOf("127.0.0.1");
  BOOST_TEST(netif::select("", AF_UNSPEC, sa(root)).name == "lo");
  bool hasV6Loopback = false;
  for (const auto& i : netif::list()) hasV6Loopback |= i.name == "lo" && i.address() == "::1";
  if (hasV6Loopback) {
    BOOST_TEST(netif::select("lo", AF_INET6).address() == "::1");
  } else {
    BOOST_TEST_MESSAGE("lo has no ::1 here; IPv6 loopback case not checked");
  }
}

BOOST_AUTO_TEST_CASE(select_missing_interface) {
  auto msg = expectError(ErrorCode::InvalidConfig, [] { netif::select("=nosuchif0"); });
  BOOST_TEST(msg.find("'=nosuchif0' matches no interface") != std::string::npos, msg);
  BOOST_TEST(msg.find("lo (127.0.0.1") != std::string::npos, msg);
}

BOOST_AUTO_TEST_SUITE_END()
