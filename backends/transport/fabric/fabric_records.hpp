#pragma once

// The fabric transport's two records (docs/transport-fabric.md, "Records"): the endpoint a peer
// needs to connect, and the descriptor of one registered buffer. Both are strata::wire records
// (magic, version, kind, length) so that a peer running another version, or a record of another
// transport, is refused instead of misread.

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace strata::fabric {

inline constexpr uint16_t kKindEndpoint = 70;
inline constexpr uint16_t kKindMemory = 71;
inline constexpr uint16_t kRecordVersion = 1;
inline constexpr size_t kMaxRecord = 4096;
inline constexpr size_t kMaxName = 256;
inline constexpr size_t kMaxAddress = 1024;

struct EndpointRecord {
  std::string provider;  ///< "tcp;ofi_rxm"
  std::string fabric;    ///< fabric_attr->name
  std::string domain;    ///< domain_attr->name (diagnostics only: NIC names differ across hosts)
  std::vector<uint8_t> address;  ///< fi_getname()
  uint64_t mrMode = 0;           ///< the mr_mode bits in force at the owner
  uint64_t cqDataSize = 0;
  uint64_t probeKey = 0;  ///< key of the owner's 8-byte probe region (checkPeer writes there)
  uint64_t probeVa = 0;   ///< its virtual address
};

struct MemoryRecord {
  uint64_t key = 0;
  uint64_t baseVa = 0;
  uint64_t length = 0;
  uint64_t mrMode = 0;
  uint8_t kind = 0;  ///< strata::MemoryKind
};

std::vector<uint8_t> encode(const EndpointRecord& record);
std::vector<uint8_t> encode(const MemoryRecord& record);
/// Throw ProtocolError naming `peer` for malformed, truncated or unknown-version input.
EndpointRecord decodeEndpoint(std::span<const uint8_t> data, int peer);
MemoryRecord decodeMemory(std::span<const uint8_t> data, int peer);

}  // namespace strata::fabric
