#include "base/wire.hpp"

#include <bit>
#include <cstring>
#include <limits>

#include <fmt/format.h>

#include <strata/error.hpp>

namespace strata::wire {

namespace {

template <typename T>
void putLe(std::vector<uint8_t>& buf, T v) {
  uint8_t bytes[sizeof(T)];
  storeLe(bytes, v);
  buf.insert(buf.end(), bytes, bytes + sizeof(T));
}

template <typename U>
U getLe(const uint8_t* p) {
  return loadLe<U>(p);
}

[[noreturn]] void protocolError(const std::string& message) {
  throw Error(ErrorCode::ProtocolError, message);
}

std::string magicText(uint32_t magic) {
  // Printable bytes help to recognise a foreign protocol ("HTTP", "SSH-").
  std::string text;
  for (int i = 0; i < 4; ++i) {
    auto c = static_cast<unsigned char>(magic >> (8 * i));
    text += (c >= 0x20 && c < 0x7f) ? static_cast<char>(c) : '.';
  }
  return text;
}

RecordHeader parseHeader(const uint8_t* p) {
  RecordHeader h;
  h.magic = getLe<uint32_t>(p);
  h.version = getLe<uint16_t>(p + 4);
  h.kind = getLe<uint16_t>(p + 6);
  h.length = getLe<uint32_t>(p + 8);
  return h;
}

void checkHeader(const RecordHeader& h, uint16_t maxVersion, size_t maxLength,
                 std::string_view what) {
  if (h.magic != kRecordMagic) {
    protocolError(fmt::format(
        "bad magic 0x{:08x} (\"{}\") in {}, expected 0x{:08x} (\"STRA\"): the peer is not a "
        "strata process of a compatible build, or something else is talking to this port",
        h.magic, magicText(h.magic), what, kRecordMagic));
  }
  if (h.version == 0 || h.version > maxVersion) {
    protocolError(
        fmt::format("{}: unknown version {} (this build understands up to {}); run the same strata "
                    "version on every rank",
                    what, h.version, maxVersion));
  }
  if (h.length > maxLength) {
    protocolError(fmt::format("{}: body length {} bytes exceeds the limit of {} bytes", what,
                              h.length, maxLength));
  }
}

}  // namespace

Writer& Writer::u8(uint8_t v) {
  buf_.push_back(v);
  return *this;
}
Writer& Writer::u16(uint16_t v) {
  putLe(buf_, v);
  return *this;
}
Writer& Writer::u32(uint32_t v) {
  putLe(buf_, v);
  return *this;
}
Writer& Writer::u64(uint64_t v) {
  putLe(buf_, v);
  return *this;
}
Writer& Writer::i32(int32_t v) {
  putLe(buf_, v);
  return *this;
}
Writer& Writer::i64(int64_t v) {
  putLe(buf_, v);
  return *this;
}
Writer& Writer::f64(double v) {
  putLe(buf_, std::bit_cast<uint64_t>(v));
  return *this;
}

Writer& Writer::bytes(std::span<const uint8_t> data) {
  if (data.size() > std::numeric_limits<uint32_t>::max()) {
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("cannot encode a {}-byte field: the wire format's length prefix "
                            "holds at most 4 GiB - 1",
                            data.size()));
  }
  putLe(buf_, static_cast<uint32_t>(data.size()));
  return raw(data);
}

Writer& Writer::str(std::string_view s) {
  return bytes({reinterpret_cast<const uint8_t*>(s.data()), s.size()});
}

Writer& Writer::raw(std::span<const uint8_t> data) {
  buf_.insert(buf_.end(), data.begin(), data.end());
  return *this;
}

Reader::Reader(std::span<const uint8_t> data, std::string_view what) : data_(data), what_(what) {}

void Reader::need(size_t n, const char* field) const {
  need(n, std::string_view(field));
}

void Reader::need(size_t n, std::string_view field) const {
  if (remaining() < n) {
    protocolError(fmt::format("truncated {}: field '{}' at offset {} needs {} bytes, {} left",
                              what_, field, pos_, n, remaining()));
  }
}

uint8_t Reader::u8() {
  return u8("u8");
}
uint16_t Reader::u16() {
  return u16("u16");
}
uint32_t Reader::u32() {
  return u32("u32");
}
uint64_t Reader::u64() {
  return u64("u64");
}
int32_t Reader::i32() {
  return i32("i32");
}
int64_t Reader::i64() {
  return i64("i64");
}
double Reader::f64() {
  return f64("f64");
}
std::vector<uint8_t> Reader::bytes(size_t maxBytes) {
  return bytes(maxBytes, "bytes");
}
std::string Reader::str(size_t maxBytes) {
  return str(maxBytes, "str");
}
std::span<const uint8_t> Reader::raw(size_t n) {
  return raw(n, "raw");
}

uint8_t Reader::u8(std::string_view field) {
  need(1, field);
  return data_[pos_++];
}

uint16_t Reader::u16(std::string_view field) {
  need(2, field);
  auto v = getLe<uint16_t>(data_.data() + pos_);
  pos_ += 2;
  return v;
}

uint32_t Reader::u32(std::string_view field) {
  need(4, field);
  auto v = getLe<uint32_t>(data_.data() + pos_);
  pos_ += 4;
  return v;
}

uint64_t Reader::u64(std::string_view field) {
  need(8, field);
  auto v = getLe<uint64_t>(data_.data() + pos_);
  pos_ += 8;
  return v;
}

int32_t Reader::i32(std::string_view field) {
  return static_cast<int32_t>(u32(field));
}
int64_t Reader::i64(std::string_view field) {
  return static_cast<int64_t>(u64(field));
}
double Reader::f64(std::string_view field) {
  return std::bit_cast<double>(u64(field));
}

std::span<const uint8_t> Reader::lengthPrefixed(size_t maxBytes, std::string_view field) {
  need(4, field);
  auto length = getLe<uint32_t>(data_.data() + pos_);
  // Both checks come before any allocation, so a forged length cannot make us reserve 4 GiB.
  if (length > maxBytes) {
    protocolError(
        fmt::format("{}: field '{}' at offset {} has length {} bytes, over the limit of "
                    "{} bytes",
                    what_, field, pos_, length, maxBytes));
  }
  if (remaining() - 4 < length) {
    protocolError(fmt::format("truncated {}: field '{}' at offset {} needs {} bytes, {} left",
                              what_, field, pos_ + 4, length, remaining() - 4));
  }
  pos_ += 4;
  auto out = data_.subspan(pos_, length);
  pos_ += length;
  return out;
}

std::vector<uint8_t> Reader::bytes(size_t maxBytes, std::string_view field) {
  auto s = lengthPrefixed(maxBytes, field);
  return {s.begin(), s.end()};
}

std::string Reader::str(size_t maxBytes, std::string_view field) {
  auto s = lengthPrefixed(maxBytes, field);
  return {reinterpret_cast<const char*>(s.data()), s.size()};
}

std::span<const uint8_t> Reader::raw(size_t n, std::string_view field) {
  need(n, field);
  auto out = data_.subspan(pos_, n);
  pos_ += n;
  return out;
}

void Reader::expectEnd() const {
  if (remaining() != 0) {
    protocolError(
        fmt::format("{}: {} unexpected trailing bytes after offset {}", what_, remaining(), pos_));
  }
}

std::vector<uint8_t> encodeRecord(uint16_t kind, uint16_t version, std::span<const uint8_t> body) {
  if (body.size() > std::numeric_limits<uint32_t>::max()) {
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("cannot encode a record with a {}-byte body: the wire format's "
                            "length field holds at most 4 GiB - 1",
                            body.size()));
  }
  Writer w;
  w.u32(kRecordMagic).u16(version).u16(kind).u32(static_cast<uint32_t>(body.size())).raw(body);
  return w.take();
}

RecordHeader decodeHeader(std::span<const uint8_t> header, uint16_t maxVersion, size_t maxLength,
                          std::string_view what) {
  if (header.size() != kRecordHeaderSize) {
    protocolError(fmt::format("truncated {}: the record header needs {} bytes, {} present", what,
                              kRecordHeaderSize, header.size()));
  }
  auto h = parseHeader(header.data());
  checkHeader(h, maxVersion, maxLength, what);
  return h;
}

DecodedRecord decodeRecord(std::span<const uint8_t> input, uint16_t expectedKind,
                           uint16_t maxVersion, size_t maxLength, std::string_view what) {
  if (input.size() < kRecordHeaderSize) {
    protocolError(fmt::format("truncated {}: the record header needs {} bytes, {} present", what,
                              kRecordHeaderSize, input.size()));
  }
  auto h = parseHeader(input.data());
  checkHeader(h, maxVersion, maxLength, what);
  if (h.kind != expectedKind) {
    protocolError(
        fmt::format("{}: unexpected record kind {} (expected {}); the peer sent a "
                    "different message than this step of the protocol needs",
                    what, h.kind, expectedKind));
  }
  size_t bodyPresent = input.size() - kRecordHeaderSize;
  if (bodyPresent < h.length) {
    protocolError(fmt::format("truncated {}: the header announces {} body bytes, {} present", what,
                              h.length, bodyPresent));
  }
  if (bodyPresent > h.length) {
    protocolError(fmt::format("{}: {} unexpected trailing bytes after the {}-byte body", what,
                              bodyPresent - h.length, h.length));
  }
  return {h, input.subspan(kRecordHeaderSize, h.length)};
}

}  // namespace strata::wire
