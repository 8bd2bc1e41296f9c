// Rank 0's rendezvous (lib/mesh/rendezvous.cpp) on a loopback listener: an authenticated rank
// that sends no check-in, a second rank 0, a retried check-in and a live duplicate.
#define BOOST_TEST_MODULE rendezvous
#include <boost/test/unit_test.hpp>

#include <poll.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <optional>
#include <thread>
#include <vector>

#include <strata/error.hpp>

#include "base/wire.hpp"
#include "mesh/rendezvous.hpp"
#include "net/handshake.hpp"
#include "net/socket.hpp"
#include "tests/harness/in_process_ranks.hpp"
#include "tests/harness/single_rank.hpp"

using namespace strata;
using strata::testing::expectError;
using strata::testing::is;
using strata::testing::LoopbackListener;
using Clock = std::chrono::steady_clock;

namespace {

/// Options of a tcp rendezvous served on `l` with secret "secret".
rendezvous::Options rendezvousOptions(const LoopbackListener& l, int size, double connectTimeout,
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

// Serves the rendezvous of `o` on `l` in a thread that takes every check-in and answers with an
// empty record; the error the rendezvous ends with lands in `err`.
std::thread serveWithoutReplies(const LoopbackListener& l, const rendezvous::Options& o,
                                std::optional<Error>& err) {
  return std::thread([&l, &o, &err] {
    try {
      rendezvous::serve(
          l.fd.get(), o, [](int, const std::vector<uint8_t>&) {},
          [](int) { return std::vector<uint8_t>{}; });
    } catch (const Error& e) {
      err = e;
    }
  });
}

}  // namespace

// A rank that authenticates and then sends no check-in record is closed after
// bootstrap.handshake_timeout, not kept (and polled every millisecond) until the rendezvous
// deadline.
BOOST_AUTO_TEST_CASE(rendezvous_closes_an_authenticated_rank_that_sends_no_record) {
  LoopbackListener l;
  net::setNonBlocking(l.fd.get());
  rendezvous::Options o = rendezvousOptions(l, 2, 3, 0.3);
  std::optional<Error> err;
  std::thread server = serveWithoutReplies(l, o, err);
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
  LoopbackListener l;
  net::setNonBlocking(l.fd.get());
  rendezvous::Options o = rendezvousOptions(l, 2, 5, 5);
  std::optional<Error> err;
  std::thread server = serveWithoutReplies(l, o, err);
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
      LoopbackListener l;
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
