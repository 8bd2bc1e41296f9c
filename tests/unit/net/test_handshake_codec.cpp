// The handshake records and checks without sockets (lib/net/handshake_codec.cpp). The main of
// the module `handshake`; test_handshake.cpp runs the engines over sockets.
#define BOOST_TEST_MODULE handshake
#include <boost/test/unit_test.hpp>

#include <string>
#include <vector>

#include <strata/error.hpp>

#include "base/wire.hpp"
#include "net/handshake_codec.hpp"

using namespace strata;
using namespace strata::handshake;

namespace {

template <typename Fn>
void expectError(Fn&& fn, ErrorCode code, const std::string& fragment) {
  try {
    fn();
    BOOST_FAIL("no error thrown, expected: " << fragment);
  } catch (const Error& e) {
    BOOST_TEST(static_cast<int>(e.code()) == static_cast<int>(code));
    BOOST_TEST(std::string(e.what()).find(fragment) != std::string::npos, e.what());
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(records_round_trip_with_documented_sizes) {
  auto c = makeChallenge(Purpose::Mesh, 3);
  auto rec = encode(c);
  BOOST_TEST(rec.size() == wire::kRecordHeaderSize + kChallengeBody);
  auto c2 = decodeChallenge(rec, "test");
  BOOST_TEST((c2.purpose == Purpose::Mesh));
  BOOST_TEST(c2.listenerRank == 3);
  BOOST_TEST((c2.nonceL == c.nonceL));

  auto a = makeAuth("secret", c, 1, 4);
  rec = encode(a);
  BOOST_TEST(rec.size() == wire::kRecordHeaderSize + kAuthBody);
  auto a2 = decodeAuth(rec, "test");
  BOOST_TEST(a2.rank == 1);
  BOOST_TEST(a2.size == 4);
  BOOST_TEST((a2.nonceC == a.nonceC && a2.mac == a.mac));

  Result r{false, {}, std::string(2000, 'x')};
  auto r2 = decodeResult(encode(r), "test");
  BOOST_TEST(!r2.ok);
  BOOST_TEST(r2.reason.size() == kMaxReason);
}

BOOST_AUTO_TEST_CASE(accepted_handshake_proves_both_sides) {
  auto c = makeChallenge(Purpose::Rendezvous, 0);
  auto a = decodeAuth(encode(makeAuth("s3cret", decodeChallenge(encode(c), "t"), 2, 4)), "t");
  BOOST_TEST(checkAuth(a, "s3cret", c, 4) == "");
  auto result = decodeResult(encode(acceptResult("s3cret", c, a)), "t");
  BOOST_CHECK_NO_THROW(checkResult(result, "s3cret", c, a, "t"));
}

BOOST_AUTO_TEST_CASE(listener_refuses_bad_auth) {
  auto c = makeChallenge(Purpose::Mesh, 1);
  BOOST_TEST(checkAuth(makeAuth("other", c, 0, 4), "s", c, 4).find("failed authentication") == 0u);
  BOOST_TEST(checkAuth(makeAuth("s", c, 0, 5), "s", c, 4).find("job of 5 ranks") !=
             std::string::npos);
  BOOST_TEST(checkAuth(makeAuth("s", c, 4, 4), "s", c, 4) == "claims an invalid rank 4");
  // A mesh peer never connects to itself.
  BOOST_TEST(checkAuth(makeAuth("s", c, 1, 4), "s", c, 4) == "claims an invalid rank 1");
  auto wrongPurpose = makeAuth("s", c, 0, 4);
  wrongPurpose.purpose = Purpose::Rendezvous;
  BOOST_TEST(checkAuth(wrongPurpose, "s", c, 4).find("failed authentication") == 0u);
}

BOOST_AUTO_TEST_CASE(connector_checks_challenge_and_result) {
  auto c = makeChallenge(Purpose::Mesh, 2);
  expectError([&] { checkChallenge(c, Purpose::Rendezvous, -1, "dial"); }, ErrorCode::ProtocolError,
              "dial: the listener serves peer connections");
  expectError([&] { checkChallenge(c, Purpose::Mesh, 3, "dial"); }, ErrorCode::ProtocolError,
              "reached rank 2 but expected rank 3");
  BOOST_CHECK_NO_THROW(checkChallenge(c, Purpose::Mesh, -1, "dial"));
  auto a = makeAuth("s", c, 0, 4);
  expectError(
      [&] {
        checkResult(Result{false, {}, "go away"}, "s", c, a, "dial");
      },
      ErrorCode::AuthFailed, "dial: rank 2 refused the connection: go away");
  expectError([&] { checkResult(acceptResult("other", c, a), "s", c, a, "dial"); },
              ErrorCode::AuthFailed, "could not prove the job secret");
}

BOOST_AUTO_TEST_CASE(decoders_reject_garbage) {
  auto c = encode(makeChallenge(Purpose::Mesh, 0));
  expectError([&] { decodeAuth(c, "hs"); }, ErrorCode::ProtocolError, "hs");
  auto truncated = c;
  truncated.pop_back();
  expectError([&] { decodeChallenge(truncated, "hs"); }, ErrorCode::ProtocolError, "hs");
  std::vector<uint8_t> garbage(40, 'G');
  expectError([&] { decodeResult(garbage, "hs"); }, ErrorCode::ProtocolError, "bad magic");
}
