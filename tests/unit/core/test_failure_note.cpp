// The failure note a rank leaves to the ranks of its host (lib/core/failure_note_codec.cpp,
// docs/wire-format.md "Failure note", through core/failure_note_testing.hpp): its record, each
// rejection, and the error a rank that read it reports. Notes between processes are exercised
// by the stress suite (stress-stall-allreduce-note-n4, stress-net-*), arbitrary bytes by the
// fuzz target fuzz-failure-note.
#define BOOST_TEST_MODULE failure_note
#include <boost/test/unit_test.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include <strata/error.hpp>

#include "base/wire.hpp"
#include "core/failure_note_testing.hpp"
#include "tests/harness/single_rank.hpp"

using namespace strata;
namespace note = strata::core::testing;
using strata::testing::expectError;

namespace {

using Bytes = std::vector<uint8_t>;

constexpr int kSize = 4;

note::Note sample() {
  return {2, "rank 2 on host h (pid 9) is not answering", 1,
          "allReduce: Timeout waiting for rank 2"};
}

/// A slot holding a record of this kind and version with the body `w` (as the encoder pads it).
Bytes slotOf(const wire::Writer& w, uint16_t kind = 110, uint16_t version = 1) {
  Bytes slot = wire::encodeRecord(kind, version, w.data());
  slot.resize(note::slotBytes(), 0);
  return slot;
}

wire::Writer body(int culprit, const std::string& verdict, int failedRank,
                  const std::string& error) {
  wire::Writer w;
  w.i32(culprit).str(verdict).i32(failedRank).str(error);
  return w;
}

void expectRefused(const Bytes& slot, const std::string& fragment, int from = 1) {
  Error e = expectError([&] { note::decode(slot, from, kSize); });
  BOOST_TEST(static_cast<int>(e.code()) == static_cast<int>(ErrorCode::ProtocolError));
  BOOST_TEST(std::string(e.what()).find(fragment) != std::string::npos, e.what());
  BOOST_TEST(e.peer() == from);
}

}  // namespace

BOOST_AUTO_TEST_CASE(round_trip) {
  const note::Note n = sample();
  const Bytes slot = note::encode(n);
  BOOST_TEST(slot.size() == note::slotBytes());
  note::Note back = note::decode(slot, 1, kSize);
  BOOST_TEST(back.culprit == n.culprit);
  BOOST_TEST(back.verdict == n.verdict);
  BOOST_TEST(back.failedRank == n.failedRank);
  BOOST_TEST(back.error == n.error);
  BOOST_TEST(note::encode(back) == slot);
  // The layout of docs/wire-format.md: header, then the fields, then zero padding.
  BOOST_TEST(slot == slotOf(body(n.culprit, n.verdict, n.failedRank, n.error)));

  const note::Note none{-1, "", 3, "send: lost rank 0"};
  back = note::decode(note::encode(none), 3, kSize);
  BOOST_TEST(back.culprit == -1);
  BOOST_TEST(back.verdict.empty());
  BOOST_TEST(back.error == none.error);
}

BOOST_AUTO_TEST_CASE(texts_are_cut_to_fit_the_slot) {
  note::Note n{0, std::string(5000, 'v'), 1, std::string(5000, 'e')};
  note::Note back = note::decode(note::encode(n), 1, kSize);
  BOOST_TEST(back.verdict.size() == note::maxVerdictBytes());
  BOOST_TEST(back.error.size() == note::maxErrorBytes() - note::maxVerdictBytes());
  // Without a verdict the error gets the whole room.
  n.verdict.clear();
  back = note::decode(note::encode(n), 1, kSize);
  BOOST_TEST(back.error.size() == note::maxErrorBytes());
  BOOST_TEST(note::encode(back) == note::encode(n));
}

BOOST_AUTO_TEST_CASE(rejections) {
  const Bytes good = note::encode(sample());

  Bytes b = good;
  b[0] ^= 0xff;
  expectRefused(b, "bad magic");

  expectRefused(slotOf(body(2, "v", 1, "e"), 110, 2), "unknown version 2");
  expectRefused(slotOf(body(2, "v", 1, "e"), 110, 0), "unknown version 0");
  expectRefused(slotOf(body(2, "v", 1, "e"), 92), "record kind 92");

  // A length past the slot, in the header and in a text field.
  b = good;
  wire::storeLe<uint32_t>(b.data() + 8, static_cast<uint32_t>(note::slotBytes()));
  expectRefused(b, "body length 2048 bytes exceeds the limit");
  expectRefused(slotOf(body(2, std::string(note::maxVerdictBytes() + 1, 'v'), 1, "e")),
                "field 'verdict'");
  b = good;
  wire::storeLe<uint32_t>(b.data() + 16, 0xffffffffu);  // the verdict's length
  expectRefused(b, "field 'verdict'");

  // A culprit outside the job, a sender that is not the rank the note came from.
  expectRefused(slotOf(body(kSize, "v", 1, "e")), "culprit 4 is not a rank of the job");
  expectRefused(slotOf(body(-2, "v", 1, "e")), "culprit -2 is not a rank of the job");
  expectRefused(slotOf(body(2, "v", 3, "e")), "names rank 3 as its sender");

  // Trailing bytes: inside the record's body, and after it where the padding must be zero.
  wire::Writer longer = body(2, "v", 1, "e");
  longer.u8(7);
  expectRefused(slotOf(longer), "trailing");
  b = good;
  b.back() = 1;
  expectRefused(b, "not zero padding");

  // A slot of another size, and one cut short.
  b = good;
  b.push_back(0);
  expectRefused(b, "2049 bytes, expected 2048");
  expectRefused(Bytes(good.begin(), good.begin() + 8), "8 bytes, expected 2048");
}

BOOST_AUTO_TEST_CASE(the_reader_names_the_culprit_of_the_note) {
  const Error lost(ErrorCode::PeerLost, "allReduce: lost rank 1 (its bootstrap closed)", 1);
  // Rank 1 found rank 2 at fault before it failed: rank 3 names rank 2 first.
  Error e = note::explain(lost, note::encode(sample()), 1, 3, kSize);
  BOOST_TEST(static_cast<int>(e.code()) == static_cast<int>(ErrorCode::PeerLost));
  BOOST_TEST(e.peer() == 2);
  BOOST_TEST(std::string(e.what()) ==
             "rank 2 on host h (pid 9) is not answering (found by rank 1 before it failed and "
             "exited). This rank (3): allReduce: lost rank 1 (its bootstrap closed) (rank 1 "
             "failed first: allReduce: Timeout waiting for rank 2)");

  // The rank that left the note was itself at fault (a mismatched call).
  note::Note self{1, "rank 1 (pid 5) is in broadcast #3 while ranks 0, 2, 3 are in allReduce #3", 1,
                  "broadcast: chunk of another operation"};
  e = note::explain(lost, note::encode(self), 1, 3, kSize);
  BOOST_TEST(e.peer() == 1);
  BOOST_TEST(std::string(e.what()) ==
             "rank 1 (pid 5) is in broadcast #3 while ranks 0, 2, 3 are in allReduce #3 (as rank "
             "1 found before it failed and exited). This rank (3): allReduce: lost rank 1 (its "
             "bootstrap closed)");

  // No diagnosis: the reader's own error with the sender's.
  e = note::explain(lost, note::encode({-1, "", 1, "send: lost rank 0"}), 1, 3, kSize);
  BOOST_TEST(e.peer() == 1);
  BOOST_TEST(std::string(e.what()) ==
             "allReduce: lost rank 1 (its bootstrap closed) (rank 1 failed first: send: lost "
             "rank 0)");
}

BOOST_AUTO_TEST_CASE(a_bad_note_leaves_the_reader_its_own_error) {
  const Error lost(ErrorCode::PeerLost, "allReduce: lost rank 1", 1);
  Bytes bad = note::encode(sample());
  bad[6] = 92;  // another record kind
  for (const Bytes& slot : {bad, Bytes(note::slotBytes(), 0), note::encode({9, "v", 1, "e"})}) {
    Error e = note::explain(lost, slot, 1, 3, kSize);
    BOOST_TEST(static_cast<int>(e.code()) == static_cast<int>(ErrorCode::PeerLost));
    BOOST_TEST(e.peer() == 1);
    BOOST_TEST(std::string(e.what()) == lost.what());
  }
}
