#pragma once

// The collectives plugin SDK. A collectives backend serves the Communicator's calls on some
// kinds of memory with a set of algorithms. The host backend is built in; a CUDA backend is a
// module (strata-collectives-<name>.so, see module.hpp) registered the same way.
//
// Per call, the Communicator validates the arguments (counts, buffers, roots, overlaps),
// classifies each buffer's memory, and builds a CollectiveRequest. It then picks the algorithm:
//   1. forced by name (collectives.<op>.algorithm, else collectives.algorithm when some
//      backend has an algorithm of that name for the op): that algorithm, which must accept
//      the request (else NotSupported naming it and why);
//   2. otherwise the backends in order (built-ins first, then collectives.modules), each
//      backend's algorithms in the order it lists them: the first that accepts the request and
//      whose preferred range (prefers()) covers it; failing that, the first that accepts it.
// An algorithm's run() returns when the call is complete for host memory, or enqueued on
// request.stream for device memory. run() may throw strata::Error (Timeout, PeerLost, ...).

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <strata/config.hpp>
#include <strata/error.hpp>
#include <strata/transport.hpp>
#include <strata/types.hpp>

namespace strata::backend {

/// The operations of the Communicator.
enum class CollectiveOp : uint16_t {
  AllReduce = 1,
  AllGather = 2,
  ReduceScatter = 3,
  Broadcast = 4,
  AllToAll = 5,
  Send = 6,
  Recv = 7,
  SendRecv = 8,  ///< a batch of sends and receives (CollectiveRequest::batch)
};

/// "allReduce", "allGather", "reduceScatter", "broadcast", "allToAll", "send", "recv",
/// "sendRecv".
constexpr std::string_view toString(CollectiveOp op) noexcept {
  switch (op) {
    case CollectiveOp::AllReduce:
      return "allReduce";
    case CollectiveOp::AllGather:
      return "allGather";
    case CollectiveOp::ReduceScatter:
      return "reduceScatter";
    case CollectiveOp::Broadcast:
      return "broadcast";
    case CollectiveOp::AllToAll:
      return "allToAll";
    case CollectiveOp::Send:
      return "send";
    case CollectiveOp::Recv:
      return "recv";
    case CollectiveOp::SendRecv:
      return "sendRecv";
  }
  return "unknown";
}

/// Where a buffer lives, as the Communicator classified it.
enum class BufferKind : uint8_t {
  Host = 1,        ///< pageable host memory (malloc, strata's allocator)
  CudaDevice = 2,  ///< cudaMalloc'd device memory
  CudaHost = 3,    ///< CUDA host-pinned (cudaMallocHost) or managed memory: the CPU may touch it
};

/// "host", "cuda-device", "cuda-host".
constexpr std::string_view toString(BufferKind kind) noexcept {
  switch (kind) {
    case BufferKind::Host:
      return "host";
    case BufferKind::CudaDevice:
      return "cuda-device";
    case BufferKind::CudaHost:
      return "cuda-host";
  }
  return "unknown";
}

/// One call, already validated.
struct CollectiveRequest {
  CollectiveOp op = CollectiveOp::AllReduce;
  const void* send = nullptr;  ///< null for recv
  void* recv = nullptr;        ///< null for send
  /// Elements: allReduce and broadcast count, allGather's sendCount, reduceScatter's recvCount,
  /// allToAll's countPerRank, send/recv count.
  size_t count = 0;
  DataType type = DataType::Float32;
  ReduceOp redop = ReduceOp::Sum;  ///< allReduce and reduceScatter only
  int root = -1;                   ///< broadcast only
  int peer = -1;                   ///< send and recv only
  BufferKind sendKind = BufferKind::Host;
  BufferKind recvKind = BufferKind::Host;
  Stream stream;
  /// sendRecv only: the batch, validated (peers other than this rank, buffers of one kind, which
  /// sendKind and recvKind give; count and type above are unused). Every rank's batch must
  /// complete whatever the order of its items, as long as the peers' batches match it (the
  /// k-th send to a peer pairs with that peer's k-th receive from this rank, same size).
  std::span<const PointToPoint> batch;
  /// The bytes one rank contributes (count * element size).
  size_t bytes() const noexcept { return count * sizeOf(type); }
};

/// The ranks as the Communicator sees them.
struct Topology {
  int rank = 0;
  int size = 1;
  /// Ranks grouped by host: each group in rank order, groups ordered by their first rank.
  std::vector<std::vector<int>> hosts;
};

/// One way to run some operations.
class Algorithm {
 public:
  virtual ~Algorithm() = default;
  /// Unique within its backend and op (the name collectives.algorithm forces).
  virtual std::string_view name() const noexcept = 0;
  /// The operations it implements.
  virtual std::vector<CollectiveOp> ops() const = 0;
  /// What it accepts and when auto selection prefers it, in words (strata-info --algorithms).
  virtual std::string describe() const = 0;
  /// Empty when it can serve the request on this topology; else why not, in a few words
  /// ("needs ranks on several hosts", "process_vm_readv is not permitted between the ranks").
  virtual std::string unsuitable(const CollectiveRequest& request) const = 0;
  /// Whether auto selection should take it for this request (its size range and rank layout).
  virtual bool prefers(const CollectiveRequest& request) const = 0;
  /// Runs the call; every rank runs the same algorithm for the same call.
  virtual void run(const CollectiveRequest& request) = 0;
  /// How its last run() launched, for tools ("grid 8 block 512" for a kernel); empty for
  /// algorithms that launch nothing.
  virtual std::string launchShape() const { return {}; }
};

/// A backend: its algorithms and the memory they serve, set up on one Context.
class CollectivesBackend {
 public:
  virtual ~CollectivesBackend() = default;
  virtual std::string_view name() const noexcept = 0;
  /// Memory kinds its algorithms accept (the Communicator asks only backends that serve the
  /// kinds of a request's buffers).
  virtual std::vector<BufferKind> memoryKinds() const = 0;
  /// Its algorithms, in its order of preference. Owned by the backend.
  virtual std::vector<Algorithm*> algorithms() = 0;
  /// An error of work that completed after its call returned (a device kernel that gave up
  /// waiting), or nullopt. Must not block; Communicator::asyncError() asks.
  virtual std::optional<Error> asyncError() const { return std::nullopt; }
  /// What the backend measured at set-up and the choices it derived from it, in lines of
  /// text, for strata-info --tuning (empty: nothing tuned).
  virtual std::string tuningReport() const { return {}; }
};

/// What a collectives backend is created with. Creation is collective over the context's
/// ranks (every rank creates the same backends in the same order).
struct CollectivesInit {
  std::shared_ptr<Context> context;
  const Config* config = nullptr;
  Topology topology;
};

}  // namespace strata::backend
