// libFuzzer target for the host collectives' chunk header (collectives/host/chunk_header.cpp),
// which a receiver reads from memory its peer wrote. The first 64 bytes of the input are the
// header (zero-padded when shorter); the next 64, when present, are decoded the same way to make
// what the receiver expects (else it expects exactly what the header says, so that the fuzzer
// also reaches the accepting path). Checked:
//   * a decoded header encodes back to the same 48 bytes of fields (the 16 reserved bytes are
//     written as zeros);
//   * checkChunkHeader accepts exactly when magic, version and every field match what is
//     expected, and refuses only with Error(ProtocolError) naming the peer;
//   * describe() formats any signature (unknown types, ops and kinds included).
#include <cstring>

#include "collectives/host/chunk_header.hpp"
#include "fuzz_common.hpp"

namespace coll = strata::collectives;
using strata::Error;
using strata::ErrorCode;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  char header[coll::kChunkHeaderBytes] = {};
  std::memcpy(header, data, std::min(size, coll::kChunkHeaderBytes));
  coll::ChunkHeader h = coll::decodeChunkHeader(header);

  char again[coll::kChunkHeaderBytes];
  coll::encodeChunkHeader(h, again);
  FUZZ_CHECK(std::memcmp(again, header, 48) == 0);
  for (size_t i = 48; i < coll::kChunkHeaderBytes; ++i) FUZZ_CHECK(again[i] == 0);

  coll::ChunkHeader want = h;
  if (size > coll::kChunkHeaderBytes) {
    char second[coll::kChunkHeaderBytes] = {};
    std::memcpy(second, data + coll::kChunkHeaderBytes,
                std::min(size - coll::kChunkHeaderBytes, coll::kChunkHeaderBytes));
    want = coll::decodeChunkHeader(second);
  }
  coll::ChunkExpectation e;
  e.chunk = want.seq;
  e.sig = {want.op, want.type, want.redop, want.root, want.count};
  e.offset = want.offset;
  e.bytes = want.bytes;
  e.peer = 3;
  e.rank = 5;
  const bool match = h.magic == coll::kChunkMagic && h.version == coll::kChunkVersion &&
                     h.op == want.op && h.type == want.type && h.redop == want.redop &&
                     h.root == want.root && h.count == want.count && h.seq == want.seq &&
                     h.offset == want.offset && h.bytes == want.bytes;
  try {
    coll::checkChunkHeader(header, e);
    FUZZ_CHECK(match);
  } catch (const Error& err) {
    fuzz::expectCode(err, ErrorCode::ProtocolError);
    FUZZ_CHECK(!match);
    FUZZ_CHECK(err.peer() == e.peer);
  }
  FUZZ_CHECK(!coll::describe({h.op, h.type, h.redop, h.root, h.count}).empty());
  return 0;
}
