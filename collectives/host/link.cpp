#include "link.hpp"

#include <cstring>
#include <exception>

#include <fmt/format.h>

#include <strata/error.hpp>

#include "base/backoff.hpp"
#include "base/deadline.hpp"
#include "base/log.hpp"

namespace strata::collectives {

namespace {

/// Semaphore words: (source rank * 2 + {0 data, 1 ack}) * kFlagStride of the receiver's block.
constexpr size_t kFlagStride = 64;

uint64_t dataFlagOffset(int source) {
  return static_cast<uint64_t>(source) * 2 * kFlagStride;
}
uint64_t ackFlagOffset(int source) {
  return dataFlagOffset(source) + kFlagStride;
}

}  // namespace

size_t Link::flagBytes(int ranks) {
  return static_cast<size_t>(ranks) * 2 * kFlagStride;
}

bool Link::mappable(const LinkEnds& ends) {
  return ends.peerArea.hostPointer() && ends.peerFlags.hostPointer();
}

Link::Link(const LinkEnds& ends)
    : peer_(ends.peer),
      depth_(ends.slots.depth),
      slotBytes_(ends.slots.slotBytes),
      chunkBytes_(ends.slots.chunkBytes),
      regionOffset_(ends.slots.regionOffset(ends.rank)),
      writable_(ends.slots.regionBytes()),
      inbound_(ends.ownArea + ends.slots.regionOffset(ends.peer)),
      conn_(ends.conn),
      peerArea_(ends.peerArea),
      peerFlags_(ends.peerFlags),
      consumedSignals_(new uint64_t[2]{0, 0}) {
  // The geometry check at set-up makes every rank's area the same size; this guards the
  // writes on their own, whatever the peer's configuration.
  if (regionOffset_ + writable_ > peerArea_.size()) {
    throw Error(
        ErrorCode::Internal,
        fmt::format("rank {} registered a receive area of {} bytes, but rank {}'s slots "
                    "in it would span bytes {} to {}: the ranks' slot geometries differ",
                    peer_, peerArea_.size(), ends.rank, regionOffset_, regionOffset_ + writable_),
        peer_);
  }
  if (ackFlagOffset(ends.rank) + sizeof(uint64_t) > peerFlags_.size()) {
    throw Error(ErrorCode::Internal,
                fmt::format("rank {} registered {} bytes of semaphore words, too few for rank {}'s "
                            "(which end at byte {})",
                            peer_, peerFlags_.size(), ends.rank,
                            ackFlagOffset(ends.rank) + sizeof(uint64_t)),
                peer_);
  }
}

Link Link::mapped(const LinkEnds& ends) {
  Link link(ends);
  link.mapped_ = true;
  auto* area = static_cast<char*>(link.peerArea_.hostPointer());
  auto* flags = static_cast<char*>(link.peerFlags_.hostPointer());
  link.data_.remote = area + link.regionOffset_;
  link.data_.inbound = reinterpret_cast<uint64_t*>(ends.ownFlags + dataFlagOffset(ends.peer));
  link.data_.remoteInbound = reinterpret_cast<uint64_t*>(flags + dataFlagOffset(ends.rank));
  link.data_.expected = &link.consumedSignals_[0];
  link.ack_.inbound = reinterpret_cast<uint64_t*>(ends.ownFlags + ackFlagOffset(ends.peer));
  link.ack_.remoteInbound = reinterpret_cast<uint64_t*>(flags + ackFlagOffset(ends.rank));
  link.ack_.expected = &link.consumedSignals_[1];
  return link;
}

void Link::stageAndWatch(const LinkEnds& ends, const RegisteredMemory& staging) {
  stagingMem_ = staging;
  stagingOffset_ = ends.slots.regionOffset(ends.peer);
  staging_ = static_cast<char*>(staging.data()) + stagingOffset_;
  data_.inbound = reinterpret_cast<uint64_t*>(ends.ownFlags + dataFlagOffset(ends.peer));
  data_.expected = &consumedSignals_[0];
  ack_.inbound = reinterpret_cast<uint64_t*>(ends.ownFlags + ackFlagOffset(ends.peer));
  ack_.expected = &consumedSignals_[1];
  // Signals that arrived before the link existed are not pending.
  consumedSignals_[0] = device::loadAcquire(data_.inbound);
  consumedSignals_[1] = device::loadAcquire(ack_.inbound);
}

Link Link::direct(const LinkEnds& ends, const RegisteredMemory& staging) {
  Link link(ends);
  link.direct_ = true;
  link.dataFlagOut_ = dataFlagOffset(ends.rank);
  link.ackFlagOut_ = ackFlagOffset(ends.rank);
  link.stageAndWatch(ends, staging);
  return link;
}

Link Link::proxied(const LinkEnds& ends, ProxyService& proxy, const RegisteredMemory& staging,
                   double timeoutSeconds) {
  Link link(ends);
  link.proxy_ = &proxy;
  link.timeout_ = timeoutSeconds;
  link.stageAndWatch(ends, staging);
  uint32_t data = proxy.addChannel(ends.conn, ends.peerArea, staging, ends.peerFlags,
                                   dataFlagOffset(ends.rank));
  uint32_t ack =
      proxy.addChannel(ends.conn, ends.peerArea, staging, ends.peerFlags, ackFlagOffset(ends.rank));
  link.dataPort_ = proxy.portChannel(data, link.data_.inbound, &link.consumedSignals_[0]);
  link.ackPort_ = proxy.portChannel(ack, link.ack_.inbound, &link.consumedSignals_[1]);
  link.dataChannel_ = data;
  return link;
}

void Link::putChunk(ChunkHeader header, const char* payload) {
  const uint64_t bytes = header.bytes;
  const uint64_t slot = (sent_ % depth_) * slotBytes_;
  if (bytes > chunkBytes_ || slot + kChunkHeaderBytes + bytes > writable_) {
    throw Error(ErrorCode::Internal,
                fmt::format("chunk {} to rank {} ({} bytes at offset {} of this rank's {}-byte "
                            "region of rank {}'s {}-byte receive area) would pass the end of its "
                            "slot; nothing was written",
                            sent_, peer_, kChunkHeaderBytes + bytes, slot, writable_, peer_,
                            peerArea_.size()),
                peer_);
  }
  header.seq = sent_;
  if (mapped_) {
    char encoded[kChunkHeaderBytes];
    encodeChunkHeader(header, encoded);
    data_.putFrom(slot + kChunkHeaderBytes, payload, bytes);
    data_.putFrom(slot, encoded, kChunkHeaderBytes);
    data_.signal();
  } else {
    // The slot's staging copy is free: its last chunk was acknowledged, so it has landed.
    char* staged = staging_ + slot;
    encodeChunkHeader(header, staged);
    std::memcpy(staged + kChunkHeaderBytes, payload, bytes);
    if (direct_) {
      conn_->write(peerArea_, regionOffset_ + slot, stagingMem_, stagingOffset_ + slot,
                   kChunkHeaderBytes + bytes);
      signalDirect(dataFlagOut_, ++outbound_[0]);
      ++sent_;
      return;
    }
    pushToProxy([&](uint64_t* id) {
      return dataPort_.tryPutWithSignal(regionOffset_ + slot, stagingOffset_ + slot,
                                        kChunkHeaderBytes + bytes, id);
    });
  }
  ++sent_;
}

void Link::signalDirect(uint64_t flagOffset, uint64_t value) {
  conn_->updateAndSync(peerFlags_, flagOffset, value);
}

void Link::ackDirect() {
  try {
    signalDirect(ackFlagOut_, ++outbound_[1]);
  } catch (const Error& e) {
    // As through the proxy (which records a failed trigger instead of throwing): a peer that
    // sent all this rank needed and left cannot take its last acks, and that is no error of
    // this call. A call that still needs the peer finds its Connection lost when it checks
    // (checkNeededPeers) and fails then, naming the peer and what it still needed.
    if (e.code() != ErrorCode::PeerLost) throw;
    STRATA_LOG(Debug, "coll", "ack to rank {} not sent: {}", peer_, e.what());
  }
}

void Link::signalThroughProxy() {
  pushToProxy([&](uint64_t* id) { return ackPort_.trySignal(id); });
}

template <typename TryPush>
void Link::pushToProxy(TryPush tryPush) {
  // The FIFO holds far more than the outstanding chunks and acks of every peer, and the proxy
  // always drains it, so this wait is short; the deadline covers a proxy stuck in a transport.
  uint64_t id;
  Backoff backoff;
  auto deadline = Deadline::fromTimeout(timeout_);
  while (!tryPush(&id)) {
    proxy_->check(dataChannel_);
    if (deadline.expired()) {
      throw Error(ErrorCode::Timeout,
                  fmt::format("the proxy FIFO stayed full for {} s while queueing a write to "
                              "rank {} over {}: the proxy thread is stuck in the transport",
                              timeout_, peer_, conn_->transport()),
                  peer_);
    }
    backoff.pause();
  }
}

void Link::checkPeer() const {
  if (conn_) conn_->checkPeer();
  // The proxy fails a Connection as a whole, so the data channel answers for the ack one too.
  if (proxy_) proxy_->check(dataChannel_);
}

void Link::flushAtExit(double timeoutSeconds) noexcept {
  if (!conn_ || mapped_ || gone_) return;
  try {
    conn_->flush(timeoutSeconds);
  } catch (const std::exception& e) {
    // Once every chunk was acknowledged, only acks can be left, and a peer that has gone no
    // longer needs them.
    if (acked_ < sent_) {
      STRATA_LOG(Warn, "coll", "flushing the connection to rank {} at exit: {}", peer_, e.what());
    } else {
      STRATA_LOG(Debug, "coll", "flushing the connection to rank {} at exit: {}", peer_, e.what());
    }
  }
}

}  // namespace strata::collectives
