#pragma once
#ifndef STRATA_INTERNAL_HEADERS
#error "mesh/frames.hpp is internal to strata: applications include <strata/...> only"
#endif

// The frames of the peer mesh (docs/wire-format.md, "Peer frames"), without any I/O: the fixed
// 20-byte header, its checks, and the control payloads (GOODBYE, ABORT, LOST). frame_io.cpp reads
// them from its peers' sockets; tests/fuzz feeds them arbitrary bytes.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace strata::mesh {

/// Frame header: magic u32 "STRF", version u8, type u8, flags u16, tag i32, length u64.
inline constexpr uint32_t kFrameMagic = 0x46525453u;
inline constexpr uint8_t kFrameVersion = 1;
inline constexpr size_t kFrameHeaderSize = 20;
enum class FrameType : uint8_t { Data = 1, Goodbye = 2, Abort = 3, Lost = 4 };
/// Payload limit of the control frames (GOODBYE, ABORT, LOST); DATA has bootstrap.max_message.
inline constexpr size_t kMaxControlPayload = 4096;

struct FrameHeader {
  uint32_t magic = kFrameMagic;
  uint8_t version = kFrameVersion;
  uint8_t type = 0;
  uint16_t flags = 0;
  int32_t tag = 0;
  uint64_t length = 0;
};

/// Writes kFrameHeaderSize bytes at h (flags 0).
void encodeFrameHeader(uint8_t* h, FrameType type, int32_t tag, uint64_t length);
/// Reads kFrameHeaderSize bytes at h, without checks.
FrameHeader decodeFrameHeader(const uint8_t* h);
/// Why a received header is refused (bad magic, version or type, a length past its limit:
/// `maxMessage` for DATA, kMaxControlPayload otherwise), or "" when it is accepted.
std::string checkFrameHeader(const FrameHeader& h, uint64_t maxMessage);

/// ABORT payload: origin rank i32, reason str (at most kMaxControlPayload bytes).
struct AbortPayload {
  int32_t origin = -1;
  std::string reason;
};
std::vector<uint8_t> encodeAbort(int32_t origin, std::string_view reason);
/// Throws ProtocolError for a truncated or oversized payload or trailing bytes.
AbortPayload decodeAbort(std::span<const uint8_t> payload);

/// GOODBYE payload: empty when the rank finished well, else the failure of one of its own calls
/// (str, at most kMaxControlPayload bytes; longer text is cut).
std::vector<uint8_t> encodeGoodbye(std::string_view failure);
/// The failure a GOODBYE carries ("" for an empty payload); throws ProtocolError for a truncated
/// or oversized string or trailing bytes.
std::string decodeGoodbye(std::span<const uint8_t> payload);

/// LOST payload: the rank i32 whose connection broke.
std::vector<uint8_t> encodeLost(int32_t rank);
/// Throws ProtocolError unless the payload is exactly one i32.
int32_t decodeLost(std::span<const uint8_t> payload);

}  // namespace strata::mesh
