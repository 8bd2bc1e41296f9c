#pragma once

// Private to lib/transport: the Impl structs behind the public handles (other layers use the
// public accessors; tests use transport/testing.hpp).

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <strata/backend/transport.hpp>
#include <strata/error.hpp>
#include <strata/transport.hpp>

#include "base/watch_calls.hpp"

namespace strata::transport {

/// Tags the Context uses on the bootstrap; far above what applications use (documented in
/// docs/transports.md).
inline constexpr int kTagConnect = 0x53540001;
inline constexpr int kTagReady = 0x53540002;
inline constexpr int kTagExchange = 0x53540003;
inline constexpr int kTagSemaphore = 0x53540004;

/// Record kinds (docs/wire-format.md).
inline constexpr uint16_t kKindMemory = 80;
inline constexpr uint16_t kKindConnect = 81;
inline constexpr uint16_t kKindReady = 82;
inline constexpr uint16_t kKindSemaphore = 83;
inline constexpr uint16_t kKindHost = 84;
inline constexpr size_t kMaxRecord = 64 * 1024;

/// A context's revocation (Context::revoke): set once, read by every call on its connections and
/// semaphores. The flag is read without the lock on every call; the error under it.
struct Revocation {
  std::atomic<bool> raised{false};
  std::mutex mu;
  std::optional<Error> error;
  /// Throws the revocation's error when raised.
  void check() {
    if (!raised.load(std::memory_order_acquire)) return;
    std::lock_guard lk(mu);
    throw *error;
  }
};

struct HostRecord {
  int rank = -1;
  uint64_t hostId = 0;
  int32_t pid = 0;
  std::string hostName;
  std::vector<std::string> transports;  ///< filled in the second round
};

/// A transport this process created.
struct LoadedTransport {
  std::string name;
  std::shared_ptr<backend::Transport> transport;
};

/// Host memory the core allocated (memfd), released with the last registration.
struct HostBlock {
  void* data = nullptr;
  size_t bytes = 0;  ///< mapped length (page-rounded)
  backend::HostAllocation alloc;
  ~HostBlock();
};

/// Device memory a transport allocated, released with the last registration.
struct DeviceBlock {
  std::shared_ptr<backend::Transport> owner;
  void* data = nullptr;
  MemoryKind kind = MemoryKind::Cuda;
  ~DeviceBlock();
};

}  // namespace strata::transport

namespace strata {

struct RegisteredMemory::Impl {
  bool local = true;
  int rank = -1;
  void* data = nullptr;  ///< local only
  size_t size = 0;
  MemoryKind kind = MemoryKind::Host;
  uint64_t id = 0;  ///< random registration id carried in the record
  uint64_t hostId = 0;
  int32_t pid = 0;
  std::shared_ptr<transport::HostBlock> hostBlock;      ///< memory the core allocated
  std::shared_ptr<transport::DeviceBlock> deviceBlock;  ///< memory a transport allocated
  struct LocalReg {
    std::string name;
    std::shared_ptr<backend::Transport> transport;
    std::unique_ptr<backend::LocalMemory> memory;
  };
  std::vector<LocalReg> locals;  ///< local: one per transport
  // Remote view: the one transport it was imported through.
  std::string remoteTransport;
  std::shared_ptr<backend::Transport> remoteOwner;
  std::unique_ptr<backend::RemoteMemory> remote;

  ~Impl();
  /// The registration with transport `name`, or nullptr.
  backend::LocalMemory* localFor(std::string_view name) const;
};

struct Connection::Impl {
  int peer = -1;
  std::string transportName;
  std::shared_ptr<backend::Transport> transport;
  std::unique_ptr<backend::TransportConnection> conn;
  double timeout = 30;
  std::mutex mu;
  bool lost = false;
  std::string lostMessage;
  /// The peer's semaphore counters (a remote view of its arena for this transport).
  RegisteredMemory peerArena;
  /// This rank's arena for this transport (counters the peer raises).
  RegisteredMemory localArena;
  /// The watch scope of the context's bootstrap (base/watch_calls.hpp), or null.
  std::shared_ptr<watch::Scope> scope;
  /// The context's revocation (null for connections made outside a context, in tests).
  std::shared_ptr<transport::Revocation> revocation;
  /// Rethrows the context's revocation, then PeerLost for every call once the peer was lost.
  void checkLost();
  template <typename F>
  void guarded(F&& fn);
};

namespace transport {
/// The only way to the Impl behind the public handles (their impl() accessors are private):
/// lib/transport's own files include this header, no other layer can.
struct Access {
  static Connection::Impl& impl(Connection& c) noexcept { return *c.impl_; }
  static Context::Impl& impl(Context& c) noexcept { return *c.impl_; }
  static const std::shared_ptr<RegisteredMemory::Impl>& impl(const RegisteredMemory& m) noexcept {
    return m.impl_;
  }
};
}  // namespace transport

}  // namespace strata
