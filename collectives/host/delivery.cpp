// What the engine sends outside the calls: the buffered data of a send() that returned early
// (a delivery thread sends it while the application does something else), the drain when the
// communicator goes, and forgetting the queue after an error.

#include <time.h>

#include <chrono>
#include <cstring>

#include <fmt/format.h>

#include <strata/error.hpp>

#include "base/deadline.hpp"
#include "base/log.hpp"
#include "engine.hpp"

namespace strata::collectives {

namespace {

/// How often the drain at exit checks the peers it waits for.
constexpr auto kPeerCheckPeriod = std::chrono::milliseconds(10);

}  // namespace

Engine::~Engine() {
  drainOnExit();
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopDelivery_ = true;
  }
  cv_.notify_all();
  if (delivery_.joinable()) delivery_.join();
  if (proxy_) proxy_->stop();
  // What the proxy wrote must land before this process may exit (not once revoked: nobody
  // reads it any more, and the peers may be dead).
  if (!context_->revoked()) {
    for (Link& link : links_) link.flushAtExit(timeout_);
  }
}

bool Engine::anyPending() const {
  for (const auto& out : out_) {
    if (!out.empty()) return true;
  }
  return false;
}

void Engine::drainOnExit() noexcept {
  // A rank that sends and then destroys its communicator must not lose the buffered data, and
  // no peer may still write to it once it has gone: wait (up to transport.timeout) until its
  // receivers have taken every chunk into their slots and acknowledged it. Acks are sent as
  // soon as a chunk is consumed, so this waits only for peers still in the matching call.
  std::unique_lock<std::mutex> lock(mu_);
  if (deliveryError_ || abandoned_ || context_->revoked()) return;
  auto waitingFor = [this](const Link& link) {
    return link.peer() >= 0 && !link.gone() &&
           (!out_[link.peer()].empty() || link.acked() < link.sent());
  };
  auto deadline = Deadline::fromTimeout(timeout_);
  auto lastCheck = std::chrono::steady_clock::now();
  try {
    for (;;) {
      bool progress = false, waiting = false;
      for (Link& link : links_) {
        if (!waitingFor(link)) continue;
        while (trySend(link)) progress = true;
        while (link.pollAck()) progress = true;
        waiting = waiting || waitingFor(link);
      }
      if (!waiting || deadline.expired()) break;
      if (progress) continue;
      auto now = std::chrono::steady_clock::now();
      if (now - lastCheck > kPeerCheckPeriod) {
        lastCheck = now;
        for (Link& link : links_) {
          if (!waitingFor(link)) continue;
          try {
            link.checkPeer();
          } catch (const Error& e) {
            // Nobody will take or acknowledge the rest.
            link.markGone();
            STRATA_LOG(Warn, "coll",
                       "at exit: rank {} is gone with {} chunks this rank sent it not "
                       "acknowledged and {} not sent: {}",
                       link.peer(), link.sent() - link.acked(), out_[link.peer()].size(), e.what());
          }
        }
      }
      driveTransports();
      lock.unlock();
      timespec ts{0, 100'000};
      nanosleep(&ts, nullptr);
      lock.lock();
    }
  } catch (const std::exception& e) {
    STRATA_LOG(Warn, "coll", "delivering buffered send() data at exit: {}", e.what());
  }
  size_t pending = 0, unacked = 0;
  std::string ranks;  // the receivers still holding or owed something
  for (const Link& link : links_) {
    if (link.gone() || !waitingFor(link)) continue;
    pending += out_[link.peer()].size();
    unacked += link.sent() - link.acked();
    ranks += fmt::format("{}{}", ranks.empty() ? "" : ", ", link.peer());
  }
  if (pending) {
    STRATA_LOG(Warn, "coll",
               "communicator destroyed with {} chunks of send() not yet delivered after {} s "
               "(receivers: rank {}; they never called recv)",
               pending, timeout_, ranks);
  } else if (unacked) {
    STRATA_LOG(Warn, "coll",
               "communicator destroyed with {} chunks in the receivers' slots that they did not "
               "take within {} s (rank {}: a recv() or collective still to come on their side?)",
               unacked, timeout_, ranks);
  }
}

void Engine::deliveryLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopDelivery_) {
    if (!anyPending() || deliveryError_) {
      cv_.wait(lock);
      continue;
    }
    try {
      for (Link& link : links_) {
        while (link.peer() >= 0 && trySend(link)) {
        }
      }
      checkPeersWithSends();
    } catch (...) {
      deliveryError_ = std::current_exception();
      continue;
    }
    // Let the application's calls in; try again soon.
    cv_.wait_for(lock, std::chrono::microseconds(200));
  }
}

void Engine::checkPeersWithSends() {
  for (const Link& link : links_) {
    if (link.peer() >= 0 && !out_[link.peer()].empty()) link.checkPeer();
  }
}

void Engine::abandon() {
  abandoned_ = true;
  for (auto& out : out_) out.clear();
}

void Engine::checkDelivery() {
  if (deliveryError_) std::rethrow_exception(deliveryError_);
}

void Engine::flushSendsOrBuffer(int peer) {
  Link& link = links_[peer];
  while (trySend(link)) {
  }
  auto& out = out_[peer];
  if (out.empty()) return;
  // The receiver has not made room yet: keep a copy of the rest so that send() can return
  // (as with a buffered MPI send); later calls deliver it.
  size_t total = 0;
  for (const OutPiece& p : out) {
    if (!p.owned) total += p.bytes;
  }
  if (total == 0) return;
  if (!delivery_.joinable()) delivery_ = std::thread([this] { deliveryLoop(); });
  cv_.notify_all();
  auto buffer = std::make_shared_for_overwrite<char[]>(total);
  size_t at = 0;
  for (OutPiece& p : out) {
    if (p.owned) continue;
    std::memcpy(buffer.get() + at, p.src, p.bytes);
    p.src = buffer.get() + at;
    p.owned = buffer;
    at += p.bytes;
  }
}

}  // namespace strata::collectives
