#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <strata/export.hpp>

namespace strata {

class Context;
namespace transport {
struct Access;
}  // namespace transport

/// Where a buffer lives.
enum class MemoryKind : uint8_t { Host = 1, Cuda = 2 };

/// "host", "cuda".
STRATA_API std::string_view toString(MemoryKind kind) noexcept;

/// A buffer registered with the transports of a Context, or a peer's buffer seen through its
/// record (a "remote view").
///
/// A local RegisteredMemory comes from Context::allocate() or Context::registerMemory(). Its
/// serialize() gives a versioned record (docs/wire-format.md) with the owner's rank, host,
/// process, memory kind, size and each transport's keys or handles. deserialize() on a peer
/// checks the record against what the bootstrap agreed about its owner and imports it with the
/// transport that connects the two ranks; the result is the destination of Connection::write().
///
/// Copies share the registration; it is released when the last copy goes. The Context must
/// outlive every RegisteredMemory made from it.
class STRATA_API RegisteredMemory {
 public:
  RegisteredMemory();
  ~RegisteredMemory();
  RegisteredMemory(const RegisteredMemory&);
  RegisteredMemory& operator=(const RegisteredMemory&);
  RegisteredMemory(RegisteredMemory&&) noexcept;
  RegisteredMemory& operator=(RegisteredMemory&&) noexcept;

  /// False for a default-constructed object.
  explicit operator bool() const noexcept { return impl_ != nullptr; }
  /// The local address; nullptr for a remote view.
  void* data() const noexcept;
  size_t size() const noexcept;
  MemoryKind kind() const noexcept;
  /// Host memory the CPU of this process can load from and store to: data() for local host
  /// memory; for a remote view of a peer's host memory that its transport mapped into this
  /// process (shm), the mapping; nullptr otherwise (device memory, or not mapped).
  void* hostPointer() const noexcept;
  /// Device memory: data() for local CUDA memory; for a remote view of a peer's CUDA memory
  /// mapped into this process (CUDA IPC), the mapped device address; nullptr otherwise. Never
  /// for the CPU to touch: host code cannot mistake it for hostPointer().
  void* devicePointer() const noexcept;
  /// True for memory of this process, false for a remote view.
  bool isLocal() const noexcept;
  /// The owner's rank.
  int rank() const noexcept;
  /// The transports this buffer is registered with (local) or was imported through (remote).
  std::vector<std::string> transports() const;
  /// Local memory only (InvalidArgument for a remote view).
  std::vector<uint8_t> serialize() const;
  /// Imports a peer's record. Throws ProtocolError for a malformed or truncated record, an
  /// unknown version, or one whose owner (rank, host, process) does not match what the bootstrap
  /// agreed; InvalidArgument when expectedRank >= 0 and the record is from another rank;
  /// NotSupported when the record lacks the transport that connects this rank to its owner.
  static RegisteredMemory deserialize(Context& context, std::span<const uint8_t> record,
                                      int expectedRank = -1);

  struct Impl;
  explicit RegisteredMemory(std::shared_ptr<Impl> impl);

 private:
  friend struct transport::Access;
  std::shared_ptr<Impl> impl_;
};

}  // namespace strata
