#include "fabric_records.hpp"

#include <fmt/format.h>

#include <strata/error.hpp>

#include "base/wire.hpp"

namespace strata::fabric {

std::vector<uint8_t> encode(const EndpointRecord& r) {
  wire::Writer w;
  w.str(r.provider).str(r.fabric).str(r.domain).bytes(r.address);
  w.u64(r.mrMode).u64(r.cqDataSize).u64(r.probeKey).u64(r.probeVa);
  return wire::encodeRecord(kKindEndpoint, kRecordVersion, w.data());
}

std::vector<uint8_t> encode(const MemoryRecord& r) {
  wire::Writer w;
  w.u64(r.key).u64(r.baseVa).u64(r.length).u64(r.mrMode).u8(r.kind);
  return wire::encodeRecord(kKindMemory, kRecordVersion, w.data());
}

EndpointRecord decodeEndpoint(std::span<const uint8_t> data, int peer) {
  std::string what = fmt::format("fabric endpoint record of rank {}", peer);
  try {
    auto rec = wire::decodeRecord(data, kKindEndpoint, kRecordVersion, kMaxRecord, what);
    wire::Reader rd(rec.body, what);
    EndpointRecord r;
    r.provider = rd.str(kMaxName, "provider");
    r.fabric = rd.str(kMaxName, "fabric");
    r.domain = rd.str(kMaxName, "domain");
    r.address = rd.bytes(kMaxAddress, "address");
    r.mrMode = rd.u64("mr_mode");
    r.cqDataSize = rd.u64("cq_data_size");
    r.probeKey = rd.u64("probe key");
    r.probeVa = rd.u64("probe address");
    rd.expectEnd();
    if (r.address.empty()) {
      throw Error(ErrorCode::ProtocolError, what + ": empty fabric address", peer);
    }
    return r;
  } catch (const Error& e) {
    // The wire layer does not know the rank; keep its message, attach the peer.
    if (e.peer() == peer) throw;
    throw Error(e.code(), e.what(), peer);
  }
}

MemoryRecord decodeMemory(std::span<const uint8_t> data, int peer) {
  std::string what = fmt::format("fabric memory descriptor of rank {}", peer);
  try {
    auto rec = wire::decodeRecord(data, kKindMemory, kRecordVersion, kMaxRecord, what);
    wire::Reader rd(rec.body, what);
    MemoryRecord r;
    r.key = rd.u64("key");
    r.baseVa = rd.u64("base address");
    r.length = rd.u64("length");
    r.mrMode = rd.u64("mr_mode");
    r.kind = rd.u8("memory kind");
    rd.expectEnd();
    return r;
  } catch (const Error& e) {
    if (e.peer() == peer) throw;
    throw Error(e.code(), e.what(), peer);
  }
}

}  // namespace strata::fabric
