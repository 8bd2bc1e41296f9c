#pragma once

// The failure note (failure_note.cpp) as a wire record, without any I/O: docs/wire-format.md
// "Failure note", kind 110. A note travels in a fixed-size bootstrap message, because its
// reader posts the receive before it knows what was sent: the record, zero-padded to
// kFailureNoteSlot bytes. The encoder cuts the texts so that the record fits; the decoder
// refuses anything malformed with Error(ProtocolError) only, and what it accepts encodes back to
// the same bytes. A test seam (core/failure_note_testing.hpp) reaches these for the unit test
// and the fuzz target.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <strata/error.hpp>

#include "base/wire.hpp"

namespace strata::core {

/// What a rank whose call failed because of a peer tells the other ranks of its host.
struct FailureNote {
  /// The rank the watch's diagnosis found at fault first (watch::Verdict::culprit); -1: none.
  int culprit = -1;
  std::string verdict;  ///< the diagnosis as any rank says it (watch::Verdict::text)
  int failedRank = -1;  ///< the rank that left the note
  std::string error;    ///< the text of its error
};

inline constexpr uint16_t kFailureNoteKind = 110;
inline constexpr uint16_t kFailureNoteVersion = 1;
/// Bytes of the bootstrap message that carries a note.
inline constexpr size_t kFailureNoteSlot = 2048;
/// Text limits (bytes): the verdict first, the error gets the rest of the slot. A record body
/// holds culprit i32, verdict str, failed rank i32 and error str: 16 bytes besides the texts.
inline constexpr size_t kFailureNoteFixedBytes = 16;
inline constexpr size_t kMaxNoteVerdict = 1024;
inline constexpr size_t kMaxNoteError =
    kFailureNoteSlot - wire::kRecordHeaderSize - kFailureNoteFixedBytes;

/// The note's record, zero-padded to kFailureNoteSlot bytes; the verdict cut to
/// kMaxNoteVerdict bytes, the error to what is left of the slot (kMaxNoteError without a
/// verdict).
std::vector<uint8_t> encodeFailureNote(const FailureNote& note);

/// The note in `slot`, sent by rank `from` of a job of `size` ranks. Refuses a slot of another
/// size, a bad header (magic, version, kind, a length past the slot), texts over their limits,
/// a culprit that is not a rank of the job (nor -1), a note that names another rank than its
/// sender, and bytes after the record that are not zero padding.
FailureNote decodeFailureNote(std::span<const uint8_t> slot, int from, int size);

/// The error of rank `rank`, which lost rank `from` with the error `lost`, once it has received
/// `from`'s note in `slot`: the rank at fault that the note names first, with `from`'s own
/// failure; `lost` itself when the note is malformed, as when there is none.
Error explainWithNote(const Error& lost, std::span<const uint8_t> slot, int from, int rank,
                      int size);

}  // namespace strata::core
