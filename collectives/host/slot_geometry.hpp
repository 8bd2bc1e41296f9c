#pragma once

// How a rank's receive area is cut into slots, from collectives.buffer_bytes and
// collectives.chunk_bytes.

#include <cstddef>
#include <cstdint>

namespace strata::collectives {

/// The receive area of every rank: one region of `depth` slots per source rank, in rank order;
/// a slot is a chunk header followed by up to chunkBytes of payload.
struct SlotGeometry {
  uint32_t depth = 0;     ///< slots per source rank
  size_t chunkBytes = 0;  ///< payload of a full chunk
  size_t slotBytes = 0;   ///< chunk header + chunkBytes
  size_t areaBytes = 0;   ///< the whole area: ranks x depth x slotBytes

  size_t regionBytes() const { return static_cast<size_t>(depth) * slotBytes; }
  /// Where the slots that rank `source` writes start, in every receiver's area.
  uint64_t regionOffset(int source) const { return static_cast<uint64_t>(source) * regionBytes(); }
};

/// The geometry for `ranks` ranks from collectives.buffer_bytes and collectives.chunk_bytes:
/// four slots per peer while that leaves chunks of 64 KiB (or the whole chunk_bytes), else
/// two; never chunks under 4 KiB (rank 0 warns that the area grows then). One rank: no area,
/// chunks of chunkSetting.
SlotGeometry slotGeometry(size_t bufferSetting, size_t chunkSetting, int ranks, int rank);

}  // namespace strata::collectives
