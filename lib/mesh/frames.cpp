#include "mesh/frames.hpp"

#include <fmt/format.h>

#include "base/wire.hpp"

namespace strata::mesh {

void encodeFrameHeader(uint8_t* h, FrameType type, int32_t tag, uint64_t length) {
  wire::storeLe<uint32_t>(h, kFrameMagic);
  h[4] = kFrameVersion;
  h[5] = static_cast<uint8_t>(type);
  wire::storeLe<uint16_t>(h + 6, 0);  // flags
  wire::storeLe<int32_t>(h + 8, tag);
  wire::storeLe<uint64_t>(h + 12, length);
}

FrameHeader decodeFrameHeader(const uint8_t* h) {
  return {wire::loadLe<uint32_t>(h),
          h[4],
          h[5],
          wire::loadLe<uint16_t>(h + 6),
          wire::loadLe<int32_t>(h + 8),
          wire::loadLe<uint64_t>(h + 12)};
}

std::string checkFrameHeader(const FrameHeader& h, uint64_t maxMessage) {
  if (h.magic != kFrameMagic) return fmt::format("bad frame magic 0x{:08x}", h.magic);
  if (h.version != kFrameVersion) return fmt::format("unknown frame version {}", h.version);
  if (h.type < 1 || h.type > 4) return fmt::format("unknown frame type {}", h.type);
  uint64_t limit =
      h.type == static_cast<uint8_t>(FrameType::Data) ? maxMessage : kMaxControlPayload;
  if (h.length > limit) {
    return fmt::format("frame of {} bytes exceeds the limit of {} bytes (bootstrap.max_message)",
                       h.length, limit);
  }
  return {};
}

std::vector<uint8_t> encodeAbort(int32_t origin, std::string_view reason) {
  wire::Writer w;
  w.i32(origin).str(reason);
  return w.take();
}

AbortPayload decodeAbort(std::span<const uint8_t> payload) {
  wire::Reader r(payload, "abort frame");
  AbortPayload a;
  a.origin = r.i32();
  a.reason = r.str(kMaxControlPayload);
  r.expectEnd();
  return a;
}

std::vector<uint8_t> encodeGoodbye(std::string_view failure) {
  if (failure.empty()) return {};
  wire::Writer w;
  // The str's 4-byte length fits in the payload limit too.
  w.str(failure.substr(0, kMaxControlPayload - 16));
  return w.take();
}

std::string decodeGoodbye(std::span<const uint8_t> payload) {
  if (payload.empty()) return {};
  wire::Reader r(payload, "goodbye frame");
  std::string why = r.str(kMaxControlPayload);
  r.expectEnd();
  return why;
}

std::vector<uint8_t> encodeLost(int32_t rank) {
  wire::Writer w;
  w.i32(rank);
  return w.take();
}

int32_t decodeLost(std::span<const uint8_t> payload) {
  wire::Reader r(payload, "peer-lost frame");
  int32_t who = r.i32();
  r.expectEnd();
  return who;
}

}  // namespace strata::mesh
