#define BOOST_TEST_MODULE socket
#include <boost/test/unit_test.hpp>

#include <poll.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <optional>
#include <thread>

#include <strata/error.hpp>

#include "base/wire.hpp"
#include "mesh/rendezvous.hpp"
#include "net/handshake.hpp"
#include "net/socket.hpp"
#include "tests/harness/in_process_ranks.hpp"

using namespace strata;
using Clock = std::chrono::steady_clock;

namespace {

template <class F>
Error expectError(F f) {
  try {
    f();
  } catch (const Error& e) {
    return e;
  }
  BOOST_FAIL("expected a strata::Error");
  return Error(ErrorCode::Internal, "unreachable");
}

bool is(const Error& e, ErrorCode c) {
  return e.code() == c;
}

using Listener = testing::LoopbackListener;

}  // namespace

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
    std::unique_ptr<Listener> l;
    try {
      l = std::make_unique<Listener>(family);
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
  Listener l;
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
  Listener l;
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
  Listener l;
  auto e = expectError([&] {
    // SO_REUSEADDR does not allow two listeners on one port.
    net::listenOn(l.addr);
  });
  BOOST_TEST(is(e, ErrorCode::SystemError));
  BOOST_TEST(std::string(e.what()).find(l.addr.toString()) != std::string::npos);
}

namespace {

// Runs the listening side of a handshake to completion (or rejection).
handshake::ListenSide::State serve(net::Fd fd, const std::string& secret, double timeout,
                                   int* rank = nullptr) {
  handshake::ListenSide hs(std::move(fd), net::SockAddr(), secret, handshake::Purpose::Mesh, 0, 4,
                           Deadline::after(timeout));
  while (hs.state() == handshake::ListenSide::State::InProgress) {
    if (hs.fd() >= 0) {
      pollfd p{hs.fd(), POLLIN, 0};
      ::poll(&p, 1, 20);
    }
    hs.step();
  }
  if (rank) *rank = hs.peerRank();
  return hs.state();
}

}  // namespace

BOOST_AUTO_TEST_CASE(handshake_accepts_the_right_secret) {
  Listener l;
  auto c = net::connectWithRetry({l.addr}, Deadline::after(5), "c");
  auto s = l.accept();
  int rank = -1;
  std::thread server([&] { serve(std::move(s), "secret", 5, &rank); });
  handshake::connectSide(c.get(), "secret", handshake::Purpose::Mesh, 2, 4, 0, Deadline::after(5),
                         "c");
  server.join();
  BOOST_TEST(rank == 2);
}

BOOST_AUTO_TEST_CASE(handshake_rejects_a_wrong_secret_and_a_wrong_size) {
  for (int size : {4, 5}) {
    Listener l;
    auto c = net::connectWithRetry({l.addr}, Deadline::after(5), "c");
    auto s = l.accept();
    handshake::ListenSide::State st{};
    std::thread server([&] { st = serve(std::move(s), "secret", 5); });
    auto e = expectError([&] {
      handshake::connectSide(c.get(), size == 4 ? "wrong" : "secret", handshake::Purpose::Mesh, 1,
                             size, 0, Deadline::after(5), "c");
    });
    server.join();
    BOOST_TEST(is(e, ErrorCode::AuthFailed));
    BOOST_TEST((st == handshake::ListenSide::State::Rejected));
  }
}

BOOST_AUTO_TEST_CASE(handshake_drops_garbage_and_stalls_on_their_own_deadline) {
  Listener l;
  auto garbage = net::connectWithRetry({l.addr}, Deadline::after(5), "g");
  auto gs = l.accept();
  const char junk[] = "GET / HTTP/1.0\r\n\r\n";
  ::write(garbage.get(), junk, sizeof junk);
  auto t0 = Clock::now();
  BOOST_TEST((serve(std::move(gs), "s", 5) == handshake::ListenSide::State::Rejected));
  BOOST_TEST(std::chrono::duration<double>(Clock::now() - t0).count() < 1.0);

  auto staller = net::connectWithRetry({l.addr}, Deadline::after(5), "s");
  auto ss = l.accept();
  t0 = Clock::now();
  BOOST_TEST((serve(std::move(ss), "s", 0.3) == handshake::ListenSide::State::Rejected));
  double took = std::chrono::duration<double>(Clock::now() - t0).count();
  BOOST_TEST(took >= 0.3);
  BOOST_TEST(took < 3.0);
}

/// Options of a tcp rendezvous served on `l` with secret "secret".
rendezvous::Options rendezvousOptions(const Listener& l, int size, double connectTimeout,
                                      double handshakeTimeout) {
  rendezvous::Options o;
  o.backend = "tcp";
  o.root = l.addr.toString();
  o.secret = "secret";
  o.size = size;
  o.helloKind = 10;
  o.connectTimeout = connectTimeout;
  o.handshakeTimeout = handshakeTimeout;
  return o;
}

// A rank that authenticates and then sends no check-in record is closed after
// bootstrap.handshake_timeout, not kept (and polled every millisecond) until the rendezvous
// deadline.
BOOST_AUTO_TEST_CASE(rendezvous_closes_an_authenticated_rank_that_sends_no_record) {
  Listener l;
  net::setNonBlocking(l.fd.get());
  rendezvous::Options o = rendezvousOptions(l, 2, 3, 0.3);
  std::optional<Error> err;
  std::thread server([&] {
    try {
      rendezvous::serve(
          l.fd.get(), o, [](int, const std::vector<uint8_t>&) {},
          [](int) { return std::vector<uint8_t>{}; });
    } catch (const Error& e) {
      err = e;
    }
  });
  auto c = net::connectWithRetry({l.addr}, Deadline::after(5), "c");
  handshake::connectSide(c.get(), "secret", handshake::Purpose::Rendezvous, 1, 2, 0,
                         Deadline::after(5), "c");
  auto t0 = Clock::now();
  pollfd p{c.get(), POLLIN, 0};
  BOOST_TEST(::poll(&p, 1, 2500) == 1);
  char b = 0;
  BOOST_TEST(::recv(c.get(), &b, 1, MSG_DONTWAIT) == 0, "expected the server to close");
  double took = std::chrono::duration<double>(Clock::now() - t0).count();
  BOOST_TEST(took < 1.5, "closed after " << took << " s, the handshake timeout is 0.3 s");
  server.join();
  BOOST_REQUIRE(err.has_value());
  BOOST_TEST(is(*err, ErrorCode::Timeout));
}

// A second process that authenticates as rank 0 fails the rendezvous, naming it, instead of
// being counted in place of a real rank.
BOOST_AUTO_TEST_CASE(rendezvous_fails_on_a_second_rank_0) {
  Listener l;
  net::setNonBlocking(l.fd.get());
  rendezvous::Options o = rendezvousOptions(l, 2, 5, 5);
  std::optional<Error> err;
  std::thread server([&] {
    try {
      rendezvous::serve(
          l.fd.get(), o, [](int, const std::vector<uint8_t>&) {},
          [](int) { return std::vector<uint8_t>{}; });
    } catch (const Error& e) {
      err = e;
    }
  });
  auto rejected = expectError([&] {
    rendezvous::checkIn({l.addr}, o, 0, wire::encodeRecord(10, 1, std::vector<uint8_t>{}));
  });
  server.join();
  BOOST_REQUIRE(err.has_value());
  BOOST_TEST(is(*err, ErrorCode::InvalidConfig));
  BOOST_TEST(std::string(err->what()).find("rank 0 checked in twice") != std::string::npos,
             err->what());
  BOOST_TEST(is(rejected, ErrorCode::InvalidConfig));
}

// A rank whose check-in connection was closed (a relay or the network reset it) and that
// checks in again is a retry, not a second process: the rendezvous completes. A second live
// connection for the same rank still fails it.
BOOST_AUTO_TEST_CASE(rendezvous_takes_a_retried_check_in_and_refuses_a_live_duplicate) {
  for (bool firstClosed : {true, false}) {
    BOOST_TEST_CONTEXT("first connection " << (firstClosed ? "closed" : "still open")) {
      Listener l;
      net::setNonBlocking(l.fd.get());
      rendezvous::Options o = rendezvousOptions(l, 3, 5, 5);
      std::optional<Error> err;
      std::atomic<int> checkIns{0};
      std::thread server([&] {
        try {
          rendezvous::serve(
              l.fd.get(), o, [&](int, const std::vector<uint8_t>&) { ++checkIns; },
              [](int) { return wire::encodeRecord(10, 1, std::vector<uint8_t>{}); });
        } catch (const Error& e) {
          err = e;
        }
      });
      const auto hello = wire::encodeRecord(10, 1, std::vector<uint8_t>{});
      {
        auto c = net::connectWithRetry({l.addr}, Deadline::after(5), "c");
        handshake::connectSide(c.get(), "secret", handshake::Purpose::Rendezvous, 1, 3, 0,
                               Deadline::after(5), "c");
        handshake::writeRecord(c.get(), hello, Deadline::after(5), "c");
        // Wait until the server has read the check-in (it then holds the connection).
        for (int i = 0; i < 500 && checkIns == 0; ++i) {
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        BOOST_TEST(checkIns == 1);
        if (!firstClosed) {
          std::optional<Error> second;
          try {
            rendezvous::checkIn({l.addr}, o, 1, hello);
          } catch (const Error& e) {
            second = e;
          }
          server.join();
          BOOST_REQUIRE(err.has_value());
          BOOST_TEST(std::string(err->what()).find("rank 1 checked in twice") != std::string::npos,
                     err->what());
          BOOST_REQUIRE(second.has_value());
          BOOST_TEST(is(*second, ErrorCode::InvalidConfig));
          continue;
        }
      }  // closed: the retry below takes its place
      std::optional<Error> e1, e2;
      std::thread r1([&] {
        try {
          rendezvous::checkIn({l.addr}, o, 1, hello);
        } catch (const Error& e) {
          e1 = e;
        }
      });
      // The retry is taken before the last rank checks in.
      for (int i = 0; i < 500 && checkIns < 2; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      BOOST_TEST(checkIns == 2);
      std::thread r2([&] {
        try {
          rendezvous::checkIn({l.addr}, o, 2, hello);
        } catch (const Error& e) {
          e2 = e;
        }
      });
      r1.join();
      r2.join();
      server.join();
      BOOST_TEST(!err.has_value(), (err ? err->what() : ""));
      BOOST_TEST(!e1.has_value(), (e1 ? e1->what() : ""));
      BOOST_TEST(!e2.has_value(), (e2 ? e2->what() : ""));
    }
  }
}
