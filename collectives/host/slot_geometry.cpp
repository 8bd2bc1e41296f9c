#include "slot_geometry.hpp"

#include <algorithm>

#include "base/log.hpp"
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

}  // namespace

SlotGeometry slotGeometry(size_t bufferSetting, size_t chunkSetting, int ranks, int rank) {
  SlotGeometry g;
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

}  // namespace strata::collectives
