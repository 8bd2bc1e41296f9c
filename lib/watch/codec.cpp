#include "watch/codec.hpp"

#include <algorithm>

#include <fmt/format.h>

#include <strata/error.hpp>
#include "base/wire.hpp"

namespace strata::watch {

namespace {
/// Bit 7 of a revoke's code byte: an explicit revoke (Request::interrupt).
constexpr uint8_t kRevokeInterruptBit = 0x80;
}  // namespace

std::vector<uint8_t> encodeRequest(const Request& r) {
  wire::Writer w;
  w.u8(static_cast<uint8_t>(r.type)).u64(r.jobId);
  if (r.type == RequestType::Revoke) {
    w.str(r.domain.substr(0, kMaxDomain)).i32(r.origin).str(r.reason.substr(0, kMaxRevokeReason));
    const size_t n = std::min(r.suspects.size(), kMaxRevokeSuspects);
    w.u32(static_cast<uint32_t>(n));
    for (size_t i = 0; i < n; ++i) w.i32(r.suspects[i]);
    w.u8(static_cast<uint8_t>(r.code | (r.interrupt ? kRevokeInterruptBit : 0)));
  }
  return wire::encodeRecord(kRequestKind, kWatchVersion, w.data());
}

Request decodeRequest(std::span<const uint8_t> record) {
  auto d = wire::decodeRecord(record, kRequestKind, kWatchVersion, kMaxRequest, "status request");
  wire::Reader r(d.body, "status request");
  Request q;
  uint8_t t = r.u8("type");
  if (t < 1 || t > 4) {
    throw Error(ErrorCode::ProtocolError, fmt::format("status request: unknown type {}", t));
  }
  q.type = static_cast<RequestType>(t);
  q.jobId = r.u64("job id");
  if (q.type == RequestType::Revoke) {
    q.domain = r.str(kMaxDomain, "domain");
    q.origin = r.i32("origin");
    q.reason = r.str(kMaxRevokeReason, "reason");
    const uint32_t n = r.u32("suspect count");
    if (n > kMaxRevokeSuspects) {
      throw Error(ErrorCode::ProtocolError,
                  fmt::format("status request: {} suspects (at most {})", n, kMaxRevokeSuspects));
    }
    q.suspects.reserve(n);
    for (uint32_t i = 0; i < n; ++i) q.suspects.push_back(r.i32("suspect"));
    const uint8_t byte = r.u8("code");
    q.interrupt = (byte & kRevokeInterruptBit) != 0;
    q.code = static_cast<uint8_t>(byte & ~kRevokeInterruptBit);
    if (q.code > static_cast<uint8_t>(ErrorCode::Internal)) {
      throw Error(ErrorCode::ProtocolError,
                  fmt::format("status request: unknown error code {} in a revoke", q.code));
    }
  }
  r.expectEnd();
  return q;
}

namespace {
void writeReport(wire::Writer& w, const RankReport& s) {
  w.i32(s.rank).i32(s.size).i32(s.pid).str(s.host.substr(0, kMaxHost)).u64(s.jobId);
  w.u16(static_cast<uint16_t>(std::min(s.calls.size(), kMaxCallsReported)));
  for (size_t i = 0; i < s.calls.size() && i < kMaxCallsReported; ++i) {
    const CallReport& c = s.calls[i];
    w.str(c.domain.substr(0, kMaxDomain)).str(c.op.substr(0, kMaxOp)).u64(c.seq).f64(c.seconds);
    w.i32(c.waitingFor).f64(c.waitingSeconds).str(c.detail.substr(0, kMaxDetail));
    w.u8(c.failed ? 1 : 0);
  }
}

RankReport readReport(wire::Reader& r) {
  RankReport s;
  s.rank = r.i32("rank");
  s.size = r.i32("size");
  s.pid = r.i32("pid");
  s.host = r.str(kMaxHost, "host");
  s.jobId = r.u64("job id");
  uint16_t n = r.u16("call count");
  if (n > kMaxCallsReported) {
    throw Error(ErrorCode::ProtocolError, fmt::format("status reply: {} calls", n));
  }
  for (uint16_t i = 0; i < n; ++i) {
    CallReport c;
    c.domain = r.str(kMaxDomain, "domain");
    c.op = r.str(kMaxOp, "op");
    c.seq = r.u64("seq");
    c.seconds = r.f64("seconds");
    c.waitingFor = r.i32("waiting for");
    c.waitingSeconds = r.f64("waiting seconds");
    c.detail = r.str(kMaxDetail, "detail");
    const uint8_t failed = r.u8("failed");
    if (failed > 1) {  // a flag: 0 or 1, so that every reply has one encoding
      throw Error(ErrorCode::ProtocolError,
                  fmt::format("status reply: call flag 'failed' is {} (0 or 1)", failed));
    }
    c.failed = failed == 1;
    s.calls.push_back(std::move(c));
  }
  return s;
}
}  // namespace

std::vector<uint8_t> encodeReply(const Reply& rep) {
  wire::Writer w;
  w.str(rep.error.substr(0, kMaxError)).str(rep.text.substr(0, kMaxText));
  const size_t n = std::min(rep.reports.size(), kMaxReports);
  w.u32(static_cast<uint32_t>(n));
  for (size_t i = 0; i < n; ++i) writeReport(w, rep.reports[i]);
  return wire::encodeRecord(kAnswerKind, kWatchVersion, w.data());
}

Reply decodeReply(std::span<const uint8_t> record) {
  auto d = wire::decodeRecord(record, kAnswerKind, kWatchVersion, kMaxReply, "status reply");
  wire::Reader r(d.body, "status reply");
  Reply rep;
  rep.error = r.str(kMaxError, "error");
  rep.text = r.str(kMaxText, "text");
  uint32_t n = r.u32("state count");
  if (n > kMaxReports) {
    throw Error(ErrorCode::ProtocolError, fmt::format("status reply: {} rank reports", n));
  }
  for (uint32_t i = 0; i < n; ++i) rep.reports.push_back(readReport(r));
  r.expectEnd();
  return rep;
}

static_assert(wire::kRecordHeaderSize + 8 + 3 * 4 + kMaxExchangeSecret + kMaxExchangeAddress +
                      kExchangeHost + 4 <=
                  kExchangeSlot,
              "the largest exchange record must fit its slot");

std::vector<uint8_t> encodeExchange(const Exchange& e) {
  // Every rank decodes every slot: a field its decoder refuses would fail the job's start on all
  // of them, so refuse it here, where it is made.
  if (e.secret.size() > kMaxExchangeSecret || e.peer.address.size() > kMaxExchangeAddress) {
    throw Error(ErrorCode::Internal,
                fmt::format("status exchange record: a {}-byte secret or {}-byte address is over "
                            "the limit of {} bytes",
                            e.secret.size(), e.peer.address.size(), kMaxExchangeSecret));
  }
  wire::Writer w;
  w.u64(e.jobId).str(e.secret).str(e.peer.address).str(e.peer.host.substr(0, kExchangeHost));
  w.i32(e.peer.pid);
  auto rec = wire::encodeRecord(kExchangeKind, kWatchVersion, w.data());
  rec.resize(kExchangeSlot, 0);
  return rec;
}

Exchange decodeExchange(std::span<const uint8_t> slot, int rank) {
  const std::string what = fmt::format("status exchange record of rank {}", rank);
  auto bad = [&](const std::string& why) {
    throw Error(ErrorCode::ProtocolError, fmt::format("malformed {}: {}", what, why), rank);
  };
  if (slot.size() < wire::kRecordHeaderSize) {
    bad(fmt::format("a slot of {} bytes cannot hold a record header", slot.size()));
  }
  // The version and the kind are checked like decodeRecord() does (a slot of another kind or
  // version is another build's record, not this one with other fields).
  auto h = wire::decodeHeader(slot.first(wire::kRecordHeaderSize), kWatchVersion,
                              kExchangeSlot - wire::kRecordHeaderSize, what);
  if (h.kind != kExchangeKind) {
    bad(fmt::format("record kind {} (expected {})", h.kind, kExchangeKind));
  }
  if (h.length > slot.size() - wire::kRecordHeaderSize) {
    bad(fmt::format("the header announces {} body bytes, the slot holds {}", h.length,
                    slot.size() - wire::kRecordHeaderSize));
  }
  wire::Reader r(slot.subspan(wire::kRecordHeaderSize, h.length), what);
  Exchange e;
  e.jobId = r.u64("job id");
  e.secret = r.str(kMaxExchangeSecret, "secret");
  e.peer.address = r.str(kMaxExchangeAddress, "address");
  e.peer.host = r.str(kExchangeHost, "host");
  e.peer.pid = r.i32("pid");
  r.expectEnd();
  return e;
}

}  // namespace strata::watch
