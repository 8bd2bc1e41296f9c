#pragma once

// For one-process unit tests that play several ranks: a listener on a loopback port for each,
// and one thread per rank (header-only; the tests link the static archive).

#include <boost/test/unit_test.hpp>

#include <poll.h>
#include <sys/socket.h>

#include <chrono>
#include <exception>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "net/socket.hpp"

namespace strata::testing {

/// A listener on an ephemeral port of 127.0.0.1 (or ::1).
struct LoopbackListener {
  net::Fd fd;
  net::SockAddr addr;

  explicit LoopbackListener(int family = AF_INET) {
    auto a = net::SockAddr::parseNumeric(family == AF_INET ? "127.0.0.1:1" : "[::1]:1");
    a.setPort(0);
    fd = net::listenOn(a);
    addr = net::localAddress(fd.get());
  }

  /// The next connection, within `seconds`; the test fails when none comes.
  net::Fd accept(double seconds = 5) {
    auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (std::chrono::steady_clock::now() < end) {
      pollfd p{fd.get(), POLLIN, 0};
      ::poll(&p, 1, 100);
      auto c = net::acceptOne(fd.get());
      if (c.valid()) return c;
    }
    BOOST_FAIL("nothing connected");
    return net::Fd();
  }
};

/// Runs fn(rank) in one thread per rank and rethrows the first failure on the calling thread.
inline void runRanks(int size, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

/// Boost.Test's assertions are not thread-safe: a rank thread checks with this, which throws,
/// and runRanks rethrows on the main thread.
inline void expectInRank(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error(what);
}

}  // namespace strata::testing
