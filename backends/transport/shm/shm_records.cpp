#include "shm_transport.hpp"

#include <fmt/format.h>

#include <strata/error.hpp>

#include "base/wire.hpp"

namespace strata::shm {

std::vector<uint8_t> encodeDescriptor(const MemoryDescriptor& d) {
  wire::Writer w;
  w.u8(static_cast<uint8_t>(d.mode))
      .i32(d.pid)
      .u64(d.hostId)
      .u64(d.nonce)
      .u64(d.address)
      .u64(d.size);
  if (d.mode == DescriptorMode::Memfd) w.i32(d.fd).u64(d.inode).u64(d.offset);
  return wire::encodeRecord(kDescriptorKind, kDescriptorVersion, w.data());
}

MemoryDescriptor decodeDescriptor(std::span<const uint8_t> record, std::string_view what) {
  auto rec = wire::decodeRecord(record, kDescriptorKind, kDescriptorVersion, kMaxRecordBody, what);
  wire::Reader r(rec.body, what);
  MemoryDescriptor d;
  const uint8_t mode = r.u8("mode");
  if (mode != static_cast<uint8_t>(DescriptorMode::Memfd) &&
      mode != static_cast<uint8_t>(DescriptorMode::User)) {
    throw Error(ErrorCode::ProtocolError,
                fmt::format("{}: unknown mode {} (expected 1 memfd or 2 user)", what, mode));
  }
  d.mode = static_cast<DescriptorMode>(mode);
  d.pid = r.i32("pid");
  d.hostId = r.u64("host id");
  d.nonce = r.u64("nonce");
  d.address = r.u64("address");
  d.size = r.u64("size");
  if (d.mode == DescriptorMode::Memfd) {
    d.fd = r.i32("fd");
    d.inode = r.u64("inode");
    d.offset = r.u64("offset");
    if (d.fd < 0) {
      throw Error(ErrorCode::ProtocolError, fmt::format("{}: invalid fd {}", what, d.fd));
    }
  }
  r.expectEnd();
  return d;
}

std::vector<uint8_t> encodeEndpoint(const Endpoint& e) {
  wire::Writer w;
  w.i32(e.pid).u64(e.hostId);
  return wire::encodeRecord(kEndpointKind, kEndpointVersion, w.data());
}

Endpoint decodeEndpoint(std::span<const uint8_t> record, std::string_view what) {
  auto rec = wire::decodeRecord(record, kEndpointKind, kEndpointVersion, kMaxRecordBody, what);
  wire::Reader r(rec.body, what);
  Endpoint e;
  e.pid = r.i32("pid");
  e.hostId = r.u64("host id");
  r.expectEnd();
  return e;
}

}  // namespace strata::shm
