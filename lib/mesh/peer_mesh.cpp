// The public API of the peer mesh: construction, point-to-point send and recv, the
// collectives over them (lib/mesh/p2p_collectives.cpp's algorithms), abort and close. The
// engine behind them is in frame_io, progress, connections and failures (see mesh_impl.hpp).

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>

#include <fmt/format.h>

#include "base/config_keys.hpp"
#include "base/log.hpp"
#include "base/process.hpp"
#include "base/watch_calls.hpp"
#include "mesh/p2p_collectives.hpp"
#include "mesh_impl.hpp"

namespace strata::mesh {
namespace {

constexpr int kStarMaxRanks = 128;
constexpr size_t kStarMaxBytes = 64u << 10;

/// Small collectives use the star through rank 0 when asked to (see the header).
bool useStar(const PeerMesh::Impl& I, size_t totalBytes) {
  return I.star && I.opt.size <= kStarMaxRanks && totalBytes <= kStarMaxBytes;
}

/// One collective call's messages: internal `tag`, `op` in errors, bootstrap.timeout. Each
/// collective runs alone (collMu), with one tag and one deadline for all its messages.
p2p::Messenger collectiveMessenger(PeerMesh::Impl& I, int tag, std::string_view op) {
  Deadline dl = Deadline::fromTimeout(I.opt.timeout);
  return {I.opt.rank, I.opt.size,
          [&I, tag, op, dl](int peer, uint32_t, const void* data, size_t bytes) {
            I.send(peer, tag, data, bytes, dl, op, true);
          },
          [&I, tag, op, dl](int peer, uint32_t, void* data, size_t bytes) {
            I.recv(peer, tag, data, bytes, dl, op, true);
          }};
}

}  // namespace

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

Interruptible::~Interruptible() = default;
Interrupted::Interrupted(std::string_view backend, const Error& why)
    : Error(
          why.code(),
          fmt::format("{} bootstrap: a call in progress was interrupted: {}", backend, why.what()),
          why.peer()) {}
Interrupted::~Interrupted() = default;
SizeMismatch::~SizeMismatch() = default;

namespace {
/// The call this thread is in (CallScope).
thread_local const void* tlsOwner = nullptr;
thread_local uint64_t tlsInterrupts = 0;
}  // namespace

CallScope::CallScope(const void* owner, const std::atomic<uint64_t>& interrupts) noexcept
    : CallScope(InterruptKey{owner, &interrupts}) {}

CallScope::CallScope(const InterruptKey& key) noexcept {
  // Nested in a call on the same object: the outer one's count holds.
  if (key.owner == nullptr || key.count == nullptr || tlsOwner == key.owner) return;
  savedOwner_ = tlsOwner;
  savedCount_ = tlsInterrupts;
  outer_ = true;
  tlsOwner = key.owner;
  tlsInterrupts = key.count->load(std::memory_order_acquire);
}

CallScope::~CallScope() {
  if (!outer_) return;
  tlsOwner = savedOwner_;
  tlsInterrupts = savedCount_;
}

bool CallScope::interrupted(const void* owner, const std::atomic<uint64_t>& interrupts) noexcept {
  return tlsOwner == owner && interrupts.load(std::memory_order_acquire) != tlsInterrupts;
}

bool PeerMesh::Impl::interruptedCall() const {
  return CallScope::interrupted(this, interrupts);
}

void PeerMesh::Impl::throwInterrupted() {
  throw Interrupted(opt.backend, *interruptWhy);
}

InterruptKey PeerMesh::interruptKey() const noexcept {
  return {impl_.get(), &impl_->interrupts};
}

void PeerMesh::interrupt(const Error& why) noexcept {
  auto& I = *impl_;
  try {
    std::lock_guard lk(I.mu);
    I.interruptWhy = why;
    const uint64_t k = I.interrupts.fetch_add(1, std::memory_order_acq_rel) + 1;
    STRATA_LOG(Debug, I.opt.backend.c_str(), "interrupt {}: the calls in progress end: {}", k,
               why.what());
    I.cv.notify_all();
    I.wakeDriver();
  } catch (...) {
  }
}

void PeerMesh::send(int peer, int tag, const void* data, size_t bytes, const Deadline& deadline,
                    std::string_view op, bool internal) {
  CallScope call(interruptKey());
  impl_->send(peer, tag, data, bytes, deadline, op, internal);
}

void PeerMesh::recv(int peer, int tag, void* data, size_t bytes, const Deadline& deadline,
                    std::string_view op, bool internal) {
  CallScope call(interruptKey());
  impl_->recv(peer, tag, data, bytes, deadline, op, internal);
}

void PeerMesh::Impl::send(int peer, int tag, const void* data, size_t bytes,
                          const Deadline& deadline, std::string_view op, bool internal) {
  p2p::checkPeer(opt.rank, opt.size, peer, op);
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
        bool started = written > 0 ||
                       (!c.outq.empty() && c.outq.front().seq == seq && c.outq.front().offset > 0);
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

void PeerMesh::Impl::recv(int peer, int tag, void* data, size_t bytes, const Deadline& deadline,
                          std::string_view op, bool internal) {
  p2p::checkPeer(opt.rank, opt.size, peer, op);
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
    throw SizeMismatch(ErrorCode::ProtocolError,
                       fmt::format("{} from rank {} ({}): expected {} bytes but rank {} sent {} "
                                   "bytes; the message was discarded",
                                   op, peer, tagText(tag), bytes, peer, m.size),
                       peer);
  }
  if (bytes) std::memcpy(data, m.data.get(), bytes);
}

void PeerMesh::allGather(void* data, size_t bytesPerRank) {
  auto& I = *impl_;
  CallScope call(interruptKey());
  if (!p2p::allGatherNeeded(I.opt.size, data, bytesPerRank)) return;
  std::lock_guard coll(I.collMu);
  const bool star = useStar(I, static_cast<size_t>(I.opt.size) * bytesPerRank);
  p2p::allGather(collectiveMessenger(I, kTagAllGather, "allGather"),
                 star ? p2p::AllGatherAlgorithm::Star : p2p::AllGatherAlgorithm::Bruck, data,
                 bytesPerRank);
}

void PeerMesh::broadcast(void* data, size_t bytes, int root) {
  auto& I = *impl_;
  CallScope call(interruptKey());
  if (!p2p::broadcastNeeded(I.opt.size, data, bytes, root)) return;
  std::lock_guard coll(I.collMu);
  p2p::broadcast(collectiveMessenger(I, kTagBroadcast, "broadcast"), useStar(I, bytes), data, bytes,
                 root);
}

void PeerMesh::barrier() {
  auto& I = *impl_;
  CallScope call(interruptKey());
  if (!p2p::barrierNeeded(I.opt.size)) return;
  std::lock_guard coll(I.collMu);
  p2p::barrier(collectiveMessenger(I, kTagBarrier, "barrier"), useStar(I, 0));
}

void PeerMesh::abort(std::string_view reason) noexcept {
  auto& I = *impl_;
  try {
    std::unique_lock lk(I.mu);
    if (I.aborted || I.closed) return;
    std::string why(reason.substr(0, kMaxAbortReason));
    STRATA_LOG(Error, I.opt.backend.c_str(), "aborting the job: {}", why);
    I.enterAborted(I.opt.rank, std::move(why), nullptr);
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
    I.forEachOpenConn([&](Conn& c) {
      if (!c.outq.empty()) {
        STRATA_LOG(Debug, I.opt.backend.c_str(),
                   "closing with {} frames unsent to rank {} (it does not read)", c.outq.size(),
                   c.peer);
      }
    });
    I.closed = true;
    I.forEachOpenConn([](Conn& c) {
      ::shutdown(c.fd.get(), SHUT_WR);
      c.fd.reset();
    });
    I.pending.clear();
    I.listener.reset();
    I.cv.notify_all();
  } catch (...) {
  }
}

}  // namespace strata::mesh
