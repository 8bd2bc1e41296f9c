#pragma once
#ifndef STRATA_INTERNAL_HEADERS
#error "base/wire.hpp is internal to strata: applications include <strata/...> only"
#endif

// Versioned, length-prefixed, little-endian encoding for everything that crosses a process
// boundary (docs/wire-format.md). Decoders throw Error(ProtocolError) on bad magic, unknown
// versions or kinds, lengths past the limit, truncated input and trailing bytes.

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <strata/export.hpp>

namespace strata::wire {

/// "STRA" little-endian: the first four bytes of every record.
inline constexpr uint32_t kRecordMagic = 0x41525453u;
/// Size of the fixed record header: magic u32, version u16, kind u16, body length u32.
inline constexpr size_t kRecordHeaderSize = 12;

/// A little-endian field at a fixed offset of a fixed-size header (no allocation: for headers
/// written per message, such as the host collectives' chunk headers).
template <typename T>
inline void storeLe(void* at, T value) noexcept {
  static_assert(std::is_integral_v<T>);
  auto v = static_cast<std::make_unsigned_t<T>>(value);
  if constexpr (std::endian::native == std::endian::little) {
    std::memcpy(at, &v, sizeof v);  // one store: this is the wire's byte order already
  } else {
    auto* p = static_cast<uint8_t*>(at);
    for (size_t i = 0; i < sizeof(T); ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
  }
}
template <typename T>
inline T loadLe(const void* at) noexcept {
  static_assert(std::is_integral_v<T>);
  std::make_unsigned_t<T> v = 0;
  if constexpr (std::endian::native == std::endian::little) {
    std::memcpy(&v, at, sizeof v);
  } else {
    const auto* p = static_cast<const uint8_t*>(at);
    for (size_t i = 0; i < sizeof(T); ++i)
      v |= static_cast<std::make_unsigned_t<T>>(p[i]) << (8 * i);
  }
  return static_cast<T>(v);
}

/// Appends little-endian fields to a byte vector.
class STRATA_API Writer {
 public:
  Writer& u8(uint8_t v) { return put(v); }
  Writer& u16(uint16_t v) { return put(v); }
  Writer& u32(uint32_t v) { return put(v); }
  Writer& u64(uint64_t v) { return put(v); }
  Writer& i32(int32_t v) { return put(v); }
  Writer& i64(int64_t v) { return put(v); }
  Writer& f64(double v) { return put(std::bit_cast<uint64_t>(v)); }
  /// u32 length then the bytes.
  Writer& bytes(std::span<const uint8_t> data);
  Writer& str(std::string_view s);
  /// Raw bytes without a length (fixed-size fields such as a 32-byte digest).
  Writer& raw(std::span<const uint8_t> data);
  const std::vector<uint8_t>& data() const { return buf_; }
  std::vector<uint8_t> take() { return std::move(buf_); }
  size_t size() const { return buf_.size(); }

 private:
  template <typename T>
  Writer& put(T v) {
    uint8_t le[sizeof(T)];
    storeLe(le, v);
    return raw({le, sizeof(T)});
  }
  std::vector<uint8_t> buf_;
};

/// Reads little-endian fields; every read checks the remaining length.
/// `what` names the record in error messages ("tcp hello record"), and `field` the field read
/// ("truncated tcp hello record: field 'rank' at offset 4 needs 4 bytes, 2 left").
class STRATA_API Reader {
 public:
  Reader(std::span<const uint8_t> data, std::string_view what);
  uint8_t u8(std::string_view field = "u8") { return get<uint8_t>(field); }
  uint16_t u16(std::string_view field = "u16") { return get<uint16_t>(field); }
  uint32_t u32(std::string_view field = "u32") { return get<uint32_t>(field); }
  uint64_t u64(std::string_view field = "u64") { return get<uint64_t>(field); }
  int32_t i32(std::string_view field = "i32") { return get<int32_t>(field); }
  int64_t i64(std::string_view field = "i64") { return get<int64_t>(field); }
  double f64(std::string_view field = "f64") { return std::bit_cast<double>(get<uint64_t>(field)); }
  /// A u32-length-prefixed field of at most maxBytes.
  std::vector<uint8_t> bytes(size_t maxBytes, std::string_view field = "bytes");
  std::string str(size_t maxBytes, std::string_view field = "str");
  /// Exactly n raw bytes.
  std::span<const uint8_t> raw(size_t n, std::string_view field = "raw");
  size_t remaining() const { return data_.size() - pos_; }
  /// Throws ProtocolError if bytes are left over.
  void expectEnd() const;

 private:
  template <typename T>
  T get(std::string_view field) {
    need(sizeof(T), field);
    T v = loadLe<T>(data_.data() + pos_);
    pos_ += sizeof(T);
    return v;
  }
  void need(size_t n, std::string_view field) const;
  std::span<const uint8_t> lengthPrefixed(size_t maxBytes, std::string_view field);
  std::span<const uint8_t> data_;
  size_t pos_ = 0;
  std::string what_;
};

struct RecordHeader {
  uint32_t magic = kRecordMagic;
  uint16_t version = 0;
  uint16_t kind = 0;
  uint32_t length = 0;  ///< body bytes after the header
};

/// Header + body.
STRATA_API std::vector<uint8_t> encodeRecord(uint16_t kind, uint16_t version,
                                             std::span<const uint8_t> body);

/// Checks the header and returns a view of the body. Throws ProtocolError naming `what` for
/// bad magic, kind != expectedKind, version == 0 or > maxVersion, length > maxLength,
/// truncated input, or trailing bytes after the body.
struct DecodedRecord {
  RecordHeader header;
  std::span<const uint8_t> body;
};
STRATA_API DecodedRecord decodeRecord(std::span<const uint8_t> input, uint16_t expectedKind,
                                      uint16_t maxVersion, size_t maxLength, std::string_view what);
/// Decodes only a 12-byte header (for streams); same checks except truncation of the body.
STRATA_API RecordHeader decodeHeader(std::span<const uint8_t> header, uint16_t maxVersion,
                                     size_t maxLength, std::string_view what);

}  // namespace strata::wire
