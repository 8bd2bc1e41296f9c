#pragma once
#ifndef STRATA_INTERNAL_HEADERS
#error "core/failure_note_testing.hpp is internal to strata: applications include <strata/...> only"
#endif

// A test seam over the failure note's codec (lib/core/failure_note_codec.cpp,
// docs/wire-format.md "Failure note"), whose types stay private to lib/core: encode a note,
// decode one the way a rank that lost its sender does, and the error that rank then reports.
// Defined in the strata_testing library, which only tests link (the unit test and the fuzz
// target and its replay).

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <strata/error.hpp>

namespace strata::core::testing {

/// The fields of a note (lib/core's FailureNote).
struct Note {
  int culprit = -1;  ///< the rank the diagnosis found at fault first; -1: none
  std::string verdict;
  int failedRank = -1;  ///< the rank that left the note
  std::string error;
};

/// Bytes of the bootstrap message a note travels in, and the limits on its texts.
size_t slotBytes();
size_t maxVerdictBytes();
size_t maxErrorBytes();

std::vector<uint8_t> encode(const Note& note);
/// Throws what the decoder throws (ProtocolError for anything malformed).
Note decode(std::span<const uint8_t> slot, int from, int size);
/// What rank `rank` reports after losing rank `from` with `lost` and reading `slot` from it.
Error explain(const Error& lost, std::span<const uint8_t> slot, int from, int rank, int size);

}  // namespace strata::core::testing
