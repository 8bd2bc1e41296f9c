// How the mesh learns that a peer or the job failed, and how it says so. A broken connection
// marks its peer lost and tells the other ranks (LOST), so that ranks waiting for it fail with
// PeerLost at once instead of timing out; a peer that finished says goodbye (with the failure
// of its own call, if one failed); an abort is forwarded once to every connected peer. The
// errors name the peer, the operation and the tag.

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <fmt/format.h>

#include "base/log.hpp"
#include "mesh_impl.hpp"

namespace strata::mesh {

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

// A connection with data the peer's host has not acknowledged for a second or more, while TCP
// retransmits, means the network between the hosts is down (or that host is), not that the
// rank is slow; otherwise nothing (the rank is stuck, or called something else).
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

void PeerMesh::Impl::throwAborted() {
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

Error PeerMesh::Impl::peerGone(int peer, std::string_view op, int tag) {
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

Error PeerMesh::Impl::failed(Error e) {
  if (failure.empty()) failure = e.what();
  return e;
}

void PeerMesh::Impl::queueControlToAll(FrameType type, const std::vector<uint8_t>& body,
                                       const Conn* except) {
  forEachOpenConn([&](Conn& c) {
    if (&c != except) queueFrame(c, type, 0, body.data(), body.size());
  });
  wakeDriver();
}

void PeerMesh::Impl::markLost(int peer, std::string why, bool tellOthers) {
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

void PeerMesh::Impl::enterAborted(int origin, std::string reason, const Conn* except) {
  aborted = true;
  abortOrigin = origin;
  abortReason = std::move(reason);
  queueControlToAll(FrameType::Abort, encodeAbort(origin, abortReason), except);
  cv.notify_all();
}

// The peers are told that this rank aborted the job and why, instead of that the peer it tried
// to reach died.
void PeerMesh::Impl::failHere(std::string why) {
  if (aborted) return;
  abortedHere = true;
  std::string reason = why.substr(0, kMaxAbortReason);
  STRATA_LOG(Error, opt.backend.c_str(), "aborting the job: {}", reason);
  enterAborted(opt.rank, std::move(reason), nullptr);
}

void PeerMesh::Impl::tellAbortOnNewConnection(Conn& c) {
  if (!aborted) return;
  auto body = encodeAbort(abortOrigin, abortReason);
  queueFrame(c, FrameType::Abort, 0, body.data(), body.size());
}

void PeerMesh::Impl::closeConn(Conn& c, const std::string& why, bool tellOthers) {
  if (!c.fd.valid()) return;
  c.fd.reset();
  c.outq.clear();
  Peer& p = *peers[c.peer];
  if (!c.goodbye && !p.finished && !closed && !closing) {
    markLost(c.peer, why, tellOthers);
  }
  cv.notify_all();
}

void PeerMesh::Impl::protocolViolation(Conn& c, const std::string& what) {
  STRATA_LOG(Error, opt.backend.c_str(), "closing the connection with rank {}: {}", c.peer, what);
  int peer = c.peer;
  c.goodbye = false;
  closeConn(c, fmt::format("rank {} sent a malformed frame ({})", peer, what));
}

void PeerMesh::Impl::onGoodbye(Conn& c) {
  Peer& p = *peers[c.peer];
  try {
    p.goodbyeWhy = decodeGoodbye({c.payload.data.get(), c.payload.size});
  } catch (const Error& e) {
    protocolViolation(c, e.what());
    return;
  }
  c.goodbye = true;
  p.finished = true;
  cv.notify_all();
}

void PeerMesh::Impl::onAbort(Conn& c) {
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
    STRATA_LOG(Error, opt.backend.c_str(), "rank {} aborted the job: {}", origin, reason);
    enterAborted(origin, std::move(reason), &c);
  }
  cv.notify_all();
}

void PeerMesh::Impl::onLost(Conn& c) {
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
}

}  // namespace strata::mesh
