// The ucx backend's data path: messages by UCX tag matching. The 64-bit tag holds a kind
// (user, collective, abort, setup, handshake) in the top 8 bits, the sender's rank (for
// handshakes: the connection id) in the next 24 and the user tag or collective sequence in the
// low 32, and receives match it with a full mask, so a message is only ever taken for the
// (peer, tag) it was sent on. UCX matches messages of one endpoint in send order. Sends are
// copied and buffered; calling threads and a progress thread drive the worker under mu_.

#include <poll.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include <strata/error.hpp>

#include "base/log.hpp"
#include "base/wire.hpp"
#include "ucx_internal.hpp"

namespace strata::ucx {
namespace {

// A waiting thread blocks on the worker's event fd for at most this long, so that deadlines
// and peers lost without an event are noticed.
constexpr int kMaxSleepMs = 50;
// A peer whose endpoint failed is reported lost only after this long, so that an abort
// message it sent just before closing (possibly on another connection) is seen first.
constexpr auto kLostGrace = std::chrono::milliseconds(150);
// Sends are buffered (see send()); past this many bytes in flight a send waits.
constexpr size_t kMaxInFlightBytes = size_t{1} << 30;

bool isPeerFailure(ucs_status_t status) {
  switch (status) {
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_REJECTED:
    case UCS_ERR_NOT_CONNECTED:
    case UCS_ERR_IO_ERROR:
    case UCS_ERR_TIMED_OUT:
      return true;
    default:
      return false;
  }
}

std::string tagText(Kind kind, int tag) {
  return kind == Kind::User ? fmt::format("tag {}", tag) : std::string("internal tag");
}

}  // namespace

void sendDone(void* /*request*/, ucs_status_t status, void* user) {
  auto* op = static_cast<OpState*>(user);
  op->done = true;
  op->status = status;
}

void recvDone(void* /*request*/, ucs_status_t status, const ucp_tag_recv_info_t* info, void* user) {
  auto* op = static_cast<OpState*>(user);
  op->done = true;
  op->status = status;
  if (info) {
    op->length = info->length;
    op->senderTag = info->sender_tag;
  }
}

void closeDone(void* /*request*/, ucs_status_t status, void* user) {
  auto* op = static_cast<OpState*>(user);
  op->done = true;
  op->status = status;
}

void UcxBootstrap::onPeerError(void* arg, ucp_ep_h /*ep*/, ucs_status_t status) {
  auto* p = static_cast<Peer*>(arg);
  if (p->lost.load()) return;
  p->lostWhy = fmt::format("its UCX endpoint failed: {}", statusText(status));
  p->lostAt = std::chrono::steady_clock::now();
  p->lost.store(true);
  STRATA_LOG(Debug, kSub, "rank {} lost: {}", p->rank, p->lostWhy);
}

ucp_ep_h UcxBootstrap::endpoint(int peer) {
  Peer& p = *peers_[static_cast<size_t>(peer)];
  if (p.ep) return p.ep;
  const auto& address = table_[static_cast<size_t>(peer)];
  if (address.empty()) {
    throw Error(ErrorCode::Internal,
                fmt::format("ucx bootstrap: no worker address for rank {}", peer), peer);
  }
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                  UCP_EP_PARAM_FIELD_ERR_HANDLER;
  ep.address = reinterpret_cast<const ucp_address_t*>(address.data());
  // PEER mode: requests to a dead peer fail, and onPeerError tells waiting calls.
  ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  ep.err_handler.cb = &UcxBootstrap::onPeerError;
  ep.err_handler.arg = &p;
  ucs_status_t st = ucp_ep_create(worker_, &ep, &p.ep);
  if (st != UCS_OK) {
    p.ep = nullptr;
    throw Error(ErrorCode::BackendError,
                fmt::format("ucx bootstrap: creating an endpoint to rank {} failed: {}. Check "
                            "that UCX_TLS and UCX_NET_DEVICES give both ranks a common transport",
                            peer, statusText(st)),
                peer);
  }
  return p.ep;
}

void UcxBootstrap::reapSends() {
  for (auto it = sends_.begin(); it != sends_.end();) {
    PendingSend& s = **it;
    if (!s.op.done) {
      ++it;
      continue;
    }
    if (s.op.status != UCS_OK && s.op.status != UCS_ERR_CANCELED && s.peer >= 0) {
      Peer& p = *peers_[static_cast<size_t>(s.peer)];
      if (!p.lost.load()) {
        p.lostWhy = fmt::format("a send to it failed: {}", statusText(s.op.status));
        p.lostAt = std::chrono::steady_clock::now();
        p.lost.store(true);
      }
    }
    ucp_request_free(s.request);
    inFlightBytes_ -= s.bytes;
    it = sends_.erase(it);
  }
}

void UcxBootstrap::checkAbortMessage() {
  if (!abortRequest_ || !abortOp_.done) return;
  ucp_request_free(abortRequest_);
  abortRequest_ = nullptr;
  if (abortOp_.status == UCS_ERR_CANCELED) return;
  int origin = tagRank(abortOp_.senderTag);
  std::string reason = "(no reason received)";
  if (abortOp_.status == UCS_OK) {
    try {
      auto d = wire::decodeRecord({abortBuf_.data(), abortOp_.length}, kAbortRecord, kVersion,
                                  abortBuf_.size(), "ucx abort record");
      wire::Reader r(d.body, "ucx abort record");
      origin = r.i32("origin");
      reason = r.str(kMaxAbortReason, "reason");
    } catch (const Error& e) {
      reason = fmt::format("(unreadable abort record: {})", e.what());
    }
  }
  if (!aborted_) {
    aborted_ = true;
    abortOrigin_ = origin;
    abortReason_ = reason;
    STRATA_LOG(Error, kSub, "rank {} aborted the job: {}", origin, reason);
  }
  cv_.notify_all();
}

void UcxBootstrap::progress(Lock& /*lk*/) {
  unsigned events = 0;
  for (int i = 0; i < 64; ++i) {
    unsigned e = ucp_worker_progress(worker_);
    events += e;
    if (e == 0) break;
  }
  reapSends();
  checkAbortMessage();
  if (events > 0 && driving_) {
    ucp_worker_signal(worker_);  // the thread asleep on the efd may be waiting for this
  }
  if (events > 0) cv_.notify_all();
}

void UcxBootstrap::throwAborted() const {
  if (abortOrigin_ == launch_.rank) {
    throw Error(ErrorCode::Aborted,
                fmt::format("ucx bootstrap: this rank called abort(): {}", abortReason_),
                abortOrigin_);
  }
  throw Error(ErrorCode::Aborted,
              fmt::format("ucx bootstrap: rank {} aborted the job: {}", abortOrigin_, abortReason_),
              abortOrigin_);
}

void UcxBootstrap::throwInterrupted() const {
  throw mesh::Interrupted("ucx", *interruptWhy_);
}

bool UcxBootstrap::interruptCalls(const Error& why) noexcept {
  try {
    Lock lk(mu_);
    interruptWhy_ = why;
    interrupts_.fetch_add(1, std::memory_order_acq_rel);
    cv_.notify_all();
    if (worker_) ucp_worker_signal(worker_);  // the thread blocked on the worker's fd
  } catch (...) {
  }
  return true;
}

bool UcxBootstrap::lostLongEnough(int peer) const {
  if (peer < 0) return false;
  const Peer& p = *peers_[static_cast<size_t>(peer)];
  return p.lost.load() && std::chrono::steady_clock::now() - p.lostAt >= kLostGrace;
}

void UcxBootstrap::throwLost(int peer, std::string_view op, Kind kind, int tag) const {
  const Peer& p = *peers_[static_cast<size_t>(peer)];
  throw Error(
      ErrorCode::PeerLost,
      fmt::format("{} {} rank {} ({}) failed: rank {} is gone ({}); it died or "
                  "destroyed its bootstrap. Make every rank take part in the same "
                  "exchanges",
                  op, op == "send" ? "to" : "with", peer, tagText(kind, tag), peer, p.lostWhy),
      peer);
}

template <class Done, class OnTimeout>
void UcxBootstrap::waitUntil(Lock& lk, const Deadline& deadline, int peer, Done done,
                             OnTimeout onTimeout, std::string_view op, Kind kind, int tag) {
  const auto spinUntil = std::chrono::steady_clock::now() + std::chrono::microseconds(spin_.us);
  for (;;) {
    progress(lk);
    if (aborted_) throwAborted();
    if (done()) return;
    if (mesh::CallScope::interrupted(this, interrupts_)) throwInterrupted();
    if (lostLongEnough(peer)) throwLost(peer, op, kind, tag);
    if (deadline.expired()) {
      onTimeout();  // throws, except where the caller only wanted to wait a while
      return;
    }
    if (std::chrono::steady_clock::now() < spinUntil) {
      // Poll the worker again before sleeping (bootstrap.spin_us); let other threads in.
      lk.unlock();
      if (spin_.yield) sched_yield();
      lk.lock();
      continue;
    }
    int capMs = kMaxSleepMs;
    if (peer >= 0 && peers_[static_cast<size_t>(peer)]->lost.load()) capMs = 10;
    blockOnce(lk, deadline, capMs);
  }
}

void UcxBootstrap::blockOnce(Lock& lk, const Deadline& deadline, int capMs) {
  if (driving_ || efd_ < 0) {
    if (efd_ < 0 && !driving_) {
      lk.unlock();
      std::this_thread::sleep_for(std::chrono::microseconds(100));
      lk.lock();
    } else {
      // Another thread sleeps on the worker's fd and wakes us after each progress.
      cv_.wait_for(lk, std::chrono::milliseconds(deadline.pollMs(capMs) + 1));
    }
    return;
  }
  ucs_status_t st = ucp_worker_arm(worker_);
  if (st == UCS_ERR_BUSY) return;  // events arrived meanwhile: progress again
  driving_ = true;
  lk.unlock();
  pollfd pfd{efd_, POLLIN, 0};
  ::poll(&pfd, 1, st == UCS_OK ? deadline.pollMs(capMs) + 1 : 1);
  lk.lock();
  driving_ = false;
  cv_.notify_all();
}

// Sends complete, wireup requests are answered and aborts and lost peers are noticed even
// while the user makes no call (a rank that sends and then computes must still deliver).
void UcxBootstrap::progressLoop() {
  Lock lk(mu_);
  while (!stopping_) {
    progress(lk);
    if (stopping_) break;
    blockOnce(lk, Deadline::never(), 100);
  }
}

void UcxBootstrap::waitRequest(Lock& lk, void* request, std::unique_ptr<OpState>& state,
                               const Deadline& deadline, int peer, std::string_view opName,
                               Kind kind, int tag) {
  OpState& op = *state;
  try {
    waitUntil(
        lk, deadline, peer, [&] { return op.done; },
        [&] {
          throw Error(ErrorCode::Timeout,
                      fmt::format("{} {} rank {} ({}) timed out after {} s in the middle of the "
                                  "transfer",
                                  opName, opName == "send" ? "to" : "from", peer,
                                  tagText(kind, tag), timeout_),
                      peer);
        },
        opName, kind, tag);
  } catch (...) {
    // Take the request back before the caller's buffer goes away.
    ucp_request_cancel(worker_, request);
    Deadline grace = Deadline::after(5.0);
    while (!op.done && !grace.expired()) {
      if (ucp_worker_progress(worker_) == 0) {
        lk.unlock();
        std::this_thread::sleep_for(std::chrono::microseconds(200));
        lk.lock();
      }
    }
    if (op.done) {
      ucp_request_free(request);
    } else {
      // UCX still owns it: keep its state alive until the worker is destroyed.
      STRATA_LOG(Warn, kSub,
                 "a {} with rank {} could not be cancelled; its buffer may still be "
                 "written by UCX",
                 opName, peer);
      orphans_.emplace_back(request, std::move(state));
    }
    throw;
  }
  ucp_request_free(request);
}

void UcxBootstrap::startSend(Lock& lk, int peer, uint64_t tag, const void* data, size_t bytes,
                             const Deadline& deadline, std::string_view op, Kind kind,
                             int userTag) {
  if (aborted_) throwAborted();
  if (peers_[static_cast<size_t>(peer)]->lost.load()) {
    // Give a just-sent abort the chance to arrive first.
    waitUntil(
        lk, Deadline::after(1.0), peer, [] { return false; }, [] {}, op, kind, userTag);
    throwLost(peer, op, kind, userTag);
  }
  if (inFlightBytes_ + bytes > kMaxInFlightBytes && !sends_.empty()) {
    waitUntil(
        lk, deadline, peer,
        [&] { return sends_.empty() || inFlightBytes_ + bytes <= kMaxInFlightBytes; },
        [&] {
          throw Error(
              ErrorCode::Timeout,
              fmt::format("{} to rank {} ({}, {} bytes) timed out after {} s: {} bytes "
                          "sent earlier are still not received by their peers",
                          op, peer, tagText(kind, userTag), bytes, timeout_, inFlightBytes_),
              peer);
        },
        op, kind, userTag);
  }
  ucp_ep_h ep = endpoint(peer);
  // The message is copied so that send() returns without waiting for the receiver: a large
  // message goes by rendezvous, which completes only once the peer receives it, and two
  // ranks sending to each other must not deadlock.
  ucs_status_t st = postSend(ep, peer, tag, data, bytes);
  if (st != UCS_OK) {
    if (isPeerFailure(st)) {
      Peer& p = *peers_[static_cast<size_t>(peer)];
      if (!p.lost.load()) {
        p.lostWhy = fmt::format("a send to it failed: {}", statusText(st));
        p.lostAt = std::chrono::steady_clock::now() - kLostGrace;
        p.lost.store(true);
      }
      throwLost(peer, op, kind, userTag);
    }
    throw Error(ErrorCode::BackendError,
                fmt::format("{} to rank {} ({}, {} bytes): ucp_tag_send_nbx() failed: {}", op, peer,
                            tagText(kind, userTag), bytes, statusText(st)),
                peer);
  }
}

ucs_status_t UcxBootstrap::postSend(ucp_ep_h ep, int peer, uint64_t tag, const void* data,
                                    size_t bytes) {
  auto s = std::make_unique<PendingSend>();
  s->peer = peer;
  s->bytes = bytes;
  s->data.reset(new uint8_t[bytes ? bytes : 1]);
  if (bytes) std::memcpy(s->data.get(), data, bytes);
  ucp_request_param_t rp{};
  rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  rp.cb.send = sendDone;
  rp.user_data = &s->op;
  void* req = ucp_tag_send_nbx(ep, s->data.get(), bytes, tag, &rp);
  if (req == nullptr) return UCS_OK;  // completed in place
  if (UCS_PTR_IS_ERR(req)) return UCS_PTR_STATUS(req);
  s->request = req;
  inFlightBytes_ += bytes;
  sends_.push_back(std::move(s));
  return UCS_OK;
}

void* UcxBootstrap::recvProbed(ucp_tag_message_h msg, void* buffer, size_t capacity,
                               OpState& state) {
  ucp_request_param_t rp{};
  rp.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  rp.cb.recv = recvDone;
  rp.user_data = &state;
  return ucp_tag_msg_recv_nbx(worker_, buffer, capacity, msg, &rp);
}

void UcxBootstrap::closeEndpoints(Lock& lk, const std::vector<ucp_ep_h*>& eps,
                                  const std::vector<bool>& force) {
  std::vector<std::pair<void*, std::unique_ptr<OpState>>> closing;
  for (size_t i = 0; i < eps.size(); ++i) {
    if (!*eps[i]) continue;
    auto op = std::make_unique<OpState>();
    ucp_request_param_t cp{};
    cp.op_attr_mask =
        UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
    cp.cb.send = closeDone;
    cp.user_data = op.get();
    cp.flags = force[i] ? UCP_EP_CLOSE_FLAG_FORCE : 0;
    void* req = ucp_ep_close_nbx(*eps[i], &cp);
    *eps[i] = nullptr;
    if (req != nullptr && !UCS_PTR_IS_ERR(req)) closing.emplace_back(req, std::move(op));
  }
  Deadline closeBy = Deadline::after(2.0);
  auto allClosed = [&] {
    return std::all_of(closing.begin(), closing.end(),
                       [](const auto& c) { return c.second->done; });
  };
  while (!allClosed() && !closeBy.expired()) {
    if (ucp_worker_progress(worker_) == 0) {
      lk.unlock();
      std::this_thread::sleep_for(std::chrono::microseconds(100));
      lk.lock();
    }
  }
  for (auto& c : closing) {
    if (!c.second->done) STRATA_LOG(Debug, kSub, "an endpoint did not close within 2 s");
    ucp_request_free(c.first);  // UCX releases unfinished ones when they complete
  }
}

void UcxBootstrap::recvTagged(Lock& lk, int peer, uint64_t tag, void* data, size_t bytes,
                              const Deadline& deadline, std::string_view op, Kind kind, int userTag,
                              std::vector<uint8_t>* any) {
  if (aborted_) throwAborted();
  // An endpoint of our own makes the peer's death visible to us (onPeerError).
  if (!table_[static_cast<size_t>(peer)].empty()) endpoint(peer);
  ucp_tag_message_h msg = nullptr;
  ucp_tag_recv_info_t info{};
  waitUntil(
      lk, deadline, peer,
      [&] {
        msg = ucp_tag_probe_nb(worker_, tag, kFullMask, 1, &info);
        return msg != nullptr;
      },
      [&] {
        throw Error(ErrorCode::Timeout,
                    fmt::format("{} from rank {} ({}, {} bytes) timed out after {} s: rank {} "
                                "did not send it (is it stuck, or did the ranks call different "
                                "operations?)",
                                op, peer, tagText(kind, userTag), bytes, timeout_, peer),
                    peer);
      },
      op, kind, userTag);

  const size_t length = info.length;
  std::unique_ptr<uint8_t[]> scratch;
  void* target = data;
  size_t capacity = bytes;
  bool mismatch = false;
  if (any) {
    if (length > maxMessage_) {
      mismatch = true;
    } else {
      any->resize(length);
      target = any->data();
      capacity = length;
    }
  } else if (length != bytes) {
    mismatch = true;
  }
  if (mismatch) {
    // Consume the message so that the stream stays in step, then report.
    capacity = length <= maxMessage_ ? length : 0;
    scratch.reset(new uint8_t[capacity ? capacity : 1]);
    target = scratch.get();
  }
  auto state = std::make_unique<OpState>();
  uint8_t dummy = 0;
  void* req = recvProbed(msg, target ? target : &dummy, capacity, *state);
  if (UCS_PTR_IS_ERR(req)) {
    throw Error(ErrorCode::BackendError,
                fmt::format("{} from rank {} ({}): ucp_tag_msg_recv_nbx() failed: {}", op, peer,
                            tagText(kind, userTag), statusText(UCS_PTR_STATUS(req))),
                peer);
  }
  waitRequest(lk, req, state, deadline, peer, op, kind, userTag);
  if (mismatch) {
    throw mesh::SizeMismatch(
        ErrorCode::ProtocolError,
        any ? fmt::format("{} from rank {} ({}): rank {} sent {} bytes, more than "
                          "bootstrap.max_message ({} bytes); the message was discarded",
                          op, peer, tagText(kind, userTag), peer, length, maxMessage_)
            : fmt::format("{} from rank {} ({}): expected {} bytes but rank {} sent {} "
                          "bytes; the message was discarded",
                          op, peer, tagText(kind, userTag), bytes, peer, length),
        peer);
  }
  if (state->status != UCS_OK) {
    if (isPeerFailure(state->status)) {
      Peer& p = *peers_[static_cast<size_t>(peer)];
      if (!p.lost.load()) {
        p.lostWhy = fmt::format("a receive from it failed: {}", statusText(state->status));
        p.lostAt = std::chrono::steady_clock::now() - kLostGrace;
        p.lost.store(true);
      }
      throwLost(peer, op, kind, userTag);
    }
    throw Error(ErrorCode::BackendError,
                fmt::format("{} from rank {} ({}, {} bytes) failed in UCX: {}", op, peer,
                            tagText(kind, userTag), length, statusText(state->status)),
                peer);
  }
}

void UcxBootstrap::sendInternal(Lock& lk, int peer, Kind kind, uint32_t low, const void* data,
                                size_t bytes, const Deadline& deadline, std::string_view op) {
  startSend(lk, peer, makeTag(kind, launch_.rank, low), data, bytes, deadline, op, kind, 0);
}

void UcxBootstrap::recvInternal(Lock& lk, int peer, Kind kind, uint32_t low, void* data,
                                size_t bytes, const Deadline& deadline, std::string_view op) {
  recvTagged(lk, peer, makeTag(kind, peer, low), data, bytes, deadline, op, kind, 0);
}

uint32_t UcxBootstrap::nextCollective() {
  // Every rank calls the collectives in the same order, so sequence numbers agree; the low
  // 8 bits number the steps within one collective.
  return (++collectiveSeq_ & 0xFFFFFF) << 8;
}

void UcxBootstrap::send(int peer, int tag, const void* data, size_t bytes) {
  mesh::CallScope call(this, interrupts_);
  p2p::checkPeer(launch_.rank, launch_.size, peer, "send");
  if (tag < 0) {
    throw Error(ErrorCode::InvalidArgument, fmt::format("send: tag {} is negative", tag), peer);
  }
  if (bytes > maxMessage_) {
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("send to rank {}: {} bytes exceed bootstrap.max_message ({} bytes)",
                            peer, bytes, maxMessage_),
                peer);
  }
  if (bytes && !data) {
    throw Error(ErrorCode::InvalidArgument, "send: null buffer", peer);
  }
  Deadline dl = callDeadline();
  Lock lk(mu_);
  startSend(lk, peer, makeTag(Kind::User, launch_.rank, static_cast<uint32_t>(tag)), data, bytes,
            dl, "send", Kind::User, tag);
  progress(lk);
}

void UcxBootstrap::recv(int peer, int tag, void* data, size_t bytes) {
  mesh::CallScope call(this, interrupts_);
  p2p::checkPeer(launch_.rank, launch_.size, peer, "recv");
  if (tag < 0) {
    throw Error(ErrorCode::InvalidArgument, fmt::format("recv: tag {} is negative", tag), peer);
  }
  if (bytes && !data) {
    throw Error(ErrorCode::InvalidArgument, "recv: null buffer", peer);
  }
  Deadline dl = callDeadline();
  Lock lk(mu_);
  recvTagged(lk, peer, makeTag(Kind::User, peer, static_cast<uint32_t>(tag)), data, bytes, dl,
             "recv", Kind::User, tag);
}

// The algorithms are lib/mesh/p2p_collectives.cpp's. Every rank calls the collectives
// in the same order, so one sequence number per call (nextCollective) tags all its messages;
// the barrier also puts its round in the low 8 bits.
p2p::Messenger UcxBootstrap::collectiveMessenger(Lock& lk, const Deadline& deadline,
                                                 std::string_view op, bool tagRounds) {
  const uint32_t seq = nextCollective();
  auto low = [seq, tagRounds](uint32_t round) { return tagRounds ? seq | round : seq; };
  return {launch_.rank, launch_.size,
          [this, &lk, deadline, op, low](int peer, uint32_t round, const void* data, size_t bytes) {
            sendInternal(lk, peer, Kind::Collective, low(round), data, bytes, deadline, op);
          },
          [this, &lk, deadline, op, low](int peer, uint32_t round, void* data, size_t bytes) {
            recvInternal(lk, peer, Kind::Collective, low(round), data, bytes, deadline, op);
          }};
}

// Ring: sends are buffered, so the ring never waits on itself.
void UcxBootstrap::allGather(void* data, size_t bytesPerRank) {
  mesh::CallScope call(this, interrupts_);
  if (!p2p::allGatherNeeded(launch_.size, data, bytesPerRank)) return;
  Deadline dl = callDeadline();
  Lock lk(mu_);
  if (aborted_) throwAborted();
  p2p::allGather(collectiveMessenger(lk, dl, "allGather", false), p2p::AllGatherAlgorithm::Ring,
                 data, bytesPerRank);
}

void UcxBootstrap::broadcast(void* data, size_t bytes, int root) {
  mesh::CallScope call(this, interrupts_);
  if (!p2p::broadcastNeeded(launch_.size, data, bytes, root)) return;
  Deadline dl = callDeadline();
  Lock lk(mu_);
  if (aborted_) throwAborted();
  p2p::broadcast(collectiveMessenger(lk, dl, "broadcast", false), false, data, bytes, root);
}

void UcxBootstrap::barrier() {
  mesh::CallScope call(this, interrupts_);
  if (!p2p::barrierNeeded(launch_.size)) return;
  Deadline dl = callDeadline();
  Lock lk(mu_);
  if (aborted_) throwAborted();
  p2p::barrier(collectiveMessenger(lk, dl, "barrier", true), false);
}

void UcxBootstrap::abort(std::string_view reason) noexcept {
  try {
    Lock lk(mu_);
    if (aborted_ || !worker_) return;
    aborted_ = true;
    abortOrigin_ = launch_.rank;
    abortReason_ = std::string(reason.substr(0, kMaxAbortReason));
    STRATA_LOG(Error, kSub, "aborting the job: {}", abortReason_);
    cv_.notify_all();
    wire::Writer w;
    w.i32(launch_.rank).str(abortReason_);
    auto rec = wire::encodeRecord(kAbortRecord, kVersion, w.data());
    // Every rank, not only connected ones: a rank may be waiting on us without ever having
    // talked to us.
    for (int r = 0; r < launch_.size; ++r) {
      if (r == launch_.rank || peers_[static_cast<size_t>(r)]->lost.load()) continue;
      if (table_[static_cast<size_t>(r)].empty()) continue;
      try {
        postSend(endpoint(r), r, makeTag(Kind::Abort, launch_.rank, 0), rec.data(), rec.size());
      } catch (const Error& e) {
        STRATA_LOG(Debug, kSub, "abort: cannot tell rank {}: {}", r, e.what());
      }
    }
    // Deliver them before the caller goes on (and likely destroys us or exits).
    Deadline dl = Deadline::after(2.0);
    while (!sends_.empty() && !dl.expired()) {
      if (ucp_worker_progress(worker_) == 0) {
        lk.unlock();
        std::this_thread::sleep_for(std::chrono::microseconds(100));
        lk.lock();
      }
      reapSends();
    }
  } catch (...) {
  }
}

}  // namespace strata::ucx
