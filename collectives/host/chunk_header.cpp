#include "chunk_header.hpp"

#include <cstring>

#include <fmt/format.h>

#include <strata/error.hpp>
#include <strata/types.hpp>

#include "base/wire.hpp"

namespace strata::collectives {

static_assert(sizeof(ChunkHeader) <= kChunkHeaderBytes);

const char* toString(OpKind kind) noexcept {
  switch (kind) {
    case OpKind::AllReduce:
      return "allReduce";
    case OpKind::AllGather:
      return "allGather";
    case OpKind::ReduceScatter:
      return "reduceScatter";
    case OpKind::Broadcast:
      return "broadcast";
    case OpKind::AllToAll:
      return "allToAll";
    case OpKind::SendRecv:
      return "send/recv";
  }
  return "unknown";
}

void encodeChunkHeader(const ChunkHeader& h, char* out) {
  std::memset(out, 0, kChunkHeaderBytes);
  wire::storeLe(out + 0, h.magic);
  wire::storeLe(out + 4, h.version);
  wire::storeLe(out + 6, h.op);
  wire::storeLe(out + 8, h.type);
  wire::storeLe(out + 10, h.redop);
  wire::storeLe(out + 12, h.root);
  wire::storeLe(out + 16, h.count);
  wire::storeLe(out + 24, h.offset);
  wire::storeLe(out + 32, h.bytes);
  wire::storeLe(out + 40, h.seq);
}

ChunkHeader decodeChunkHeader(const char* in) {
  ChunkHeader h;
  h.magic = wire::loadLe<uint32_t>(in + 0);
  h.version = wire::loadLe<uint16_t>(in + 4);
  h.op = wire::loadLe<uint16_t>(in + 6);
  h.type = wire::loadLe<uint16_t>(in + 8);
  h.redop = wire::loadLe<uint16_t>(in + 10);
  h.root = wire::loadLe<int32_t>(in + 12);
  h.count = wire::loadLe<uint64_t>(in + 16);
  h.offset = wire::loadLe<uint64_t>(in + 24);
  h.bytes = wire::loadLe<uint64_t>(in + 32);
  h.seq = wire::loadLe<uint64_t>(in + 40);
  return h;
}

std::string describe(const OpSignature& s) {
  auto kind = static_cast<OpKind>(s.op);
  std::string text = fmt::format("{}(count {}", toString(kind), s.count);
  if (isKnown(static_cast<DataType>(s.type))) {
    text += fmt::format(", {}", toString(static_cast<DataType>(s.type)));
  } else {
    text += fmt::format(", type {}", s.type);
  }
  if (kind == OpKind::AllReduce || kind == OpKind::ReduceScatter) {
    text += isKnown(static_cast<ReduceOp>(s.redop))
                ? fmt::format(", {}", toString(static_cast<ReduceOp>(s.redop)))
                : fmt::format(", op {}", s.redop);
  }
  if (kind == OpKind::Broadcast) text += fmt::format(", root {}", s.root);
  return text + ")";
}

void checkChunkHeader(const char* in, const ChunkExpectation& e) {
  ChunkHeader h = decodeChunkHeader(in);
  if (h.magic != kChunkMagic || h.version != kChunkVersion) {
    throw Error(ErrorCode::ProtocolError,
                fmt::format("chunk {} from rank {} has a bad header (magic {:#x}, version {}); "
                            "both ranks must run the same strata version",
                            e.chunk, e.peer, h.magic, h.version),
                e.peer);
  }
  OpSignature theirs{h.op, h.type, h.redop, h.root, h.count};
  const OpSignature& sig = e.sig;
  if (theirs.op != sig.op || theirs.type != sig.type || theirs.redop != sig.redop ||
      theirs.root != sig.root || theirs.count != sig.count) {
    throw Error(ErrorCode::ProtocolError,
                fmt::format("rank {} sent data of {} while rank {} runs {}: every rank must call "
                            "the same collectives (and matching send/recv) in the same order with "
                            "the same counts, types and roots",
                            e.peer, describe(theirs), e.rank, describe(sig)),
                e.peer);
  }
  if (h.seq != e.chunk || h.offset != e.offset || h.bytes != e.bytes) {
    throw Error(ErrorCode::ProtocolError,
                fmt::format("rank {} sent chunk {} (offset {}, {} B) of {} where rank {} expected "
                            "chunk {} (offset {}, {} B)",
                            e.peer, h.seq, h.offset, h.bytes, describe(sig), e.rank, e.chunk,
                            e.offset, e.bytes),
                e.peer);
  }
}

}  // namespace strata::collectives
