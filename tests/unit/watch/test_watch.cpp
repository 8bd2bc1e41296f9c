// The status service's records (watch/codec.hpp: request, reply, exchange) without
// sockets, the analysis of the peers' answers and its texts (through watch/testing.hpp),
// and attachWatch() over an in-process bootstrap. The service over sockets is exercised by the
// stress suite (stress-watch-*) and the fuzz target fuzz-watch.
#define BOOST_TEST_MODULE watch
#include <boost/test/unit_test.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include <strata/bootstrap.hpp>
#include <strata/config.hpp>
#include <strata/error.hpp>

#include "base/wire.hpp"
#include "bootstrap/watched.hpp"
#include "launch/contract.hpp"
#include "watch/codec.hpp"
#include "watch/testing.hpp"
#include "watch/watch.hpp"

using namespace strata;
using namespace strata::watch;
using strata::bootstrap::attachWatch;
using strata::bootstrap::scopeOf;
using strata::bootstrap::unwrap;

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

CallReport call(std::string domain, std::string op, uint64_t seq, int32_t waitingFor = -1) {
  CallReport c;
  c.domain = std::move(domain);
  c.op = std::move(op);
  c.seq = seq;
  c.seconds = 5.5;
  c.waitingFor = waitingFor;
  if (waitingFor >= 0) {
    c.waitingSeconds = 5.0;
    c.detail = "0 of 3 pieces from it received";
  }
  return c;
}

RankReport state(int rank, int size, std::vector<CallReport> calls = {}) {
  RankReport s;
  s.rank = rank;
  s.size = size;
  s.pid = 100 + rank;
  s.host = "h" + std::to_string(rank);
  s.jobId = 0xabc;
  s.calls = std::move(calls);
  return s;
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
    Request q{type, 0x0123456789abcdefull};
    Bytes rec = encodeRequest(q);
    BOOST_TEST(rec.size() == wire::kRecordHeaderSize + 9);
    BOOST_TEST(wire::loadLe<uint16_t>(rec.data() + 6) == kRequestKind);
    Request back = decodeRequest(rec);
    BOOST_TEST(static_cast<int>(back.type) == static_cast<int>(type));
    BOOST_TEST(back.jobId == q.jobId);
    BOOST_TEST(encodeRequest(back) == rec);
  }
}

BOOST_AUTO_TEST_CASE(request_rejections) {
  const Bytes rec = encodeRequest({RequestType::Status, 42});
  for (size_t n = 0; n < rec.size(); ++n) {
    expectError([&] { decodeRequest(std::span(rec).first(n)); }, ErrorCode::ProtocolError,
                "status request");
  }
  Bytes longer = rec;
  longer.push_back(0);
  expectError([&] { decodeRequest(longer); }, ErrorCode::ProtocolError, "trailing");
  for (uint8_t t : {0, 4, 255}) {
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

// ---- attachWatch: the exchange over an in-process bootstrap ----

namespace {

/// Rank 0 of `size`; allGather gives every other rank a copy of rank 0's slot.
class FakeBootstrap final : public Bootstrap {
 public:
  explicit FakeBootstrap(int size) : size_(size) {}
  std::string_view backend() const noexcept override { return "fake"; }
  int rank() const noexcept override { return 0; }
  int size() const noexcept override { return size_; }
  int localRank() const noexcept override { return 0; }
  int localSize() const noexcept override { return size_; }
  void send(int, int, const void*, size_t) override {}
  void recv(int, int, void*, size_t) override {}
  void allGather(void* data, size_t bytesPerRank) override {
    auto* p = static_cast<uint8_t*>(data);
    for (int r = 1; r < size_; ++r) std::memcpy(p + bytesPerRank * r, p, bytesPerRank);
  }
  void broadcast(void*, size_t, int) override {}
  void barrier() override {}
  void abort(std::string_view) noexcept override {}

 private:
  int size_;
};

Config localConfig() {
  Config c = Config::load();
  c.set("bootstrap.tcp.interface", "lo");
  return c;
}

}  // namespace

BOOST_AUTO_TEST_CASE(attach_with_a_job_secret_longer_than_the_record_holds) {
  // The job secret has no length limit (STRATA_SECRET, bootstrap.secret_file). Rank 0 once sent
  // it in its exchange record: over 128 bytes every rank refused rank 0's record and the job
  // could not start. Now only a secret rank 0 made is sent.
  for (size_t n : {size_t(48), size_t(129), size_t(600)}) {
    BOOST_TEST_CONTEXT("secret of " << n << " bytes") {
      LaunchInfo launch;
      launch.secret = std::string(n, 's');
      auto b = attachWatch(std::make_unique<FakeBootstrap>(2), localConfig(), launch);
      BOOST_TEST(scopeOf(b.get()) != nullptr);
      BOOST_TEST(&unwrap(*b) != b.get());
    }
  }
  auto b = attachWatch(std::make_unique<FakeBootstrap>(3), localConfig(), LaunchInfo{});
  BOOST_TEST(scopeOf(b.get()) != nullptr);
}

// ---- analysis ----

BOOST_AUTO_TEST_CASE(rank_list_formatting) {
  using testing::rankList;
  BOOST_TEST(rankList({}) == "");
  BOOST_TEST(rankList({3}) == "3");
  BOOST_TEST(rankList({1, 0}) == "0, 1");
  BOOST_TEST(rankList({2, 0, 1}) == "0-2");
  BOOST_TEST(rankList({0, 1, 3}) == "0, 1, 3");
  BOOST_TEST(rankList({10, 9, 8, 7, 5, 2, 1, 0}) == "0-2, 5, 7-10");
  std::vector<int> even;
  for (int r = 0; r < 30; r += 2) even.push_back(r);  // 15 groups of one
  BOOST_TEST(rankList(even) == "0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22 and 3 more");
  std::vector<int> big;
  for (int r = 0; r < 1000; ++r) big.push_back(r);
  BOOST_TEST(rankList(big) == "0-999");
}

namespace {

Answer answered(RankReport s) {
  Answer a;
  a.kind = Answer::Kind::Answered;
  a.report = std::move(s);
  return a;
}

Answer silent(int rank, Answer::Kind kind, std::string error = "") {
  Answer a;
  a.kind = kind;
  a.report.rank = rank;
  a.report.host = "h" + std::to_string(rank);
  a.report.pid = 100 + rank;
  a.error = std::move(error);
  return a;
}

const CallReport kRef = call("communicator 0", "allReduce", 41);

}  // namespace

BOOST_AUTO_TEST_CASE(analysis_names_the_stopped_rank_first) {
  // The case: rank 2 stopped; 1 and 3 wait for 0, 0 waits for 2.
  std::vector<Answer> answers = {
      answered(state(0, 4, {call("communicator 0", "allReduce", 41, 2)})),
      answered(state(1, 4, {call("communicator 0", "allReduce", 41, 0)})),
      silent(2, Answer::Kind::NoAnswer),
      answered(state(3, 4, {call("communicator 0", "allReduce", 41, 0)})),
  };
  answers[3].kind = Answer::Kind::Self;
  auto f = testing::analyse(answers, kRef, 3);
  BOOST_TEST(f.culprits == std::vector<int>{2});
  BOOST_TEST(f.waiters[2] == (std::vector<int>{0, 1, 3}));
  BOOST_TEST(f.text ==
             "rank 2 on host h2 (pid 102) made no progress: it is not answering (stopped by a "
             "signal or a debugger, swapping, or starved of CPU); ranks 0, 1, 3 waited for it");
}

// A rank that got all it needed from allReduce #261 before rank 2 stopped is in #262: one call
// ahead is normal skew, not a mismatch (seen under ThreadSanitizer in the strata-perf case,
// where rank 0 was named "in allReduce #262 while ranks 1, 3 are in allReduce #261").
BOOST_AUTO_TEST_CASE(analysis_takes_a_rank_one_call_ahead_for_skew) {
  const CallReport ref = call("communicator 0", "allReduce", 261);
  std::vector<Answer> answers = {
      answered(state(0, 4, {call("communicator 0", "allReduce", 262, 2)})),
      answered(state(1, 4, {call("communicator 0", "allReduce", 261, 2)})),
      silent(2, Answer::Kind::NoAnswer),
      answered(state(3, 4, {call("communicator 0", "allReduce", 261, 2)})),
  };
  answers[1].kind = Answer::Kind::Self;
  auto f = testing::analyse(answers, ref, 1);
  BOOST_TEST(f.culprits == std::vector<int>{2});
  BOOST_TEST(f.waiters[2] == (std::vector<int>{0, 1, 3}));
  // Another operation at the same number still is a mismatch, also among skewed ranks.
  answers[0].report.calls = {call("communicator 0", "broadcast", 261, 2)};
  f = testing::analyse(answers, ref, 1);
  BOOST_TEST(f.culprits == (std::vector<int>{0, 2}));
  BOOST_TEST(f.text.find("rank 0 on host h0 (pid 100) is in broadcast #261 while ranks 1, 3 are "
                         "in allReduce #261") == 0,
             f.text);
}

BOOST_AUTO_TEST_CASE(analysis_names_a_mismatched_call) {
  std::vector<Answer> answers;
  for (int r = 0; r < 3; ++r) {
    answers.push_back(answered(state(r, 4, {call("communicator 0", "allReduce", 41, 3)})));
  }
  answers.push_back(answered(state(3, 4, {call("communicator 0", "broadcast", 41)})));
  answers[3].kind = Answer::Kind::Self;
  auto f = testing::analyse(answers, call("communicator 0", "broadcast", 41), 3);
  BOOST_TEST(f.culprits == std::vector<int>{3});
  BOOST_TEST(f.text ==
             "rank 3 (this rank) on host h3 (pid 103) is in broadcast #41 while ranks 0-2 are in "
             "allReduce #41; ranks 0-2 waited for it");
  answers[3].kind = Answer::Kind::Answered;
  answers[0].kind = Answer::Kind::Self;
  f = testing::analyse(answers, kRef, 0);
  BOOST_TEST(f.text.rfind("rank 3 on host h3 (pid 103) is in broadcast #41 while ranks 0-2 are "
                          "in allReduce #41",
                          0) == 0,
             f.text);
}

BOOST_AUTO_TEST_CASE(analysis_a_rank_behind_because_of_the_stopped_one_is_not_at_fault) {
  // Rank 2 stopped while it sent its part of allReduce #50: ranks 0, 1, 3 got it and went on to
  // #51, ranks 4 and 5 wait for it in #50 (stress-stall-allreduce-n16 named rank 4 first, as
  // "in allReduce #50 while ranks ... are in allReduce #51").
  std::vector<Answer> answers = {
      answered(state(0, 6, {call("communicator 0", "allReduce", 51, 2)})),
      answered(state(1, 6, {call("communicator 0", "allReduce", 51, 2)})),
      silent(2, Answer::Kind::NoAnswer),
      answered(state(3, 6, {call("communicator 0", "allReduce", 51, 2)})),
      answered(state(4, 6, {call("communicator 0", "allReduce", 50, 2)})),
      answered(state(5, 6, {call("communicator 0", "allReduce", 50, 4)})),  // through rank 4
  };
  for (int self : {0, 4}) {
    answers[static_cast<size_t>(self)].kind = Answer::Kind::Self;
    const uint64_t seq = self == 0 ? 51 : 50;
    auto f = testing::analyse(answers, call("communicator 0", "allReduce", seq), self);
    BOOST_TEST(f.culprits == std::vector<int>{2}, f.text);
    BOOST_TEST(f.waiters[2] == (std::vector<int>{0, 1, 3, 4, 5}), f.text);
    answers[static_cast<size_t>(self)].kind = Answer::Kind::Answered;
  }
  // A rank that skipped a call (in #51 while the others are in #50, waiting for a rank that
  // waits for it) is still named, even with a stopped rank besides.
  answers = {
      answered(state(0, 4, {call("communicator 0", "allReduce", 50, 3)})),
      answered(state(1, 4, {call("communicator 0", "allReduce", 50, 3)})),
      silent(2, Answer::Kind::NoAnswer),
      answered(state(3, 4, {call("communicator 0", "allReduce", 51, 0)})),
  };
  answers[0].kind = Answer::Kind::Self;
  auto f = testing::analyse(answers, call("communicator 0", "allReduce", 50), 0);
  BOOST_TEST(f.culprits == (std::vector<int>{3, 2}), f.text);
  BOOST_TEST(f.text.rfind("rank 3 on host h3 (pid 103) is in allReduce #51 while ranks 0, 1 are "
                          "in allReduce #50",
                          0) == 0,
             f.text);
}

BOOST_AUTO_TEST_CASE(analysis_orders_culprits_and_skips_failed_answers) {
  // Rank 1 exited, rank 2 is not answering, rank 3's answer could not be read, rank 4 is in
  // no call, rank 5 is in another domain's call.
  std::vector<Answer> answers = {
      answered(state(0, 6, {call("communicator 0", "allReduce", 41, 1)})),
      silent(1, Answer::Kind::Exited),
      silent(2, Answer::Kind::NoAnswer),
      silent(3, Answer::Kind::Failed, "bad reply"),
      answered(state(4, 6)),
      answered(state(5, 6, {call("bootstrap", "barrier", 7)})),
  };
  answers[0].kind = Answer::Kind::Self;
  auto f = testing::analyse(answers, kRef, 0);
  // Not answering first, then the ranks elsewhere, then the exited one.
  BOOST_TEST(f.culprits == (std::vector<int>{2, 4, 5, 1}));
  BOOST_TEST(f.waiters[1] == std::vector<int>{0});
  BOOST_TEST(f.text.find("rank 4 on host h4 (pid 104) is in no strata call") != std::string::npos,
             f.text);
  BOOST_TEST(f.text.find("rank 5 on host h5 (pid 105) is in bootstrap barrier #7 while this rank "
                         "is in allReduce #41") != std::string::npos,
             f.text);
  BOOST_TEST(f.text.find("; and 0 more") == std::string::npos);
}

BOOST_AUTO_TEST_CASE(analysis_of_answers_from_a_confused_peer) {
  // Waits for ranks that do not exist, or in a cycle, lead nowhere and do not crash.
  std::vector<Answer> answers = {
      answered(state(0, 3, {call("communicator 0", "allReduce", 41, 99)})),
      answered(state(1, 3, {call("communicator 0", "allReduce", 41, -7)})),
      answered(state(2, 3, {call("communicator 0", "allReduce", 41, 2)})),
  };
  auto f = testing::analyse(answers, kRef, 0);
  BOOST_TEST(f.culprits.empty());
  BOOST_TEST(f.waiters.empty());
  answers = {answered(state(0, 2, {call("communicator 0", "allReduce", 41, 1)})),
             answered(state(1, 2, {call("communicator 0", "allReduce", 41, 0)}))};
  BOOST_TEST(testing::analyse(answers, kRef, 0).culprits.empty());
}

BOOST_AUTO_TEST_CASE(analysis_text_shows_at_most_four_culprits) {
  std::vector<Answer> answers = {answered(state(0, 7, {call("communicator 0", "allReduce", 41)}))};
  for (int r = 1; r < 7; ++r) answers.push_back(silent(r, Answer::Kind::NoAnswer));
  auto f = testing::analyse(answers, kRef, 0);
  BOOST_TEST(f.culprits.size() == 6u);
  BOOST_TEST(f.text.find("; and 2 more rank(s) at fault") != std::string::npos, f.text);
}

BOOST_AUTO_TEST_CASE(describe_a_healthy_and_a_stalled_job) {
  std::vector<Answer> healthy = {
      answered(state(0, 2, {call("communicator 0", "allReduce", 5)})),
      answered(state(1, 2, {call("communicator 0", "allReduce", 5, 0)})),
  };
  healthy[0].kind = Answer::Kind::Self;
  std::string text = testing::describe(0xabc, 0, healthy);
  BOOST_TEST(text.rfind("job 0000000000000abc: 2 ranks, asked from rank 0\n", 0) == 0, text);
  BOOST_TEST(
      text.find("rank    1  h1  pid 101  communicator 0 allReduce #5 for 5.5 s, waiting "
                "for rank 0 for 5.0 s (0 of 3 pieces from it received)") != std::string::npos,
      text);
  BOOST_TEST(text.find("verdict: every rank answered; the ranks in a call are in communicator 0 "
                       "allReduce #5 (nobody is stopped or in another call)") != std::string::npos,
             text);

  std::vector<Answer> idle = {answered(state(0, 2)), answered(state(1, 2))};
  BOOST_TEST(testing::describe(1, 0, idle)
                 .find("verdict: every rank answered; none is in a strata call") !=
             std::string::npos);

  std::vector<Answer> stalled = {
      answered(state(0, 3, {call("communicator 0", "allReduce", 41, 2)})),
      answered(state(1, 3, {call("communicator 0", "allReduce", 41, 0)})),
      silent(2, Answer::Kind::NoAnswer),
  };
  text = testing::describe(0xabc, 0, stalled);
  BOOST_TEST(text.find("rank    2  h2  pid 102  NOT ANSWERING") != std::string::npos, text);
  BOOST_TEST(
      text.find("verdict: rank 2 on host h2 (pid 102) made no progress") != std::string::npos,
      text);
  BOOST_TEST(text.find("ranks 0, 1 waited for it") != std::string::npos, text);
}

// ---- the service, in this process ----

// The status service answers (status, list, dump) while another thread enters and leaves calls
// and changes what it waits for; run under ThreadSanitizer as well (docs/testing.md).
BOOST_AUTO_TEST_CASE(service_answers_while_calls_change) {
  auto b = attachWatch(std::make_unique<FakeBootstrap>(2), localConfig(), LaunchInfo{});
  auto scope = scopeOf(b.get());
  BOOST_REQUIRE(scope != nullptr);
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> calls{0};
  std::thread worker([&] {
    for (uint64_t i = 1; !stop; ++i) {
      Call c(scope, "communicator 0", "allReduce", i);
      for (int k = 0; k < 200; ++k) {
        waitingFor(1, k % 2 ? "0 of 2 pieces from it received" : "1 of 2 pieces from it");
        waitingFor(1, "1 of 2 pieces from it received", std::chrono::steady_clock::now());
        progressed();
      }
      ++calls;
    }
  });
  const int32_t pid = static_cast<int32_t>(::getpid());
  uint64_t jobId = 0;
  int seenWaiting = 0;  // answers caught while the worker waited (the racy moments)
  for (int i = 0; i < 200; ++i) {
    Reply list = askLocal(pid, {RequestType::List, 0}, 5);
    BOOST_REQUIRE(list.error.empty());
    BOOST_REQUIRE(!list.reports.empty());
    jobId = list.reports.front().jobId;
    Reply st = askLocal(pid, {RequestType::Status, jobId}, 5);
    BOOST_REQUIRE(st.reports.size() == 1u);
    BOOST_TEST(st.reports.front().rank == 0);
    for (const auto& c : st.reports.front().calls) {
      BOOST_TEST(c.op == "allReduce");
      BOOST_TEST((c.waitingFor == -1 || c.waitingFor == 1));
      if (c.waitingFor == 1) ++seenWaiting;
    }
  }
  Reply dump = askLocal(pid, {RequestType::Dump, jobId}, 10);
  BOOST_TEST(dump.error.empty(), dump.error);
  BOOST_TEST(dump.text.find("2 ranks, asked from rank 0") != std::string::npos, dump.text);
  Reply none = askLocal(pid, {RequestType::Status, jobId + 1}, 5);
  BOOST_TEST(none.error.find("has no job") != std::string::npos, none.error);
  stop = true;
  worker.join();
  BOOST_TEST(calls > 0u);
  BOOST_TEST_MESSAGE("worker calls " << calls << ", answers showing a wait " << seenWaiting);
  b.reset();
  // The last scope closed: the service thread and its socket are gone.
  BOOST_CHECK_THROW(askLocal(pid, {RequestType::List, 0}, 1), Error);
}

// A process that forks while its status service runs (a PyTorch DataLoader worker, a test
// that forks a stand-in rank): the child starts a service of its own for a bootstrap it creates,
// and destroying what it inherited neither hangs nor touches the parent's.
BOOST_AUTO_TEST_CASE(a_forked_child_runs_its_own_service) {
#if defined(__SANITIZE_THREAD__)
  // ThreadSanitizer cannot start threads in the child of a multi-threaded fork.
  BOOST_TEST_MESSAGE("skipped under ThreadSanitizer (no threads after a multi-threaded fork)");
  return;
#endif
  auto parent = attachWatch(std::make_unique<FakeBootstrap>(2), localConfig(), LaunchInfo{});
  BOOST_REQUIRE(scopeOf(parent.get()) != nullptr);
  std::fflush(nullptr);
  pid_t child = ::fork();
  BOOST_REQUIRE(child >= 0);
  if (child == 0) {
    int rc = 0;
    try {
      auto own = attachWatch(std::make_unique<FakeBootstrap>(2), localConfig(), LaunchInfo{});
      Reply r = askLocal(static_cast<int32_t>(::getpid()), {RequestType::List, 0}, 5);
      if (r.reports.size() != 1) rc = 2;
      own.reset();
      parent.reset();  // inherited: must not wait for the parent's thread
    } catch (...) {
      rc = 3;
    }
    ::_exit(rc);
  }
  int status = 0;
  while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  BOOST_TEST((WIFEXITED(status) && WEXITSTATUS(status) == 0), "child status " << status);
  Reply mine = askLocal(static_cast<int32_t>(::getpid()), {RequestType::List, 0}, 5);
  BOOST_TEST(mine.reports.size() == 1u);
}
