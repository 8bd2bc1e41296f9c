// libFuzzer target for the nvlink transport's records (backends/transport/nvlink/
// nvlink_records.cpp, CUDA-free on purpose): the memory descriptor (kind 60) an importer maps
// from and the endpoint (kind 61). The input is tried as each. Checked:
//   * a decoder refuses only with Error(ProtocolError), its message naming the record;
//   * what decodes encodes back to the same bytes;
//   * a decoded descriptor is safe to map: 1-4 handles, known handle types of exactly 64 bytes,
//     a non-empty buffer inside its allocation (no overflow), owner address = base + offset, a
//     valid pid, and find() returns the first handle of a type.
#include <string_view>

#include "backends/transport/nvlink/nvlink_records.hpp"
#include "fuzz_common.hpp"

namespace nv = strata::nvlink;
using strata::Error;
using strata::ErrorCode;

namespace {

void descriptor(std::span<const uint8_t> in) {
  nv::MemoryDescriptor d;
  try {
    d = nv::decodeDescriptor(in);
  } catch (const Error& e) {
    fuzz::expectCode(e, ErrorCode::ProtocolError);
    FUZZ_CHECK(std::string_view(e.what()).find("nvlink memory descriptor") !=
               std::string_view::npos);
    return;
  }
  FUZZ_CHECK(!d.handles.empty() && d.handles.size() <= nv::kMaxHandles);
  for (const auto& h : d.handles) {
    if (h.type == 1 || h.type == 2) FUZZ_CHECK(h.bytes.size() == nv::kHandleBytes);
    FUZZ_CHECK(h.bytes.size() <= nv::kHandleBytes);
  }
  FUZZ_CHECK(d.length > 0 && d.offset <= d.allocationSize &&
             d.length <= d.allocationSize - d.offset);
  FUZZ_CHECK(d.allocationBase <= d.ownerAddress && d.ownerAddress - d.allocationBase == d.offset);
  FUZZ_CHECK(d.pid > 0 && d.pciBusId.size() <= nv::kMaxBusIdBytes);
  for (auto type : {nv::HandleType::RuntimeIpc, nv::HandleType::Fabric}) {
    const nv::MemoryHandle* found = d.find(type);
    for (const auto& h : d.handles) {
      if (h.type == static_cast<uint8_t>(type)) {
        FUZZ_CHECK(found == &h);
        break;
      }
    }
  }
  FUZZ_CHECK(fuzz::same(nv::encodeDescriptor(d), in));
  FUZZ_CHECK(nv::uuidString(d.deviceUuid).size() == 40);
}

void endpoint(std::span<const uint8_t> in) {
  nv::Endpoint e;
  try {
    e = nv::decodeEndpoint(in);
  } catch (const Error& err) {
    fuzz::expectCode(err, ErrorCode::ProtocolError);
    return;
  }
  FUZZ_CHECK(e.pid > 0 && e.pciBusId.size() <= nv::kMaxBusIdBytes);
  FUZZ_CHECK(fuzz::same(nv::encodeEndpoint(e), in));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::span<const uint8_t> in(data, size);
  descriptor(in);
  endpoint(in);
  return 0;
}
