// The status service's records (lib/watch/codec.cpp: request, reply, exchange) without sockets.
// The main of the module `watch`; test_analysis.cpp and test_service.cpp add the wait-for
// analysis and the service in this process. The service over sockets is exercised by the stress
// suite (stress-stall-*) and the fuzz target fuzz-watch.
#define BOOST_TEST_MODULE watch
#include <boost/test/unit_test.hpp>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include <strata/error.hpp>

#include "base/wire.hpp"
#include "tests/unit/watch/sample_reports.hpp"
#include "watch/codec.hpp"

using namespace strata;
using namespace strata::watch;
using strata::watch::samples::call;
using strata::watch::samples::state;

namespace {

using Bytes = std::vector<uint8_t>;

template <typename Fn>
Error expectError(Fn&& fn, ErrorCode code, const std::string& fragment) {
  try {
    fn();
  } catch (const Error& e) {
    BOOST_TEST(static_cast<int>(e.code()) == static_cast<int>(code), e.what());
    BOOST_TEST(std::string(e.what()).find(fragment) != std::string::npos, e.what());
    return e;
  }
  BOOST_FAIL("no error thrown, expected: " << fragment);
  return Error(ErrorCode::Internal, "unreachable");
}

bool sameCall(const CallReport& a, const CallReport& b) {
  return a.domain == b.domain && a.op == b.op && a.seq == b.seq &&
         std::bit_cast<uint64_t>(a.seconds) == std::bit_cast<uint64_t>(b.seconds) &&
         a.waitingFor == b.waitingFor &&
         std::bit_cast<uint64_t>(a.waitingSeconds) == std::bit_cast<uint64_t>(b.waitingSeconds) &&
         a.detail == b.detail && a.failed == b.failed;
}

bool sameState(const RankReport& a, const RankReport& b) {
  if (a.rank != b.rank || a.size != b.size || a.pid != b.pid || a.host != b.host ||
      a.jobId != b.jobId || a.calls.size() != b.calls.size()) {
    return false;
  }
  for (size_t i = 0; i < a.calls.size(); ++i) {
    if (!sameCall(a.calls[i], b.calls[i])) return false;
  }
  return true;
}

/// A reply record with a body written by `body` (to forge what the encoder never writes).
Bytes replyRecord(const wire::Writer& body, uint16_t version = kWatchVersion) {
  return wire::encodeRecord(kAnswerKind, version, body.data());
}

/// One state with `calls` calls whose `failed` byte is `failed`, written field by field.
void writeReport(wire::Writer& w, uint16_t calls, uint8_t failed = 0,
                 const std::string& host = "h") {
  w.i32(0).i32(2).i32(7).str(host).u64(1).u16(calls);
  for (uint16_t i = 0; i < calls; ++i) {
    w.str("bootstrap").str("barrier").u64(1).f64(0.5).i32(-1).f64(0).str("").u8(failed);
  }
}

}  // namespace

// ---- request ----

BOOST_AUTO_TEST_CASE(request_round_trip_each_type) {
  for (auto type : {RequestType::Status, RequestType::List, RequestType::Dump}) {
    Request q = makeRequest(type, 0x0123456789abcdefull);
    Bytes rec = encodeRequest(q);
    BOOST_TEST(rec.size() == wire::kRecordHeaderSize + 9);
    BOOST_TEST(wire::loadLe<uint16_t>(rec.data() + 6) == kRequestKind);
    Request back = decodeRequest(rec);
    BOOST_TEST(static_cast<int>(back.type) == static_cast<int>(type));
    BOOST_TEST(back.jobId == q.jobId);
    BOOST_TEST(encodeRequest(back) == rec);
  }
}

BOOST_AUTO_TEST_CASE(revoke_request_round_trip) {
  Request q = makeRequest(RequestType::Revoke, 7);
  q.domain = "communicator 3";
  q.origin = 5;
  q.reason = "rank 2 died";
  q.suspects = {2, 9};
  q.code = static_cast<uint8_t>(ErrorCode::PeerLost);
  const Bytes rec = encodeRequest(q);
  Request back = decodeRequest(rec);
  BOOST_TEST(static_cast<int>(back.type) == static_cast<int>(RequestType::Revoke));
  BOOST_TEST(back.jobId == 7u);
  BOOST_TEST(back.domain == q.domain);
  BOOST_TEST(back.origin == 5);
  BOOST_TEST(back.reason == q.reason);
  BOOST_TEST((back.suspects == q.suspects));
  BOOST_TEST(back.code == q.code);
  BOOST_TEST(!back.interrupt);
  BOOST_TEST(encodeRequest(back) == rec);
  // An explicit revoke (bit 7 of the code byte) keeps its code.
  q.code = static_cast<uint8_t>(ErrorCode::Aborted);
  q.interrupt = true;
  back = decodeRequest(encodeRequest(q));
  BOOST_TEST(back.interrupt);
  BOOST_TEST(back.code == static_cast<uint8_t>(ErrorCode::Aborted));
  q.code = static_cast<uint8_t>(ErrorCode::PeerLost);
  q.interrupt = false;
  // Cut to its limits by the encoder: a long reason, many suspects.
  q.reason.assign(5000, 'x');
  q.suspects.assign(3000, 1);
  back = decodeRequest(encodeRequest(q));
  BOOST_TEST(back.reason.size() == kMaxRevokeReason);
  BOOST_TEST(back.suspects.size() == kMaxRevokeSuspects);
  // Every truncation is refused; so are an unknown error code and too many suspects.
  for (size_t n = wire::kRecordHeaderSize; n < rec.size(); ++n) {
    expectError([&] { decodeRequest(std::span(rec).first(n)); }, ErrorCode::ProtocolError,
                "status request");
  }
  Bytes badCode = rec;
  badCode.back() = 100;
  expectError([&] { decodeRequest(badCode); }, ErrorCode::ProtocolError, "error code 100");
  badCode.back() = 0x80 | 100;  // the flag does not make a bad code good
  expectError([&] { decodeRequest(badCode); }, ErrorCode::ProtocolError, "error code 100");
  wire::Writer body;
  body.u8(4).u64(7).str("communicator 0").i32(1).str("why").u32(2000);
  expectError([&] { decodeRequest(wire::encodeRecord(kRequestKind, kWatchVersion, body.data())); },
              ErrorCode::ProtocolError, "2000 suspects");
}

BOOST_AUTO_TEST_CASE(request_rejections) {
  const Bytes rec = encodeRequest(makeRequest(RequestType::Status, 42));
  for (size_t n = 0; n < rec.size(); ++n) {
    expectError([&] { decodeRequest(std::span(rec).first(n)); }, ErrorCode::ProtocolError,
                "status request");
  }
  Bytes longer = rec;
  longer.push_back(0);
  expectError([&] { decodeRequest(longer); }, ErrorCode::ProtocolError, "trailing");
  for (uint8_t t : {0, 5, 255}) {
    Bytes bad = rec;
    bad[wire::kRecordHeaderSize] = t;
    expectError([&] { decodeRequest(bad); }, ErrorCode::ProtocolError,
                "unknown type " + std::to_string(t));
  }
  wire::Writer body;
  body.u8(1).u64(42);
  expectError([&] { decodeRequest(wire::encodeRecord(kAnswerKind, 1, body.data())); },
              ErrorCode::ProtocolError, "unexpected record kind");
  expectError([&] { decodeRequest(wire::encodeRecord(kRequestKind, 2, body.data())); },
              ErrorCode::ProtocolError, "unknown version 2");
  expectError([&] { decodeRequest(wire::encodeRecord(kRequestKind, 0, body.data())); },
              ErrorCode::ProtocolError, "version");
  // A body over the request limit is refused from its header, before it is read.
  expectError([&] { decodeRequest(wire::encodeRecord(kRequestKind, 1, Bytes(kMaxRequest + 1))); },
              ErrorCode::ProtocolError, "status request");
  // Another process's record kinds are not status requests.
  expectError([&] { decodeRequest(encodeReply({})); }, ErrorCode::ProtocolError,
              "unexpected record kind");
}

// ---- reply ----

BOOST_AUTO_TEST_CASE(reply_round_trip_states_and_calls) {
  Reply rep;
  CallReport a = call("communicator 0", "allReduce", 41, 2);
  a.failed = true;
  CallReport b = call("bootstrap", "barrier", 3);
  b.seconds = -0.0;
  b.waitingSeconds = std::numeric_limits<double>::quiet_NaN();
  rep.reports = {state(1, 4, {a, b}), state(3, 4)};
  Bytes rec = encodeReply(rep);
  BOOST_TEST(wire::loadLe<uint16_t>(rec.data() + 6) == kAnswerKind);
  Reply back = decodeReply(rec);
  BOOST_TEST(back.error.empty());
  BOOST_TEST(back.text.empty());
  BOOST_TEST_REQUIRE(back.reports.size() == 2u);
  BOOST_TEST(sameState(back.reports[0], rep.reports[0]));
  BOOST_TEST(sameState(back.reports[1], rep.reports[1]));
  BOOST_TEST(std::signbit(back.reports[0].calls[1].seconds));
  BOOST_TEST(std::isnan(back.reports[0].calls[1].waitingSeconds));
  BOOST_TEST(encodeReply(back) == rec);
}

BOOST_AUTO_TEST_CASE(reply_round_trip_text_and_error) {
  Reply text;
  text.reports = {state(0, 2)};
  text.text = "job 0000000000000abc: 2 ranks\nverdict: every rank answered\n";
  Reply back = decodeReply(encodeReply(text));
  BOOST_TEST(back.text == text.text);
  BOOST_TEST_REQUIRE(back.reports.size() == 1u);
  BOOST_TEST(sameState(back.reports[0], text.reports[0]));

  Reply error;
  error.error = "this process (pid 7) has no job 0000000000000001";
  back = decodeReply(encodeReply(error));
  BOOST_TEST(back.error == error.error);
  BOOST_TEST(back.reports.empty());
}

BOOST_AUTO_TEST_CASE(reply_encoder_cuts_to_the_decoder_limits) {
  Reply rep;
  RankReport s = state(0, 2);
  s.host = std::string(300, 'h');
  for (int i = 0; i < 20; ++i) {
    CallReport c = call(std::string(100, 'd'), std::string(100, 'o'), 1, 1);
    c.detail = std::string(300, 'x');
    s.calls.push_back(c);
  }
  rep.reports = {s};
  rep.error = std::string(kMaxError + 10, 'e');
  Reply back = decodeReply(encodeReply(rep));
  BOOST_TEST(back.error.size() == kMaxError);
  BOOST_TEST_REQUIRE(back.reports.size() == 1u);
  BOOST_TEST(back.reports[0].host.size() == kMaxHost);
  BOOST_TEST(back.reports[0].calls.size() == kMaxCallsReported);
  BOOST_TEST(back.reports[0].calls[0].domain.size() == kMaxDomain);
  BOOST_TEST(back.reports[0].calls[0].op.size() == kMaxOp);
  BOOST_TEST(back.reports[0].calls[0].detail.size() == kMaxDetail);

  Reply many;
  many.reports.assign(kMaxReports + 3, state(0, 2));
  BOOST_TEST(decodeReply(encodeReply(many)).reports.size() == kMaxReports);
}

BOOST_AUTO_TEST_CASE(reply_rejections) {
  Reply rep;
  rep.reports = {state(1, 4, {call("communicator 0", "allReduce", 41, 2)})};
  rep.text = "t";
  const Bytes rec = encodeReply(rep);
  for (size_t n = 0; n < rec.size(); ++n) {
    expectError([&] { decodeReply(std::span(rec).first(n)); }, ErrorCode::ProtocolError,
                "status reply");
  }
  Bytes longer = rec;
  longer.push_back(0);
  expectError([&] { decodeReply(longer); }, ErrorCode::ProtocolError, "trailing");
  expectError([&] { decodeReply(encodeRequest({})); }, ErrorCode::ProtocolError,
              "unexpected record kind");

  wire::Writer ok;
  ok.str("").str("").u32(1);
  writeReport(ok, 1);
  BOOST_TEST(decodeReply(replyRecord(ok)).reports.size() == 1u);
  expectError([&] { decodeReply(replyRecord(ok, 2)); }, ErrorCode::ProtocolError,
              "unknown version 2");

  wire::Writer calls;
  calls.str("").str("").u32(1);
  writeReport(calls, kMaxCallsReported + 1);
  expectError([&] { decodeReply(replyRecord(calls)); }, ErrorCode::ProtocolError, "17 calls");

  wire::Writer states;
  states.str("").str("").u32(kMaxReports + 1);
  expectError([&] { decodeReply(replyRecord(states)); }, ErrorCode::ProtocolError,
              std::to_string(kMaxReports + 1) + " rank reports");

  wire::Writer failed;
  failed.str("").str("").u32(1);
  writeReport(failed, 1, 2);
  expectError([&] { decodeReply(replyRecord(failed)); }, ErrorCode::ProtocolError, "'failed' is 2");

  wire::Writer host;
  host.str("").str("").u32(1);
  writeReport(host, 0, 0, std::string(kMaxHost + 1, 'h'));
  expectError([&] { decodeReply(replyRecord(host)); }, ErrorCode::ProtocolError, "'host'");

  wire::Writer error;
  error.str(std::string(kMaxError + 1, 'e')).str("").u32(0);
  expectError([&] { decodeReply(replyRecord(error)); }, ErrorCode::ProtocolError, "'error'");

  // A state count that the body cannot hold is refused when the body runs out, not allocated.
  wire::Writer lying;
  lying.str("").str("").u32(kMaxReports);
  expectError([&] { decodeReply(replyRecord(lying)); }, ErrorCode::ProtocolError, "truncated");
}

// ---- exchange ----

BOOST_AUTO_TEST_CASE(exchange_round_trip_in_its_slot) {
  Exchange x{0x5eed, std::string(48, 'f'), {"127.0.0.1:40123", "node17", 4242}};
  Bytes slot = encodeExchange(x);
  BOOST_TEST(slot.size() == kExchangeSlot);
  BOOST_TEST(wire::loadLe<uint16_t>(slot.data() + 6) == kExchangeKind);
  Exchange back = decodeExchange(slot, 0);
  BOOST_TEST(back.jobId == x.jobId);
  BOOST_TEST(back.secret == x.secret);
  BOOST_TEST(back.peer.address == x.peer.address);
  BOOST_TEST(back.peer.host == x.peer.host);
  BOOST_TEST(back.peer.pid == x.peer.pid);
  // The padding after the record is not read.
  slot.back() = 0x55;
  BOOST_TEST(decodeExchange(slot, 0).peer.pid == 4242);
  // Other ranks send no secret.
  BOOST_TEST(decodeExchange(encodeExchange({1, "", {"", "h", 1}}), 3).secret.empty());
}

BOOST_AUTO_TEST_CASE(exchange_encoder_limits) {
  Exchange x{1, "", {"127.0.0.1:1", std::string(300, 'h'), 1}};
  BOOST_TEST(decodeExchange(encodeExchange(x), 0).peer.host.size() == kExchangeHost);
  Exchange big{1,
               std::string(kMaxExchangeSecret, 's'),
               {std::string(kMaxExchangeAddress, 'a'), std::string(kExchangeHost, 'h'), 1}};
  BOOST_TEST(decodeExchange(encodeExchange(big), 0).secret.size() == kMaxExchangeSecret);
  big.secret += 's';
  expectError([&] { encodeExchange(big); }, ErrorCode::Internal, "secret");
}

BOOST_AUTO_TEST_CASE(exchange_rejections_name_the_rank) {
  const Bytes slot = encodeExchange({1, "", {"127.0.0.1:1", "h", 7}});
  expectError([&] { decodeExchange(std::span(slot).first(11), 5); }, ErrorCode::ProtocolError,
              "rank 5");
  // The record kind and version are checked (decodeExchange once passed the kind as the maximum
  // version: any kind and versions up to 62, its kind number then, were taken).
  for (uint16_t kind : {uint16_t(0), kAnswerKind, uint16_t(84), uint16_t(0xdd)}) {
    Bytes bad = slot;
    wire::storeLe<uint16_t>(bad.data() + 6, kind);
    Error e = expectError([&] { decodeExchange(bad, 5); }, ErrorCode::ProtocolError, "record kind");
    BOOST_TEST(e.peer() == 5);
  }
  for (uint16_t version : {uint16_t(0), uint16_t(2), uint16_t(3), uint16_t(62)}) {
    Bytes bad = slot;
    wire::storeLe<uint16_t>(bad.data() + 4, version);
    expectError([&] { decodeExchange(bad, 5); }, ErrorCode::ProtocolError, "version");
  }
  Bytes magic = slot;
  magic[0] = 'X';
  expectError([&] { decodeExchange(magic, 5); }, ErrorCode::ProtocolError, "rank 5");
  // A length past the slot (the allGather's 512 bytes, or a shorter span).
  Bytes past = slot;
  wire::storeLe<uint32_t>(past.data() + 8, kExchangeSlot);
  expectError([&] { decodeExchange(past, 5); }, ErrorCode::ProtocolError, "rank 5");
  Error e = expectError([&] { decodeExchange(std::span(slot).first(20), 5); },
                        ErrorCode::ProtocolError, "the slot holds 8");
  BOOST_TEST(e.peer() == 5);
  // A field over its limit, and a body with bytes after the last field.
  auto forged = [](const std::string& secret, const std::string& host, bool extra) {
    wire::Writer w;
    w.u64(1).str(secret).str("127.0.0.1:1").str(host).i32(7);
    if (extra) w.u8(0);
    Bytes rec = wire::encodeRecord(kExchangeKind, kWatchVersion, w.data());
    rec.resize(kExchangeSlot, 0);
    return rec;
  };
  expectError([&] { decodeExchange(forged(std::string(129, 's'), "h", false), 5); },
              ErrorCode::ProtocolError, "'secret'");
  expectError([&] { decodeExchange(forged("", std::string(kExchangeHost + 1, 'h'), false), 5); },
              ErrorCode::ProtocolError, "'host'");
  expectError([&] { decodeExchange(forged("", "h", true), 5); }, ErrorCode::ProtocolError,
              "rank 5");
}
