#pragma once

// Encoders and decoders of the transport records (docs/wire-format.md, kinds 80-84). Decoders
// throw ProtocolError naming the record, the field and the peer.

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "internal.hpp"

namespace strata::transport {

/// Fixed size of one rank's slot in the Context's host allGather.
inline constexpr size_t kHostSlot = 2048;

std::vector<uint8_t> encodeHost(const HostRecord& h);
/// Decodes rank `slotRank`'s slot (zero padding after the record is ignored).
HostRecord decodeHost(std::span<const uint8_t> slot, int slotRank, int size);

struct MemoryRecord {
  int rank = -1;
  uint64_t hostId = 0;
  int32_t pid = 0;
  MemoryKind kind = MemoryKind::Host;
  uint64_t size = 0;
  uint64_t id = 0;
  struct Entry {
    std::string transport;
    std::vector<uint8_t> descriptor;
  };
  std::vector<Entry> entries;
};
std::vector<uint8_t> encodeMemory(const MemoryRecord& m);
MemoryRecord decodeMemory(std::span<const uint8_t> record);

struct ConnectRecord {
  int from = -1;
  int to = -1;
  std::string transport;
  std::vector<uint8_t> endpoint;
  std::vector<uint8_t> arena;  ///< the sender's semaphore arena (a memory record)
};
std::vector<uint8_t> encodeConnect(const ConnectRecord& c);
ConnectRecord decodeConnect(std::span<const uint8_t> record, int expectedFrom);

struct ReadyRecord {
  int from = -1;
  int to = -1;
  std::string transport;
};
std::vector<uint8_t> encodeReady(const ReadyRecord& r);
ReadyRecord decodeReady(std::span<const uint8_t> record, int expectedFrom);

struct SemaphoreRecord {
  int from = -1;
  int to = -1;
  struct Slot {
    std::string transport;
    uint32_t slot = 0;
    uint64_t base = 0;  ///< the counter's value when it was handed out
  };
  std::vector<Slot> slots;
};
std::vector<uint8_t> encodeSemaphore(const SemaphoreRecord& s);
SemaphoreRecord decodeSemaphore(std::span<const uint8_t> record, int expectedFrom);

/// A transport name as it may appear in a list or a record: [a-z0-9_]{1,32}.
bool validTransportName(std::string_view name);

}  // namespace strata::transport
