// The mesh has no thread of its own: a calling thread that must wait becomes the driver and
// polls every socket (accepting and authenticating peers, reading frames, writing queued
// ones); the others sleep on the condition variable until the driver hands over. So two ranks
// that send large messages to each other both keep reading, and never deadlock.

#include <poll.h>
#include <sched.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include <fmt/format.h>

#include "mesh_impl.hpp"

namespace strata::mesh {
namespace {

/// epoll_event.data of a connection: its peer and direction (looked up again on each event,
/// so that an event never reaches a Conn that was replaced).
uint64_t connKey(const Conn& c) {
  return static_cast<uint64_t>(c.peer) << 1 | (c.outgoing ? 1u : 0u);
}

}  // namespace

void PeerMesh::Impl::wakeDriver() {
  if (!driving) return;
  uint64_t one = 1;
  [[maybe_unused]] auto n = ::write(wake.get(), &one, sizeof one);
}

// POLLOUT only while frames are queued.
void PeerMesh::Impl::arm(Conn& c) {
  uint32_t want = EPOLLIN | (c.outq.empty() ? 0u : static_cast<uint32_t>(EPOLLOUT));
  if (c.registered && c.armed == want) return;
  epoll_event ev{};
  ev.events = want;
  ev.data.u64 = connKey(c);
  int rc = ::epoll_ctl(epoll.get(), c.registered ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, c.fd.get(), &ev);
  if (rc != 0 && errno == EEXIST) rc = ::epoll_ctl(epoll.get(), EPOLL_CTL_MOD, c.fd.get(), &ev);
  if (rc != 0) {
    int err = errno;
    throw Error(ErrorCode::SystemError,
                fmt::format("{} bootstrap: epoll_ctl() for the connection with rank {}: {}{}",
                            opt.backend, c.peer, net::errnoText(err),
                            err == ENOSPC ? " (the limit is /proc/sys/fs/epoll/max_user_watches"
                                            ", per user; raise it with sysctl)"
                                          : ""),
                c.peer);
  }
  c.registered = true;
  c.armed = want;
}

void PeerMesh::Impl::progressOnce(std::unique_lock<std::mutex>& lk, int timeoutMs) {
  // Reused across rounds: a spinning driver calls this in a tight loop.
  auto& fds = pollFds;
  auto& hs = pollPending;
  auto& connectingPeers = pollConnecting;
  fds.clear();
  hs.clear();
  connectingPeers.clear();
  fds.push_back({wake.get(), POLLIN, 0});
  if (listener.valid()) fds.push_back({listener.get(), POLLIN, 0});
  size_t firstPending = fds.size();
  Deadline next = Deadline::never();
  for (auto it = pending.begin(); it != pending.end(); ++it) {
    fds.push_back({it->fd(), POLLIN, 0});
    hs.push_back(it);
    next = Deadline::earlier(next, it->deadline());
  }
  size_t firstConnecting = fds.size();
  for (size_t r = 0; r < peers.size(); ++r) {
    auto& p = peers[r];
    if (!p || !p->connecting) continue;
    fds.push_back({p->connecting->fd(), p->connecting->events(), 0});
    connectingPeers.push_back(static_cast<int>(r));
    next = Deadline::earlier(next, p->connecting->wakeAt());
  }
  forEachOpenConn([&](Conn& c) { arm(c); });
  const size_t epollIndex = fds.size();
  fds.push_back({epoll.get(), POLLIN, 0});
  if (!next.isNever()) timeoutMs = std::min(timeoutMs, next.pollMs(kPollCapMs) + 1);
  lk.unlock();
  int rc = ::poll(fds.data(), fds.size(), timeoutMs);
  int err = errno;
  int ready = 0;
  if (rc > 0 && fds[epollIndex].revents) {
    ready = ::epoll_wait(epoll.get(), epollEvents.data(), static_cast<int>(epollEvents.size()), 0);
    err = errno;
  }
  lk.lock();
  // close() may have run while the lock was released: it cleared `pending` (hs would
  // dangle) and closed every socket.
  if (closed) return;
  if (rc < 0 || ready < 0) {
    if (err == EINTR) return;
    throw Error(ErrorCode::SystemError,
                fmt::format("{}(): {}", rc < 0 ? "poll" : "epoll_wait", net::errnoText(err)));
  }
  if (fds[0].revents) {
    uint64_t v;
    [[maybe_unused]] auto n = ::read(wake.get(), &v, sizeof v);
  }
  // Pending handshakes: step the readable ones and expire the stalled ones. stepPending
  // erases only the entry it steps, so the other iterators stay valid.
  for (size_t i = 0; i < hs.size(); ++i) {
    if (fds[firstPending + i].revents || hs[i]->deadline().expired()) stepPending(hs[i]);
  }
  for (size_t i = 0; i < connectingPeers.size(); ++i) {
    Peer& p = *peers[static_cast<size_t>(connectingPeers[i])];
    if (!p.connecting) continue;
    if (fds[firstConnecting + i].revents || p.connecting->wakeAt().expired() ||
        p.connecting->fd() < 0) {
      stepConnecting(connectingPeers[i]);
    }
  }
  for (int i = 0; i < ready; ++i) {
    const epoll_event& e = epollEvents[static_cast<size_t>(i)];
    auto peer = static_cast<size_t>(e.data.u64 >> 1);
    if (peer >= peers.size() || !peers[peer]) continue;
    Conn* c = (e.data.u64 & 1) ? peers[peer]->out.get() : peers[peer]->in.get();
    if (!c || !c->fd.valid()) continue;  // closed since; a new one is armed next round
    // Read first: a peer that said goodbye and exited leaves the goodbye in the socket, and a
    // write first would fail (EPIPE) and report that finished peer lost to everyone.
    if (e.events & (EPOLLIN | EPOLLHUP | EPOLLERR)) readConn(*c);
    if ((e.events & EPOLLOUT) && c->fd.valid()) writeConn(*c);
  }
  if (listener.valid() && fds[1].revents) acceptAll();
}

void PeerMesh::Impl::driveOrSleep(std::unique_lock<std::mutex>& lk, const Deadline& deadline,
                                  Spin& spin, int expectFrom) {
  if (driving) {
    cv.wait_until(lk, std::min(deadline.at(),
                               Deadline::Clock::now() + std::chrono::milliseconds(kPollCapMs)));
    return;
  }
  driving = true;
  try {
    bool spinning = Deadline::Clock::now() < spin.until;
    Conn* hot = expectFrom >= 0 ? peers[static_cast<size_t>(expectFrom)]->in.get() : nullptr;
    if (spinning && hot && hot->fd.valid() && (++spin.round % 16) != 0) {
      // While spinning for one peer's message, read its socket directly (one syscall
      // instead of poll() plus read); every 16th round still polls everything.
      readConn(*hot);
    } else {
      progressOnce(lk, spinning ? 0 : deadline.pollMs(kPollCapMs));
    }
    if (spinning && opt.spinYield) {
      lk.unlock();
      sched_yield();
      lk.lock();
    }
  } catch (...) {
    driving = false;
    cv.notify_all();
    throw;
  }
  driving = false;
  cv.notify_all();
}

void PeerMesh::Impl::flushAll(std::unique_lock<std::mutex>& lk, const Deadline& deadline) {
  auto empty = [&] {
    bool queued = false;
    forEachOpenConn([&](Conn& c) { queued = queued || !c.outq.empty(); });
    return !queued;
  };
  while (!empty() && !deadline.expired()) {
    if (!driving) {
      driving = true;
      try {
        progressOnce(lk, deadline.pollMs(100));
      } catch (...) {
      }
      driving = false;
      cv.notify_all();
    } else {
      cv.wait_until(
          lk, std::min(deadline.at(), Deadline::Clock::now() + std::chrono::milliseconds(100)));
    }
  }
}

}  // namespace strata::mesh
