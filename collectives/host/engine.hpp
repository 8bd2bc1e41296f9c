#pragma once

// The host collective engine: one Link per peer (link.hpp: mapped memory or the proxy), a
// receive area with pipeline slots per peer (slot_geometry.hpp), and a progress loop that moves
// an operation's pieces with credits, deadlines and peer checks. Set-up is in setup.cpp, the
// delivery of buffered sends and the exit in delivery.cpp, the progress loop in engine.cpp.
//
// Every message between two ranks is a sequence of chunks on that ordered pair. A chunk is a
// 64-byte header (what operation it belongs to, where it goes) followed by up to chunkBytes of
// payload, written into slot (sent % depth) of the sender's region in the receiver's area,
// then announced with the pair's data semaphore. The receiver acknowledges each chunk it has
// consumed with the ack semaphore; a sender holds at most `depth` unacknowledged chunks per
// peer. Both sides derive the same chunk sequence from the call, so no sizes travel except in
// the header, which the receiver checks.

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <strata/transport.hpp>
#include <strata/types.hpp>

#include "chunk_header.hpp"
#include "link.hpp"
#include "peer_maps.hpp"
#include "slot_geometry.hpp"
#include "tuning.hpp"

namespace strata::collectives {

/// A piece this rank sends to one peer: payload from src (any local memory).
struct OutPiece {
  const char* src = nullptr;
  size_t bytes = 0;
  uint64_t offset = 0;  ///< byte offset in the operation's message (checked by the receiver)
  OpSignature sig;
  std::shared_ptr<char[]> owned;  ///< buffered data of a send() that returned early, or a copy
};

/// A piece this rank expects from one peer: copied to dst, or one member of a reduction round.
struct InPiece {
  char* dst = nullptr;  ///< Copy: destination
  size_t bytes = 0;
  uint64_t offset = 0;
  int round = -1;  ///< >= 0: a reduction round member (dst unused)
  /// Called with the payload instead of the copy to dst (descriptors of single-copy ops).
  std::function<void(const char* payload)> onArrive;
};

/// A reduction round: dst = op over ranks (in rank order) of the round's pieces, own being
/// this rank's contribution; then `after` runs (it may queue more pieces).
struct Round {
  char* dst = nullptr;
  const char* own = nullptr;
  size_t count = 0;
  std::function<void()> after;
  /// After the reduction, dst goes to every rank of *forwardTo but this one, at byte offset
  /// forwardOffset of the operation's message (two-shot's all-gather; no allocation per round).
  const std::vector<int>* forwardTo = nullptr;
  uint64_t forwardOffset = 0;
  /// The ranks folded, in order (null: every rank in rank order); this rank must be one. The
  /// vector outlives the plan's run.
  const std::vector<int>* members = nullptr;
  /// Avg divides by this (-1: the communicator size; 1: no division, a partial sum).
  int divisor = -1;
  /// Replaces the reduction: called with every rank's payload of the round (own: nullptr).
  std::function<void(const std::vector<const char*>& payloads)> action;
};

struct Plan {
  OpSignature sig;
  /// The element type and reduction of the call's rounds (per call, not per engine).
  DataType type = DataType::Float32;
  ReduceOp redop = ReduceOp::Sum;
  std::vector<std::vector<InPiece>> in;  ///< per rank (own rank empty)
  std::vector<Round> rounds;
  /// Round r runs only once links_[p].sent() >= minSent[r][p] for every peer (in-place one-shot:
  /// a round overwrites input that must have gone to every peer first). Empty: no condition.
  std::vector<std::vector<uint64_t>> minSent;
  /// Wait until every queued piece is sent (collectives: they read the caller's buffers);
  /// false for recv(), which may leave earlier buffered send() pieces queued.
  bool waitForSends = true;
  /// Local work (a rank's copy of its own block) done after the first round of sends, so that
  /// peers can start while this rank copies.
  std::function<void()> localWork;
  /// Copy arriving pieces into their destination with streaming stores (Engine::streams).
  bool stream = false;
};

/// How this engine chose between the slots and single copy (strata-info --tuning).
struct HostTuning {
  Choices choices;
  /// Where the figures came from: "measured at create in 4.2 ms", "cache <file>",
  /// "collectives.tuning = off", "not needed: ...".
  std::string source;
  std::vector<ProbeSample> samples;  ///< empty: no measurement
  std::string machine;               ///< rank 0's MachineKey::text()
};

class Engine {
 public:
  /// Collective over the context's ranks: checks that every rank cut its slots the same way
  /// (InvalidConfig otherwise), connects every pair, shares receive areas and semaphores,
  /// starts the proxy when some peer is not mapped.
  Engine(std::shared_ptr<Context> context, const Config& config);
  ~Engine();

  int rank() const { return rank_; }
  int size() const { return size_; }
  size_t chunkBytes() const { return slots_.chunkBytes; }
  Context& context() { return *context_; }
  /// Every rank, in rank order.
  const std::vector<int>& allRanks() const { return allRanks_; }
  /// Ranks grouped by host (each group in rank order, groups ordered by their first rank).
  const std::vector<std::vector<int>>& hosts() const { return hosts_; }

  /// The pipelining unit of a message of `bytes`: the whole chunk for messages up to
  /// 2 x kMinPieceBytes (one piece), else about a kPipelinePieces-th of the message in 4 KiB
  /// multiples, at least kMinPieceBytes and at most the chunk, so that the reader copies or
  /// reduces one piece while the writer fills the next. A function of the message length alone:
  /// the sender of a message and its receiver cut it the same way.
  size_t pieceBytes(size_t bytes) const;
  static constexpr size_t kPipelinePieces = 4;
  static constexpr size_t kMinPieceBytes = 256 * 1024;
  /// Queues bytes from src to peer as pieces (pieceBytes(bytes), or `piece` when given) of the
  /// operation sig.
  void queueSend(int peer, const void* src, size_t bytes, const OpSignature& sig,
                 uint64_t offsetBase = 0, size_t piece = 0);
  /// Chunks already sent to peer plus those queued (the value links_[peer].sent() reaches once
  /// every queued piece has gone).
  uint64_t sentAfterQueue(int peer) const { return links_[peer].sent() + out_[peer].size(); }
  /// Expected pieces (of chunkBytes: pass pieceBytes(bytes) of the sender's message) from peer
  /// copied into dst.
  static void expectCopy(Plan& plan, int peer, void* dst, size_t bytes, size_t chunkBytes);
  /// Runs until every InPiece and round of the plan is done and every queued piece is sent
  /// (for plan.waitForSends), with the no-progress deadline transport.timeout.
  void run(Plan& plan, const char* what);
  /// Queues a small message (copied now) to peer.
  void queueCopy(int peer, const void* data, size_t bytes, const OpSignature& sig, uint64_t offset);
  /// True when every peer shares this host and its memory can be read with
  /// process_vm_readv (probed at creation; collectives.single_copy): the single-copy
  /// algorithms read peers' buffers directly.
  bool singleCopy() const { return singleCopy_; }
  /// Whether collectives.single_copy_min_bytes was set explicitly: rank 0's answer where the
  /// tuning was broadcast (every rank alike), else this rank's.
  bool singleCopyMinSet() const { return singleCopyMinSet_; }
  /// The crossovers auto uses (the same on every rank: rank 0's figures).
  const Choices& choices() const { return tuning_.choices; }
  const HostTuning& tuning() const { return tuning_; }
  /// True when every peer shares this host and each rank can map the others' allocHost memory
  /// (probed at creation, collectives.zero_copy): a call whose buffers are such memory on
  /// every rank reads them with plain loads.
  bool zeroCopy() const { return zeroCopy_; }
  /// The CPUs the ranks may use together when every rank is on this host (the union of their
  /// affinities, the same on every rank); 0 for a job on several hosts or of one rank.
  int sharedCores() const { return hostCores_; }
  /// Whether a call whose send plus receive buffers on this rank total `bufferBytes` copies into
  /// its destination with streaming stores (collectives.stream_copy; stream_copy.hpp).
  bool streams(uint64_t bufferBytes) const { return bufferBytes >= streamMin_; }
  /// Why streams() decides as it does, with the cache figures (strata-info --tuning).
  const std::string& streamWhy() const { return streamWhy_; }
  /// Bytes [offset, offset + bytes) of peer's buffer b mapped into this process, or nullptr
  /// when b is not allocHost memory or cannot be mapped (said once per peer at info level; the
  /// caller then reads with process_vm_readv). ProtocolError when the range lies outside the
  /// allocation the peer described.
  const char* peerView(int peer, const PeerBuffer& b, uint64_t frees, uint64_t offset,
                       size_t bytes);
  /// A buffer of this process for staging (reused across calls, so its pages stay mapped).
  char* temp(size_t bytes) {
    if (temp_.size() < bytes) temp_.resize(bytes);
    return temp_.data();
  }
  /// Reads bytes at address addr of peer's process into dst (process_vm_readv).
  void readFrom(int peer, uint64_t addr, void* dst, size_t bytes);
  /// After send(): sends what credits allow, buffers the rest; the delivery thread sends it
  /// while no call runs (and every later call does too).
  void flushSendsOrBuffer(int peer);
  /// Held by every Communicator call and by the delivery thread while it sends.
  std::mutex& mutex() { return mu_; }
  /// Rethrows an error the delivery thread hit (under mutex()).
  void checkDelivery();
  /// After an error in a call: forgets every queued piece (they may point into the caller's
  /// buffers, which are gone once the call has thrown) and sends nothing more.
  void abandon();

 private:
  // Set-up (setup.cpp).
  /// Connects every pair, exchanges areas and flags, and makes each peer's Link.
  void connectLinks();
  /// Whether every pair of ranks can read each other's memory with process_vm_readv
  /// (singleCopy_) and map each other's memfd memory (zeroCopy_).
  void probePeerAccess(const Config& config);
  /// Sets streamMin_ and streamWhy_ (collectives.stream_copy, the cache size).
  void chooseStreaming(const Config& config);
  /// Sets tuning_: rank 0 measures (or reads the cache) and tells every rank (setup.cpp).
  void tune(const Config& config);

  // The progress loop (engine.cpp).
  /// Sends the link's next queued piece if a slot is free.
  bool trySend(Link& link);
  void checkHeader(const Link& link, const OpSignature& sig, const InPiece& piece) const;
  /// Whether the plan still needs the peer: pieces from it that have not arrived, or pieces
  /// to it not yet sent.
  bool needs(const Plan& plan, const std::vector<size_t>& idx, const Link& link) const;
  /// checkPeer for the peers the plan still needs. A peer found lost is an error only if the
  /// plan needs what it has not sent: one that finished its part and exited is not.
  void checkNeededPeers(const Plan& plan, const std::vector<size_t>& idx, const char* what);

  // Buffered sends and the exit (delivery.cpp).
  /// checkPeer for every peer with queued pieces (delivery): a peer this rank sends nothing to
  /// may have finished and exited, which is no error.
  void checkPeersWithSends();
  bool anyPending() const;
  void deliveryLoop();
  void drainOnExit() noexcept;

  std::shared_ptr<Context> context_;
  int rank_ = 0;
  int size_ = 1;
  double timeout_ = 30;
  SlotGeometry slots_;
  int spinUs_ = 10;  ///< spin before yielding; 0 when this host's ranks outnumber its cores
  std::vector<int> allRanks_;
  // Scratch of run(), reused so that a call allocates nothing in its loop.
  std::vector<size_t> runIdx_;
  std::vector<const void*> runSrcs_;
  std::vector<const char*> runPayloads_;
  RegisteredMemory area_;     ///< receive area: region per source rank, depth slots each
  RegisteredMemory flags_;    ///< semaphore words (Link::flagBytes)
  RegisteredMemory staging_;  ///< links across hosts: source of puts, region per destination
  /// collectives.net_path: links that are not mapped write from the calling thread (direct)
  /// rather than through the proxy thread.
  bool netDirect_ = true;
  /// Direct links, one per transport: driving one drives its transport's endpoint.
  std::vector<int> progressPeers_;
  /// Drives the transports of the direct links (run() and the drain at exit, while waiting).
  void driveTransports();
  bool singleCopy_ = false;
  size_t singleCopyMin_ = 0;
  bool singleCopyMinSet_ = false;  ///< collectives.single_copy_min_bytes set (rank 0's answer)
  bool zeroCopy_ = false;
  uint64_t streamMin_ = UINT64_MAX;  ///< streams() from this many buffer bytes
  std::string streamWhy_;
  int hostCores_ = 0;  ///< CPUs the ranks of this host may use together (union of affinities)
  HostTuning tuning_;
  uint64_t probePeerArea_ = 0;           ///< rank 0: rank 1's receive area, in rank 1's process
  const char* probePeerView_ = nullptr;  ///< rank 0: the same area mapped here
  std::unique_ptr<PeerMaps> maps_;
  std::vector<uint8_t> mapFailureSaid_;  ///< per peer: a failed mapping was logged
  std::vector<int32_t> pids_;
  std::vector<std::vector<int>> hosts_;
  std::vector<char> temp_;
  uint64_t probeWord_ = 0x5354524154414341ull;
  std::vector<Link> links_;  ///< indexed by rank (own entry: no peer)
  /// Pending pieces to each peer, in order (may span operations), indexed by rank.
  std::vector<std::deque<OutPiece>> out_;
  std::unique_ptr<ProxyService> proxy_;
  // Delivery of buffered send() data while the application does something else.
  std::mutex mu_;
  std::condition_variable cv_;
  std::thread delivery_;
  bool stopDelivery_ = false;
  bool abandoned_ = false;
  std::exception_ptr deliveryError_;
};

}  // namespace strata::collectives
