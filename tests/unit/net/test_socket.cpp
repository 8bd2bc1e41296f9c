// Sockets with deadlines (lib/net/socket.cpp): address parsing, IPv4 and IPv6 loopback round
// trips, read timeouts and a closed peer, connect retries, a taken port.
#define BOOST_TEST_MODULE socket
#include <boost/test/unit_test.hpp>

#include <sys/socket.h>

#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include <strata/error.hpp>

#include "net/socket.hpp"
#include "tests/harness/in_process_ranks.hpp"
#include "tests/harness/single_rank.hpp"

using namespace strata;
using strata::testing::expectError;
using strata::testing::is;
using strata::testing::LoopbackListener;
using Clock = std::chrono::steady_clock;

BOOST_AUTO_TEST_CASE(host_port_parsing) {
  std::string host;
  uint16_t port = 0;
  net::splitHostPort("node01:29500", host, port, "t");
  BOOST_TEST(host == "node01");
  BOOST_TEST(port == 29500);
  net::splitHostPort("[fe80::1]:7", host, port, "t");
  BOOST_TEST(host == "fe80::1");
  BOOST_TEST(port == 7);
  for (const char* bad : {"", "node", "node:", ":80", "node:0", "node:65536", "node:8x",
                          "fe80::1:80", "[::1]80", "[::1"}) {
    BOOST_TEST(is(expectError([&] { net::splitHostPort(bad, host, port, "t"); }),
                  ErrorCode::InvalidConfig),
               bad);
  }
  auto a = net::SockAddr::parseNumeric("127.0.0.1:5000");
  BOOST_TEST(a.toString() == "127.0.0.1:5000");
  BOOST_TEST(a.isLoopback());
  auto b = net::SockAddr::parseNumeric("[::1]:5000");
  BOOST_TEST(b.toString() == "[::1]:5000");
  BOOST_TEST(is(expectError([] { net::SockAddr::parseNumeric("localhost:1"); }),
                ErrorCode::InvalidArgument));
  auto r = net::resolve("localhost", 80);
  BOOST_TEST(!r.empty());
  BOOST_TEST(r.front().isLoopback());
}

BOOST_AUTO_TEST_CASE(ipv4_and_ipv6_round_trip) {
  for (int family : {AF_INET, AF_INET6}) {
    std::unique_ptr<LoopbackListener> l;
    try {
      l = std::make_unique<LoopbackListener>(family);
    } catch (const Error& e) {
      BOOST_TEST_MESSAGE("no IPv6 loopback here: " << e.what());
      continue;
    }
    auto c = net::connectWithRetry({l->addr}, Deadline::after(5), "test connect");
    auto s = l->accept();
    std::vector<uint8_t> out(3 << 20), in(out.size());
    for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<uint8_t>(i * 7);
    std::thread w(
        [&] { net::writeFull(c.get(), out.data(), out.size(), Deadline::after(10), "w"); });
    net::readFull(s.get(), in.data(), in.size(), Deadline::after(10), "r");
    w.join();
    BOOST_TEST((in == out));
  }
}

BOOST_AUTO_TEST_CASE(read_timeout_and_peer_close) {
  LoopbackListener l;
  auto c = net::connectWithRetry({l.addr}, Deadline::after(5), "test connect");
  auto s = l.accept();
  uint8_t buf[4];
  auto t0 = Clock::now();
  auto e = expectError([&] { net::readFull(s.get(), buf, 4, Deadline::after(0.3), "r"); });
  double took = std::chrono::duration<double>(Clock::now() - t0).count();
  BOOST_TEST(is(e, ErrorCode::Timeout));
  BOOST_TEST(took >= 0.3);
  BOOST_TEST(took < 3.0);
  c.reset();
  e = expectError([&] { net::readFull(s.get(), buf, 4, Deadline::after(5), "r"); });
  BOOST_TEST(is(e, ErrorCode::PeerLost));
}

BOOST_AUTO_TEST_CASE(connect_retries_until_the_deadline) {
  LoopbackListener l;
  auto addr = l.addr;
  l.fd.reset();  // nothing listens there now
  auto t0 = Clock::now();
  auto e = expectError([&] { net::connectWithRetry({addr}, Deadline::after(0.5), "test"); });
  double took = std::chrono::duration<double>(Clock::now() - t0).count();
  BOOST_TEST(is(e, ErrorCode::Timeout));
  BOOST_TEST(took >= 0.5);
  BOOST_TEST(took < 3.0);
  BOOST_TEST(std::string(e.what()).find(addr.toString()) != std::string::npos);
}

BOOST_AUTO_TEST_CASE(listen_on_a_taken_port_says_so) {
  LoopbackListener l;
  auto e = expectError([&] {
    // SO_REUSEADDR does not allow two listeners on one port.
    net::listenOn(l.addr);
  });
  BOOST_TEST(is(e, ErrorCode::SystemError));
  BOOST_TEST(std::string(e.what()).find(l.addr.toString()) != std::string::npos);
}
