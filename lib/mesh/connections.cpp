// One persistent connection per peer and direction, identified by its handshake, never by
// accept order (that depends on timing; a library that trusted it took one sender's messages
// for another's). We connect lazily on the first send; the peer's connection to us arrives
// through the listener. Both sides of the handshake run inside the progress loop, so two ranks
// that connect to each other at once both make progress, and a stranger that stalls delays
// nobody.

#include <algorithm>
#include <iterator>

#include <fmt/format.h>

#include "base/log.hpp"
#include "base/process.hpp"
#include "mesh_impl.hpp"

namespace strata::mesh {

void PeerMesh::setPeerAddress(int rank, const std::string& address) {
  std::lock_guard lk(impl_->mu);
  if (rank >= 0 && rank < impl_->opt.size && rank != impl_->opt.rank) {
    impl_->peers[static_cast<size_t>(rank)]->address = address;
  }
}

void PeerMesh::setPeerAddresses(const std::vector<std::string>& addresses) {
  for (size_t r = 0; r < addresses.size(); ++r) setPeerAddress(static_cast<int>(r), addresses[r]);
}

Conn& PeerMesh::Impl::outgoing(std::unique_lock<std::mutex>& lk, int peer, const Deadline& deadline,
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
        throw failed(Error(ErrorCode::Timeout,
                           fmt::format("{} to rank {} ({}) timed out after {} s while connecting "
                                       "to it at {}",
                                       op, peer, tagText(tag), opt.timeout, p.address),
                           peer));
      });
  if (p.out && p.out->fd.valid()) return *p.out;
  throw failed(peerGone(peer, op, tag));
}

void PeerMesh::Impl::stepConnecting(int peer) {
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
  tellAbortOnNewConnection(*p.out);
  STRATA_LOG(Debug, opt.backend.c_str(), "connected to rank {} at {}", peer, p.address);
  cv.notify_all();
}

void PeerMesh::Impl::acceptAll() {
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

void PeerMesh::Impl::stepPending(std::list<handshake::ListenSide>::iterator it) {
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
  tellAbortOnNewConnection(*p.in);
}

}  // namespace strata::mesh
