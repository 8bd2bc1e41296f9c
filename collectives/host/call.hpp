#pragma once

// What the host algorithms (algorithms.cpp: through the slots; single_copy.cpp: reading the
// peers' buffers) share about one call: its chunk signature, an empty plan, the block split.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>

#include <strata/backend/collectives.hpp>

#include "engine.hpp"

namespace strata::collectives {

/// What every chunk of the call carries (docs/wire-format.md, "Collective chunks"), with
/// checked conversions (InvalidArgument when a value does not fit its field).
OpSignature signatureOf(const backend::CollectiveRequest& call);
Plan makePlan(Engine& e, const OpSignature& sig);
void copyIfDistinct(void* dst, const void* src, size_t bytes);
/// The bytes of the send and recv buffers of the call on a rank, as the op defines them
/// (n: ranks).
std::pair<size_t, size_t> bufferBytes(const backend::CollectiveRequest& call, size_t n);
/// Whether the call copies into its destination with streaming stores (Engine::streams of its
/// send plus recv bytes).
bool streamsCall(const Engine& e, const backend::CollectiveRequest& call);

/// Blocks of [0, count) elements split n ways, 16-element aligned: byte start and length.
struct Blocks {
  size_t count, n, ts, blk;
  Blocks(size_t count_, size_t n_, size_t ts_) : count(count_), n(n_), ts(ts_) {
    blk = (count + n - 1) / n;
    blk = (blk + 15) / 16 * 16;
  }
  size_t start(size_t b) const { return std::min(count, b * blk) * ts; }
  size_t length(size_t b) const { return start(b + 1) - start(b); }
};

}  // namespace strata::collectives
