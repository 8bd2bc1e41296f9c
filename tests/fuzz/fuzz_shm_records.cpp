// libFuzzer target for the shm transport's records (backends/transport/shm/shm_records.cpp):
// the memory descriptor (kind 50) that importMemory() reads and the endpoint (kind 51) that
// connect() reads, both written by another process. The input is tried as each. Checked:
//   * a decoder refuses only with Error(ProtocolError);
//   * what decodes encodes back to the same bytes;
//   * a decoded descriptor has a known mode, and in memfd mode a valid fd (user mode: none).
#include "backends/transport/shm/shm_transport.hpp"
#include "fuzz_common.hpp"

namespace shm = strata::shm;
using strata::Error;
using strata::ErrorCode;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::span<const uint8_t> in(data, size);
  try {
    shm::MemoryDescriptor d = shm::decodeDescriptor(in, "fuzz descriptor");
    FUZZ_CHECK(d.mode == shm::DescriptorMode::Memfd || d.mode == shm::DescriptorMode::User);
    if (d.mode == shm::DescriptorMode::Memfd) {
      FUZZ_CHECK(d.fd >= 0);
    } else {
      FUZZ_CHECK(d.fd == -1 && d.inode == 0 && d.offset == 0);
    }
    FUZZ_CHECK(fuzz::same(shm::encodeDescriptor(d), in));
  } catch (const Error& e) {
    fuzz::expectCode(e, ErrorCode::ProtocolError);
  }
  try {
    shm::Endpoint e = shm::decodeEndpoint(in, "fuzz endpoint");
    FUZZ_CHECK(fuzz::same(shm::encodeEndpoint(e), in));
  } catch (const Error& e) {
    fuzz::expectCode(e, ErrorCode::ProtocolError);
  }
  return 0;
}
