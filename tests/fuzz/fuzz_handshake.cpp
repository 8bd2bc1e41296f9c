// libFuzzer target for the connection handshake's records (lib/net/handshake_codec.cpp): the
// input is tried as CHALLENGE (what a connector reads from a listener), AUTH (what a listener
// reads from a connector) and RESULT / REJECT (what a connector reads back). Checked:
//   * a decoder refuses only with Error(ProtocolError);
//   * what decodes encodes back to the same bytes (RESULT: the same fields, and the same bytes
//     when the ok byte is 0 or 1);
//   * the checks that follow a decode in handshake.cpp: a decoded challenge can be answered and
//     the answer verifies; a decoded AUTH is accepted only with a valid proof of the fuzz secret
//     for the fixed challenge, a rank in range and the job's size; a decoded RESULT passes
//     checkResult only when it accepts with the listener's proof, else AuthFailed.
#include <cstring>

#include "base/wire.hpp"
#include "fuzz_common.hpp"
#include "net/handshake_codec.hpp"

namespace hs = strata::handshake;
using strata::Error;
using strata::ErrorCode;

namespace {

constexpr std::string_view kSecret = "fuzz-secret";
constexpr int kSize = 4;

// The fixed exchange the seeds were made from (tests/fuzz/make_corpus.cpp): the listener is
// rank 1 of 4 serving mesh connections; the connector is rank 2.
hs::Challenge fixedChallenge() {
  hs::Challenge c;
  c.purpose = hs::Purpose::Mesh;
  c.listenerRank = 1;
  for (size_t i = 0; i < c.nonceL.size(); ++i) c.nonceL[i] = static_cast<uint8_t>(i);
  return c;
}

hs::Auth fixedAuth() {
  hs::Auth a;
  a.purpose = hs::Purpose::Mesh;
  a.rank = 2;
  a.size = kSize;
  for (size_t i = 0; i < a.nonceC.size(); ++i) a.nonceC[i] = static_cast<uint8_t>(0x80 + i);
  hs::Challenge c = fixedChallenge();
  a.mac =
      hs::authMac(kSecret, 'C', c.purpose, c.nonceL, a.nonceC, a.rank, a.size, c.listenerRank, 0);
  return a;
}

void challenge(std::span<const uint8_t> in) {
  hs::Challenge c;
  try {
    c = hs::decodeChallenge(in, "fuzz");
  } catch (const Error& e) {
    fuzz::expectCode(e, ErrorCode::ProtocolError);
    return;
  }
  FUZZ_CHECK(fuzz::same(hs::encode(c), in));
  try {
    hs::checkChallenge(c, hs::Purpose::Mesh, 1, "fuzz");
    FUZZ_CHECK(c.purpose == hs::Purpose::Mesh && c.listenerRank == 1);
  } catch (const Error& e) {
    fuzz::expectCode(e, ErrorCode::ProtocolError);
  }
  // The connector answers whatever challenge it read; its own answer must verify.
  hs::Auth a = hs::makeAuth(kSecret, c, 2, kSize);
  std::string why = hs::checkAuth(a, kSecret, c, kSize);
  bool selfConnect = c.purpose == hs::Purpose::Mesh && c.listenerRank == 2;
  FUZZ_CHECK(why.empty() != selfConnect);
  if (why.empty()) hs::checkResult(hs::acceptResult(kSecret, c, a), kSecret, c, a, "fuzz");
}

void auth(std::span<const uint8_t> in) {
  hs::Auth a;
  try {
    a = hs::decodeAuth(in, "fuzz");
  } catch (const Error& e) {
    fuzz::expectCode(e, ErrorCode::ProtocolError);
    return;
  }
  FUZZ_CHECK(fuzz::same(hs::encode(a), in));
  hs::Challenge c = fixedChallenge();
  std::string why = hs::checkAuth(a, kSecret, c, kSize);
  if (why.empty()) {
    // Only a proof made with the secret for this challenge gets in (the seed's, or a forgery).
    auto expect =
        hs::authMac(kSecret, 'C', c.purpose, c.nonceL, a.nonceC, a.rank, a.size, c.listenerRank, 0);
    FUZZ_CHECK(expect == a.mac && a.purpose == c.purpose);
    FUZZ_CHECK(a.size == kSize && a.rank >= 0 && a.rank < kSize && a.rank != c.listenerRank);
    hs::Result r = hs::acceptResult(kSecret, c, a);
    hs::checkResult(hs::decodeResult(hs::encode(r), "fuzz"), kSecret, c, a, "fuzz");
  }
}

void result(std::span<const uint8_t> in) {
  hs::Result r;
  try {
    r = hs::decodeResult(in, "fuzz");
  } catch (const Error& e) {
    fuzz::expectCode(e, ErrorCode::ProtocolError);
    return;
  }
  FUZZ_CHECK(r.reason.size() <= hs::kMaxReason);
  auto again = hs::encode(r);
  hs::Result r2 = hs::decodeResult(again, "fuzz");
  FUZZ_CHECK(r2.ok == r.ok && r2.mac == r.mac && r2.reason == r.reason);
  if (in[strata::wire::kRecordHeaderSize] <= 1) FUZZ_CHECK(fuzz::same(again, in));
  hs::Challenge c = fixedChallenge();
  hs::Auth a = fixedAuth();
  try {
    hs::checkResult(r, kSecret, c, a, "fuzz");
    FUZZ_CHECK(r.ok && r.mac == hs::acceptResult(kSecret, c, a).mac);
  } catch (const Error& e) {
    fuzz::expectCode(e, ErrorCode::AuthFailed);
    FUZZ_CHECK(e.peer() == c.listenerRank);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::span<const uint8_t> in(data, size);
  challenge(in);
  auth(in);
  result(in);
  return 0;
}
