#pragma once

// The built-in shm transport: host memory shared between processes of one host
// (docs/transport-shm.md). Memory the core allocated with memfd_create() is mapped by the
// importer through /proc/<owner pid>/fd/<fd>; user memory is written with process_vm_writev().
// No name is ever created in /dev/shm, so nothing can leak there, even when a process crashes.

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include <strata/backend/transport.hpp>

namespace strata::shm {

inline constexpr std::string_view kTransportName = "shm";

/// Record kinds (docs/wire-format.md: kinds are unique across layers) and their versions.
inline constexpr uint16_t kDescriptorKind = 50;
inline constexpr uint16_t kDescriptorVersion = 1;
inline constexpr uint16_t kEndpointKind = 51;
inline constexpr uint16_t kEndpointVersion = 1;
/// Largest body either record may claim; both are far smaller.
inline constexpr size_t kMaxRecordBody = 256;

/// How the owner's buffer can be reached.
enum class DescriptorMode : uint8_t {
  Memfd = 1,  ///< core-allocated memory in a memfd: the importer maps it
  User = 2,   ///< user memory: the importer writes with process_vm_writev()
};

/// The content of an shm memory descriptor (record kind 50).
struct MemoryDescriptor {
  DescriptorMode mode = DescriptorMode::Memfd;
  int32_t pid = 0;       ///< owner process
  uint64_t hostId = 0;   ///< owner's TransportInit::hostId (0 = unknown)
  uint64_t nonce = 0;    ///< random, per registration: identifies it in the owner process
  uint64_t address = 0;  ///< the buffer's address in the owner process
  uint64_t size = 0;     ///< bytes
  // Memfd mode only (absent from the record in user mode).
  int32_t fd = -1;      ///< the memfd's number in the owner process
  uint64_t inode = 0;   ///< st_ino of the memfd, checked by the importer
  uint64_t offset = 0;  ///< offset of the buffer in the memfd
};

/// Encodes a descriptor as a versioned record.
std::vector<uint8_t> encodeDescriptor(const MemoryDescriptor& descriptor);
/// Decodes and checks the structure of a descriptor (header, version, fields, mode); `what`
/// names it in errors. Throws ProtocolError. Semantic checks (pid, size) are importMemory()'s.
MemoryDescriptor decodeDescriptor(std::span<const uint8_t> record, std::string_view what);

/// The content of an shm endpoint record (kind 51): who the peer is, checked against what the
/// bootstrap reported.
struct Endpoint {
  int32_t pid = 0;
  uint64_t hostId = 0;
};
std::vector<uint8_t> encodeEndpoint(const Endpoint& endpoint);
/// Decodes the structure of an endpoint record; throws ProtocolError naming `what`.
Endpoint decodeEndpoint(std::span<const uint8_t> record, std::string_view what);

/// Creates the shm transport (name "shm"). The core's transport registry calls it.
std::unique_ptr<backend::Transport> createShmTransport(const backend::TransportInit& init);

}  // namespace strata::shm
