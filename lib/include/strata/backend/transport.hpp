#pragma once

// The transport plugin SDK. A transport is built in (shm) or a module
// (strata-transport-<name>.so, see module.hpp). The core (lib/transport) owns the records, the
// connection exchange and the ready handshake; a transport only registers and imports memory,
// names its endpoint, and moves bytes. Every method may throw strata::Error; messages name the
// peer rank and the transport.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <strata/bootstrap.hpp>
#include <strata/config.hpp>
#include <strata/memory.hpp>

namespace strata::backend {

/// What the core tells a transport about a rank (agreed through the bootstrap).
struct PeerInfo {
  int rank = -1;
  bool sameHost = false;
  uint64_t hostId = 0;   ///< hash of the host name and boot id
  std::string hostName;
  int32_t pid = 0;       ///< process id (meaningful on the same host only)
};

/// Passed to a transport's factory.
struct TransportInit {
  const Config* config = nullptr;
  Bootstrap* bootstrap = nullptr;  ///< for transports that need their own exchange; may be used
                                   ///< only from Transport methods the core calls collectively
  int rank = -1;
  int size = 0;
  int localRank = -1;
  int localSize = 0;
  uint64_t hostId = 0;
  /// The NIC lib/topology chose for this rank (transport.fabric.nic; docs/topology.md): its
  /// names (mlx5_0, ib0) and PCI address ("0000:1b:00.0"), empty when the topology shows no
  /// NIC or could not be read. A transport that offers several NICs opens this one.
  std::vector<std::string> nicNames;
  std::string nicBusId;
  /// Why it was chosen (for logs and errors).
  std::string nicWhy;
  /// transport.fabric.nic named NICs (not auto): a transport that cannot open the chosen one
  /// fails instead of taking another.
  bool nicRequired = false;
  /// CPUs for the transport's own threads (progress), from transport.proxy_cpus; empty: leave
  /// them unbound. process::pinCurrentThread applies it.
  std::vector<int> proxyCpus;
};

/// How the core allocated a host buffer it passes to registerMemory (shm maps it directly).
struct HostAllocation {
  int memfd = -1;        ///< memfd_create() descriptor owned by the core, or -1 (user memory)
  uint64_t inode = 0;    ///< st_ino of memfd, which the importer checks
  uint64_t offset = 0;   ///< offset of the buffer in the memfd
};

/// A local buffer as registered with one transport.
class LocalMemory {
 public:
  virtual ~LocalMemory() = default;
  /// This transport's part of the RegisteredMemory record: whatever a peer needs to import it
  /// (keys, handles, names). Opaque to the core; the transport versions its own content.
  virtual std::vector<uint8_t> descriptor() const = 0;
};

/// A peer's buffer as imported by one transport (a mapping, a remote key, an IPC pointer).
class RemoteMemory {
 public:
  virtual ~RemoteMemory() = default;
  /// Host memory of the peer mapped into this process, which the CPU may load from and store
  /// to (shm), or nullptr.
  virtual void* hostPointer() const noexcept { return nullptr; }
  /// Device memory of the peer mapped into this process (CUDA IPC over NVLink or PCIe), for
  /// device code and CUDA copies only, or nullptr. Separate from hostPointer() so that host
  /// code can never memcpy into an IPC device pointer.
  virtual void* devicePointer() const noexcept { return nullptr; }
};

/// A local buffer for write(): its address and this transport's registration of it.
struct LocalRef {
  void* data = nullptr;
  size_t size = 0;
  MemoryKind kind = MemoryKind::Host;
  LocalMemory* memory = nullptr;
};
/// A remote buffer for write().
struct RemoteRef {
  size_t size = 0;
  MemoryKind kind = MemoryKind::Host;
  RemoteMemory* memory = nullptr;
};

/// A one-sided link to one peer. The core serializes calls on one object (no two threads at
/// once) and checks ranges before calling, so implementations may assume valid arguments.
class TransportConnection {
 public:
  virtual ~TransportConnection() = default;
  /// Starts copying bytes from src + srcOffset to dst + dstOffset at the peer. May return
  /// before the data has landed; src may be modified once flush() returned.
  virtual void write(const RemoteRef& dst, uint64_t dstOffset, const LocalRef& src,
                     uint64_t srcOffset, size_t bytes) = 0;
  /// Stores value into the aligned 8-byte word at dst + dstOffset, visible at the peer only
  /// after every earlier write() has landed there.
  virtual void updateAndSync(const RemoteRef& dst, uint64_t dstOffset, uint64_t value) = 0;
  /// Blocks until every earlier write() has landed at the peer, or the deadline passes
  /// (then Timeout). Sleeps or polls a descriptor while waiting; never spins without yielding.
  virtual void flush(double deadlineSeconds) = 0;
  /// Drives progress for providers that need the caller; never blocks.
  virtual void progress() {}
  /// Throws PeerLost if the peer is known to be gone. Called by waits every few milliseconds,
  /// so it must be cheap (it may rate-limit itself).
  virtual void checkPeer() {}
};

/// Counters the tests read to prove nothing leaks.
struct TransportStats {
  size_t registrations = 0;  ///< live LocalMemory objects
  size_t imports = 0;        ///< live RemoteMemory objects
  size_t connections = 0;    ///< live TransportConnection objects
};

/// One transport in one process.
class Transport {
 public:
  virtual ~Transport() = default;
  virtual std::string_view name() const noexcept = 0;
  /// Can this transport connect this process to a rank with that relation at all?
  /// (shm and nvlink: same host only.)
  virtual bool canReach(const PeerInfo& peer) const noexcept = 0;
  virtual bool supportsMemory(MemoryKind kind) const noexcept = 0;
  /// Allocates memory this transport can share better than user memory (CUDA: cudaMalloc).
  /// nullptr if it has no allocator for that kind; the core then allocates host memory itself.
  virtual void* allocate(size_t /*bytes*/, MemoryKind /*kind*/) { return nullptr; }
  virtual void deallocate(void* /*data*/, MemoryKind /*kind*/) noexcept {}
  /// Registers a local buffer. host is set for host memory the core allocated.
  virtual std::unique_ptr<LocalMemory> registerMemory(void* data, size_t bytes, MemoryKind kind,
                                                      const HostAllocation* host) = 0;
  /// Imports a descriptor that owner's registerMemory produced.
  virtual std::unique_ptr<RemoteMemory> importMemory(const PeerInfo& owner,
                                                     std::span<const uint8_t> descriptor,
                                                     size_t bytes, MemoryKind kind) = 0;
  /// This process's endpoint for peers (a fabric address; empty if the transport needs none).
  virtual std::vector<uint8_t> endpoint() = 0;
  /// Connects to peer given the endpoint that peer's endpoint() returned (AV insert, ...).
  /// Must not block on the peer: the core runs the ready handshake afterwards.
  virtual std::unique_ptr<TransportConnection> connect(const PeerInfo& peer,
                                                       std::span<const uint8_t> peerEndpoint) = 0;
  /// The memory kind of the words this transport's updateAndSync() targets: the core allocates
  /// semaphore counters of this kind (Host for shm and fabric; nvlink may prefer Cuda).
  virtual MemoryKind signalMemoryKind() const noexcept { return MemoryKind::Host; }
  /// Reads the 8-byte counter at mem + offset that a peer raises with updateAndSync(): an
  /// acquire load for host memory; device memory needs the transport's help.
  virtual uint64_t loadSignal(const LocalRef& mem, uint64_t offset);
  /// Whether waitSignal() can block. True for transports whose incoming writes land only through
  /// their own progress thread (fabric with a provider that has a wait fd): a waiter then sleeps
  /// until that thread sees the value, instead of polling in sleep steps, which on a shared core
  /// takes CPU time from the very thread that moves the data.
  virtual bool blockingWaitSupported() const noexcept { return false; }
  /// Blocks until loadSignal(mem, offset) > above (true) or maxSeconds pass (false). May return
  /// false early (a spurious wake-up); callers loop. Only called when blockingWaitSupported().
  virtual bool waitSignal(const LocalRef& /*mem*/, uint64_t /*offset*/, uint64_t /*above*/,
                          double /*maxSeconds*/) {
    return false;
  }
  virtual TransportStats stats() const noexcept = 0;
};

inline uint64_t Transport::loadSignal(const LocalRef& mem, uint64_t offset) {
  auto* word = reinterpret_cast<uint64_t*>(static_cast<char*>(mem.data) + offset);
  return __atomic_load_n(word, __ATOMIC_ACQUIRE);
}

}  // namespace strata::backend
