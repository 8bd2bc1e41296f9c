#include "failure_note_codec.hpp"

#include <algorithm>

#include <fmt/format.h>

namespace strata::core {

std::vector<uint8_t> encodeFailureNote(const FailureNote& note) {
  const std::string_view verdict = std::string_view(note.verdict).substr(0, kMaxNoteVerdict);
  const std::string_view error =
      std::string_view(note.error).substr(0, kMaxNoteError - verdict.size());
  wire::Writer w;
  w.i32(note.culprit).str(verdict).i32(note.failedRank).str(error);
  auto record = wire::encodeRecord(kFailureNoteKind, kFailureNoteVersion, w.data());
  record.resize(kFailureNoteSlot, 0);
  return record;
}

namespace {

FailureNote decodeSlot(std::span<const uint8_t> slot, int from, int size, const std::string& what) {
  auto bad = [&](const std::string& why) {
    throw Error(ErrorCode::ProtocolError, fmt::format("malformed {}: {}", what, why), from);
  };
  if (slot.size() != kFailureNoteSlot) {
    bad(fmt::format("{} bytes, expected {}", slot.size(), kFailureNoteSlot));
  }
  const auto header = wire::decodeHeader(slot.first(wire::kRecordHeaderSize), kFailureNoteVersion,
                                         kFailureNoteSlot - wire::kRecordHeaderSize, what);
  if (header.kind != kFailureNoteKind) {
    bad(fmt::format("record kind {} (expected {})", header.kind, kFailureNoteKind));
  }
  wire::Reader r(slot.subspan(wire::kRecordHeaderSize, header.length), what);
  FailureNote note;
  note.culprit = r.i32("culprit");
  note.verdict = r.str(kMaxNoteVerdict, "verdict");
  note.failedRank = r.i32("failed rank");
  note.error = r.str(kMaxNoteError, "error");
  r.expectEnd();
  const auto padding = slot.subspan(wire::kRecordHeaderSize + header.length);
  if (std::any_of(padding.begin(), padding.end(), [](uint8_t b) { return b != 0; })) {
    bad("bytes after the record that are not zero padding");
  }
  if (note.culprit < -1 || note.culprit >= size) {
    bad(fmt::format("culprit {} is not a rank of the job (0..{}, or -1 for none)", note.culprit,
                    size - 1));
  }
  if (note.failedRank != from) bad(fmt::format("it names rank {} as its sender", note.failedRank));
  return note;
}

}  // namespace

FailureNote decodeFailureNote(std::span<const uint8_t> slot, int from, int size) {
  const std::string what = fmt::format("failure note of rank {}", from);
  try {
    return decodeSlot(slot, from, size, what);
  } catch (const Error& e) {
    // The wire checks do not know the sender: every refusal names it as the peer.
    if (e.peer() == from) throw;
    throw Error(e.code(), e.what(), from);
  }
}

Error explainWithNote(const Error& lost, std::span<const uint8_t> slot, int from, int rank,
                      int size) {
  FailureNote note;
  try {
    note = decodeFailureNote(slot, from, size);
  } catch (const Error&) {
    // Only a ProtocolError: a note this rank cannot read says nothing it could trust.
    return lost;
  }
  const std::string first = fmt::format("rank {} failed first: {}", from, note.error);
  if (note.culprit >= 0 && !note.verdict.empty()) {
    // The rank that exited had found who was at fault: say that first.
    if (note.culprit == from) {
      return Error(lost.code(),
                   fmt::format("{} (as rank {} found before it failed and exited). This rank "
                               "({}): {}",
                               note.verdict, from, rank, lost.what()),
                   note.culprit);
    }
    return Error(lost.code(),
                 fmt::format("{} (found by rank {} before it failed and exited). This rank "
                             "({}): {} ({})",
                             note.verdict, from, rank, lost.what(), first),
                 note.culprit);
  }
  return Error(lost.code(), fmt::format("{} ({})", lost.what(), first), from);
}

}  // namespace strata::core
