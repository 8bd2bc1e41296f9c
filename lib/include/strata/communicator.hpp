#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <strata/bootstrap.hpp>
#include <strata/config.hpp>
#include <strata/error.hpp>
#include <strata/export.hpp>
#include <strata/types.hpp>

namespace strata {

class Context;

/// A group of ranks that run collectives together: the ranks of one Bootstrap, connected over
/// the transports of one Context (shm inside a host, fabric across hosts).
///
/// Every rank calls the same collectives in the same order (as with NCCL). Buffers follow
/// NCCL's rules: counts are in elements, and a collective is in place when send == recv
/// (allReduce, broadcast), send == recv + rank * sendCount elements (allGather) or
/// recv == send + rank * recvCount elements (reduceScatter). Host memory (from malloc, or
/// strata's allocator) is complete when the call returns. Arguments are checked before anything
/// is sent: a null buffer with count > 0, a bad root or peer, or buffers that overlap other
/// than in place throw InvalidArgument and leave the communicator usable. Errors while data
/// moves (Timeout, PeerLost) name the peer; after one the communicator should be destroyed, or
/// shrunk (below) to go on without the lost ranks (docs/fault-tolerance.md).
///
/// Each call is run by an algorithm of a collectives backend (<strata/backend/collectives.hpp>):
/// the built-in host backend serves host memory (and CUDA pinned or managed memory, which the
/// CPU may touch); device memory needs the CUDA module (NotSupported naming it until then).
/// collectives.algorithm and collectives.<op>.algorithm force one by name.
///
/// Calls on one Communicator must not overlap (one thread at a time).
class STRATA_API Communicator {
 public:
  /// Creates the bootstrap from config, then the communicator. Collective over the job.
  static std::unique_ptr<Communicator> create(const Config& config = Config::load());
  /// Builds on an existing bootstrap (shared with the caller). Collective over its ranks.
  static std::unique_ptr<Communicator> create(std::shared_ptr<Bootstrap> bootstrap,
                                              const Config& config = Config::load());
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const;
  int size() const;
  Bootstrap& bootstrap();
  /// The transport context (connections, registered memory) the collectives run on.
  Context& context();

  /// One algorithm of a loaded collectives backend (strata-info --algorithms).
  struct AlgorithmInfo {
    std::string backend;                 ///< "host"
    std::string name;                    ///< "twoshot"
    std::vector<std::string> ops;        ///< "allReduce", ...
    std::string memory;                  ///< memory kinds its backend serves: "host, cuda-host"
    std::string description;             ///< what it accepts and when auto takes it
    std::vector<std::string> forcedFor;  ///< ops for which the config forces it
  };
  /// Every algorithm of every loaded backend, in selection order.
  std::vector<AlgorithmInfo> algorithms() const;
  /// What the loaded collectives backends measured at create and the choices they derived
  /// (the host backend: process_vm_readv against a mapped copy, and where auto switches to
  /// single copy), one report per backend that tuned something, in lines of text
  /// (strata-info --tuning); empty when none did. Rank 0's figures: the same on every rank.
  std::string tuningReport() const;
  /// "backend/name" of the algorithm the last call chose (empty before the first).
  std::string lastAlgorithm() const;
  /// Never blocks: the error of a call whose work failed after the call returned (a device
  /// collective whose kernel gave up waiting for a peer: Timeout or PeerLost naming it), or of an
  /// earlier call; nullopt while all is well. After an error the communicator is unusable. Poll
  /// it where only CUDA graph replays run (no call would report it), as with NCCL's
  /// ncclCommGetAsyncError.
  std::optional<Error> asyncError() const;
  /// How the last call's algorithm launched its kernel ("grid 8 block 512"); empty for host
  /// algorithms and before the first call.
  std::string lastLaunch() const;

  /// Host memory that the ranks of this host map into each other (a shared memfd, page
  /// aligned, at least bytes). Collectives whose buffers lie in it on every rank read the
  /// peers' buffers directly, with no kernel and no slot copy (collectives.zero_copy_min_bytes;
  /// docs/collectives.md, "Zero copy"); any other use is that of ordinary memory. Not
  /// collective; thread-safe; the memory belongs to the process, not to this communicator (it
  /// stays valid after the communicator is destroyed and serves every communicator). As
  /// ncclMemAlloc. InvalidArgument for 0 bytes; SystemError when the memory cannot be had.
  void* allocHost(size_t bytes);
  /// Frees memory from allocHost (nullptr: nothing). InvalidArgument for a pointer that is not
  /// the start of a live allocation. No call may be using it.
  void freeHost(void* ptr);

  /// recv[i] = op over ranks of send[i], count elements; in place when send == recv.
  void allReduce(const void* send, void* recv, size_t count, DataType type, ReduceOp op,
                 Stream stream = {});
  /// recv (size * sendCount elements) gets every rank's send in rank order; in place when
  /// send == recv + rank * sendCount elements.
  void allGather(const void* send, void* recv, size_t sendCount, DataType type, Stream stream = {});
  /// recv (recvCount elements) gets block `rank` of the reduction of every rank's send
  /// (size * recvCount elements); in place when recv == send + rank * recvCount elements.
  void reduceScatter(const void* send, void* recv, size_t recvCount, DataType type, ReduceOp op,
                     Stream stream = {});
  /// recv gets root's send (count elements); send is read on root only; in place when
  /// send == recv.
  void broadcast(const void* send, void* recv, size_t count, DataType type, int root,
                 Stream stream = {});
  /// Block j of send (countPerRank elements) goes to rank j, landing in block `rank` of its
  /// recv. send and recv must not overlap.
  void allToAll(const void* send, void* recv, size_t countPerRank, DataType type,
                Stream stream = {});
  /// Point to point: matched in order with the peer's recv of the same count and type. On device
  /// memory the send's kernel waits on its stream until the peer's recv has read the data (as
  /// an ungrouped NCCL send), so a ring of messages larger than one round of the P2P slots
  /// where every rank sends before it receives waits until transport.timeout (sendRecv below
  /// completes it); on host memory that pattern works.
  void send(const void* buf, size_t count, DataType type, int peer, Stream stream = {});
  void recv(void* buf, size_t count, DataType type, int peer, Stream stream = {});
  /// Sends and receives issued together, as an NCCL group of ncclSend/ncclRecv or torch's
  /// batch_isend_irecv: the batch completes whatever the order of its items on each rank (rings,
  /// halo exchanges, all-to-alls with any sizes), as long as the peers' batches match it (the
  /// k-th send to a peer pairs with that peer's k-th receive from this rank, same count and
  /// type). Peers other than this rank; every item's memory of one kind (device or host). On
  /// device memory every item runs on `stream`; on host memory the call completes before it
  /// returns. An empty batch, or one whose items are all empty, does nothing.
  void sendRecv(std::span<const PointToPoint> ops, Stream stream = {});

  // ---- Fault tolerance (docs/fault-tolerance.md) -----------------------------------------------

  /// Revokes this communicator on every rank (MPI ULFM's MPIX_Comm_revoke, ncclCommRevoke):
  /// every rank's current and later calls on it fail with Aborted naming this rank and `reason`
  /// (a call waiting in a host collective within milliseconds; a device collective's kernels at
  /// their next abort-word poll, its error from asyncError() and the next call). The other ranks
  /// learn it through their status services (the watch: watch.enabled, the default), also while
  /// they compute or sit in no call; a stopped rank learns it once it runs again. Not collective;
  /// never blocks; thread-safe (another thread may be in a call). Idempotent: the first revoke
  /// (this rank's or a peer's) is the one reported. A rank whose call fails with PeerLost or a
  /// diagnosed Timeout revokes by itself (collectives.revoke_on_error).
  void revoke(std::string_view reason);
  /// The error calls on this communicator fail with since it was revoked (by any rank), or
  /// nullopt. Never blocks.
  std::optional<Error> revoked() const;
  /// The ranks this rank knows to be lost or stuck, ascending: those its own calls failed on
  /// (PeerLost, the rank a Timeout's diagnosis named) and those named by the revokes it received.
  /// What shrink() excludes.
  std::vector<int> lostRanks() const;
  /// A new communicator of the ranks not excluded (ULFM's MPIX_Comm_shrink, ncclCommShrink),
  /// built without any participation of the excluded ranks, dead, stopped or alive. Collective
  /// over the survivors only. Revokes this communicator first (calls still running on it fail),
  /// then the survivors agree on the excluded set: `exclude`, this rank's lostRanks(), every
  /// other survivor's, and any rank found dead or silent (bootstrap.timeout) during the
  /// agreement, which repeats until every survivor holds the same set. Survivors keep their
  /// relative order: rank r's new rank is the number of survivors below r. The new communicator
  /// talks over this one's bootstrap connections between the survivors (no new rendezvous, no
  /// dependence on rank 0) and has its own transports and watch scope. InvalidArgument when
  /// `exclude` names this rank or no rank of this communicator; Aborted when the others
  /// excluded this rank; the error of the last attempt when no agreement holds within a few
  /// attempts. This communicator stays revoked; destroy it (its destruction waits for no peer).
  std::unique_ptr<Communicator> shrink(std::span<const int> exclude);
  /// shrink(lostRanks()).
  std::unique_ptr<Communicator> shrink();

  /// Grow, step 1, on rank 0 only (not collective): opens a rendezvous listener for a
  /// communicator of `newSize` ranks (more than size()) and returns the invitation, a line of
  /// text (address and a fresh secret, as an ncclUniqueId carries them) to give each newcomer.
  /// InvalidArgument on another rank or for newSize <= size().
  std::string growInvitation(int newSize);
  /// Grow, step 2, collective over this communicator's ranks and the newcomers (join()): a new
  /// communicator of `newSize` ranks where this communicator's ranks keep their numbers and the
  /// newcomers take size() .. newSize - 1. Rank 0 tells the others the invitation over this
  /// communicator's bootstrap. Everyone waits for every newcomer up to bootstrap.timeout. This
  /// communicator stays usable (its bootstrap and transports are not shared with the new one).
  std::unique_ptr<Communicator> grow(int newSize);
  /// The newcomer's side of grow(): joins with the invitation rank 0 gave, as newcomer `index`
  /// (0 .. newSize - size - 1; its rank is the old size + index). Its Bootstrap reports local
  /// rank 0 of 1 (it cannot know its host's other ranks before it joins).
  static std::unique_ptr<Communicator> join(const std::string& invitation, int index,
                                            const Config& config = Config::load());

  struct Impl;
  explicit Communicator(std::unique_ptr<Impl> impl);

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata
