#include "records.hpp"

#include <fmt/format.h>

#include <strata/error.hpp>

#include "base/wire.hpp"

namespace strata::transport {
namespace {

constexpr uint16_t kVersion = 1;
constexpr size_t kMaxName = 32;
constexpr size_t kMaxHostName = 255;
constexpr size_t kMaxEntries = 16;
constexpr size_t kMaxBlob = 16 * 1024;

[[noreturn]] void bad(const std::string& what, int peer, const std::string& why) {
  throw Error(ErrorCode::ProtocolError,
              fmt::format("bad {} from rank {}: {}", what, peer < 0 ? -1 : peer, why), peer);
}

std::string readName(wire::Reader& r, std::string_view field, const std::string& what, int peer) {
  std::string name = r.str(kMaxName, field);
  if (!validTransportName(name)) bad(what, peer, fmt::format("invalid transport name '{}'", name));
  return name;
}

}  // namespace

bool validTransportName(std::string_view name) {
  if (name.empty() || name.size() > kMaxName) return false;
  for (char c : name) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return false;
  }
  return true;
}

std::vector<uint8_t> encodeHost(const HostRecord& h) {
  wire::Writer w;
  w.i32(h.rank).u64(h.hostId).i32(h.pid).str(h.hostName);
  w.u16(static_cast<uint16_t>(h.transports.size()));
  for (const auto& t : h.transports) w.str(t);
  auto rec = wire::encodeRecord(kKindHost, kVersion, w.data());
  if (rec.size() > kHostSlot) {
    throw Error(ErrorCode::Internal, fmt::format("host record of {} bytes exceeds its {}-byte slot",
                                                 rec.size(), kHostSlot));
  }
  rec.resize(kHostSlot, 0);
  return rec;
}

HostRecord decodeHost(std::span<const uint8_t> slot, int slotRank, int size) {
  const std::string what = "transport host record";
  // The Context's slots are kHostSlot bytes; a shorter one must not make the decoder read past
  // it (the header, or the body the header announces).
  if (slot.size() < wire::kRecordHeaderSize) {
    bad(what, slotRank, fmt::format("a slot of {} bytes cannot hold a record header", slot.size()));
  }
  auto header = wire::decodeHeader(slot.first(wire::kRecordHeaderSize), kVersion,
                                   kHostSlot - wire::kRecordHeaderSize, what);
  if (header.kind != kKindHost) bad(what, slotRank, fmt::format("record kind {}", header.kind));
  if (header.length > slot.size() - wire::kRecordHeaderSize) {
    bad(what, slotRank,
        fmt::format("the header announces {} body bytes, the slot holds {}", header.length,
                    slot.size() - wire::kRecordHeaderSize));
  }
  auto rec = wire::decodeRecord(slot.first(wire::kRecordHeaderSize + header.length), kKindHost,
                                kVersion, kHostSlot, what);
  wire::Reader r(rec.body, what);
  HostRecord h;
  h.rank = r.i32("rank");
  h.hostId = r.u64("host id");
  h.pid = r.i32("pid");
  h.hostName = r.str(kMaxHostName, "host name");
  size_t n = r.u16("transport count");
  if (n > kMaxEntries) bad(what, slotRank, fmt::format("{} transports", n));
  for (size_t i = 0; i < n; ++i) h.transports.push_back(readName(r, "transport", what, slotRank));
  r.expectEnd();
  if (h.rank != slotRank || h.rank < 0 || h.rank >= size) {
    bad(what, slotRank, fmt::format("slot {} holds rank {}", slotRank, h.rank));
  }
  if (h.pid <= 0) bad(what, slotRank, fmt::format("pid {}", h.pid));
  return h;
}

std::vector<uint8_t> encodeMemory(const MemoryRecord& m) {
  wire::Writer w;
  w.i32(m.rank).u64(m.hostId).i32(m.pid).u8(static_cast<uint8_t>(m.kind)).u64(m.size).u64(m.id);
  w.u16(static_cast<uint16_t>(m.entries.size()));
  for (const auto& e : m.entries) {
    w.str(e.transport);
    w.bytes(e.descriptor);
  }
  return wire::encodeRecord(kKindMemory, kVersion, w.data());
}

MemoryRecord decodeMemory(std::span<const uint8_t> record) {
  const std::string what = "registered memory record";
  auto rec = wire::decodeRecord(record, kKindMemory, kVersion, kMaxRecord, what);
  wire::Reader r(rec.body, what);
  MemoryRecord m;
  m.rank = r.i32("rank");
  m.hostId = r.u64("host id");
  m.pid = r.i32("pid");
  uint8_t kind = r.u8("memory kind");
  if (kind != static_cast<uint8_t>(MemoryKind::Host) &&
      kind != static_cast<uint8_t>(MemoryKind::Cuda)) {
    bad(what, m.rank, fmt::format("unknown memory kind {}", kind));
  }
  m.kind = static_cast<MemoryKind>(kind);
  m.size = r.u64("size");
  m.id = r.u64("registration id");
  size_t n = r.u16("transport count");
  if (n == 0 || n > kMaxEntries) bad(what, m.rank, fmt::format("{} transport entries", n));
  for (size_t i = 0; i < n; ++i) {
    MemoryRecord::Entry e;
    e.transport = readName(r, "transport", what, m.rank);
    e.descriptor = r.bytes(kMaxBlob, "descriptor");
    m.entries.push_back(std::move(e));
  }
  r.expectEnd();
  return m;
}

std::vector<uint8_t> encodeConnect(const ConnectRecord& c) {
  wire::Writer w;
  w.i32(c.from).i32(c.to).str(c.transport).bytes(c.endpoint).bytes(c.arena);
  return wire::encodeRecord(kKindConnect, kVersion, w.data());
}

ConnectRecord decodeConnect(std::span<const uint8_t> record, int expectedFrom) {
  const std::string what = "transport connect record";
  auto rec = wire::decodeRecord(record, kKindConnect, kVersion, kMaxRecord, what);
  wire::Reader r(rec.body, what);
  ConnectRecord c;
  c.from = r.i32("from");
  c.to = r.i32("to");
  c.transport = readName(r, "transport", what, expectedFrom);
  c.endpoint = r.bytes(kMaxBlob, "endpoint");
  c.arena = r.bytes(kMaxRecord / 2, "semaphore arena");
  r.expectEnd();
  if (c.from != expectedFrom) bad(what, expectedFrom, fmt::format("it claims rank {}", c.from));
  return c;
}

std::vector<uint8_t> encodeReady(const ReadyRecord& rr) {
  wire::Writer w;
  w.i32(rr.from).i32(rr.to).str(rr.transport);
  return wire::encodeRecord(kKindReady, kVersion, w.data());
}

ReadyRecord decodeReady(std::span<const uint8_t> record, int expectedFrom) {
  const std::string what = "transport ready record";
  auto rec = wire::decodeRecord(record, kKindReady, kVersion, kMaxRecord, what);
  wire::Reader r(rec.body, what);
  ReadyRecord rr;
  rr.from = r.i32("from");
  rr.to = r.i32("to");
  rr.transport = readName(r, "transport", what, expectedFrom);
  r.expectEnd();
  if (rr.from != expectedFrom) bad(what, expectedFrom, fmt::format("it claims rank {}", rr.from));
  return rr;
}

std::vector<uint8_t> encodeSemaphore(const SemaphoreRecord& s) {
  wire::Writer w;
  w.i32(s.from).i32(s.to).u32(static_cast<uint32_t>(s.slots.size()));
  for (const auto& sl : s.slots) w.str(sl.transport).u32(sl.slot).u64(sl.base);
  return wire::encodeRecord(kKindSemaphore, kVersion, w.data());
}

SemaphoreRecord decodeSemaphore(std::span<const uint8_t> record, int expectedFrom) {
  const std::string what = "semaphore record";
  auto rec = wire::decodeRecord(record, kKindSemaphore, kVersion, kMaxRecord, what);
  wire::Reader r(rec.body, what);
  SemaphoreRecord s;
  s.from = r.i32("from");
  s.to = r.i32("to");
  size_t n = r.u32("count");
  if (n > 4096) bad(what, expectedFrom, fmt::format("{} semaphores", n));
  for (size_t i = 0; i < n; ++i) {
    SemaphoreRecord::Slot sl;
    sl.transport = readName(r, "transport", what, expectedFrom);
    sl.slot = r.u32("slot");
    sl.base = r.u64("base");
    s.slots.push_back(std::move(sl));
  }
  r.expectEnd();
  if (s.from != expectedFrom) bad(what, expectedFrom, fmt::format("it claims rank {}", s.from));
  return s;
}

}  // namespace strata::transport
