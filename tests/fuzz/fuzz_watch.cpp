// libFuzzer target for the status service's records (lib/watch/codec.cpp,
// docs/wire-format.md "Status service"): the request (kind 90) a tool or a rank sends to a status
// port, the reply (kind 91) it reads back, and the exchange record (kind 92) every rank reads from
// each peer's allGather slot. Input: byte 0 picks the record (request, reply, exchange), byte 1 the
// rank whose exchange slot it is; the rest is the record (the exchange: the slot, any size).
// Checked:
//   * a decoder refuses only with Error(ProtocolError) (any other exception escapes and fails
//     the run); an exchange refusal names the rank in its message;
//   * what decodes keeps the documented limits (request type 1-3; at most 4096 states and 16
//     calls per state; every text field within its limit);
//   * what decodes encodes back to exactly the same bytes: the encoding is canonical (f64 fields
//     are carried as their bit pattern, NaN payloads and -0.0 included; `failed` is 0 or 1; the
//     decoders' text limits are the encoders' cuts). The exchange record: the same record in
//     front of the slot padding, which the decoder ignores; the re-encoded slot decodes again to
//     the same fields.
#include <cstring>
#include <string>

#include "base/wire.hpp"
#include "fuzz_common.hpp"
#include "watch/codec.hpp"

namespace watch = strata::watch;
namespace wire = strata::wire;
using strata::Error;
using strata::ErrorCode;

namespace {

void request(std::span<const uint8_t> bytes) {
  watch::Request q;
  try {
    q = watch::decodeRequest(bytes);
  } catch (const Error& e) {
    fuzz::expectCode(e, ErrorCode::ProtocolError);
    return;
  }
  const auto t = static_cast<uint8_t>(q.type);
  FUZZ_CHECK(t >= 1 && t <= 4);
  if (q.type == watch::RequestType::Revoke) {
    FUZZ_CHECK(q.domain.size() <= watch::kMaxDomain && q.reason.size() <= watch::kMaxRevokeReason);
    FUZZ_CHECK(q.suspects.size() <= watch::kMaxRevokeSuspects);
    FUZZ_CHECK(q.code <= static_cast<uint8_t>(ErrorCode::Internal));
  }
  FUZZ_CHECK(fuzz::same(watch::encodeRequest(q), bytes));
}

void reply(std::span<const uint8_t> bytes) {
  watch::Reply rep;
  try {
    rep = watch::decodeReply(bytes);
  } catch (const Error& e) {
    fuzz::expectCode(e, ErrorCode::ProtocolError);
    return;
  }
  FUZZ_CHECK(rep.error.size() <= watch::kMaxError && rep.text.size() <= watch::kMaxText);
  FUZZ_CHECK(rep.reports.size() <= watch::kMaxReports);
  for (const auto& s : rep.reports) {
    FUZZ_CHECK(s.host.size() <= watch::kMaxHost);
    FUZZ_CHECK(s.calls.size() <= watch::kMaxCallsReported);
    for (const auto& c : s.calls) {
      FUZZ_CHECK(c.domain.size() <= watch::kMaxDomain && c.op.size() <= watch::kMaxOp);
      FUZZ_CHECK(c.detail.size() <= watch::kMaxDetail);
    }
  }
  FUZZ_CHECK(fuzz::same(watch::encodeReply(rep), bytes));
}

bool sameExchange(const watch::Exchange& a, const watch::Exchange& b) {
  return a.jobId == b.jobId && a.secret == b.secret && a.peer.address == b.peer.address &&
         a.peer.host == b.peer.host && a.peer.pid == b.peer.pid;
}

void exchange(std::span<const uint8_t> slot, int rank) {
  watch::Exchange x;
  try {
    x = watch::decodeExchange(slot, rank);
  } catch (const Error& e) {
    fuzz::expectCode(e, ErrorCode::ProtocolError);
    FUZZ_CHECK(std::string(e.what()).find("rank " + std::to_string(rank)) != std::string::npos);
    return;
  }
  FUZZ_CHECK(x.secret.size() <= watch::kMaxExchangeSecret);
  FUZZ_CHECK(x.peer.address.size() <= watch::kMaxExchangeAddress);
  FUZZ_CHECK(x.peer.host.size() <= watch::kMaxHost);
  std::vector<uint8_t> again = watch::encodeExchange(x);
  FUZZ_CHECK(again.size() == watch::kExchangeSlot);
  // The record's own bytes: header and the body its header announces.
  FUZZ_CHECK(slot.size() >= wire::kRecordHeaderSize);
  const size_t used = wire::kRecordHeaderSize + wire::loadLe<uint32_t>(slot.data() + 8);
  FUZZ_CHECK(used <= slot.size() && used <= again.size());
  FUZZ_CHECK(fuzz::same(std::span(again).first(used), slot.first(used)));
  for (size_t i = used; i < again.size(); ++i) FUZZ_CHECK(again[i] == 0);
  FUZZ_CHECK(sameExchange(watch::decodeExchange(again, rank), x));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Input input(data, size);
  const uint8_t which = input.byte() % 3;
  const int rank = input.byte();
  std::span<const uint8_t> bytes = input.rest();
  switch (which) {
    case 0:
      request(bytes);
      break;
    case 1:
      reply(bytes);
      break;
    default:
      exchange(bytes, rank);
      break;
  }
  return 0;
}
