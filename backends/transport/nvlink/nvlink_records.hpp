#pragma once

// The nvlink transport's two records (docs/transport-nvlink.md): the memory descriptor that
// registerMemory() produces and importMemory() reads, and the endpoint that connect() reads.
// This file has no CUDA dependency so that the decoders can be tested (and fuzzed) on any
// machine.

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace strata::nvlink {

/// Record kinds, unique across strata (docs/wire-format.md).
inline constexpr uint16_t kDescriptorKind = 60;
inline constexpr uint16_t kEndpointKind = 61;
inline constexpr uint16_t kDescriptorVersion = 1;
inline constexpr uint16_t kEndpointVersion = 1;
/// Generous caps: a descriptor with every handle type is about 300 bytes.
inline constexpr size_t kMaxDescriptorBody = 1024;
inline constexpr size_t kMaxEndpointBody = 256;
inline constexpr size_t kMaxHandles = 4;
inline constexpr size_t kHandleBytes = 64;  // cudaIpcMemHandle_t and CUmemFabricHandle
inline constexpr size_t kMaxBusIdBytes = 32;

enum class HandleType : uint8_t {
  RuntimeIpc = 1,  ///< cudaIpcMemHandle_t of a cudaMalloc allocation (same host)
  Fabric = 2,      ///< CUmemFabricHandle of a cuMem allocation (NVLink fabric / IMEX)
};

using Uuid = std::array<uint8_t, 16>;

struct MemoryHandle {
  /// Kept as a number: a version-1 decoder skips handle types it does not know.
  uint8_t type = 0;
  std::vector<uint8_t> bytes;
};

struct MemoryDescriptor {
  std::vector<MemoryHandle> handles;  ///< in the order the importer should try them
  uint64_t ownerAddress = 0;          ///< the registered pointer in the owner's address space
  uint64_t allocationBase = 0;        ///< start of the CUDA allocation in the owner's space
  uint64_t allocationSize = 0;
  uint64_t offset = 0;  ///< ownerAddress - allocationBase
  uint64_t length = 0;  ///< registered bytes
  Uuid deviceUuid{};
  std::string pciBusId;  ///< "0000:3b:00.0"
  uint64_t hostId = 0;
  int32_t pid = 0;

  const MemoryHandle* find(HandleType type) const;
};

struct Endpoint {
  Uuid deviceUuid{};
  std::string pciBusId;
  uint64_t hostId = 0;
  int32_t pid = 0;
};

std::vector<uint8_t> encodeDescriptor(const MemoryDescriptor& d);
/// Throws ProtocolError (its message naming the "nvlink memory descriptor") for a malformed,
/// truncated or inconsistent record (offset + length past the allocation, no handle, ...).
MemoryDescriptor decodeDescriptor(std::span<const uint8_t> record);

std::vector<uint8_t> encodeEndpoint(const Endpoint& e);
Endpoint decodeEndpoint(std::span<const uint8_t> record);

/// "GPU-6a3c1e0b-...", the form nvidia-smi -L and CUDA_VISIBLE_DEVICES use.
std::string uuidString(const Uuid& uuid);

}  // namespace strata::nvlink
