#include "slot_geometry.hpp"

#include <algorithm>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <strata/error.hpp>

#include "base/log.hpp"
#include "base/wire.hpp"
#include "chunk_header.hpp"

namespace strata::collectives {

namespace {

constexpr size_t kHeaderBytes = kChunkHeaderBytes;
/// Pipeline slots per peer: deep when the buffer leaves chunks of kDeepChunkMin or more.
constexpr uint32_t kDeepSlots = 4;
constexpr uint32_t kShallowSlots = 2;
constexpr size_t kDeepChunkMin = 64 * 1024;
/// The smallest chunk, whatever collectives.buffer_bytes says (a warning says so at create).
constexpr size_t kChunkFloor = 4096;

/// The geometry record each rank contributes to the allGather (docs/wire-format.md, "Slot
/// geometry"), zero-padded to one allGather slot.
constexpr uint16_t kGeometryKind = 100;
constexpr uint16_t kGeometryVersion = 1;
constexpr size_t kGeometrySlot = 64;

std::vector<uint8_t> encodeGeometry(const SlotGeometry& g, int rank) {
  wire::Writer w;
  w.i32(rank).u32(g.depth).u64(g.chunkBytes).u64(g.slotBytes).u64(g.areaBytes);
  w.u64(g.bufferSetting).u64(g.chunkSetting);
  auto record = wire::encodeRecord(kGeometryKind, kGeometryVersion, w.data());
  record.resize(kGeometrySlot, 0);
  return record;
}

SlotGeometry decodeGeometry(std::span<const uint8_t> slot, int rank) {
  const std::string what = fmt::format("host collectives slot geometry record of rank {}", rank);
  auto header = wire::decodeHeader(slot.first(wire::kRecordHeaderSize), kGeometryVersion,
                                   kGeometrySlot - wire::kRecordHeaderSize, what);
  auto record =
      wire::decodeRecord(slot.first(wire::kRecordHeaderSize + header.length), kGeometryKind,
                         kGeometryVersion, kGeometrySlot - wire::kRecordHeaderSize, what);
  wire::Reader r(record.body, what);
  if (r.i32("rank") != rank) {
    throw Error(ErrorCode::ProtocolError, fmt::format("{} names another rank", what), rank);
  }
  SlotGeometry g;
  g.depth = r.u32("depth");
  g.chunkBytes = r.u64("chunk bytes");
  g.slotBytes = r.u64("slot bytes");
  g.areaBytes = r.u64("area bytes");
  g.bufferSetting = r.u64("collectives.buffer_bytes");
  g.chunkSetting = r.u64("collectives.chunk_bytes");
  r.expectEnd();
  return g;
}

/// "collectives.buffer_bytes = 1048576 (2 slots per peer of 262080-byte chunks)".
std::string describeSettings(const SlotGeometry& g, bool buffer, bool chunk) {
  std::string text;
  if (buffer) text = fmt::format("collectives.buffer_bytes = {}", g.bufferSetting);
  if (chunk) {
    text += fmt::format("{}collectives.chunk_bytes = {}", text.empty() ? "" : ", ", g.chunkSetting);
  }
  return text + fmt::format(" ({} slots per peer of {}-byte chunks)", g.depth, g.chunkBytes);
}

}  // namespace

SlotGeometry slotGeometry(size_t bufferSetting, size_t chunkSetting, int ranks, int rank) {
  SlotGeometry g;
  g.bufferSetting = bufferSetting;
  g.chunkSetting = chunkSetting;
  if (ranks <= 1) {
    g.chunkBytes = chunkSetting;
    return g;
  }
  const size_t n = static_cast<size_t>(ranks);
  auto chunkFor = [&](uint32_t depth) -> size_t {
    size_t per = bufferSetting / (n * depth);
    return per > kHeaderBytes ? std::min(chunkSetting, per - kHeaderBytes) : 0;
  };
  g.depth = chunkFor(kDeepSlots) >= kDeepChunkMin || chunkFor(kDeepSlots) >= chunkSetting
                ? kDeepSlots
                : kShallowSlots;
  g.chunkBytes = chunkFor(g.depth) / kHeaderBytes * kHeaderBytes;
  if (g.chunkBytes < kChunkFloor) {
    g.chunkBytes = kChunkFloor;
    if (rank == 0) {
      STRATA_LOG(Warn, "coll",
                 "collectives.buffer_bytes = {} is too small for {} ranks: every peer needs {} "
                 "slots of at least {} bytes, so the receive buffer takes {} bytes instead; "
                 "raise collectives.buffer_bytes to silence this",
                 bufferSetting, ranks, g.depth, kChunkFloor + kHeaderBytes,
                 n * g.depth * (kChunkFloor + kHeaderBytes));
    }
  }
  g.slotBytes = kHeaderBytes + g.chunkBytes;
  g.areaBytes = n * g.regionBytes();
  return g;
}

void requireSameGeometry(Bootstrap& bootstrap, const SlotGeometry& mine) {
  const int size = bootstrap.size();
  if (size == 1) return;
  std::vector<uint8_t> all(kGeometrySlot * static_cast<size_t>(size));
  auto record = encodeGeometry(mine, bootstrap.rank());
  std::copy(record.begin(), record.end(),
            all.begin() + static_cast<std::ptrdiff_t>(kGeometrySlot * bootstrap.rank()));
  bootstrap.allGather(all.data(), kGeometrySlot);
  // Every rank holds the same table and reaches the same verdict, so all fail together.
  auto slotOf = [&](int r) {
    return std::span<const uint8_t>(all).subspan(kGeometrySlot * static_cast<size_t>(r),
                                                 kGeometrySlot);
  };
  const SlotGeometry first = decodeGeometry(slotOf(0), 0);
  for (int r = 1; r < size; ++r) {
    const SlotGeometry other = decodeGeometry(slotOf(r), r);
    if (other.sameSlots(first)) continue;
    bool buffer = other.bufferSetting != first.bufferSetting;
    bool chunk = other.chunkSetting != first.chunkSetting;
    if (!buffer && !chunk) buffer = chunk = true;  // equal settings give equal slots: a guard
    const char* keys = buffer && chunk ? "collectives.buffer_bytes and collectives.chunk_bytes"
                       : buffer        ? "collectives.buffer_bytes"
                                       : "collectives.chunk_bytes";
    throw Error(ErrorCode::InvalidConfig,
                fmt::format("ranks 0 and {} cut the host collectives' receive slots differently: "
                            "rank 0 has {}, rank {} has {}. Each rank writes its chunks into its "
                            "peers' slots, so every rank must use the same {}: check the STRATA_* "
                            "environment and strata.toml of every rank, and the Config given to "
                            "Communicator::create",
                            r, describeSettings(first, buffer, chunk), r,
                            describeSettings(other, buffer, chunk), keys),
                r);
  }
}

}  // namespace strata::collectives
