// The test seam of core/failure_note_testing.hpp (in the strata_testing library, for tests only).

#include "core/failure_note_testing.hpp"

#include "failure_note_codec.hpp"

namespace strata::core::testing {

size_t slotBytes() {
  return kFailureNoteSlot;
}
size_t maxVerdictBytes() {
  return kMaxNoteVerdict;
}
size_t maxErrorBytes() {
  return kMaxNoteError;
}

std::vector<uint8_t> encode(const Note& note) {
  return encodeFailureNote({note.culprit, note.verdict, note.failedRank, note.error});
}

Note decode(std::span<const uint8_t> slot, int from, int size) {
  FailureNote n = decodeFailureNote(slot, from, size);
  return {n.culprit, std::move(n.verdict), n.failedRank, std::move(n.error)};
}

Error explain(const Error& lost, std::span<const uint8_t> slot, int from, int rank, int size) {
  return explainWithNote(lost, slot, from, rank, size);
}

}  // namespace strata::core::testing
