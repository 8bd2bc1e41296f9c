#pragma once

// The 64-byte header in front of every chunk the host engine sends (docs/wire-format.md, "Host
// collective chunks"): what operation the chunk belongs to and where it goes. The receiver
// decodes it from memory its peer wrote and checks it against what it expects, so the decoder
// and the check live here, apart from the engine, where tests/fuzz can reach them.

#include <cstddef>
#include <cstdint>
#include <string>

namespace strata::collectives {

/// What an operation is, as both sides of a chunk must agree.
struct OpSignature {
  uint16_t op = 0;  ///< OpKind
  uint16_t type = 0;
  uint16_t redop = 0;
  int32_t root = -1;
  uint64_t count = 0;
};

enum class OpKind : uint16_t {
  AllReduce = 1,
  AllGather = 2,
  ReduceScatter = 3,
  Broadcast = 4,
  AllToAll = 5,
  SendRecv = 6,
};
const char* toString(OpKind kind) noexcept;

inline constexpr uint32_t kChunkMagic = 0x48435453;  // "STCH"
inline constexpr uint16_t kChunkVersion = 1;
inline constexpr size_t kChunkHeaderBytes = 64;

/// The header's fields (little-endian at fixed offsets; bytes 48..63 are zero).
struct ChunkHeader {
  uint32_t magic = kChunkMagic;
  uint16_t version = kChunkVersion;
  uint16_t op = 0;
  uint16_t type = 0;
  uint16_t redop = 0;
  int32_t root = -1;
  uint64_t count = 0;
  uint64_t offset = 0;
  uint64_t bytes = 0;
  uint64_t seq = 0;
};

/// Writes kChunkHeaderBytes at out.
void encodeChunkHeader(const ChunkHeader& h, char* out);
/// Reads kChunkHeaderBytes at in (no checks: see checkChunkHeader).
ChunkHeader decodeChunkHeader(const char* in);

/// "allReduce(count 12, float, sum)": an operation for error messages.
std::string describe(const OpSignature& sig);

/// What the receiver expects of chunk `chunk` from `peer`.
struct ChunkExpectation {
  uint64_t chunk = 0;
  OpSignature sig;
  uint64_t offset = 0;
  uint64_t bytes = 0;
  int peer = -1;
  int rank = -1;  ///< the receiver, for messages
};
/// Throws ProtocolError naming the peer for a bad magic or version, another operation, or
/// another chunk than expected.
void checkChunkHeader(const char* in, const ChunkExpectation& expected);

}  // namespace strata::collectives
