// The host collectives' slots and links in one process (collectives/host/slot_geometry.hpp,
// link.hpp): the geometry the settings give, and a mapped Link over a plain buffer standing in
// for a peer's receive area, which must never write outside the slots this rank owns there
// (issue 23: a rank wrote past a peer's smaller area and died of SIGSEGV).
#define BOOST_TEST_MODULE link
#include <boost/test/unit_test.hpp>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <strata/error.hpp>

#include "collectives/host/chunk_header.hpp"
#include "collectives/host/link.hpp"
#include "collectives/host/slot_geometry.hpp"
#include "transport/testing.hpp"

using strata::Error;
using strata::ErrorCode;
using strata::collectives::ChunkHeader;
using strata::collectives::kChunkHeaderBytes;
using strata::collectives::Link;
using strata::collectives::LinkEnds;
using strata::collectives::SlotGeometry;
using strata::collectives::slotGeometry;
using strata::transport::testing::fakeMemory;

namespace {

constexpr char kUntouched = 0x5a;

// Two ranks: this is rank 0, the peer rank 1, whose "receive area" and semaphore words are
// plain buffers of this process (local memory is mappable, like a peer's shm mapping).
struct Pair {
  SlotGeometry slots = slotGeometry(65536, 4096, 2, 0);
  std::vector<char> ownArea, ownFlags, peerArea, peerFlags;

  explicit Pair(size_t peerAreaBytes)
      : ownArea(slots.areaBytes, 0),
        ownFlags(Link::flagBytes(2), 0),
        peerArea(peerAreaBytes, kUntouched),
        peerFlags(Link::flagBytes(2), 0) {}

  LinkEnds ends() {
    return {0,
            1,
            nullptr,
            slots,
            ownArea.data(),
            ownFlags.data(),
            fakeMemory(true, peerArea.data(), peerArea.size()),
            fakeMemory(true, peerFlags.data(), peerFlags.size())};
  }
  // Bytes of the peer's area that are no longer what the test put there.
  size_t touched() const {
    size_t n = 0;
    for (char c : peerArea) n += c != kUntouched;
    return n;
  }
};

ChunkHeader chunkOf(size_t bytes) {
  ChunkHeader h;
  h.op = 1;
  h.count = bytes / 4;
  h.bytes = bytes;
  return h;
}

auto internalNaming(int peer) {
  return [peer](const Error& e) {
    const std::string msg = e.what();
    return e.code() == ErrorCode::Internal && e.peer() == peer &&
           msg.find("rank " + std::to_string(peer)) != std::string::npos;
  };
}

}  // namespace

BOOST_AUTO_TEST_CASE(geometry_from_the_settings) {
  // The defaults at 2 ranks: four slots of (1 MiB - one header) per peer, in an 8 MiB area.
  SlotGeometry g = slotGeometry(8 << 20, 1 << 20, 2, 0);
  BOOST_TEST(g.depth == 4u);
  BOOST_TEST(g.chunkBytes == (1u << 20) - kChunkHeaderBytes);
  BOOST_TEST(g.slotBytes == size_t{1} << 20);
  BOOST_TEST(g.areaBytes == size_t{8} << 20);
  BOOST_TEST(g.regionOffset(1) == size_t{4} << 20);
  // A 1 MiB buffer at 2 ranks leaves 128 KiB slots; chunk_bytes caps the chunk below that.
  SlotGeometry small = slotGeometry(1 << 20, 1 << 20, 2, 0);
  BOOST_TEST(small.chunkBytes == (128u << 10) - kChunkHeaderBytes);
  BOOST_TEST(!small.sameSlots(g));
  BOOST_TEST(slotGeometry(8 << 20, 65536, 2, 0).chunkBytes == 65536u);
  // Below the 4 KiB floor the area grows instead.
  BOOST_TEST(slotGeometry(65536, 1 << 20, 8, 1).chunkBytes == 4096u);
  // One rank: no area, chunks of chunk_bytes.
  SlotGeometry one = slotGeometry(8 << 20, 1 << 20, 1, 0);
  BOOST_TEST(one.areaBytes == 0u);
  BOOST_TEST(one.chunkBytes == size_t{1} << 20);
}

BOOST_AUTO_TEST_CASE(chunk_lands_in_its_slot_and_signals) {
  Pair pair(SlotGeometry(slotGeometry(65536, 4096, 2, 0)).areaBytes);
  Link link = Link::mapped(pair.ends());
  BOOST_TEST(link.isMapped());
  std::vector<char> payload(100, 'x');
  for (int i = 0; i < 2; ++i) {
    BOOST_REQUIRE(link.slotFree());
    link.putChunk(chunkOf(payload.size()), payload.data());
  }
  BOOST_TEST(link.sent() == 2u);
  // Rank 0's region starts the peer's area; chunk 1 is in slot 1.
  const char* slot1 = pair.peerArea.data() + pair.slots.slotBytes;
  auto h = strata::collectives::decodeChunkHeader(slot1);
  BOOST_TEST(h.seq == 1u);
  BOOST_TEST(h.bytes == payload.size());
  BOOST_TEST(std::memcmp(slot1 + kChunkHeaderBytes, payload.data(), payload.size()) == 0);
  uint64_t dataWord = 0;
  std::memcpy(&dataWord, pair.peerFlags.data(), sizeof dataWord);  // rank 0's data word
  BOOST_TEST(dataWord == 2u);
  // Nothing past rank 0's region (rank 1's own slots) was written.
  for (size_t i = pair.slots.regionBytes(); i < pair.peerArea.size(); ++i) {
    BOOST_REQUIRE(pair.peerArea[i] == kUntouched);
  }
}

BOOST_AUTO_TEST_CASE(a_smaller_peer_area_is_refused_when_the_link_is_made) {
  Pair pair(SlotGeometry(slotGeometry(65536, 4096, 2, 0)).regionBytes() - 1);
  BOOST_CHECK_EXCEPTION(Link::mapped(pair.ends()), Error, internalNaming(1));
  BOOST_TEST(pair.touched() == 0u);
}

BOOST_AUTO_TEST_CASE(a_chunk_larger_than_a_slot_is_never_written) {
  Pair pair(SlotGeometry(slotGeometry(65536, 4096, 2, 0)).areaBytes);
  Link link = Link::mapped(pair.ends());
  std::vector<char> payload(pair.slots.chunkBytes + 1, 'y');
  BOOST_CHECK_EXCEPTION(link.putChunk(chunkOf(payload.size()), payload.data()), Error,
                        internalNaming(1));
  BOOST_TEST(link.sent() == 0u);
  BOOST_TEST(pair.touched() == 0u);
  uint64_t dataWord = 1;
  std::memcpy(&dataWord, pair.peerFlags.data(), sizeof dataWord);
  BOOST_TEST(dataWord == 0u, "the peer was signalled");
}
