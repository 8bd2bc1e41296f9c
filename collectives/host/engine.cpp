#include "engine.hpp"

#include <sched.h>
#include <sys/uio.h>
#include <time.h>

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include <strata/error.hpp>

#include "base/backoff.hpp"
#include "base/config_keys.hpp"
#include "base/deadline.hpp"
#include "base/log.hpp"
#include "base/watch_calls.hpp"
#include "base/wire.hpp"
#include "chunk_header.hpp"
#include "reduce.hpp"

namespace strata::collectives {

namespace {

constexpr size_t kHeaderBytes = kChunkHeaderBytes;
constexpr size_t kFlagStride = 64;
/// Pipeline slots per peer: deep when the buffer leaves chunks of kDeepChunkMin or more.
constexpr uint32_t kDeepSlots = 4;
constexpr uint32_t kShallowSlots = 2;
constexpr size_t kDeepChunkMin = 64 * 1024;
/// The smallest chunk, whatever collectives.buffer_bytes says (a warning says so at create).
constexpr size_t kChunkFloor = 4096;
/// Entries of the proxy FIFO of port links (triggers in flight before a push waits).
constexpr uint32_t kProxyFifoEntries = 1024;
/// Spin before yielding in the progress loop (0 when the host's ranks outnumber its cores).
constexpr int kSpinMicros = 10;
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

Engine::Engine(std::shared_ptr<Context> context, const Config& config)
    : context_(std::move(context)) {
  rank_ = context_->rank();
  size_ = context_->size();
  timeout_ = config::getDouble(config, "transport.timeout");
  singleCopyMin_ = static_cast<size_t>(config::getInt(config, "collectives.single_copy_min_bytes"));
  allRanks_.resize(static_cast<size_t>(size_));
  for (int r = 0; r < size_; ++r) allRanks_[r] = r;
  size_t buffer = static_cast<size_t>(config::getInt(config, "collectives.buffer_bytes"));
  size_t chunkMax = static_cast<size_t>(config::getInt(config, "collectives.chunk_bytes"));
  links_.resize(size_);
  hosts_ = context_->hostGroups();
  {
    cpu_set_t cpus;
    int cores = sched_getaffinity(0, sizeof cpus, &cpus) == 0 ? CPU_COUNT(&cpus) : 1;
    size_t local = 1;
    for (const auto& g : hosts_) {
      if (std::find(g.begin(), g.end(), rank_) != g.end()) local = g.size();
    }
    spinUs_ = static_cast<int>(local) > cores ? 0 : kSpinMicros;
  }
  if (size_ == 1) {
    chunkBytes_ = chunkMax;
    return;
  }
  // Four slots per peer when the buffer allows chunks of 64 KiB or more, else two.
  auto chunkFor = [&](uint32_t depth) -> size_t {
    size_t per = buffer / (static_cast<size_t>(size_) * depth);
    return per > kHeaderBytes ? std::min(chunkMax, per - kHeaderBytes) : 0;
  };
  depth_ = chunkFor(kDeepSlots) >= kDeepChunkMin || chunkFor(kDeepSlots) >= chunkMax
               ? kDeepSlots
               : kShallowSlots;
  chunkBytes_ = chunkFor(depth_) / kHeaderBytes * kHeaderBytes;
  if (chunkBytes_ < kChunkFloor) {
    chunkBytes_ = kChunkFloor;
    if (rank_ == 0) {
      STRATA_LOG(Warn, "coll",
                 "collectives.buffer_bytes = {} is too small for {} ranks: every peer needs {} "
                 "slots of at least {} bytes, so the receive buffer takes {} bytes instead; "
                 "raise collectives.buffer_bytes to silence this",
                 buffer, size_, depth_, kChunkFloor + kHeaderBytes,
                 static_cast<size_t>(size_) * depth_ * (kChunkFloor + kHeaderBytes));
    }
  }
  slotBytes_ = kHeaderBytes + chunkBytes_;

  area_ = context_->allocate(static_cast<size_t>(size_) * depth_ * slotBytes_);
  flags_ = context_->allocate(static_cast<size_t>(size_) * 2 * kFlagStride);
  std::vector<int> peers;
  for (int p = 0; p < size_; ++p) {
    if (p != rank_) peers.push_back(p);
  }
  auto conns = context_->connect(peers);
  peerAreas_ = context_->exchange(area_, peers);
  peerFlags_ = context_->exchange(flags_, peers);
  const auto& areas = peerAreas_;
  const auto& flags = peerFlags_;
  auto* myFlags = static_cast<char*>(flags_.data());
  for (size_t i = 0; i < peers.size(); ++i) {
    int p = peers[i];
    Link& link = links_[p];
    link.peer = p;
    link.conn = conns[i];
    auto* inData = reinterpret_cast<uint64_t*>(myFlags + (p * 2 + 0) * kFlagStride);
    auto* inAck = reinterpret_cast<uint64_t*>(myFlags + (p * 2 + 1) * kFlagStride);
    uint64_t myRegion = static_cast<uint64_t>(rank_) * depth_ * slotBytes_;
    auto* area = static_cast<char*>(areas[i].hostPointer());
    auto* peerFlags = static_cast<char*>(flags[i].hostPointer());
    if (area && peerFlags) {
      link.mapped = true;
      link.data.remote = area + myRegion;
      link.data.inbound = inData;
      link.data.remoteInbound =
          reinterpret_cast<uint64_t*>(peerFlags + (rank_ * 2 + 0) * kFlagStride);
      link.ack.inbound = inAck;
      link.ack.remoteInbound =
          reinterpret_cast<uint64_t*>(peerFlags + (rank_ * 2 + 1) * kFlagStride);
    } else {
      if (!proxy_) {
        proxy_ = std::make_unique<ProxyService>(kProxyFifoEntries, timeout_);
        staging_ = context_->allocate(static_cast<size_t>(size_) * depth_ * slotBytes_);
      }
      uint32_t d = proxy_->addChannel(link.conn, areas[i], staging_, flags[i],
                                      (rank_ * 2 + 0) * kFlagStride);
      uint32_t a = proxy_->addChannel(link.conn, areas[i], staging_, flags[i],
                                      (rank_ * 2 + 1) * kFlagStride);
      link.dataPort = proxy_->portChannel(d, inData);
      link.ackPort = proxy_->portChannel(a, inAck);
      link.dataChannel = d;
    }
  }
  if (proxy_) proxy_->start();
  probeSingleCopy(config);
  STRATA_LOG(Debug, "coll",
             "host collectives: {} ranks, chunk {} B, {} slots per peer, {} peers "
             "through the proxy",
             size_, chunkBytes_, depth_,
             std::count_if(links_.begin(), links_.end(),
                           [](const Link& l) { return l.peer >= 0 && !l.mapped; }));
}

Engine::~Engine() {
  drainOnExit();
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopDelivery_ = true;
  }
  cv_.notify_all();
  if (delivery_.joinable()) delivery_.join();
  if (proxy_) proxy_->stop();
  // What the proxy wrote must land before this process may exit.
  for (Link& link : links_) {
    if (link.conn && !link.mapped && !link.gone) {
      try {
        link.conn->flush(timeout_);
      } catch (const std::exception& e) {
        // Once every chunk was acknowledged, only acks can be left, and a peer that has gone
        // no longer needs them.
        if (link.acked < link.sent) {
          STRATA_LOG(Warn, "coll", "flushing the connection to rank {} at exit: {}", link.peer,
                     e.what());
        } else {
          STRATA_LOG(Debug, "coll", "flushing the connection to rank {} at exit: {}", link.peer,
                     e.what());
        }
      }
    }
  }
}

bool Engine::anyPending() const {
  for (const Link& link : links_) {
    if (!link.out.empty()) return true;
  }
  return false;
}

void Engine::drainOnExit() noexcept {
  // A rank that sends and then destroys its communicator must not lose the buffered data, and
  // no peer may still write to it once it has gone: wait (up to transport.timeout) until its
  // receivers have taken every chunk into their slots and acknowledged it. Acks are sent as
  // soon as a chunk is consumed, so this waits only for peers still in the matching call.
  std::unique_lock<std::mutex> lock(mu_);
  if (deliveryError_ || abandoned_) return;
  auto waitingFor = [](const Link& link) {
    return link.peer >= 0 && !link.gone && (!link.out.empty() || link.acked < link.sent);
  };
  auto deadline = Deadline::fromTimeout(timeout_);
  auto lastCheck = std::chrono::steady_clock::now();
  try {
    for (;;) {
      bool progress = false, waiting = false;
      for (Link& link : links_) {
        if (!waitingFor(link)) continue;
        while (trySend(link)) progress = true;
        while (link.acked < link.sent && (link.mapped ? link.ack.poll() : link.ackPort.poll())) {
          ++link.acked;
          progress = true;
        }
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
            checkPeer(link);
          } catch (const Error& e) {
            // Nobody will take or acknowledge the rest.
            link.gone = true;
            STRATA_LOG(Warn, "coll",
                       "at exit: rank {} is gone with {} chunks this rank sent it not "
                       "acknowledged and {} not sent: {}",
                       link.peer, link.sent - link.acked, link.out.size(), e.what());
          }
        }
      }
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
    if (link.gone || !waitingFor(link)) continue;
    pending += link.out.size();
    unacked += link.sent - link.acked;
    ranks += fmt::format("{}{}", ranks.empty() ? "" : ", ", link.peer);
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
        while (trySend(link)) {
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

void Engine::abandon() {
  abandoned_ = true;
  for (Link& link : links_) link.out.clear();
}

void Engine::checkDelivery() {
  if (deliveryError_) std::rethrow_exception(deliveryError_);
}

void Engine::probeSingleCopy(const Config& config) {
  std::string mode = config::getString(config, "collectives.single_copy");
  pids_.assign(size_, 0);
  for (int p = 0; p < size_; ++p) pids_[p] = context_->pid(p);
  // Every rank tries to read every same-host peer's probe word; single copy is used only when
  // all pairs of the job can, so that every rank picks the same algorithms.
  uint8_t ok = mode != "off";
  uint64_t myAddress = reinterpret_cast<uint64_t>(&probeWord_);
  std::vector<uint64_t> addresses(size_);
  addresses[rank_] = myAddress;
  context_->bootstrap().allGather(addresses.data(), sizeof(uint64_t));
  for (int p = 0; p < size_ && ok; ++p) {
    if (p == rank_) continue;
    if (!links_[p].mapped) {
      ok = 0;
      break;
    }
    uint64_t value = 0;
    iovec local{&value, sizeof value};
    iovec remote{reinterpret_cast<void*>(addresses[p]), sizeof value};
    ssize_t n = process_vm_readv(pids_[p], &local, 1, &remote, 1, 0);
    const int err = errno;  // read before anything else can change it
    if (n != static_cast<ssize_t>(sizeof value) || value != probeWord_) {
      // errno means something only when the call failed; a short read or another value leaves
      // it stale.
      std::string why = n < 0 ? std::strerror(err)
                        : n != static_cast<ssize_t>(sizeof value)
                            ? fmt::format("short read ({} of {} bytes)", n, sizeof value)
                            : std::string("read a different value (not the probe word)");
      STRATA_LOG(Info, "coll", "single copy off: cannot read rank {}'s memory (pid {}): {}", p,
                 pids_[p], why);
      ok = 0;
    }
  }
  std::vector<uint8_t> all(size_);
  all[rank_] = ok;
  context_->bootstrap().allGather(all.data(), 1);
  singleCopy_ = std::all_of(all.begin(), all.end(), [](uint8_t v) { return v != 0; });
}

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

void Engine::queueCopy(int peer, const void* data, size_t bytes, const OpSignature& sig,
                       uint64_t offset) {
  auto owned = std::make_shared<std::vector<char>>(static_cast<const char*>(data),
                                                   static_cast<const char*>(data) + bytes);
  links_[peer].out.push_back({owned->data(), bytes, offset, sig, owned});
}

void Engine::queueSend(int peer, const void* src, size_t bytes, const OpSignature& sig,
                       uint64_t offsetBase) {
  Link& link = links_[peer];
  const char* s = static_cast<const char*>(src);
  for (size_t off = 0; off < bytes; off += chunkBytes_) {
    link.out.push_back(
        {s + off, std::min(chunkBytes_, bytes - off), offsetBase + off, sig, nullptr});
  }
}

void Engine::expectCopy(Plan& plan, int peer, void* dst, size_t bytes, size_t chunkBytes) {
  char* d = static_cast<char*>(dst);
  for (size_t off = 0; off < bytes; off += chunkBytes) {
    plan.in[peer].push_back({d + off, std::min(chunkBytes, bytes - off), off, -1, {}});
  }
}

const char* Engine::slotPayload(Link& link, uint64_t chunk) const {
  uint64_t slot = chunk % depth_;
  return static_cast<const char*>(area_.data()) +
         (static_cast<uint64_t>(link.peer) * depth_ + slot) * slotBytes_ + kHeaderBytes;
}

bool Engine::trySend(Link& link) {
  if (link.out.empty()) return false;
  if (link.sent - link.acked >= depth_) {
    if (link.mapped) {
      while (link.ack.poll()) ++link.acked;
    } else {
      while (link.ackPort.poll()) ++link.acked;
    }
    if (link.sent - link.acked >= depth_) return false;
  }
  const OutPiece& piece = link.out.front();
  uint64_t slot = link.sent % depth_;
  ChunkHeader h;
  h.op = piece.sig.op;
  h.type = piece.sig.type;
  h.redop = piece.sig.redop;
  h.root = piece.sig.root;
  h.count = piece.sig.count;
  h.offset = piece.offset;
  h.bytes = piece.bytes;
  h.seq = link.sent;
  char header[kHeaderBytes];
  encodeChunkHeader(h, header);
  uint64_t off = slot * slotBytes_;
  if (link.mapped) {
    link.data.putFrom(off + kHeaderBytes, piece.src, piece.bytes);
    link.data.putFrom(off, header, kHeaderBytes);
    link.data.signal();
  } else {
    uint64_t stagingOff = (static_cast<uint64_t>(link.peer) * depth_ + slot) * slotBytes_;
    char* st = static_cast<char*>(staging_.data()) + stagingOff;
    std::memcpy(st, header, kHeaderBytes);
    std::memcpy(st + kHeaderBytes, piece.src, piece.bytes);
    uint64_t dstOff = static_cast<uint64_t>(rank_) * depth_ * slotBytes_ + off;
    pushToProxy(link, [&](uint64_t* id) {
      return link.dataPort.tryPutWithSignal(dstOff, stagingOff, kHeaderBytes + piece.bytes, id);
    });
  }
  ++link.sent;
  link.out.pop_front();
  return true;
}

template <typename TryPush>
void Engine::pushToProxy(const Link& link, TryPush tryPush) {
  // The FIFO holds far more than the outstanding chunks and acks of every peer, and the proxy
  // always drains it, so this wait is short; the deadline covers a proxy stuck in a transport.
  uint64_t id;
  Backoff backoff;
  auto deadline = Deadline::fromTimeout(timeout_);
  while (!tryPush(&id)) {
    proxy_->check(link.dataChannel);  // the link's two channels share one Connection
    if (deadline.expired()) {
      throw Error(ErrorCode::Timeout,
                  fmt::format("the proxy FIFO stayed full for {} s while queueing a write to "
                              "rank {} over {}: the proxy thread is stuck in the transport",
                              timeout_, link.peer, link.conn->transport()),
                  link.peer);
    }
    backoff.pause();
  }
}

bool Engine::tryArrive(Link& link) {
  if (link.mapped ? link.data.poll() : link.dataPort.poll()) {
    ++link.arrived;
    return true;
  }
  return false;
}

void Engine::sendAck(Link& link) {
  ++link.consumed;
  if (link.gone) return;  // it sent all it had and left: nobody reads the ack
  if (link.mapped) {
    link.ack.signal();
  } else {
    pushToProxy(link, [&](uint64_t* id) { return link.ackPort.trySignal(id); });
  }
}

void Engine::checkHeader(Link& link, uint64_t chunk, const OpSignature& sig,
                         const InPiece& piece) const {
  checkChunkHeader(slotPayload(link, chunk) - kHeaderBytes,
                   {chunk, sig, piece.offset, piece.bytes, link.peer, rank_});
}

void Engine::checkPeer(Link& link) {
  if (link.conn) link.conn->checkPeer();
  // The proxy fails a Connection as a whole, so the data channel answers for the ack one too.
  if (!link.mapped && proxy_) proxy_->check(link.dataChannel);
}

bool Engine::needs(const Plan& plan, const std::vector<size_t>& idx, const Link& link) const {
  const size_t p = static_cast<size_t>(link.peer);
  return plan.in[p].size() - idx[p] > link.arrived - link.consumed ||
         (plan.waitForSends && !link.out.empty());
}

void Engine::checkNeededPeers(const Plan& plan, const std::vector<size_t>& idx, const char* what) {
  for (Link& link : links_) {
    if (link.peer < 0 || !needs(plan, idx, link)) continue;
    try {
      checkPeer(link);
    } catch (const Error& e) {
      if (e.code() != ErrorCode::PeerLost) throw;
      // What the peer wrote before it went is here: take it, then decide.
      while (link.arrived - link.consumed < depth_ && tryArrive(link)) {
      }
      if (needs(plan, idx, link)) {
        const size_t p = static_cast<size_t>(link.peer);
        throw Error(ErrorCode::PeerLost,
                    fmt::format("{} needs rank {} ({} of {} pieces from it received, {} pieces "
                                "to it not yet sent): {}",
                                describeCall(plan.sig, what), link.peer,
                                idx[p] + (link.arrived - link.consumed), plan.in[p].size(),
                                plan.waitForSends ? link.out.size() : 0, e.what()),
                    link.peer);
      }
      link.gone = true;
      STRATA_LOG(Debug, "coll", "rank {} is gone after sending all this call needs: {}", link.peer,
                 e.what());
    }
  }
}

void Engine::checkPeersWithSends() {
  for (Link& link : links_) {
    if (link.peer >= 0 && !link.out.empty()) checkPeer(link);
  }
}

void Engine::flushSendsOrBuffer(int peer) {
  Link& link = links_[peer];
  while (trySend(link)) {
  }
  if (link.out.empty()) return;
  // The receiver has not made room yet: keep a copy of the rest so that send() can return
  // (as with a buffered MPI send); later calls deliver it.
  size_t total = 0;
  for (const OutPiece& p : link.out) {
    if (!p.owned) total += p.bytes;
  }
  if (total == 0) return;
  if (!delivery_.joinable()) delivery_ = std::thread([this] { deliveryLoop(); });
  cv_.notify_all();
  auto buffer = std::make_shared<std::vector<char>>(total);
  size_t at = 0;
  for (OutPiece& p : link.out) {
    if (p.owned) continue;
    std::memcpy(buffer->data() + at, p.src, p.bytes);
    p.src = buffer->data() + at;
    p.owned = buffer;
    at += p.bytes;
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
      if (link.peer < 0) continue;
      while (trySend(link)) progress = true;
      while (link.arrived - link.consumed < depth_ && tryArrive(link)) progress = true;
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
      while (idx[p] < in.size() && in[idx[p]].round < 0 && link.consumed < link.arrived) {
        const InPiece& piece = in[idx[p]];
        checkHeader(link, link.consumed, plan.sig, piece);
        if (piece.onArrive) {
          // Copy out first: the callback may wait for this peer, which needs the ack.
          char small[64];
          const char* payload = slotPayload(link, link.consumed);
          bool copied = piece.bytes <= sizeof small;
          if (copied) std::memcpy(small, payload, piece.bytes);
          if (copied) sendAck(link);
          piece.onArrive(copied ? small : payload);
          if (!copied) sendAck(link);
        } else {
          std::memcpy(piece.dst, slotPayload(link, link.consumed), piece.bytes);
          sendAck(link);
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
                links_[p].consumed < links_[p].arrived;
        if (ready && nextRound < plan.minSent.size()) {
          ready = links_[p].sent >= plan.minSent[nextRound][p];
        }
        if (!ready) break;
      }
      if (!ready) break;
      for (size_t k = 0; k < members.size(); ++k) {
        int p = members[k];
        if (p == rank_) {
          srcs[k] = round.own;
        } else {
          Link& link = links_[p];
          checkHeader(link, link.consumed, plan.sig, plan.in[p][idx[p]]);
          srcs[k] = slotPayload(link, link.consumed);
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
        sendAck(links_[p]);
        ++idx[p];
      }
      if (round.forwardTo) {
        const size_t len = round.count * sizeOf(plan.type);
        for (int p : *round.forwardTo) {
          if (p != rank_) queueSend(p, round.dst, len, plan.sig, round.forwardOffset);
        }
      }
      if (round.after) round.after();
      ++nextRound;
      progress = true;
    }
    bool done = nextRound == plan.rounds.size();
    for (size_t p = 0; p < n && done; ++p) {
      if (p == static_cast<size_t>(rank_)) continue;
      done = idx[p] == plan.in[p].size() && (!plan.waitForSends || links_[p].out.empty());
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
            bool sending = plan.waitForSends && !link.out.empty();
            if (pass == 0 && expecting && link.arrived == link.consumed) return int(p);
            if (pass == 1 && sending && link.sent - link.acked >= depth_) return int(p);
            if (pass == 2 && (expecting || sending)) return int(p);
          }
        }
        return -1;
      }();
      std::string progressText;
      if (culprit >= 0) {
        const Link& link = links_[culprit];
        progressText = fmt::format("{} of {} pieces from it received, {} pieces to it not yet sent",
                                   idx[culprit] + (link.arrived - link.consumed),
                                   plan.in[culprit].size(), link.out.size());
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
    backoff.pause();
  }
}

}  // namespace strata::collectives
