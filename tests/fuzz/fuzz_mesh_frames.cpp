// libFuzzer target for the peer mesh's frames (lib/mesh/frames.cpp): the input is a byte
// stream as one peer connection delivers it; frames are taken from it the way frame_io.cpp's
// readConn() does (a 20-byte header, checked, then its payload) until the stream ends or a
// header is refused. Checked:
//   * checkFrameHeader accepts only the right magic and version, types 1-4, and lengths within
//     the limit of the type; a refusal has a message;
//   * an accepted header encodes back to the same bytes (except the reserved flags);
//   * ABORT and LOST payloads decode only to what encodes back to the same bytes, and are
//     refused only with Error(ProtocolError).
#include <cstring>

#include "fuzz_common.hpp"
#include "mesh/frames.hpp"

namespace mesh = strata::mesh;
using strata::Error;
using strata::ErrorCode;

namespace {

// Small, so that the fuzzer reaches the DATA limit (bootstrap.max_message is 1 GiB by default).
constexpr uint64_t kMaxMessage = 1 << 16;

void payload(mesh::FrameType type, std::span<const uint8_t> p) {
  try {
    switch (type) {
      case mesh::FrameType::Abort: {
        mesh::AbortPayload a = mesh::decodeAbort(p);
        FUZZ_CHECK(a.reason.size() <= mesh::kMaxControlPayload);
        FUZZ_CHECK(fuzz::same(mesh::encodeAbort(a.origin, a.reason), p));
        break;
      }
      case mesh::FrameType::Lost: {
        int32_t who = mesh::decodeLost(p);
        FUZZ_CHECK(fuzz::same(mesh::encodeLost(who), p));
        break;
      }
      case mesh::FrameType::Goodbye: {
        std::string why = mesh::decodeGoodbye(p);
        FUZZ_CHECK(why.size() <= mesh::kMaxControlPayload);
        // Re-encodes to the same bytes, unless empty (sent as no payload) or past what a sender
        // writes (it cuts the text 16 bytes short of the limit).
        if (!why.empty() && why.size() <= mesh::kMaxControlPayload - 16) {
          FUZZ_CHECK(fuzz::same(mesh::encodeGoodbye(why), p));
        }
        break;
      }
      case mesh::FrameType::Data:
        break;  // DATA is the user's
    }
  } catch (const Error& e) {
    fuzz::expectCode(e, ErrorCode::ProtocolError);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  size_t pos = 0;
  while (size - pos >= mesh::kFrameHeaderSize) {
    const uint8_t* raw = data + pos;
    mesh::FrameHeader h = mesh::decodeFrameHeader(raw);
    std::string why = mesh::checkFrameHeader(h, kMaxMessage);
    if (!why.empty()) {
      FUZZ_CHECK(h.magic != mesh::kFrameMagic || h.version != mesh::kFrameVersion || h.type < 1 ||
                 h.type > 4 || h.length > (h.type == 1 ? kMaxMessage : mesh::kMaxControlPayload));
      return 0;  // frame_io.cpp closes the connection here
    }
    FUZZ_CHECK(h.magic == mesh::kFrameMagic && h.version == mesh::kFrameVersion);
    FUZZ_CHECK(h.type >= 1 && h.type <= 4);
    FUZZ_CHECK(h.length <= (h.type == 1 ? kMaxMessage : mesh::kMaxControlPayload));
    uint8_t again[mesh::kFrameHeaderSize];
    mesh::encodeFrameHeader(again, static_cast<mesh::FrameType>(h.type), h.tag, h.length);
    FUZZ_CHECK(std::memcmp(again, raw, 6) == 0 && std::memcmp(again + 8, raw + 8, 12) == 0);
    pos += mesh::kFrameHeaderSize;
    if (h.length > size - pos) return 0;  // the rest has not arrived
    payload(static_cast<mesh::FrameType>(h.type), {data + pos, static_cast<size_t>(h.length)});
    pos += h.length;
  }
  return 0;
}
