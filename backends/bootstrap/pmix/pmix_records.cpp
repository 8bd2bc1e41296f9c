// The records this backend puts into PMIx at creation (kind 40; docs/backends.md, "PMIx records
// and keys"), the keys they are put under, and the data fence that moves them between the ranks.

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <strata/error.hpp>

#include "base/wire.hpp"
#include "pmix_internal.hpp"

namespace strata::pmix {
namespace {

// Values are padded to one of these sizes, and the size is part of the key. libpmix 4.2.2's
// shared-memory store (used under Slurm and Open MPI alike) loses a key that is put again with
// a different size: peers then get NOT-FOUND. Same key, same size avoids that.
constexpr size_t kValueClasses[] = {128, 512, 2048, 8192};

size_t valueClass(size_t payloadBound) {
  for (size_t c : kValueClasses) {
    if (kValueOverhead + payloadBound <= c) return c;
  }
  return kMaxValue;
}

const char* opName(Op op) {
  switch (op) {
    case Op::Create:
      return "create";
  }
  return "?";
}

}  // namespace

std::vector<uint8_t> encodeValue(const Value& v) {
  wire::Writer w;
  w.u8(static_cast<uint8_t>(v.op)).u64(v.instance).u64(v.seq).i32(v.rank).bytes(v.payload);
  return wire::encodeRecord(kValueKind, kValueVersion, w.data());
}

std::vector<uint8_t> decodeValue(const std::vector<uint8_t>& rec, const Value& expect, int from) {
  std::string what = fmt::format("PMIx record of rank {}", from);
  // The record, then zero padding up to its size class.
  auto h = wire::decodeHeader({rec.data(), std::min(rec.size(), wire::kRecordHeaderSize)},
                              kValueVersion, kMaxValue, what);
  if (h.length > rec.size() - wire::kRecordHeaderSize) {
    throw Error(ErrorCode::ProtocolError,
                fmt::format("pmix bootstrap: truncated {} ({} of {} bytes)", what, rec.size(),
                            wire::kRecordHeaderSize + h.length),
                from);
  }
  auto d = wire::decodeRecord({rec.data(), wire::kRecordHeaderSize + h.length}, kValueKind,
                              kValueVersion, kMaxValue, what);
  wire::Reader r(d.body, what);
  auto op = static_cast<Op>(r.u8("op"));
  uint64_t instance = r.u64("instance");
  uint64_t seq = r.u64("seq");
  int32_t rank = r.i32("rank");
  auto payload = r.bytes(kCreatePayloadMax, "payload");
  r.expectEnd();
  if (op != expect.op || instance != expect.instance || seq != expect.seq || rank != from) {
    throw Error(ErrorCode::ProtocolError,
                fmt::format("pmix bootstrap: {} #{} of bootstrap #{} got rank {}'s record of {} "
                            "#{} of bootstrap #{} (claiming rank {}): the ranks called bootstrap "
                            "collectives, or created bootstraps, in different orders",
                            opName(expect.op), expect.seq, expect.instance, from, opName(op), seq,
                            instance, rank),
                from);
  }
  return payload;
}

std::vector<std::vector<uint8_t>> dataFence(const std::vector<uint8_t>* mine, size_t payloadBound,
                                            const std::vector<int>& from, double timeout,
                                            std::string_view what) {
  Session& s = session();
  std::lock_guard lk(s.fenceMu);
  size_t cls = valueClass(payloadBound);
  std::string key = fmt::format("strata.s{}.{}", s.dataFences % 2, cls);
  ++s.dataFences;
  if (mine) {
    if (mine->size() > cls) {
      throw Error(ErrorCode::Internal,
                  fmt::format("pmix bootstrap: {} record of {} bytes exceeds its {}-byte class",
                              what, mine->size(), cls));
    }
    std::vector<uint8_t> padded(*mine);
    padded.resize(cls, 0);
    put(key.c_str(), padded, what);
  }
  fence(true, timeout, what);
  std::vector<std::vector<uint8_t>> out;
  out.reserve(from.size());
  for (int peer : from) out.push_back(get(peer, key.c_str(), timeout, what));
  return out;
}

}  // namespace strata::pmix
