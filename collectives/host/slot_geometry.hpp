#pragma once

// How a rank's receive area is cut into slots, and the set-up check that every rank cut it the
// same way. A sender writes each chunk into its peer's area at offsets it computes from its own
// geometry, so ranks with different collectives.buffer_bytes or collectives.chunk_bytes would
// write past each other's slots (issue 23: a 4 MiB all_reduce killed the rank whose peer had a
// smaller buffer). Creation therefore fails on every rank instead.

#include <cstddef>
#include <cstdint>

#include <strata/bootstrap.hpp>

namespace strata::collectives {

/// The receive area of every rank: one region of `depth` slots per source rank, in rank order;
/// a slot is a chunk header followed by up to chunkBytes of payload.
struct SlotGeometry {
  uint32_t depth = 0;     ///< slots per source rank
  size_t chunkBytes = 0;  ///< payload of a full chunk
  size_t slotBytes = 0;   ///< chunk header + chunkBytes
  size_t areaBytes = 0;   ///< the whole area: ranks x depth x slotBytes
  // The settings it came from, named when two ranks differ.
  size_t bufferSetting = 0;  ///< collectives.buffer_bytes
  size_t chunkSetting = 0;   ///< collectives.chunk_bytes

  size_t regionBytes() const { return static_cast<size_t>(depth) * slotBytes; }
  /// Where the slots that rank `source` writes start, in every receiver's area.
  uint64_t regionOffset(int source) const { return static_cast<uint64_t>(source) * regionBytes(); }
  /// Whether a sender of one geometry writes where a receiver of the other expects it.
  bool sameSlots(const SlotGeometry& other) const {
    return depth == other.depth && chunkBytes == other.chunkBytes && slotBytes == other.slotBytes &&
           areaBytes == other.areaBytes;
  }
};

/// The geometry for `ranks` ranks from collectives.buffer_bytes and collectives.chunk_bytes:
/// four slots per peer while that leaves chunks of 64 KiB (or the whole chunk_bytes), else
/// two; never chunks under 4 KiB (rank 0 warns that the area grows then). One rank: no area,
/// chunks of chunkSetting.
SlotGeometry slotGeometry(size_t bufferSetting, size_t chunkSetting, int ranks, int rank);

/// Collective over the bootstrap's ranks: one allGather of every rank's geometry. When a rank
/// differs from rank 0, every rank throws the same InvalidConfig naming both ranks, their
/// settings and the key(s) that differ.
void requireSameGeometry(Bootstrap& bootstrap, const SlotGeometry& mine);

}  // namespace strata::collectives
