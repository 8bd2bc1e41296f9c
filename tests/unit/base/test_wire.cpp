// Wire encoding (lib/base/wire.cpp): round trips, one case per class of malformed input, a
// deterministic mutation loop.
#define BOOST_TEST_MODULE wire
#include <boost/test/unit_test.hpp>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <random>
#include <string>
#include <vector>

#include <strata/error.hpp>

#include "base/wire.hpp"

// Records the largest single allocation, so the mutation loop can prove that forged lengths
// never make the decoder reserve memory it was not given.
namespace {
std::atomic<size_t> gLargestAllocation{0};
}

void* operator new(size_t size) {
  size_t seen = gLargestAllocation.load(std::memory_order_relaxed);
  while (size > seen && !gLargestAllocation.compare_exchange_weak(seen, size)) {
  }
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
// Out of line: once inlined, g++ pairs the free() with the new-expression and warns.
[[gnu::noinline]] void operator delete(void* p) noexcept {
  std::free(p);
}
[[gnu::noinline]] void operator delete(void* p, size_t) noexcept {
  std::free(p);
}

using namespace strata;
using strata::wire::Reader;
using strata::wire::Writer;

namespace {

constexpr uint16_t kKind = 3;
constexpr uint16_t kMaxVersion = 1;
constexpr size_t kMaxLength = 4096;
constexpr size_t kMaxField = 256;

std::span<const uint8_t> asBytes(std::string_view s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

// Passes when `fn` throws strata::Error(ProtocolError) whose message contains every fragment.
template <typename Fn>
void expectProtocolError(Fn&& fn, std::initializer_list<std::string_view> fragments) {
  try {
    fn();
    BOOST_ERROR("no exception thrown");
  } catch (const Error& e) {
    BOOST_TEST(static_cast<int>(e.code()) == static_cast<int>(ErrorCode::ProtocolError),
               "code " << toString(e.code()) << ": " << e.what());
    std::string msg = e.what();
    for (auto f : fragments) {
      BOOST_TEST(msg.find(f) != std::string::npos, "'" << f << "' missing from: " << msg);
    }
  }
}

std::vector<uint8_t> sampleBody() {
  Writer w;
  std::vector<uint8_t> blob{1, 2, 3, 4, 5};
  std::vector<uint8_t> digest(32, 0xab);
  w.u8(0xfe)
      .u16(0xbeef)
      .u32(0xdeadbeef)
      .u64(0x0123456789abcdefull)
      .i32(-42)
      .i64(std::numeric_limits<int64_t>::min())
      .f64(3.25)
      .bytes(blob)
      .str("hello")
      .raw(digest);
  return w.take();
}

// The schema of sampleBody(); the mutation loop decodes with it.
void readSampleBody(std::span<const uint8_t> body) {
  Reader r(body, "test record");
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

std::vector<uint8_t> header(uint32_t magic, uint16_t version, uint16_t kind, uint32_t length) {
  Writer w;
  w.u32(magic).u16(version).u16(kind).u32(length);
  return w.take();
}

}  // namespace

BOOST_AUTO_TEST_SUITE(encoding)

BOOST_AUTO_TEST_CASE(little_endian_bytes) {
  Writer w;
  w.u16(0x0102).u32(0x03040506).u64(0x0708090a0b0c0d0eull).i32(-2);
  std::vector<uint8_t> expected{0x02, 0x01, 0x06, 0x05, 0x04, 0x03, 0x0e, 0x0d, 0x0c,
                                0x0b, 0x0a, 0x09, 0x08, 0x07, 0xfe, 0xff, 0xff, 0xff};
  BOOST_TEST(w.data() == expected, boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(store_and_load_in_place) {
  // The helpers that fixed headers (mesh frames) are built with: the same bytes as Writer.
  uint8_t buf[18];
  wire::storeLe<uint16_t>(buf, 0x0102);
  wire::storeLe<uint32_t>(buf + 2, 0x03040506);
  wire::storeLe<uint64_t>(buf + 6, 0x0708090a0b0c0d0eull);
  wire::storeLe<int32_t>(buf + 14, -2);
  Writer w;
  w.u16(0x0102).u32(0x03040506).u64(0x0708090a0b0c0d0eull).i32(-2);
  BOOST_TEST(std::vector<uint8_t>(buf, buf + sizeof buf) == w.data(),
             boost::test_tools::per_element());
  BOOST_TEST(wire::loadLe<uint16_t>(buf) == 0x0102);
  BOOST_TEST(wire::loadLe<uint32_t>(buf + 2) == 0x03040506u);
  BOOST_TEST(wire::loadLe<uint64_t>(buf + 6) == 0x0708090a0b0c0d0eull);
  BOOST_TEST(wire::loadLe<int32_t>(buf + 14) == -2);
}

BOOST_AUTO_TEST_CASE(record_header_layout) {
  auto rec = wire::encodeRecord(0x0201, 1, asBytes("ab"));
  std::vector<uint8_t> expected{'S', 'T', 'R', 'A', 1, 0, 0x01, 0x02, 2, 0, 0, 0, 'a', 'b'};
  BOOST_TEST(rec == expected, boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(round_trip_every_field_type) {
  auto body = sampleBody();
  Reader r(body, "test record");
  BOOST_TEST(r.u8() == 0xfe);
  BOOST_TEST(r.u16() == 0xbeef);
  BOOST_TEST(r.u32() == 0xdeadbeefu);
  BOOST_TEST(r.u64() == 0x0123456789abcdefull);
  BOOST_TEST(r.i32() == -42);
  BOOST_TEST(r.i64() == std::numeric_limits<int64_t>::min());
  BOOST_TEST(r.f64() == 3.25);
  std::vector<uint8_t> blob{1, 2, 3, 4, 5};
  BOOST_TEST(r.bytes(kMaxField) == blob, boost::test_tools::per_element());
  BOOST_TEST(r.str(kMaxField) == "hello");
  auto digest = r.raw(32);
  BOOST_TEST(digest.size() == 32u);
  BOOST_TEST(digest[31] == 0xab);
  BOOST_TEST(r.remaining() == 0u);
  r.expectEnd();
}

BOOST_AUTO_TEST_CASE(round_trip_extremes) {
  Writer w;
  w.u8(0).u16(0xffff).u32(0xffffffffu).u64(~0ull).i32(std::numeric_limits<int32_t>::min());
  w.i64(std::numeric_limits<int64_t>::max())
      .f64(-0.0)
      .f64(std::numeric_limits<double>::quiet_NaN());
  w.f64(std::numeric_limits<double>::infinity()).bytes({}).str("");
  auto buf = w.take();
  Reader r(buf, "extremes");
  BOOST_TEST(r.u8() == 0);
  BOOST_TEST(r.u16() == 0xffff);
  BOOST_TEST(r.u32() == 0xffffffffu);
  BOOST_TEST(r.u64() == ~0ull);
  BOOST_TEST(r.i32() == std::numeric_limits<int32_t>::min());
  BOOST_TEST(r.i64() == std::numeric_limits<int64_t>::max());
  double negZero = r.f64();
  BOOST_TEST(negZero == 0.0);
  BOOST_TEST(std::signbit(negZero));
  BOOST_TEST(std::isnan(r.f64()));
  BOOST_TEST(std::isinf(r.f64()));
  BOOST_TEST(r.bytes(0).empty());
  BOOST_TEST(r.str(0).empty());
  r.expectEnd();
}

BOOST_AUTO_TEST_CASE(round_trip_record) {
  auto body = sampleBody();
  auto rec = wire::encodeRecord(kKind, 1, body);
  BOOST_TEST(rec.size() == wire::kRecordHeaderSize + body.size());
  auto decoded = wire::decodeRecord(rec, kKind, kMaxVersion, kMaxLength, "test record");
  BOOST_TEST(decoded.header.magic == wire::kRecordMagic);
  BOOST_TEST(decoded.header.version == 1);
  BOOST_TEST(decoded.header.kind == kKind);
  BOOST_TEST(decoded.header.length == body.size());
  BOOST_TEST(std::vector<uint8_t>(decoded.body.begin(), decoded.body.end()) == body,
             boost::test_tools::per_element());
  readSampleBody(decoded.body);

  auto h = wire::decodeHeader(std::span(rec).first(wire::kRecordHeaderSize), kMaxVersion,
                              kMaxLength, "test record");
  BOOST_TEST(h.length == body.size());
  BOOST_TEST(h.kind == kKind);
}

BOOST_AUTO_TEST_CASE(empty_body_record) {
  auto rec = wire::encodeRecord(kKind, 1, {});
  auto decoded = wire::decodeRecord(rec, kKind, kMaxVersion, kMaxLength, "empty record");
  BOOST_TEST(decoded.body.size() == 0u);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(reader_rejects)

BOOST_AUTO_TEST_CASE(truncated_fixed_field_names_record_and_field) {
  std::vector<uint8_t> two{1, 2};
  expectProtocolError(
      [&] {
        Reader r(two, "tcp hello record");
        r.u32("rank");
      },
      {"truncated tcp hello record", "field 'rank'", "needs 4 bytes, 2 left"});
}

BOOST_AUTO_TEST_CASE(truncated_every_fixed_type) {
  std::vector<uint8_t> none;
  auto run = [&](auto read, std::string_view needs) {
    expectProtocolError(
        [&] {
          Reader r(none, "t record");
          read(r);
        },
        {"truncated t record", needs});
  };
  run([](Reader& r) { r.u8(); }, "needs 1 bytes, 0 left");
  run([](Reader& r) { r.u16(); }, "needs 2 bytes, 0 left");
  run([](Reader& r) { r.u32(); }, "needs 4 bytes, 0 left");
  run([](Reader& r) { r.u64(); }, "needs 8 bytes, 0 left");
  run([](Reader& r) { r.i32(); }, "needs 4 bytes, 0 left");
  run([](Reader& r) { r.i64(); }, "needs 8 bytes, 0 left");
  run([](Reader& r) { r.f64(); }, "needs 8 bytes, 0 left");
  run([](Reader& r) { r.raw(32); }, "needs 32 bytes, 0 left");
}

BOOST_AUTO_TEST_CASE(truncated_length_prefix) {
  std::vector<uint8_t> three{5, 0, 0};
  expectProtocolError(
      [&] {
        Reader r(three, "t record");
        r.bytes(16, "blob");
      },
      {"field 'blob'", "needs 4 bytes, 3 left"});
}

BOOST_AUTO_TEST_CASE(truncated_bytes_body) {
  Writer w;
  w.u32(10).u8(1).u8(2);
  expectProtocolError(
      [&] {
        Reader r(w.data(), "t record");
        r.bytes(16, "blob");
      },
      {"truncated t record", "field 'blob'", "needs 10 bytes, 2 left"});
}

BOOST_AUTO_TEST_CASE(bytes_over_limit_before_allocating) {
  // The length claims 4 GiB - 1 but only 4 bytes follow: the limit must fire, not an allocation.
  Writer w;
  w.u32(0xffffffffu).u32(0);
  gLargestAllocation = 0;
  expectProtocolError(
      [&] {
        Reader r(w.data(), "t record");
        r.bytes(64, "blob");
      },
      {"field 'blob'", "length 4294967295", "limit of 64 bytes"});
  BOOST_TEST(gLargestAllocation.load() < 64u * 1024);
}

BOOST_AUTO_TEST_CASE(str_over_limit) {
  Writer w;
  w.str("a longer name");
  expectProtocolError(
      [&] {
        Reader r(w.data(), "t record");
        r.str(4, "name");
      },
      {"field 'name'", "length 13", "limit of 4 bytes"});
}

BOOST_AUTO_TEST_CASE(trailing_bytes_after_fields) {
  Writer w;
  w.u32(1).u8(9);
  expectProtocolError(
      [&] {
        Reader r(w.data(), "t record");
        r.u32();
        r.expectEnd();
      },
      {"t record", "1 unexpected trailing bytes"});
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(decode_record_rejects)

BOOST_AUTO_TEST_CASE(bad_magic_in_hex) {
  auto rec = header(0x50545448u /* "HTTP" */, 1, kKind, 0);
  expectProtocolError([&] { wire::decodeRecord(rec, kKind, kMaxVersion, kMaxLength, "x record"); },
                      {"bad magic 0x50545448", "\"HTTP\"", "x record", "0x41525453"});
}

BOOST_AUTO_TEST_CASE(version_zero) {
  auto rec = header(wire::kRecordMagic, 0, kKind, 0);
  expectProtocolError([&] { wire::decodeRecord(rec, kKind, kMaxVersion, kMaxLength, "x record"); },
                      {"x record", "unknown version 0 (this build understands up to 1)"});
}

BOOST_AUTO_TEST_CASE(version_too_new) {
  auto rec = header(wire::kRecordMagic, 7, kKind, 0);
  expectProtocolError([&] { wire::decodeRecord(rec, kKind, kMaxVersion, kMaxLength, "x record"); },
                      {"x record", "unknown version 7 (this build understands up to 1)"});
}

BOOST_AUTO_TEST_CASE(kind_mismatch) {
  auto rec = wire::encodeRecord(9, 1, {});
  expectProtocolError([&] { wire::decodeRecord(rec, kKind, kMaxVersion, kMaxLength, "x record"); },
                      {"x record", "kind 9 (expected 3)"});
}

BOOST_AUTO_TEST_CASE(length_over_limit) {
  auto rec = header(wire::kRecordMagic, 1, kKind, 0x7fffffffu);
  expectProtocolError([&] { wire::decodeRecord(rec, kKind, kMaxVersion, kMaxLength, "x record"); },
                      {"x record", "body length 2147483647", "limit of 4096 bytes"});
}

BOOST_AUTO_TEST_CASE(truncated_header) {
  auto rec = wire::encodeRecord(kKind, 1, {});
  rec.resize(7);
  expectProtocolError([&] { wire::decodeRecord(rec, kKind, kMaxVersion, kMaxLength, "x record"); },
                      {"truncated x record", "header needs 12 bytes, 7 present"});
}

BOOST_AUTO_TEST_CASE(truncated_body) {
  auto rec = wire::encodeRecord(kKind, 1, sampleBody());
  rec.resize(rec.size() - 5);
  expectProtocolError([&] { wire::decodeRecord(rec, kKind, kMaxVersion, kMaxLength, "x record"); },
                      {"truncated x record", "announces 85 body bytes, 80 present"});
}

BOOST_AUTO_TEST_CASE(trailing_bytes_after_body) {
  auto rec = wire::encodeRecord(kKind, 1, asBytes("abc"));
  rec.push_back(0);
  rec.push_back(0);
  expectProtocolError([&] { wire::decodeRecord(rec, kKind, kMaxVersion, kMaxLength, "x record"); },
                      {"x record", "2 unexpected trailing bytes after the 3-byte body"});
}

BOOST_AUTO_TEST_CASE(decode_header_checks) {
  auto ok = header(wire::kRecordMagic, 1, kKind, 100);
  // The body is not there: decodeHeader is for streams and must not care.
  BOOST_TEST(wire::decodeHeader(ok, kMaxVersion, kMaxLength, "s record").length == 100u);
  expectProtocolError(
      [&] { wire::decodeHeader(std::span(ok).first(11), kMaxVersion, kMaxLength, "s record"); },
      {"truncated s record", "needs 12 bytes, 11 present"});
  expectProtocolError(
      [&] {
        wire::decodeHeader(header(0x12345678u, 1, kKind, 0), kMaxVersion, kMaxLength, "s record");
      },
      {"bad magic 0x12345678"});
  expectProtocolError(
      [&] {
        wire::decodeHeader(header(wire::kRecordMagic, 2, kKind, 0), kMaxVersion, kMaxLength,
                           "s record");
      },
      {"unknown version 2 (this build understands up to 1)"});
  expectProtocolError(
      [&] {
        wire::decodeHeader(header(wire::kRecordMagic, 1, kKind, 4097), kMaxVersion, kMaxLength,
                           "s record");
      },
      {"body length 4097", "limit of 4096"});
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_CASE(mutation_loop_only_protocol_errors) {
  const auto valid = wire::encodeRecord(kKind, 1, sampleBody());
  // Offsets of the length fields inside the record: header length, blob and name prefixes.
  const size_t kBlobLen = wire::kRecordHeaderSize + 1 + 2 + 4 + 8 + 4 + 8 + 8;
  const size_t kNameLen = kBlobLen + 4 + 5;
  const size_t lengthOffsets[] = {8, kBlobLen, kNameLen};
  std::mt19937 rng(20240611);  // fixed seed: every run checks the same inputs
  gLargestAllocation = 0;
  int accepted = 0, rejected = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    std::vector<uint8_t> m = valid;
    int mutations = 1 + static_cast<int>(rng() % 3);
    for (int k = 0; k < mutations; ++k) {
      switch (rng() % 6) {
        case 0:  // truncate
          m.resize(rng() % (m.size() + 1));
          break;
        case 1:  // flip bits of one byte
          if (!m.empty()) m[rng() % m.size()] ^= static_cast<uint8_t>(1 + rng() % 255);
          break;
        case 2:  // overwrite a random byte
          if (!m.empty()) m[rng() % m.size()] = static_cast<uint8_t>(rng());
          break;
        case 3: {  // change one of the length fields
          size_t off = lengthOffsets[rng() % 3];
          if (off + 4 <= m.size()) {
            static const uint32_t kLengths[] = {0,   1,    3,    255,         256,
                                                257, 4096, 4097, 0x7fffffffu, 0xffffffffu};
            uint32_t v = (rng() % 2) ? kLengths[rng() % 10] : static_cast<uint32_t>(rng());
            for (int b = 0; b < 4; ++b) m[off + b] = static_cast<uint8_t>(v >> (8 * b));
          }
          break;
        }
        case 4:  // append garbage
          for (unsigned n = 1 + rng() % 8; n > 0; --n) m.push_back(static_cast<uint8_t>(rng()));
          break;
        case 5:  // drop a byte in the middle
          if (!m.empty()) m.erase(m.begin() + static_cast<long>(rng() % m.size()));
          break;
      }
    }
    try {
      auto decoded = wire::decodeRecord(m, kKind, kMaxVersion, kMaxLength, "mutated record");
      readSampleBody(decoded.body);
      ++accepted;
    } catch (const Error& e) {
      if (e.code() != ErrorCode::ProtocolError) {
        BOOST_FAIL("iteration " << iter << ": " << toString(e.code()) << ": " << e.what());
      }
      ++rejected;
    } catch (const std::exception& e) {
      BOOST_FAIL("iteration " << iter << ": non-strata exception: " << e.what());
    }
  }
  BOOST_TEST_MESSAGE("accepted " << accepted << ", rejected " << rejected);
  BOOST_TEST(rejected > 10000);
  // Nothing beyond the record itself and small field copies was ever allocated.
  BOOST_TEST(gLargestAllocation.load() < 64u * 1024, "largest allocation " << gLargestAllocation);
}
