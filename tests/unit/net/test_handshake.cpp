// The handshake over real sockets (lib/net/handshake.cpp): the listening side's state machine
// against connectSide() with the right secret, a wrong secret or size, garbage and a staller.
// Part of the module `handshake` (test_handshake_codec.cpp has its main).
#include <boost/test/unit_test.hpp>

#include <poll.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>

#include <strata/error.hpp>

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
  LoopbackListener l;
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
    LoopbackListener l;
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
  LoopbackListener l;
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
