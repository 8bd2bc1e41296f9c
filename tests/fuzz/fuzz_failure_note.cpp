// libFuzzer target for the failure note a rank leaves to the ranks of its host
// (lib/core/failure_note_codec.cpp, docs/wire-format.md "Failure note", kind 110), through the
// test seam core/failure_note_testing.hpp. Input: byte 0 the job size (1-256), byte 1 the
// sender's rank (modulo the size); the rest is the slot the reader received. Checked:
//   * the decoder refuses only with Error(ProtocolError), naming the sender;
//   * what decodes keeps the documented limits (texts, a culprit of the job or -1, the sender);
//   * what decodes encodes back to exactly the same slot (padding included);
//   * the reader's error is built from any slot without throwing: the note's culprit as its
//     peer, or the sender's own rank (a note without a diagnosis, or a malformed one).
#include <string>

#include "core/failure_note_testing.hpp"
#include "fuzz_common.hpp"

namespace note = strata::core::testing;
using strata::Error;
using strata::ErrorCode;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Input input(data, size);
  const int jobSize = 1 + input.byte();
  const int from = input.byte() % jobSize;
  std::span<const uint8_t> slot = input.rest();
  const Error lost(ErrorCode::PeerLost, "lost the sender", from);
  const Error said = note::explain(lost, slot, from, 0, jobSize);
  FUZZ_CHECK(said.code() == ErrorCode::PeerLost);
  note::Note n;
  try {
    n = note::decode(slot, from, jobSize);
  } catch (const Error& e) {
    fuzz::expectCode(e, ErrorCode::ProtocolError);
    FUZZ_CHECK(e.peer() == from);
    FUZZ_CHECK(said.peer() == from && std::string(said.what()) == lost.what());
    return 0;
  }
  FUZZ_CHECK(n.verdict.size() <= note::maxVerdictBytes());
  FUZZ_CHECK(n.verdict.size() + n.error.size() <= note::maxErrorBytes());
  FUZZ_CHECK(n.culprit >= -1 && n.culprit < jobSize);
  FUZZ_CHECK(n.failedRank == from);
  FUZZ_CHECK(fuzz::same(note::encode(n), slot));
  FUZZ_CHECK(said.peer() == (n.culprit >= 0 && !n.verdict.empty() ? n.culprit : from));
  return 0;
}
