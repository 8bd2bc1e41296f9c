// libFuzzer target for the fabric transport's records (backends/transport/fabric/
// fabric_records.cpp): the endpoint (kind 70) connect() reads and the memory descriptor (kind 71)
// importMemory() reads, both from another process. The input is tried as each. Checked:
//   * a decoder refuses only with Error(ProtocolError) that names the peer it was given;
//   * what decodes encodes back to the same bytes;
//   * a decoded endpoint has a non-empty fabric address and names within their limits.
#include "backends/transport/fabric/fabric_records.hpp"
#include "fuzz_common.hpp"

namespace fab = strata::fabric;
using strata::Error;
using strata::ErrorCode;

namespace {
constexpr int kPeer = 7;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::span<const uint8_t> in(data, size);
  try {
    fab::EndpointRecord r = fab::decodeEndpoint(in, kPeer);
    FUZZ_CHECK(!r.address.empty() && r.address.size() <= fab::kMaxAddress);
    FUZZ_CHECK(r.provider.size() <= fab::kMaxName && r.fabric.size() <= fab::kMaxName &&
               r.domain.size() <= fab::kMaxName);
    FUZZ_CHECK(fuzz::same(fab::encode(r), in));
  } catch (const Error& e) {
    fuzz::expectCode(e, ErrorCode::ProtocolError);
    FUZZ_CHECK(e.peer() == kPeer);
  }
  try {
    fab::MemoryRecord r = fab::decodeMemory(in, kPeer);
    FUZZ_CHECK(fuzz::same(fab::encode(r), in));
  } catch (const Error& e) {
    fuzz::expectCode(e, ErrorCode::ProtocolError);
    FUZZ_CHECK(e.peer() == kPeer);
  }
  return 0;
}
