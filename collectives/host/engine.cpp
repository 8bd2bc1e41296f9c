// The engine's progress loop: queueing an operation's pieces, sending them as chunks when the
// peer has a free slot, taking the chunks that arrive (copies and reduction rounds, in order),
// and the deadline and peer checks of a call that makes no progress.

#include "engine.hpp"

#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include <strata/error.hpp>

#include "base/backoff.hpp"
#include "base/log.hpp"
#include "base/watch_calls.hpp"
#include "chunk_header.hpp"
#include "reduce.hpp"
#include "stream_copy.hpp"

namespace strata::collectives {

namespace {

/// How often a call without progress checks the peers it needs.
constexpr auto kPeerCheckPeriod = std::chrono::milliseconds(10);

/// The call for messages: "allReduce(count 12, float, sum)", plus the step when it is not the
/// whole call ("allReduce(...) [allReduce (within the host)]").
std::string describeCall(const OpSignature& sig, const char* what) {
  std::string call = describe(sig);
  if (std::string_view(what) != toString(static_cast<OpKind>(sig.op))) {
    call += fmt::format(" [{}]", what);
  }
  return call;
}

}  // namespace

void Engine::readFrom(int peer, uint64_t addr, void* dst, size_t bytes) {
  auto* d = static_cast<char*>(dst);
  while (bytes > 0) {
    iovec local{d, bytes};
    iovec remote{reinterpret_cast<void*>(addr), bytes};
    ssize_t n = process_vm_readv(pids_[peer], &local, 1, &remote, 1, 0);
    if (n <= 0) {
      const int err = n < 0 ? errno : 0;  // n == 0 sets no errno
      if (err == EINTR) continue;
      throw Error(err == ESRCH ? ErrorCode::PeerLost : ErrorCode::SystemError,
                  fmt::format("reading {} B of rank {}'s buffer (pid {}) failed: {}", bytes, peer,
                              pids_[peer], n == 0 ? "nothing read" : std::strerror(err)),
                  peer);
    }
    d += n;
    addr += static_cast<uint64_t>(n);
    bytes -= static_cast<size_t>(n);
  }
}

const char* Engine::peerView(int peer, const PeerBuffer& b, uint64_t frees, uint64_t offset,
                             size_t bytes) {
  if (!zeroCopy_ || !b.shared()) return nullptr;
  const auto& r = b.region;
  if (offset > r.bytes - r.offset || bytes > r.bytes - r.offset - offset) {
    throw Error(ErrorCode::ProtocolError,
                fmt::format("rank {}'s buffer lies at offset {} of an allocation of {} B, but "
                            "this call reads {} B at its offset {}: the ranks disagree about the "
                            "call's size",
                            peer, r.offset, r.bytes, bytes, offset),
                peer);
  }
  std::string why;
  const char* base = maps_->map(peer, pids_[peer], r, frees, &why);
  if (!base) {
    if (!mapFailureSaid_[peer]) {
      mapFailureSaid_[peer] = 1;
      STRATA_LOG(Info, "coll",
                 "cannot map rank {}'s allocHost memory ({}); reading it with process_vm_readv",
                 peer, why);
    }
    return nullptr;
  }
  return base + r.offset + offset;
}

void Engine::queueCopy(int peer, const void* data, size_t bytes, const OpSignature& sig,
                       uint64_t offset) {
  // One allocation (a small message per call: single copy's descriptor and "done").
  auto owned = std::make_shared_for_overwrite<char[]>(bytes);
  if (bytes) std::memcpy(owned.get(), data, bytes);
  out_[peer].push_back({owned.get(), bytes, offset, sig, std::move(owned)});
}

size_t Engine::pieceBytes(size_t bytes) const {
  const size_t chunk = slots_.chunkBytes;
  if (bytes <= 2 * kMinPieceBytes) return chunk;  // one piece: small calls stay as they were
  size_t piece = (bytes + kPipelinePieces - 1) / kPipelinePieces;
  piece = (piece + 4095) / 4096 * 4096;
  return std::clamp(piece, kMinPieceBytes, chunk);
}

void Engine::queueSend(int peer, const void* src, size_t bytes, const OpSignature& sig,
                       uint64_t offsetBase, size_t piece) {
  auto& out = out_[peer];
  const char* s = static_cast<const char*>(src);
  const size_t chunk = piece ? std::min(piece, slots_.chunkBytes) : pieceBytes(bytes);
  for (size_t off = 0; off < bytes; off += chunk) {
    out.push_back({s + off, std::min(chunk, bytes - off), offsetBase + off, sig, nullptr});
  }
}

void Engine::expectCopy(Plan& plan, int peer, void* dst, size_t bytes, size_t chunkBytes) {
  char* d = static_cast<char*>(dst);
  for (size_t off = 0; off < bytes; off += chunkBytes) {
    plan.in[peer].push_back({d + off, std::min(chunkBytes, bytes - off), off, -1, {}});
  }
}

bool Engine::trySend(Link& link) {
  auto& out = out_[link.peer()];
  if (out.empty() || !link.slotFree()) return false;
  const OutPiece& piece = out.front();
  ChunkHeader header;
  header.op = piece.sig.op;
  header.type = piece.sig.type;
  header.redop = piece.sig.redop;
  header.root = piece.sig.root;
  header.count = piece.sig.count;
  header.offset = piece.offset;
  header.bytes = piece.bytes;
  link.putChunk(header, piece.src);
  out.pop_front();
  return true;
}

void Engine::checkHeader(const Link& link, const OpSignature& sig, const InPiece& piece) const {
  checkChunkHeader(link.nextChunk(),
                   {link.consumed(), sig, piece.offset, piece.bytes, link.peer(), rank_});
}

bool Engine::needs(const Plan& plan, const std::vector<size_t>& idx, const Link& link) const {
  const size_t p = static_cast<size_t>(link.peer());
  return plan.in[p].size() - idx[p] > link.waiting() || (plan.waitForSends && !out_[p].empty());
}

void Engine::checkNeededPeers(const Plan& plan, const std::vector<size_t>& idx, const char* what) {
  // A revoked communicator (this rank's or a peer's Communicator::revoke) stops every wait.
  if (auto revoked = context_->revoked()) throw *revoked;
  for (Link& link : links_) {
    if (link.peer() < 0 || !needs(plan, idx, link)) continue;
    try {
      link.checkPeer();
    } catch (const Error& e) {
      if (e.code() != ErrorCode::PeerLost) throw;
      // What the peer wrote before it went is here: take it, then decide.
      while (link.pollArrival()) {
      }
      if (needs(plan, idx, link)) {
        const size_t p = static_cast<size_t>(link.peer());
        throw Error(
            ErrorCode::PeerLost,
            fmt::format("{} needs rank {} ({} of {} pieces from it received, {} pieces "
                        "to it not yet sent): {}",
                        describeCall(plan.sig, what), link.peer(), idx[p] + link.waiting(),
                        plan.in[p].size(), plan.waitForSends ? out_[p].size() : 0, e.what()),
            link.peer());
      }
      link.markGone();
      STRATA_LOG(Debug, "coll", "rank {} is gone after sending all this call needs: {}",
                 link.peer(), e.what());
    }
  }
}

void Engine::run(Plan& plan, const char* what) {
  const size_t n = static_cast<size_t>(size_);
  std::vector<size_t>& idx = runIdx_;
  idx.assign(n, 0);
  size_t nextRound = 0;
  std::vector<const void*>& srcs = runSrcs_;
  srcs.resize(n);
  Backoff backoff(spinUs_);
  auto lastProgress = std::chrono::steady_clock::now();
  bool published = false;  // a wait was published to the status service (base/watch_calls.hpp)
  auto lastCheck = lastProgress;
  for (;;) {
    bool progress = false;
    for (Link& link : links_) {
      if (link.peer() < 0) continue;
      try {
        while (trySend(link)) progress = true;
      } catch (const Error& e) {
        // A write over a Connection (a direct link) found the peer lost: fail the call naming
        // it and what it still needed, as a wait would, or, when this call no longer needs it,
        // drop what was queued for it (nobody will read it).
        if (e.code() != ErrorCode::PeerLost) throw;
        checkNeededPeers(plan, idx, what);
        if (!link.gone()) throw;
        out_[link.peer()].clear();
      }
      while (link.pollArrival()) progress = true;
    }
    if (plan.localWork) {
      plan.localWork();
      plan.localWork = nullptr;
      progress = true;
    }
    // Copies, in order per peer, up to the next reduction round member.
    for (size_t p = 0; p < n; ++p) {
      if (p == static_cast<size_t>(rank_)) continue;
      Link& link = links_[p];
      auto& in = plan.in[p];
      while (idx[p] < in.size() && in[idx[p]].round < 0 && link.waiting() > 0) {
        const InPiece& piece = in[idx[p]];
        checkHeader(link, plan.sig, piece);
        if (piece.onArrive) {
          // Copy out first: the callback may wait for this peer, which needs the ack.
          char small[64];
          const char* payload = link.nextPayload();
          bool copied = piece.bytes <= sizeof small;
          if (copied) std::memcpy(small, payload, piece.bytes);
          if (copied) link.ack();
          piece.onArrive(copied ? small : payload);
          if (!copied) link.ack();
        } else {
          if (plan.stream) {
            streamCopy(piece.dst, link.nextPayload(), piece.bytes);
          } else {
            std::memcpy(piece.dst, link.nextPayload(), piece.bytes);
          }
          link.ack();
        }
        ++idx[p];
        progress = true;
      }
    }
    // Reduction rounds: each needs chunk `round` of every member (default: every rank).
    while (nextRound < plan.rounds.size()) {
      Round& round = plan.rounds[nextRound];
      const std::vector<int>& members = round.members ? *round.members : allRanks_;
      bool ready = true;
      for (int p : members) {
        if (p == rank_) continue;
        const auto& in = plan.in[p];
        ready = idx[p] < in.size() && in[idx[p]].round == static_cast<int>(nextRound) &&
                links_[p].waiting() > 0;
        if (ready && nextRound < plan.minSent.size()) {
          ready = links_[p].sent() >= plan.minSent[nextRound][p];
        }
        if (!ready) break;
      }
      if (!ready) break;
      for (size_t k = 0; k < members.size(); ++k) {
        int p = members[k];
        if (p == rank_) {
          srcs[k] = round.own;
        } else {
          const Link& link = links_[p];
          checkHeader(link, plan.sig, plan.in[p][idx[p]]);
          srcs[k] = link.nextPayload();
        }
      }
      if (round.action) {
        std::vector<const char*>& payloads = runPayloads_;
        payloads.assign(n, nullptr);
        for (size_t k = 0; k < members.size(); ++k) {
          payloads[members[k]] = members[k] == rank_ ? nullptr : static_cast<const char*>(srcs[k]);
        }
        round.action(payloads);
      } else {
        reduceMany(round.dst, srcs.data(), members.size(), round.count, plan.type, plan.redop);
        int divisor = round.divisor < 0 ? size_ : round.divisor;
        if (plan.redop == ReduceOp::Avg && divisor > 1) {
          divideBy(round.dst, round.count, plan.type, divisor);
        }
      }
      for (int p : members) {
        if (p == rank_) continue;
        links_[p].ack();
        ++idx[p];
      }
      if (round.forwardTo) {
        const size_t len = round.count * sizeOf(plan.type);
        for (int p : *round.forwardTo) {
          if (p != rank_) queueSend(p, round.dst, len, plan.sig, round.forwardOffset, len);
        }
      }
      if (round.after) round.after();
      ++nextRound;
      progress = true;
    }
    bool done = nextRound == plan.rounds.size();
    for (size_t p = 0; p < n && done; ++p) {
      if (p == static_cast<size_t>(rank_)) continue;
      done = idx[p] == plan.in[p].size() && (!plan.waitForSends || out_[p].empty());
    }
    if (done) return;
    auto now = std::chrono::steady_clock::now();
    if (progress) {
      backoff.reset();
      lastProgress = now;
      if (published) {  // only after a wait was published: a fast call never touches it
        watch::progressed();
        published = false;
      }
      continue;
    }
    if (now - lastCheck > kPeerCheckPeriod) {
      lastCheck = now;
      checkNeededPeers(plan, idx, what);
      // Name the peer this rank is stuck on: first one it expects data from and has nothing
      // of (a peer whose chunks wait in the slots for a reduction round is not the culprit),
      // then one it cannot send to (slots full), then any with work left. Published for the
      // status service (base/watch_calls.hpp) at each check, so that peers asking learn it.
      const int culprit = [&]() -> int {
        for (int pass = 0; pass < 3; ++pass) {
          for (size_t p = 0; p < n; ++p) {
            if (p == static_cast<size_t>(rank_)) continue;
            const Link& link = links_[p];
            bool expecting = idx[p] < plan.in[p].size();
            bool sending = plan.waitForSends && !out_[p].empty();
            if (pass == 0 && expecting && link.waiting() == 0) return int(p);
            if (pass == 1 && sending && link.slotsFull()) return int(p);
            if (pass == 2 && (expecting || sending)) return int(p);
          }
        }
        return -1;
      }();
      std::string progressText;
      if (culprit >= 0) {
        const Link& link = links_[culprit];
        progressText = fmt::format("{} of {} pieces from it received, {} pieces to it not yet sent",
                                   idx[culprit] + link.waiting(), plan.in[culprit].size(),
                                   out_[culprit].size());
        watch::waitingFor(culprit, progressText, lastProgress);
        published = true;
      }
      if (timeout_ > 0 && now - lastProgress > std::chrono::duration<double>(timeout_)) {
        std::string call = describeCall(plan.sig, what);
        if (culprit < 0) {
          throw Error(ErrorCode::Timeout,
                      fmt::format("{} made no progress for {} s", call, timeout_));
        }
        throw Error(ErrorCode::Timeout,
                    fmt::format("{} made no progress for {} s: waiting for rank {} ({}); that "
                                "rank may be stuck, slower, or in another call: every rank must "
                                "call the same collectives in the same order. Raise "
                                "transport.timeout for slow peers",
                                call, timeout_, culprit, progressText),
                    culprit);
      }
    }
    driveTransports();
    backoff.pause();
  }
}

void Engine::driveTransports() {
  for (int p : progressPeers_) links_[p].progress();
}

}  // namespace strata::collectives
