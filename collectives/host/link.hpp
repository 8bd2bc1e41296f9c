#pragma once

// One peer as the host collectives engine sees it: the chunks this rank writes into the peer's
// slots and the chunks the peer wrote into this rank's, with the pair's data and ack semaphores.
// Whether the peer's memory is mapped here (a MemoryChannel: memcpy and a release store), written
// directly over the pair's Connection by the calling thread (stage, then write and
// updateAndSync), or reached through the proxy (PortChannels: stage, then a put-with-signal
// trigger) is decided once, when the Link is made; the engine only asks for what it wants done.
//
// Every write into the peer's memory stays inside the slots this rank owns there, which the
// Link checks against the size the peer registered when it is made, and again per chunk: a
// write past them is an Internal error naming the peer, never a write.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

#include <strata/channel.hpp>
#include <strata/transport.hpp>

#include "chunk_header.hpp"
#include "slot_geometry.hpp"

namespace strata::collectives {

/// What set-up gives a Link: the pair's connection, this rank's memory and the peer's.
struct LinkEnds {
  int rank = -1;  ///< this rank
  int peer = -1;
  std::shared_ptr<Connection> conn;
  SlotGeometry slots;
  char* ownArea = nullptr;     ///< this rank's receive area
  char* ownFlags = nullptr;    ///< this rank's semaphore words (Link::flagBytes)
  RegisteredMemory peerArea;   ///< the peer's receive area, as the exchange returned it
  RegisteredMemory peerFlags;  ///< the peer's semaphore words, likewise
};

class Link {
 public:
  /// No peer: this rank's own entry of the engine's table.
  Link() = default;

  /// Bytes of semaphore words a rank allocates for `ranks` ranks (a data and an ack word per
  /// source rank, each on its own cache line).
  static size_t flagBytes(int ranks);
  /// Whether the peer's area and flags are mapped into this process.
  static bool mappable(const LinkEnds& ends);
  /// A link over the mapped memory (mappable(ends) must hold).
  static Link mapped(const LinkEnds& ends);
  /// A link through the proxy: chunks are staged in this rank's region for the peer in
  /// `staging` (laid out like a receive area). Adds the link's channels to the proxy, which
  /// must not have started.
  static Link proxied(const LinkEnds& ends, ProxyService& proxy, const RegisteredMemory& staging,
                      double timeoutSeconds);
  /// A link whose chunks the calling thread stages in `staging` (as proxied) and writes over the
  /// Connection itself, with no proxy thread between (collectives.net_path = direct).
  static Link direct(const LinkEnds& ends, const RegisteredMemory& staging);

  /// The peer's rank; -1 for this rank's own entry.
  int peer() const noexcept { return peer_; }
  bool isMapped() const noexcept { return mapped_; }
  /// The transport this link's writes go through ("shm", "fabric"); "" for this rank's entry.
  std::string_view transport() const noexcept { return conn_ ? conn_->transport() : ""; }
  /// Drives the transport for a direct link (fabric providers with manual progress land the
  /// peer's writes only while someone reads the endpoint); nothing for the others.
  void progress() {
    if (direct_) conn_->progress();
  }

  // Sending: chunk k goes into slot k % depth of this rank's region in the peer's area.

  /// Whether the next chunk has a free slot (takes the acks that came when all are taken).
  bool slotFree() {
    if (sent_ - acked_ < depth_) return true;
    while (pollAck()) {
    }
    return sent_ - acked_ < depth_;
  }
  /// Writes the chunk (header fields but seq, then bytes of payload) into the next slot and
  /// signals the peer. Needs slotFree(). Throws Internal, writing nothing, when it would
  /// pass the end of the slots; through the proxy, Timeout when its FIFO stays full.
  void putChunk(ChunkHeader header, const char* payload);
  /// Takes one ack if one came.
  bool pollAck() {
    if (acked_ == sent_ || !(mapped_ || direct_ ? ack_.poll() : ackPort_.poll())) return false;
    ++acked_;
    return true;
  }
  uint64_t sent() const noexcept { return sent_; }
  uint64_t acked() const noexcept { return acked_; }
  /// Whether every slot holds a chunk the peer has not acknowledged.
  bool slotsFull() const noexcept { return sent_ - acked_ >= depth_; }

  // Receiving: the peer's chunk k is in slot k % depth of its region in this rank's area.

  /// Takes one data signal if one came (at most depth chunks wait unconsumed).
  bool pollArrival() {
    if (arrived_ - consumed_ >= depth_ || !(mapped_ || direct_ ? data_.poll() : dataPort_.poll())) {
      return false;
    }
    ++arrived_;
    return true;
  }
  /// Chunks that arrived and were not consumed yet.
  uint64_t waiting() const noexcept { return arrived_ - consumed_; }
  uint64_t arrived() const noexcept { return arrived_; }
  uint64_t consumed() const noexcept { return consumed_; }
  /// The header of the oldest chunk not consumed yet (needs waiting() > 0); its payload follows.
  const char* nextChunk() const noexcept { return inbound_ + (consumed_ % depth_) * slotBytes_; }
  const char* nextPayload() const noexcept { return nextChunk() + kChunkHeaderBytes; }
  /// Consumes the oldest chunk and acknowledges it (unless the peer is gone).
  void ack() {
    ++consumed_;
    if (gone_) return;  // it sent all it had and left: nobody reads the ack
    if (mapped_) {
      ack_.signal();
    } else if (direct_) {
      ackDirect();
    } else {
      signalThroughProxy();
    }
  }

  // The peer's health.

  /// Throws when the peer (its connection, or its channels in the proxy) is lost.
  void checkPeer() const;
  /// The peer was found gone after it had sent all this rank needed from it: nothing more is
  /// sent to it (no acks), and a later call that needs it fails with PeerLost (its Connection
  /// stays lost).
  void markGone() noexcept { gone_ = true; }
  bool gone() const noexcept { return gone_; }
  /// At exit, once the proxy has stopped: waits until what it wrote to the peer has landed
  /// (warns when that fails with chunks unacknowledged). Nothing to do for a mapped link.
  void flushAtExit(double timeoutSeconds) noexcept;

 private:
  explicit Link(const LinkEnds& ends);
  void signalThroughProxy();
  void signalDirect(uint64_t flagOffset, uint64_t value);
  /// The ack over the Connection; a peer already lost is not this call's error (see link.cpp).
  void ackDirect();
  /// Direct and proxied links: chunks staged in `staging` (this link's region of it), and
  /// data_/ack_'s inbound words and counters pointed at this rank's semaphore words for the
  /// peer, counting signals that came before the link existed as consumed.
  void stageAndWatch(const LinkEnds& ends, const RegisteredMemory& staging);
  /// Retries tryPush(&id) while the proxy FIFO is full, up to the timeout.
  template <typename TryPush>
  void pushToProxy(TryPush tryPush);

  int peer_ = -1;
  bool mapped_ = false;
  bool direct_ = false;
  bool gone_ = false;
  uint32_t depth_ = 1;
  uint64_t slotBytes_ = 0;
  uint64_t chunkBytes_ = 0;
  uint64_t regionOffset_ = 0;  ///< where this rank's slots start in the peer's area
  /// Bytes from regionOffset_ on that this rank may write: its region, which set-up checked
  /// lies within what the peer registered.
  uint64_t writable_ = 0;
  const char* inbound_ = nullptr;  ///< the peer's region in this rank's area
  std::shared_ptr<Connection> conn_;
  RegisteredMemory peerArea_, peerFlags_;  ///< keep the peer's mappings alive
  /// The signals consumed from the peer's data and ack counters (the channels' `expected`
  /// words: on the heap, so a moved Link keeps them where its channels point).
  std::unique_ptr<uint64_t[]> consumedSignals_;
  // Mapped: payload and data semaphore, and the ack semaphore (no payload). Direct and proxied:
  // only their inbound words and counters (direct polls them the same way; proxied hands them
  // to its PortChannels).
  MemoryChannel data_, ack_;
  // The staging memory (source of the writes). Direct: where this rank's semaphore words are
  // in the peer's block, and the values last written to them (data, ack).
  RegisteredMemory stagingMem_;
  uint64_t dataFlagOut_ = 0, ackFlagOut_ = 0;
  uint64_t outbound_[2] = {0, 0};
  // Proxied: the same through the proxy, the chunk staged at staging_ first.
  PortChannel dataPort_, ackPort_;
  ProxyService* proxy_ = nullptr;
  uint32_t dataChannel_ = 0;  ///< dataPort_'s channel; ackPort_ shares its Connection, so its
                              ///< failures show here too
  char* staging_ = nullptr;
  uint64_t stagingOffset_ = 0;
  double timeout_ = 30;
  // Lifetime counters of the pair, in chunks.
  uint64_t sent_ = 0;      ///< sent to the peer
  uint64_t acked_ = 0;     ///< acks received from the peer
  uint64_t arrived_ = 0;   ///< data signals received from the peer
  uint64_t consumed_ = 0;  ///< chunks of the peer consumed (and acked)
};

}  // namespace strata::collectives
