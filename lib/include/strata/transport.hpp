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
#include <strata/memory.hpp>

namespace strata {

namespace transport {
struct Access;
}  // namespace transport
namespace backend {
class Transport;
class TransportConnection;
}  // namespace backend

/// A one-sided link from this rank to one peer over one transport (shm, fabric, nvlink).
///
/// Writes are asynchronous: a source buffer may be reused, and the data is at the peer, only
/// after flush() returns or after the peer saw a later updateAndSync(). Calls on one Connection
/// from several threads are serialized. Errors name the peer and the transport; after PeerLost
/// every later call throws PeerLost.
class STRATA_API Connection {
 public:
  ~Connection();
  int peer() const noexcept;
  std::string_view transport() const noexcept;
  /// Copies bytes from src (local) at srcOffset to dst (the peer's memory, a remote view from
  /// the peer this connection goes to) at dstOffset. InvalidArgument for ranges past either
  /// buffer, a local dst or a remote src, or a dst owned by another rank.
  void write(const RegisteredMemory& dst, uint64_t dstOffset, const RegisteredMemory& src,
             uint64_t srcOffset, size_t bytes);
  /// Stores value into the 8-byte word at dst + dstOffset (8-byte aligned) so that the peer
  /// sees it only after every earlier write() on this connection has landed.
  void updateAndSync(const RegisteredMemory& dst, uint64_t dstOffset, uint64_t value);
  /// Waits until every earlier write() has landed at the peer. timeoutSeconds < 0 takes
  /// transport.timeout; 0 means no deadline. Throws Timeout naming the peer and the transport.
  void flush(double timeoutSeconds = -1);
  /// Lets transports that need the caller's help make progress (fabric providers with manual
  /// progress). Never blocks.
  void progress();
  /// Throws PeerLost if the transport knows that the peer is gone, or the context's revocation
  /// (Context::revoke) once it is revoked.
  void checkPeer();

  struct Impl;
  explicit Connection(std::unique_ptr<Impl> impl);

 private:
  friend struct transport::Access;
  std::unique_ptr<Impl> impl_;
};

/// A host-side semaphore between this rank and one peer over one Connection: signal() raises
/// the peer's counter after every earlier write on the connection has landed; wait() blocks
/// until this side's counter has been raised once more than it had been waited for.
class STRATA_API HostSemaphore {
 public:
  ~HostSemaphore();
  int peer() const noexcept;
  /// Raises the peer's counter by one (Connection::updateAndSync).
  void signal();
  /// Waits for the next signal from the peer. timeoutSeconds < 0 takes transport.timeout; 0
  /// means no deadline. Throws Timeout or PeerLost naming the peer and the transport.
  void wait(double timeoutSeconds = -1);
  /// True if a signal is pending (and consumes it); never blocks.
  bool poll();

  struct Impl;
  explicit HostSemaphore(std::unique_ptr<Impl> impl);

 private:
  std::unique_ptr<Impl> impl_;
};

/// One per process (or per communicator): owns the Bootstrap and the transports, and knows which
/// ranks share a host. Creation is collective over the bootstrap (one allGather of each rank's
/// host identity and transports).
class STRATA_API Context {
 public:
  /// Loads the transports named in transport.intra_node and transport.inter_node that this
  /// process can use, then agrees with every rank on hosts and transports.
  static std::shared_ptr<Context> create(std::shared_ptr<Bootstrap> bootstrap,
                                         const Config& config = Config::load());
  ~Context();

  Bootstrap& bootstrap() noexcept;
  const std::shared_ptr<Bootstrap>& bootstrapPtr() const noexcept;
  int rank() const noexcept;
  int size() const noexcept;
  /// True if peer runs on this rank's host (same host identity).
  bool sameHost(int peer) const;
  /// The peer's host name as it reported it.
  const std::string& hostName(int rank) const;
  /// The transport that connects this rank to peer for memory of that kind: the first name of
  /// transport.intra_node (same host) or transport.inter_node (other host) that both ranks
  /// loaded and that handles the kind. Throws NotSupported naming both ranks, what each has and
  /// why the others did not load, when there is none.
  std::string transportFor(int peer, MemoryKind kind = MemoryKind::Host) const;
  /// The rank's host identity (a hash of its host name and boot id, as the rank reported it).
  uint64_t hostId(int rank) const;
  /// The rank's process id, as it reported it (meaningful for ranks on this host).
  int32_t pid(int rank) const;
  /// The rank's index among the ranks of its host, in rank order.
  int localRank(int rank) const;
  /// The ranks grouped by host: each group in rank order, groups ordered by their first rank.
  std::vector<std::vector<int>> hostGroups() const;
  /// The transports this process loaded.
  std::vector<std::string> transports() const;
  /// CPUs for threads that serve this rank's network traffic (a ProxyService's, the fabric
  /// transport's progress thread), from transport.proxy_cpus (docs/topology.md); empty: leave
  /// them unbound.
  const std::vector<int>& proxyCpus() const noexcept;
  /// Live objects of one loaded transport (diagnostics; the tests use it to prove nothing
  /// leaks).
  struct TransportUsage {
    std::string name;
    size_t registrations = 0;
    size_t imports = 0;
    size_t connections = 0;
  };
  std::vector<TransportUsage> usage() const;

  /// Allocates memory that every local transport can share (for host memory, a memfd mapping
  /// that same-host peers map directly) and registers it.
  RegisteredMemory allocate(size_t bytes, MemoryKind kind = MemoryKind::Host);
  /// Registers memory the caller owns (it must outlive every copy of the result).
  RegisteredMemory registerMemory(void* data, size_t bytes, MemoryKind kind = MemoryKind::Host);

  /// Collective among the listed peers (each of them must list this rank): sets up one
  /// Connection per peer in one batched exchange, then a ready handshake so that nobody writes
  /// before the peer has imported everything. peers must be distinct and not this rank.
  /// kind picks the transport (transportFor); memory of other kinds may still be written when
  /// the transport handles it.
  std::vector<std::shared_ptr<Connection>> connect(std::span<const int> peers,
                                                   MemoryKind kind = MemoryKind::Host);
  /// Sends local's record to every listed peer and returns each peer's memory (deserialized),
  /// in the order of peers. Every listed peer must call it with this rank in its list.
  std::vector<RegisteredMemory> exchange(const RegisteredMemory& local, std::span<const int> peers);
  /// One semaphore per connection, made in one exchange with the connections' peers (each of
  /// them must call it with its connection to this rank).
  std::vector<std::shared_ptr<HostSemaphore>> createSemaphores(
      std::span<const std::shared_ptr<Connection>> connections);

  /// Stops this context's work for good (Communicator::revoke): every later call on its
  /// connections and semaphores throws `reason`, and so does every wait in progress at its next
  /// liveness check (transports check every few milliseconds). The first reason stays; later
  /// ones are ignored. Thread-safe; never blocks. Collectives backends poll revoked() in their
  /// own waits (kernels: the abort word).
  void revoke(const Error& reason) noexcept;
  /// The error revoke() was given, or nullopt. Never blocks; cheap while not revoked.
  std::optional<Error> revoked() const;

  struct Impl;
  explicit Context(std::unique_ptr<Impl> impl);

 private:
  friend struct transport::Access;
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata
