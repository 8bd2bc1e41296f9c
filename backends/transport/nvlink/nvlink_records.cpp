#include "nvlink_records.hpp"

#include <fmt/format.h>

#include <strata/error.hpp>

#include "base/wire.hpp"

namespace strata::nvlink {
namespace {

constexpr const char* kDescriptorWhat = "nvlink memory descriptor";
constexpr const char* kEndpointWhat = "nvlink endpoint record";

[[noreturn]] void invalid(const char* what, const std::string& why) {
  throw Error(ErrorCode::ProtocolError, fmt::format("{}: {}", what, why));
}

Uuid readUuid(wire::Reader& r) {
  Uuid u{};
  auto raw = r.raw(u.size(), "device uuid");
  std::copy(raw.begin(), raw.end(), u.begin());
  return u;
}

}  // namespace

const MemoryHandle* MemoryDescriptor::find(HandleType type) const {
  for (const auto& h : handles) {
    if (h.type == static_cast<uint8_t>(type)) return &h;
  }
  return nullptr;
}

std::vector<uint8_t> encodeDescriptor(const MemoryDescriptor& d) {
  wire::Writer w;
  w.u8(static_cast<uint8_t>(d.handles.size()));
  for (const auto& h : d.handles) {
    w.u8(h.type).bytes(h.bytes);
  }
  w.u64(d.ownerAddress)
      .u64(d.allocationBase)
      .u64(d.allocationSize)
      .u64(d.offset)
      .u64(d.length)
      .raw(d.deviceUuid)
      .str(d.pciBusId)
      .u64(d.hostId)
      .i32(d.pid);
  return wire::encodeRecord(kDescriptorKind, kDescriptorVersion, w.data());
}

MemoryDescriptor decodeDescriptor(std::span<const uint8_t> record) {
  auto rec = wire::decodeRecord(record, kDescriptorKind, kDescriptorVersion, kMaxDescriptorBody,
                                kDescriptorWhat);
  wire::Reader r(rec.body, kDescriptorWhat);
  MemoryDescriptor d;
  size_t count = r.u8("handle count");
  if (count == 0 || count > kMaxHandles) {
    invalid(kDescriptorWhat, fmt::format("{} handles (expected 1 to {})", count, kMaxHandles));
  }
  for (size_t i = 0; i < count; ++i) {
    MemoryHandle h;
    h.type = r.u8("handle type");
    h.bytes = r.bytes(kHandleBytes, "handle bytes");
    bool known = h.type == static_cast<uint8_t>(HandleType::RuntimeIpc) ||
                 h.type == static_cast<uint8_t>(HandleType::Fabric);
    if (known && h.bytes.size() != kHandleBytes) {
      invalid(kDescriptorWhat, fmt::format("handle of type {} has {} bytes (expected {})", h.type,
                                           h.bytes.size(), kHandleBytes));
    }
    d.handles.push_back(std::move(h));
  }
  d.ownerAddress = r.u64("owner address");
  d.allocationBase = r.u64("allocation base");
  d.allocationSize = r.u64("allocation size");
  d.offset = r.u64("offset");
  d.length = r.u64("length");
  d.deviceUuid = readUuid(r);
  d.pciBusId = r.str(kMaxBusIdBytes, "pci bus id");
  d.hostId = r.u64("host id");
  d.pid = r.i32("pid");
  r.expectEnd();
  // Overflow-safe range checks: a forged offset must not make the importer map past the
  // allocation.
  if (d.length == 0 || d.offset > d.allocationSize || d.length > d.allocationSize - d.offset) {
    invalid(kDescriptorWhat,
            fmt::format("buffer of {} bytes at offset {} does not fit its allocation of {} bytes",
                        d.length, d.offset, d.allocationSize));
  }
  if (d.ownerAddress - d.allocationBase != d.offset || d.allocationBase > d.ownerAddress) {
    invalid(kDescriptorWhat, fmt::format("owner address {:#x} is not allocation base {:#x} + "
                                         "offset {}",
                                         d.ownerAddress, d.allocationBase, d.offset));
  }
  if (d.pid <= 0) invalid(kDescriptorWhat, fmt::format("invalid owner pid {}", d.pid));
  return d;
}

std::vector<uint8_t> encodeEndpoint(const Endpoint& e) {
  wire::Writer w;
  w.raw(e.deviceUuid).str(e.pciBusId).u64(e.hostId).i32(e.pid);
  return wire::encodeRecord(kEndpointKind, kEndpointVersion, w.data());
}

Endpoint decodeEndpoint(std::span<const uint8_t> record) {
  auto rec =
      wire::decodeRecord(record, kEndpointKind, kEndpointVersion, kMaxEndpointBody, kEndpointWhat);
  wire::Reader r(rec.body, kEndpointWhat);
  Endpoint e;
  e.deviceUuid = readUuid(r);
  e.pciBusId = r.str(kMaxBusIdBytes, "pci bus id");
  e.hostId = r.u64("host id");
  e.pid = r.i32("pid");
  r.expectEnd();
  if (e.pid <= 0) invalid(kEndpointWhat, fmt::format("invalid pid {}", e.pid));
  return e;
}

std::string uuidString(const Uuid& u) {
  return fmt::format(
      "GPU-{:02x}{:02x}{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}-"
      "{:02x}{:02x}{:02x}{:02x}{:02x}{:02x}",
      u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14],
      u[15]);
}

}  // namespace strata::nvlink
