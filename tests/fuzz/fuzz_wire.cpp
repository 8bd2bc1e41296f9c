// libFuzzer target for the wire decoder: decodeRecord on the raw input, then a Reader driven by
// the input itself. Any exception other than Error(ProtocolError), a sanitizer report or a
// failed round trip is a bug.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>

#include <strata/error.hpp>

#include "base/wire.hpp"

namespace {

constexpr uint16_t kKind = 3;
constexpr uint16_t kMaxVersion = 2;
constexpr size_t kMaxLength = 1 << 16;
constexpr size_t kMaxField = 1024;

void check(bool ok) {
  if (!ok) std::abort();
}

// Reads a fixed schema, the shape of a typical bootstrap record.
void readSchema(std::span<const uint8_t> body) {
  strata::wire::Reader r(body, "fuzz record");
  r.u8("flags");
  r.u16("port");
  r.u32("rank");
  r.u64("key");
  r.i32("delta");
  r.i64("offset");
  r.f64("scale");
  r.bytes(kMaxField, "blob");
  r.str(kMaxField, "name");
  r.raw(32, "digest");
  r.expectEnd();
}

// Each byte of `ops` picks the next read, so libFuzzer explores every sequence of field types.
void readDriven(std::span<const uint8_t> ops, std::span<const uint8_t> data) {
  strata::wire::Reader r(data, "driven record");
  for (uint8_t op : ops) {
    size_t before = r.remaining();
    switch (op % 11) {
      case 0:
        r.u8();
        break;
      case 1:
        r.u16();
        break;
      case 2:
        r.u32();
        break;
      case 3:
        r.u64();
        break;
      case 4:
        r.i32();
        break;
      case 5:
        r.i64();
        break;
      case 6:
        r.f64();
        break;
      case 7:
        check(r.bytes(op).size() <= op);
        break;
      case 8:
        check(r.str(op).size() <= op);
        break;
      case 9:
        check(r.raw(op % 64).size() == op % 64u);
        break;
      case 10:
        r.expectEnd();
        break;
    }
    check(r.remaining() <= before);
  }
}

void expectProtocolError(const strata::Error& e) {
  check(e.code() == strata::ErrorCode::ProtocolError);
  check(std::strlen(e.what()) > 0);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::span<const uint8_t> input(data, size);
  try {
    auto rec = strata::wire::decodeRecord(input, kKind, kMaxVersion, kMaxLength, "fuzz record");
    check(rec.body.size() == rec.header.length);
    check(rec.header.version >= 1 && rec.header.version <= kMaxVersion);
    // A record that decodes re-encodes to the same bytes.
    auto again = strata::wire::encodeRecord(rec.header.kind, rec.header.version, rec.body);
    check(again.size() == size && std::memcmp(again.data(), data, size) == 0);
    readSchema(rec.body);
  } catch (const strata::Error& e) {
    expectProtocolError(e);
  }
  try {
    if (size >= strata::wire::kRecordHeaderSize) {
      auto h = strata::wire::decodeHeader(input.first(strata::wire::kRecordHeaderSize), kMaxVersion,
                                          kMaxLength, "fuzz header");
      check(h.length <= kMaxLength);
    }
  } catch (const strata::Error& e) {
    expectProtocolError(e);
  }
  if (size == 0) return 0;
  try {
    size_t nOps = std::min<size_t>(data[0], size - 1);
    readDriven(input.subspan(1, nOps), input.subspan(1 + nOps));
  } catch (const strata::Error& e) {
    expectProtocolError(e);
  }
  return 0;
}
