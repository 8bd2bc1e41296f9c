#include "base/wire.hpp"

#include <bit>
#include <cstring>
#include <limits>

#include <fmt/format.h>

#include <strata/error.hpp>

namespace strata::wire {

namespace {

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

/// The header at the start of `input` (`truncated`: it is not all there), checked.
RecordHeader checkedHeader(std::span<const uint8_t> input, bool truncated, uint16_t maxVersion,
                           size_t maxLength, std::string_view what) {
  if (truncated) {
    protocolError(fmt::format("truncated {}: the record header needs {} bytes, {} present", what,
                              kRecordHeaderSize, input.size()));
  }
  RecordHeader h;
  h.magic = loadLe<uint32_t>(input.data());
  h.version = loadLe<uint16_t>(input.data() + 4);
  h.kind = loadLe<uint16_t>(input.data() + 6);
  h.length = loadLe<uint32_t>(input.data() + 8);
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
  return h;
}

}  // namespace

Writer& Writer::bytes(std::span<const uint8_t> data) {
  if (data.size() > std::numeric_limits<uint32_t>::max()) {
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("cannot encode a {}-byte field: the wire format's length prefix "
                            "holds at most 4 GiB - 1",
                            data.size()));
  }
  u32(static_cast<uint32_t>(data.size()));
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

void Reader::need(size_t n, std::string_view field) const {
  if (remaining() < n) {
    protocolError(fmt::format("truncated {}: field '{}' at offset {} needs {} bytes, {} left",
                              what_, field, pos_, n, remaining()));
  }
}

std::span<const uint8_t> Reader::lengthPrefixed(size_t maxBytes, std::string_view field) {
  need(4, field);
  auto length = loadLe<uint32_t>(data_.data() + pos_);
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
  return checkedHeader(header, header.size() != kRecordHeaderSize, maxVersion, maxLength, what);
}

DecodedRecord decodeRecord(std::span<const uint8_t> input, uint16_t expectedKind,
                           uint16_t maxVersion, size_t maxLength, std::string_view what) {
  auto h = checkedHeader(input, input.size() < kRecordHeaderSize, maxVersion, maxLength, what);
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
