#pragma once

// The helpers every file of the bootstrap conformance suite uses: message seeds, ring
// neighbours, pattern messages checked on receipt.

#include <boost/test/unit_test.hpp>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "tests/harness/fixtures.hpp"

namespace conformance {

inline uint64_t seedOf(uint64_t a, uint64_t b = 0, uint64_t c = 0, uint64_t d = 0) {
  return (((a * 1000003 + b) * 1000003 + c) * 1000003 + d) + 1;
}

inline int nextRank(const Bootstrap& bs) {
  return (bs.rank() + 1) % bs.size();
}
inline int prevRank(const Bootstrap& bs) {
  return (bs.rank() - 1 + bs.size()) % bs.size();
}

// Sends a pattern message and checks one on receipt; reports the first wrong byte.
inline void sendPattern(Bootstrap& bs, int peer, int tag, size_t bytes, uint64_t seed) {
  std::vector<uint8_t> data(bytes);
  strata::testing::fillPattern(data.data(), bytes, seed);
  bs.send(peer, tag, data.data(), bytes);
}

inline void recvPattern(Bootstrap& bs, int peer, int tag, size_t bytes, uint64_t seed) {
  std::vector<uint8_t> data(bytes + 1, 0xEE);
  bs.recv(peer, tag, data.data(), bytes);
  size_t bad = strata::testing::checkPattern(data.data(), bytes, seed);
  BOOST_TEST(bad == bytes, "message of " << bytes << " bytes from rank " << peer << " tag " << tag
                                         << " differs at byte " << bad);
  BOOST_TEST(data[bytes] == 0xEE, "recv of " << bytes << " bytes wrote past the buffer");
}

}  // namespace conformance
