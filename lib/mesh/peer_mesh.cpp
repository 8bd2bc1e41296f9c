#include "mesh/peer_mesh.hpp"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <list>
#include <mutex>
#include <unordered_map>

#include <fmt/format.h>

#include <strata/error.hpp>

#include "base/config_keys.hpp"
#include "base/log.hpp"
#include "base/process.hpp"
#include "base/watch_calls.hpp"
#include "mesh/frames.hpp"
#include "mesh/p2p_collectives.hpp"
#include "net/handshake.hpp"

namespace strata::mesh {
namespace {

constexpr size_t kReadBudget = 4u << 20;  // per connection per poll round, for fairness
constexpr int kPollCapMs = 1000;
constexpr size_t kStageSize = 64u << 10;
constexpr int kStarMaxRanks = 128;
constexpr size_t kStarMaxBytes = 64u << 10;

std::string tagText(int tag) {
  switch (tag) {
    case kTagAllGather:
      return "internal allGather tag";
    case kTagBroadcast:
      return "internal broadcast tag";
    case kTagBarrier:
      return "internal barrier tag";
    case kTagSetup:
      return "internal setup tag";
    default:
      return fmt::format("tag {}", tag);
  }
}

struct Message {
  std::unique_ptr<uint8_t[]> data;
  size_t size = 0;
};

struct OutFrame {
  std::vector<uint8_t> bytes;  // header + payload still to write
  size_t offset = 0;
  uint64_t seq = 0;
};

struct Conn {
  net::Fd fd;
  int peer = -1;
  bool outgoing = false;
  // Read side.
  uint8_t header[kFrameHeaderSize];
  size_t headerGot = 0;
  bool inPayload = false;
  FrameType type = FrameType::Data;
  int32_t tag = 0;
  Message payload;
  size_t payloadGot = 0;
  bool goodbye = false;
  // Write side.
  std::deque<OutFrame> outq;
  uint64_t queuedSeq = 0;
  uint64_t doneSeq = 0;
  // In the mesh's epoll set (closing the socket takes it out), with these events.
  bool registered = false;
  uint32_t armed = 0;
};

/// epoll_event.data of a connection: its peer and direction (looked up again on each event,
/// so that an event never reaches a Conn that was replaced).
uint64_t connKey(const Conn& c) {
  return static_cast<uint64_t>(c.peer) << 1 | (c.outgoing ? 1u : 0u);
}

struct Peer {
  std::string address;
  std::unique_ptr<Conn> out;  // we send data on it
  std::unique_ptr<Conn> in;   // the peer sends data on it
  bool finished = false;      // said goodbye
  std::string goodbyeWhy;     // the failure its goodbye carried (empty: it finished well)
  bool lost = false;
  std::string lostWhy;
  ErrorCode lostCode = ErrorCode::PeerLost;
  std::unordered_map<int32_t, std::deque<Message>> inbox;
  std::unique_ptr<handshake::ConnectSide> connecting;
};

// For a Timeout's message: what the kernel knows about the path to the peer. A connection with
// data the peer's host has not acknowledged for a second or more, while TCP retransmits, means
// the network between the hosts is down (or that host is), not that the rank is slow; otherwise
// nothing (the rank is stuck, or called something else).
std::string pathHint(const Peer& p, int peer) {
  for (const Conn* c : {p.out.get(), p.in.get()}) {
    if (!c || !c->fd.valid()) continue;
    tcp_info ti{};
    socklen_t len = sizeof ti;
    if (::getsockopt(c->fd.get(), IPPROTO_TCP, TCP_INFO, &ti, &len) != 0) continue;
    if (ti.tcpi_unacked > 0 && ti.tcpi_last_ack_recv >= 1000) {
      return fmt::format(
          "; the TCP connection to rank {} has {} segments unacknowledged, no "
          "acknowledgement for {:.1f} s, {} retransmissions: the network between "
          "this host and rank {}'s looks down",
          peer, ti.tcpi_unacked, ti.tcpi_last_ack_recv / 1000.0, ti.tcpi_total_retrans, peer);
    }
  }
  return {};
}

}  // namespace

struct PeerMesh::Impl {
  Options opt;
  net::Fd listener;
  net::Fd wake;  // eventfd that interrupts the driver's poll()
  // The established connections (two per peer: 2 (N - 1) sockets) wait in an epoll set, so
  // that a wake-up costs what is ready, not a poll() over every socket: at 256 ranks on 2
  // cores, poll() over 510 sockets per wake-up made Communicator::create take 100 s.
  // poll() still watches the few others (wake, listener, handshakes) and the epoll fd itself.
  net::Fd epoll;
  std::vector<epoll_event> epollEvents = std::vector<epoll_event>(256);
  std::string listenAddr;
  std::vector<std::unique_ptr<Peer>> peers;
  std::list<handshake::ListenSide> pending;
  // Used by the driving thread only.
  std::vector<uint8_t> stage = std::vector<uint8_t>(kStageSize);
  std::vector<pollfd> pollFds;
  std::vector<std::list<handshake::ListenSide>::iterator> pollPending;
  std::vector<int> pollConnecting;

  std::mutex mu;
  std::condition_variable cv;
  bool driving = false;
  bool closed = false;
  bool closing = false;  // in close(): a peer that is gone has finished too, as far as we care
  bool aborted = false;
  std::string failure;  ///< the first Timeout or PeerLost of this rank's own calls (under mu)
  int abortOrigin = -1;
  std::string abortReason;
  bool abortedHere = false;  // by the engine itself, after a failure of this process
  std::mutex collMu;         // one engine collective at a time per process
  bool star = false;

  /// One collective call's messages: internal `tag`, `op` in errors, bootstrap.timeout.
  p2p::Link collectiveLink(int tag, std::string_view op);

  /// Small collectives use the star through rank 0 when asked to (see the header).
  bool useStar(size_t totalBytes) const {
    return star && opt.size <= kStarMaxRanks && totalBytes <= kStarMaxBytes;
  }

  // ---- helpers (mu held unless said otherwise) ----

  void wakeDriver() {
    if (!driving) return;
    uint64_t one = 1;
    [[maybe_unused]] auto n = ::write(wake.get(), &one, sizeof one);
  }

  [[noreturn]] void throwAborted() {
    if (abortOrigin == opt.rank) {
      throw Error(abortedHere ? ErrorCode::SystemError : ErrorCode::Aborted,
                  fmt::format("{} bootstrap: this rank {}: {}", opt.backend,
                              abortedHere ? "aborted the job" : "called abort()", abortReason),
                  abortOrigin);
    }
    throw Error(ErrorCode::Aborted,
                fmt::format("{} bootstrap: rank {} aborted the job: {}", opt.backend, abortOrigin,
                            abortReason),
                abortOrigin);
  }

  void checkPeer(int peer, std::string_view op) const {
    if (peer < 0 || peer >= opt.size) {
      throw Error(ErrorCode::InvalidArgument,
                  fmt::format("{}: peer {} is out of range 0..{}", op, peer, opt.size - 1), peer);
    }
    if (peer == opt.rank) {
      throw Error(
          ErrorCode::InvalidArgument,
          fmt::format("{}: peer {} is this rank; send/recv to self is not supported", op, peer),
          peer);
    }
  }

  Error peerGone(int peer, std::string_view op, int tag) {
    Peer& p = *peers[peer];
    if (p.lost) {
      return Error(p.lostCode,
                   fmt::format("{} {} rank {} ({}) failed: {}", op, op == "send" ? "to" : "with",
                               peer, tagText(tag), p.lostWhy),
                   peer);
    }
    if (!p.goodbyeWhy.empty()) {
      return Error(ErrorCode::PeerLost,
                   fmt::format("{} with rank {} ({}) failed: rank {} closed its bootstrap after "
                               "a call of its own failed: {}",
                               op, peer, tagText(tag), peer, p.goodbyeWhy),
                   peer);
    }
    return Error(ErrorCode::PeerLost,
                 fmt::format("{} with rank {} ({}) failed: rank {} has already closed its "
                             "bootstrap (it finished or destroyed it); make every rank take "
                             "part in the same exchanges",
                             op, peer, tagText(tag), peer),
                 peer);
  }

  /// Remembers the first failure of this rank's own calls, for the goodbye (see close()).
  Error failed(Error e) {
    if (failure.empty()) failure = e.what();
    return e;
  }

  void queueFrame(Conn& c, FrameType type, int32_t tag, const uint8_t* data, size_t len) {
    OutFrame f;
    f.bytes.resize(kFrameHeaderSize + len);
    encodeFrameHeader(f.bytes.data(), type, tag, len);
    if (len) std::memcpy(f.bytes.data() + kFrameHeaderSize, data, len);
    f.seq = ++c.queuedSeq;
    c.outq.push_back(std::move(f));
  }

  void queueControlToAll(FrameType type, const std::vector<uint8_t>& body, const Conn* except) {
    for (auto& p : peers) {
      if (!p) continue;
      for (Conn* c : {p->out.get(), p->in.get()}) {
        if (c && c != except && c->fd.valid()) queueFrame(*c, type, 0, body.data(), body.size());
      }
    }
    wakeDriver();
  }

  void markLost(int peer, std::string why, bool tellOthers) {
    Peer& p = *peers[peer];
    if (p.lost || p.finished) return;
    p.lost = true;
    p.lostWhy = std::move(why);
    STRATA_LOG(Warn, opt.backend.c_str(), "rank {} lost: {}", peer, p.lostWhy);
    if (tellOthers && !aborted) {
      queueControlToAll(FrameType::Lost, encodeLost(peer), nullptr);
    }
    cv.notify_all();
  }

  /// A failure of this process (out of descriptors), not of a peer: the peers are told that
  /// this rank aborted the job and why, instead of that the peer it tried to reach died.
  void failHere(std::string why) {
    if (aborted) return;
    aborted = true;
    abortedHere = true;
    abortOrigin = opt.rank;
    abortReason = why.substr(0, 1024);
    STRATA_LOG(Error, opt.backend.c_str(), "aborting the job: {}", abortReason);
    queueControlToAll(FrameType::Abort, encodeAbort(opt.rank, abortReason), nullptr);
    cv.notify_all();
  }

  void closeConn(Conn& c, const std::string& why, bool tellOthers = true) {
    if (!c.fd.valid()) return;
    c.fd.reset();
    c.outq.clear();
    Peer& p = *peers[c.peer];
    if (!c.goodbye && !p.finished && !closed && !closing) {
      markLost(c.peer, why, tellOthers);
    }
    cv.notify_all();
  }

  void protocolViolation(Conn& c, const std::string& what) {
    STRATA_LOG(Error, opt.backend.c_str(), "closing the connection with rank {}: {}", c.peer, what);
    int peer = c.peer;
    c.goodbye = false;
    closeConn(c, fmt::format("rank {} sent a malformed frame ({})", peer, what));
  }

  void dispatch(Conn& c) {
    Peer& p = *peers[c.peer];
    switch (c.type) {
      case FrameType::Data:
        p.inbox[c.tag].push_back(std::move(c.payload));
        cv.notify_all();
        break;
      case FrameType::Goodbye:
        try {
          p.goodbyeWhy = decodeGoodbye({c.payload.data.get(), c.payload.size});
        } catch (const Error& e) {
          protocolViolation(c, e.what());
          return;
        }
        c.goodbye = true;
        p.finished = true;
        cv.notify_all();
        break;
      case FrameType::Abort: {
        int origin = -1;
        std::string reason;
        try {
          AbortPayload a = decodeAbort({c.payload.data.get(), c.payload.size});
          origin = a.origin;
          reason = std::move(a.reason);
        } catch (const Error& e) {
          protocolViolation(c, e.what());
          return;
        }
        if (origin < 0 || origin >= opt.size) origin = c.peer;
        if (!aborted) {
          aborted = true;
          abortOrigin = origin;
          abortReason = reason;
          STRATA_LOG(Error, opt.backend.c_str(), "rank {} aborted the job: {}", origin, reason);
          queueControlToAll(FrameType::Abort, encodeAbort(origin, reason), &c);
        }
        cv.notify_all();
        break;
      }
      case FrameType::Lost: {
        int who = -1;
        try {
          who = decodeLost({c.payload.data.get(), c.payload.size});
        } catch (const Error& e) {
          protocolViolation(c, e.what());
          return;
        }
        if (who >= 0 && who < opt.size && who != opt.rank) {
          markLost(who,
                   fmt::format("rank {} reported that its connection to rank {} broke "
                               "(the process probably died)",
                               c.peer, who),
                   true);
        }
        break;
      }
    }
  }

  /// Validates a complete frame header and prepares the payload; false if it was refused.
  bool startFrame(Conn& c) {
    FrameHeader h = decodeFrameHeader(c.header);
    c.headerGot = 0;
    if (std::string why = checkFrameHeader(h, opt.maxMessage); !why.empty()) {
      protocolViolation(c, why);
      return false;
    }
    const uint64_t len = h.length;
    c.type = static_cast<FrameType>(h.type);
    c.tag = h.tag;
    c.payload.size = len;
    c.payload.data.reset(len ? new uint8_t[len] : nullptr);
    c.payloadGot = 0;
    c.inPayload = true;
    return true;
  }

  void finishFrameIfComplete(Conn& c) {
    if (c.inPayload && c.payloadGot == c.payload.size) {
      c.inPayload = false;
      dispatch(c);
      c.payload = Message{};
    }
  }

  /// Reads what the socket has. Small frames arrive through one staging buffer (one recv()
  /// for many frames); the bulk of a large payload is read straight into its final buffer.
  void readConn(Conn& c) {
    size_t budget = kReadBudget;
    while (c.fd.valid() && budget > 0) {
      bool direct = c.inPayload && c.payload.size - c.payloadGot >= kStageSize;
      size_t want = direct ? std::min(c.payload.size - c.payloadGot, budget) : kStageSize;
      uint8_t* dst = direct ? c.payload.data.get() + c.payloadGot : stage.data();
      ssize_t n = ::recv(c.fd.get(), dst, want, MSG_DONTWAIT);
      if (n == 0) {
        closeConn(c, fmt::format("the connection with rank {} closed without a goodbye (the "
                                 "process died or was killed)",
                                 c.peer));
        return;
      }
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        closeConn(c, fmt::format("the connection with rank {} failed: {} (the process died or "
                                 "its host is unreachable)",
                                 c.peer, net::errnoText(errno)));
        return;
      }
      size_t got = static_cast<size_t>(n);
      budget -= std::min(budget, got);
      if (direct) {
        c.payloadGot += got;
        finishFrameIfComplete(c);
      } else {
        const uint8_t* p = stage.data();
        while (got > 0 && c.fd.valid()) {
          size_t k;
          if (!c.inPayload) {
            k = std::min(got, kFrameHeaderSize - c.headerGot);
            std::memcpy(c.header + c.headerGot, p, k);
            c.headerGot += k;
            if (c.headerGot == kFrameHeaderSize && !startFrame(c)) return;
          } else {
            k = std::min(got, c.payload.size - c.payloadGot);
            std::memcpy(c.payload.data.get() + c.payloadGot, p, k);
            c.payloadGot += k;
          }
          p += k;
          got -= k;
          finishFrameIfComplete(c);
        }
      }
      // A short read means the socket is drained for now; poll() reports the rest.
      if (static_cast<size_t>(n) < want) return;
    }
  }

  void writeConn(Conn& c) {
    while (c.fd.valid() && !c.outq.empty()) {
      OutFrame& f = c.outq.front();
      ssize_t n = ::send(c.fd.get(), f.bytes.data() + f.offset, f.bytes.size() - f.offset,
                         MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        closeConn(c, fmt::format("writing to rank {} failed: {}", c.peer, net::errnoText(errno)));
        return;
      }
      f.offset += static_cast<size_t>(n);
      if (f.offset == f.bytes.size()) {
        c.doneSeq = f.seq;
        c.outq.pop_front();
        cv.notify_all();
      }
    }
  }

  void acceptAll() {
    for (;;) {
      net::SockAddr remote;
      net::Fd fd;
      try {
        fd = net::acceptOne(listener.get(), &remote);
      } catch (const Error& e) {
        if (process::outOfDescriptors(e.what())) {
          // The pending connection stays in the backlog and the listener stays readable: a
          // poll loop until the deadline. Nobody can reach this rank any more; end it here.
          failHere(fmt::format("rank {} cannot accept a peer's connection: {}; {}", opt.rank,
                               e.what(), process::descriptorAdvice(opt.size)));
          listener.reset();
          return;
        }
        STRATA_LOG(Warn, opt.backend.c_str(), "accept failed: {}", e.what());
        return;
      }
      if (!fd.valid()) return;
      pending.emplace_back(std::move(fd), remote, opt.secret, handshake::Purpose::Mesh, opt.rank,
                           opt.size, Deadline::fromTimeout(opt.handshakeTimeout));
      stepPending(std::prev(pending.end()));
    }
  }

  void stepPending(std::list<handshake::ListenSide>::iterator it) {
    auto state = it->step();
    if (state == handshake::ListenSide::State::InProgress) return;
    if (state == handshake::ListenSide::State::Rejected) {
      if (it->probe()) {
        STRATA_LOG(Debug, opt.backend.c_str(), "closed a connection from {}: {}",
                   it->remote().toString(), it->reason());
      } else {
        STRATA_LOG(Warn, opt.backend.c_str(), "rejected a connection from {}: {}",
                   it->remote().toString(), it->reason());
      }
      pending.erase(it);
      return;
    }
    int r = it->peerRank();
    Peer& p = *peers[r];
    if (p.in && p.in->fd.valid()) {
      STRATA_LOG(Warn, opt.backend.c_str(), "rejected a second connection claiming rank {} from {}",
                 r, it->remote().toString());
      pending.erase(it);
      return;
    }
    auto c = std::make_unique<Conn>();
    c->fd = it->takeFd();
    c->peer = r;
    c->outgoing = false;
    p.in = std::move(c);
    pending.erase(it);
    STRATA_LOG(Debug, opt.backend.c_str(), "accepted the connection from rank {}", r);
    // Anything we queued for this peer before (abort, lost) goes out on it too.
    if (aborted) {
      auto body = encodeAbort(abortOrigin, abortReason);
      queueFrame(*p.in, FrameType::Abort, 0, body.data(), body.size());
    }
  }

  /// Puts a connection in the epoll set, or updates what it waits for (POLLOUT only while
  /// frames are queued).
  void arm(Conn& c) {
    uint32_t want = EPOLLIN | (c.outq.empty() ? 0u : static_cast<uint32_t>(EPOLLOUT));
    if (c.registered && c.armed == want) return;
    epoll_event ev{};
    ev.events = want;
    ev.data.u64 = connKey(c);
    int rc =
        ::epoll_ctl(epoll.get(), c.registered ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, c.fd.get(), &ev);
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

  /// One round of poll over every socket. Called by the driving thread with mu held; releases
  /// it while blocked in poll().
  void progressOnce(std::unique_lock<std::mutex>& lk, int timeoutMs) {
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
    for (auto& p : peers) {
      if (!p) continue;
      for (Conn* c : {p->out.get(), p->in.get()}) {
        if (c && c->fd.valid()) arm(*c);
      }
    }
    const size_t epollIndex = fds.size();
    fds.push_back({epoll.get(), POLLIN, 0});
    if (!next.isNever()) timeoutMs = std::min(timeoutMs, next.pollMs(kPollCapMs) + 1);
    lk.unlock();
    int rc = ::poll(fds.data(), fds.size(), timeoutMs);
    int err = errno;
    int ready = 0;
    if (rc > 0 && fds[epollIndex].revents) {
      ready =
          ::epoll_wait(epoll.get(), epollEvents.data(), static_cast<int>(epollEvents.size()), 0);
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

  /// Waits until done() holds, driving progress when no other thread does.
  template <class Done, class OnTimeout>
  void waitUntil(std::unique_lock<std::mutex>& lk, Done done, const Deadline& deadline,
                 OnTimeout onTimeout, int expectFrom = -1) {
    auto spinUntil = Deadline::Clock::now() + std::chrono::microseconds(opt.spinUs);
    unsigned round = 0;
    for (;;) {
      if (done()) return;
      if (aborted) throwAborted();
      if (deadline.expired()) onTimeout();
      if (!driving) {
        driving = true;
        try {
          bool spinning = Deadline::Clock::now() < spinUntil;
          Conn* hot = expectFrom >= 0 ? peers[static_cast<size_t>(expectFrom)]->in.get() : nullptr;
          if (spinning && hot && hot->fd.valid() && (++round % 16) != 0) {
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
      } else {
        cv.wait_until(lk, std::min(deadline.at(),
                                   Deadline::Clock::now() + std::chrono::milliseconds(kPollCapMs)));
      }
    }
  }

  /// Drives progress until no frame is queued anywhere, or the deadline passes.
  void flushAll(std::unique_lock<std::mutex>& lk, const Deadline& deadline) {
    auto empty = [&] {
      for (auto& p : peers) {
        if (!p) continue;
        for (Conn* c : {p->out.get(), p->in.get()}) {
          if (c && c->fd.valid() && !c->outq.empty()) return false;
        }
      }
      return true;
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

  void stepConnecting(int peer) {
    Peer& p = *peers[static_cast<size_t>(peer)];
    auto st = p.connecting->step();
    if (st == handshake::ConnectSide::State::InProgress) return;
    if (st == handshake::ConnectSide::State::Failed) {
      auto code = p.connecting->errorCode();
      std::string why = p.connecting->error();
      p.connecting.reset();
      if (code == ErrorCode::SystemError && process::outOfDescriptors(why)) {
        // This process's limit, not the peer's death: the others must not hear "rank P lost".
        std::string text = fmt::format("rank {} cannot connect to rank {}: {}; {}", opt.rank, peer,
                                       why, process::descriptorAdvice(opt.size));
        p.lost = true;
        p.lostCode = ErrorCode::SystemError;
        p.lostWhy = text;
        failHere(text);
        return;
      }
      if (code == ErrorCode::AuthFailed || code == ErrorCode::ProtocolError) {
        p.lostCode = code;
      }
      markLost(peer, fmt::format("cannot connect to rank {} at {}: {}", peer, p.address, why),
               code != ErrorCode::Timeout);
      cv.notify_all();
      return;
    }
    auto c = std::make_unique<Conn>();
    c->fd = p.connecting->takeFd();
    c->peer = peer;
    c->outgoing = true;
    p.connecting.reset();
    p.out = std::move(c);
    if (aborted) {
      auto body = encodeAbort(abortOrigin, abortReason);
      queueFrame(*p.out, FrameType::Abort, 0, body.data(), body.size());
    }
    STRATA_LOG(Debug, opt.backend.c_str(), "connected to rank {} at {}", peer, p.address);
    cv.notify_all();
  }

  /// The connection we send to `peer` on, made on first use. The handshake runs inside the
  /// progress engine, so two ranks that connect to each other at once both make progress.
  Conn& outgoing(std::unique_lock<std::mutex>& lk, int peer, const Deadline& deadline,
                 std::string_view op, int tag) {
    Peer& p = *peers[static_cast<size_t>(peer)];
    if (aborted) throwAborted();
    if (p.out && p.out->fd.valid()) return *p.out;
    if (p.lost || p.finished || p.out) throw failed(peerGone(peer, op, tag));
    if (!p.connecting) {
      if (p.address.empty()) {
        throw Error(ErrorCode::Internal,
                    fmt::format("{}: no address known for rank {} (the rendezvous did not "
                                "finish)",
                                op, peer),
                    peer);
      }
      // A live peer already listens: refusal for more than a moment means it is gone.
      Deadline connectDeadline =
          Deadline::earlier(deadline, Deadline::after(std::max(2.0, opt.handshakeTimeout)));
      p.connecting = std::make_unique<handshake::ConnectSide>(
          net::SockAddr::parseNumeric(p.address), opt.secret, handshake::Purpose::Mesh, opt.rank,
          opt.size, peer, connectDeadline, deadline,
          fmt::format("{} bootstrap: connecting to rank {} at {}", opt.backend, peer, p.address));
      wakeDriver();
    }
    waitUntil(
        lk, [&] { return (p.out && p.out->fd.valid()) || p.lost || p.finished || !p.connecting; },
        deadline,
        [&] {
          throw failed(
              Error(ErrorCode::Timeout,
                    fmt::format("{} to rank {} ({}) timed out after {} s while connecting to "
                                "it at {}",
                                op, peer, tagText(tag), opt.timeout, p.address),
                    peer));
        });
    if (p.out && p.out->fd.valid()) return *p.out;
    throw failed(peerGone(peer, op, tag));
  }

  void send(int peer, int tag, const void* data, size_t bytes, const Deadline& deadline,
            std::string_view op, bool internal) {
    checkPeer(peer, op);
    if (tag < 0 && !internal) {
      throw Error(ErrorCode::InvalidArgument, fmt::format("{}: tag {} is negative", op, tag), peer);
    }
    if (bytes > opt.maxMessage) {
      throw Error(ErrorCode::InvalidArgument,
                  fmt::format("{} to rank {}: {} bytes exceed bootstrap.max_message ({} bytes)", op,
                              peer, bytes, opt.maxMessage),
                  peer);
    }
    if (bytes && !data) {
      throw Error(ErrorCode::InvalidArgument, fmt::format("{}: null buffer", op), peer);
    }
    std::unique_lock lk(mu);
    Conn& c = outgoing(lk, peer, deadline, op, tag);
    uint8_t header[kFrameHeaderSize];
    encodeFrameHeader(header, FrameType::Data, tag, bytes);
    size_t written = 0;
    const size_t total = kFrameHeaderSize + bytes;
    if (c.outq.empty()) {
      // Fast path: straight from the caller's buffer into the socket.
      iovec iov[2] = {{header, kFrameHeaderSize}, {const_cast<void*>(data), bytes}};
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen = bytes ? 2 : 1;
      for (;;) {
        ssize_t n = ::sendmsg(c.fd.get(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n >= 0) {
          written = static_cast<size_t>(n);
          break;
        }
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
          closeConn(c, fmt::format("writing to rank {} failed: {}", peer, net::errnoText(errno)));
          throw failed(peerGone(peer, op, tag));
        }
        break;
      }
      if (written == total) return;
    }
    // Queue what the socket did not take (a copy: the caller's buffer is theirs again on error).
    OutFrame f;
    f.bytes.resize(total - written);
    const size_t headerSent = std::min(written, kFrameHeaderSize);
    const size_t payloadSent = written - headerSent;
    std::memcpy(f.bytes.data(), header + headerSent, kFrameHeaderSize - headerSent);
    if (bytes > payloadSent) {
      std::memcpy(f.bytes.data() + (kFrameHeaderSize - headerSent),
                  static_cast<const uint8_t*>(data) + payloadSent, bytes - payloadSent);
    }
    uint64_t seq = f.seq = ++c.queuedSeq;
    c.outq.push_back(std::move(f));
    wakeDriver();
    watch::Waiting waiting(
        peer, fmt::format("{} to it not yet taken ({}, {} bytes)", op, tagText(tag), bytes));
    waitUntil(
        lk, [&] { return c.doneSeq >= seq || !c.fd.valid(); }, deadline,
        [&] {
          // A half-written frame cannot be taken back: the connection is unusable now.
          bool started = written > 0 || (!c.outq.empty() && c.outq.front().seq == seq &&
                                         c.outq.front().offset > 0);
          if (started) {
            // Slow is not dead: the other ranks are not told that this peer was lost.
            closeConn(c, fmt::format("a send to rank {} timed out half-way", peer), false);
          } else {
            std::erase_if(c.outq, [&](const OutFrame& o) { return o.seq == seq; });
          }
          throw failed(
              Error(ErrorCode::Timeout,
                    fmt::format("{} to rank {} ({}, {} bytes) timed out after {} s: rank {} is not "
                                "reading (is it stuck, or waiting for something else?){}",
                                op, peer, tagText(tag), bytes, opt.timeout, peer,
                                pathHint(*peers[peer], peer)),
                    peer));
        });
    if (c.doneSeq < seq) {
      if (aborted) throwAborted();
      throw failed(peerGone(peer, op, tag));
    }
  }

  void recv(int peer, int tag, void* data, size_t bytes, const Deadline& deadline,
            std::string_view op, bool internal) {
    checkPeer(peer, op);
    if (tag < 0 && !internal) {
      throw Error(ErrorCode::InvalidArgument, fmt::format("{}: tag {} is negative", op, tag), peer);
    }
    if (bytes && !data) {
      throw Error(ErrorCode::InvalidArgument, fmt::format("{}: null buffer", op), peer);
    }
    std::unique_lock lk(mu);
    Peer& p = *peers[peer];
    auto ready = [&] {
      auto it = p.inbox.find(tag);
      return (it != p.inbox.end() && !it->second.empty()) || p.lost || p.finished;
    };
    std::optional<watch::Waiting> waiting;
    if (!ready()) {
      waiting.emplace(
          peer, fmt::format("{} from it not yet received ({}, {} bytes)", op, tagText(tag), bytes));
    }
    waitUntil(
        lk, ready, deadline,
        [&] {
          throw failed(Error(
              ErrorCode::Timeout,
              fmt::format("{} from rank {} ({}, {} bytes) timed out after {} s: rank {} did not "
                          "send it (is it stuck, or did the ranks call different operations?){}",
                          op, peer, tagText(tag), bytes, opt.timeout, peer, pathHint(p, peer)),
              peer));
        },
        peer);
    auto it = p.inbox.find(tag);
    if (it == p.inbox.end() || it->second.empty()) {
      if (aborted) throwAborted();
      throw failed(peerGone(peer, op, tag));
    }
    Message m = std::move(it->second.front());
    it->second.pop_front();
    if (it->second.empty()) p.inbox.erase(it);
    lk.unlock();
    if (m.size != bytes) {
      throw Error(ErrorCode::ProtocolError,
                  fmt::format("{} from rank {} ({}): expected {} bytes but rank {} sent {} "
                              "bytes; the message was discarded",
                              op, peer, tagText(tag), bytes, peer, m.size),
                  peer);
    }
    if (bytes) std::memcpy(data, m.data.get(), bytes);
  }
};

SpinPolicy spinPolicy(const Config& config, int localSize) {
  SpinPolicy p;
  p.yield = localSize > sysconf(_SC_NPROCESSORS_ONLN);
  auto us = config::getInt(config, "bootstrap.spin_us");
  p.us = us >= 0 ? static_cast<int>(std::min<int64_t>(us, 10'000'000)) : (p.yield ? 100 : 200);
  return p;
}

PeerMesh::PeerMesh(Options options, net::Fd listener) : impl_(std::make_unique<Impl>()) {
  auto& I = *impl_;
  I.opt = std::move(options);
  I.listener = std::move(listener);
  I.wake = net::Fd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!I.wake.valid()) {
    throw Error(ErrorCode::SystemError, fmt::format("eventfd(): {}", net::errnoText(errno)));
  }
  if (I.opt.size > 1) process::ensureDescriptors(I.opt.size, I.opt.rank, I.opt.backend.c_str());
  I.epoll = net::Fd(::epoll_create1(EPOLL_CLOEXEC));
  if (!I.epoll.valid()) {
    throw Error(ErrorCode::SystemError, fmt::format("epoll_create1(): {}", net::errnoText(errno)));
  }
  if (I.listener.valid()) I.listenAddr = net::localAddress(I.listener.get()).toString();
  I.peers.resize(static_cast<size_t>(I.opt.size));
  for (int r = 0; r < I.opt.size; ++r) {
    if (r != I.opt.rank) I.peers[static_cast<size_t>(r)] = std::make_unique<Peer>();
  }
}

PeerMesh::~PeerMesh() {
  close();
}

const Options& PeerMesh::options() const {
  return impl_->opt;
}
std::string PeerMesh::listenAddress() const {
  return impl_->listenAddr;
}

Deadline PeerMesh::callDeadline() const {
  return Deadline::fromTimeout(impl_->opt.timeout);
}

void PeerMesh::setStarCollectives(bool star) {
  std::lock_guard lk(impl_->mu);
  impl_->star = star;
}

void PeerMesh::setPeerAddress(int rank, const std::string& address) {
  std::lock_guard lk(impl_->mu);
  if (rank >= 0 && rank < impl_->opt.size && rank != impl_->opt.rank) {
    impl_->peers[static_cast<size_t>(rank)]->address = address;
  }
}

void PeerMesh::setPeerAddresses(const std::vector<std::string>& addresses) {
  for (size_t r = 0; r < addresses.size(); ++r) setPeerAddress(static_cast<int>(r), addresses[r]);
}

void PeerMesh::send(int peer, int tag, const void* data, size_t bytes, const Deadline& deadline,
                    std::string_view op, bool internal) {
  impl_->send(peer, tag, data, bytes, deadline, op, internal);
}

void PeerMesh::recv(int peer, int tag, void* data, size_t bytes, const Deadline& deadline,
                    std::string_view op, bool internal) {
  impl_->recv(peer, tag, data, bytes, deadline, op, internal);
}

// The algorithms are lib/base/collectives_over_p2p.cpp's; each collective runs alone
// (collMu), with one tag and one deadline for all its messages.
p2p::Link PeerMesh::Impl::collectiveLink(int tag, std::string_view op) {
  Deadline dl = Deadline::fromTimeout(opt.timeout);
  return {opt.rank, opt.size,
          [this, tag, op, dl](int peer, uint32_t, const void* data, size_t bytes) {
            send(peer, tag, data, bytes, dl, op, true);
          },
          [this, tag, op, dl](int peer, uint32_t, void* data, size_t bytes) {
            recv(peer, tag, data, bytes, dl, op, true);
          }};
}

void PeerMesh::allGather(void* data, size_t bytesPerRank) {
  auto& I = *impl_;
  if (!p2p::allGatherNeeded(I.opt.size, data, bytesPerRank)) return;
  std::lock_guard coll(I.collMu);
  const bool star = I.useStar(static_cast<size_t>(I.opt.size) * bytesPerRank);
  p2p::allGather(I.collectiveLink(kTagAllGather, "allGather"),
                 star ? p2p::AllGatherAlgorithm::Star : p2p::AllGatherAlgorithm::Bruck, data,
                 bytesPerRank);
}

void PeerMesh::broadcast(void* data, size_t bytes, int root) {
  auto& I = *impl_;
  if (!p2p::broadcastNeeded(I.opt.size, data, bytes, root)) return;
  std::lock_guard coll(I.collMu);
  p2p::broadcast(I.collectiveLink(kTagBroadcast, "broadcast"), I.useStar(bytes), data, bytes, root);
}

void PeerMesh::barrier() {
  auto& I = *impl_;
  if (!p2p::barrierNeeded(I.opt.size)) return;
  std::lock_guard coll(I.collMu);
  p2p::barrier(I.collectiveLink(kTagBarrier, "barrier"), I.useStar(0));
}

void PeerMesh::abort(std::string_view reason) noexcept {
  auto& I = *impl_;
  try {
    std::unique_lock lk(I.mu);
    if (I.aborted || I.closed) return;
    I.aborted = true;
    I.abortOrigin = I.opt.rank;
    I.abortReason = std::string(reason.substr(0, 1024));
    STRATA_LOG(Error, I.opt.backend.c_str(), "aborting the job: {}", I.abortReason);
    I.queueControlToAll(FrameType::Abort, encodeAbort(I.opt.rank, I.abortReason), nullptr);
    I.cv.notify_all();
    I.flushAll(lk, Deadline::after(2.0));
  } catch (...) {
  }
}

void PeerMesh::close() noexcept {
  auto& I = *impl_;
  try {
    std::unique_lock lk(I.mu);
    if (I.closed) return;
    // Deliver what is queued (sends that completed from the caller's view are already in the
    // kernel; this covers forwarded abort/lost notices), then say goodbye.
    // While closing, a peer that has gone (it finished first) is not reported lost: at 256
    // ranks on 2 cores such reports reached ranks still in their last call and failed it.
    I.closing = true;
    const double flushSeconds = std::min(I.opt.timeout > 0 ? I.opt.timeout : 10.0, 10.0);
    // A rank whose own call failed says why: its peers, still waiting for it, would otherwise
    // be told it finished (and name it, not the rank behind its failure).
    const std::vector<uint8_t> goodbye = encodeGoodbye(I.failure);
    std::vector<char> told(I.peers.size(), 0);
    // Each peer gets its goodbye only after everything queued for it (on both connections) is
    // written. A failed rank tells the peers with nothing queued at once: the first flush can
    // take flushSeconds on a connection to an unreachable host, and a peer of this host waiting
    // for this rank would time out first, naming this rank instead of the cause.
    auto queueGoodbyes = [&](bool onlyIdle) {
      for (size_t i = 0; i < I.peers.size(); ++i) {
        auto& p = I.peers[i];
        if (!p || told[i]) continue;
        bool idle = true;
        for (const Conn* c : {p->out.get(), p->in.get()}) {
          if (c && c->fd.valid() && !c->outq.empty()) idle = false;
        }
        if (onlyIdle && !idle) continue;
        for (Conn* c : {p->out.get(), p->in.get()}) {
          if (c && c->fd.valid())
            I.queueFrame(*c, FrameType::Goodbye, 0, goodbye.data(), goodbye.size());
        }
        told[i] = 1;
      }
      I.wakeDriver();
    };
    if (!I.failure.empty()) queueGoodbyes(true);
    I.flushAll(lk, Deadline::after(flushSeconds));
    queueGoodbyes(false);
    // Not 2 s as before: with hundreds of ranks per core a closing rank may not run for that
    // long, and a connection closed with its goodbye unsent makes the peer report it lost. A
    // live peer takes the frame at once; only a full socket to a stuck peer waits this long.
    I.flushAll(lk, Deadline::after(flushSeconds));
    for (auto& p : I.peers) {
      if (!p) continue;
      for (Conn* c : {p->out.get(), p->in.get()}) {
        if (c && c->fd.valid() && !c->outq.empty()) {
          STRATA_LOG(Debug, I.opt.backend.c_str(),
                     "closing with {} frames unsent to rank {} (it does not read)", c->outq.size(),
                     c->peer);
        }
      }
    }
    I.closed = true;
    for (auto& p : I.peers) {
      if (!p) continue;
      for (Conn* c : {p->out.get(), p->in.get()}) {
        if (c && c->fd.valid()) {
          ::shutdown(c->fd.get(), SHUT_WR);
          c->fd.reset();
        }
      }
    }
    I.pending.clear();
    I.listener.reset();
    I.cv.notify_all();
  } catch (...) {
  }
}

}  // namespace strata::mesh
