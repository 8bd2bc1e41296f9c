#include "net/handshake_codec.hpp"

#include <algorithm>

#include <fmt/format.h>

#include <strata/error.hpp>

#include "base/crypto.hpp"
#include "base/wire.hpp"

namespace strata::handshake {
namespace {

std::string_view purposeName(Purpose p) {
  switch (p) {
    case Purpose::Rendezvous:
      return "rendezvous";
    case Purpose::Mesh:
      return "peer";
    case Purpose::Status:
      return "status";
  }
  return "unknown";
}

template <size_t N>
void copyRaw(std::span<const uint8_t> from, std::array<uint8_t, N>& to) {
  std::copy(from.begin(), from.end(), to.begin());
}

}  // namespace

Mac authMac(std::string_view secret, char side, Purpose purpose, const Nonce& nl, const Nonce& nc,
            int rank, int size, int listenerRank, uint8_t ok) {
  wire::Writer w;
  w.raw({reinterpret_cast<const uint8_t*>("strata-auth-v1"), 14});
  w.u8(static_cast<uint8_t>(side)).u8(static_cast<uint8_t>(purpose));
  w.raw(nl).raw(nc).i32(rank).i32(size).i32(listenerRank).u8(ok);
  return crypto::hmacSha256({reinterpret_cast<const uint8_t*>(secret.data()), secret.size()},
                            w.data());
}

std::vector<uint8_t> encode(const Challenge& c) {
  wire::Writer w;
  w.u8(static_cast<uint8_t>(c.purpose)).i32(c.listenerRank).raw(c.nonceL);
  return wire::encodeRecord(kChallengeKind, kVersion, w.data());
}

std::vector<uint8_t> encode(const Auth& a) {
  wire::Writer w;
  w.u8(static_cast<uint8_t>(a.purpose)).i32(a.rank).i32(a.size).raw(a.nonceC).raw(a.mac);
  return wire::encodeRecord(kAuthKind, kVersion, w.data());
}

std::vector<uint8_t> encode(const Result& r) {
  wire::Writer w;
  w.u8(r.ok ? 1 : 0).raw(r.mac).str(std::string_view(r.reason).substr(0, kMaxReason));
  return wire::encodeRecord(kResultKind, kVersion, w.data());
}

Challenge decodeChallenge(std::span<const uint8_t> record, std::string_view what) {
  auto d = wire::decodeRecord(record, kChallengeKind, kVersion, kMaxChallengeBody, what);
  wire::Reader r(d.body, fmt::format("{} challenge", what));
  Challenge c;
  c.purpose = static_cast<Purpose>(r.u8("purpose"));
  c.listenerRank = r.i32("listener rank");
  copyRaw(r.raw(32, "nonce"), c.nonceL);
  r.expectEnd();
  return c;
}

Auth decodeAuth(std::span<const uint8_t> record, std::string_view what) {
  auto d = wire::decodeRecord(record, kAuthKind, kVersion, kAuthBody, what);
  wire::Reader r(d.body, what);
  Auth a;
  a.purpose = static_cast<Purpose>(r.u8("purpose"));
  a.rank = r.i32("rank");
  a.size = r.i32("size");
  copyRaw(r.raw(32, "nonce"), a.nonceC);
  copyRaw(r.raw(32, "mac"), a.mac);
  r.expectEnd();
  return a;
}

Result decodeResult(std::span<const uint8_t> record, std::string_view what) {
  auto d = wire::decodeRecord(record, kResultKind, kVersion, kMaxResultBody, what);
  wire::Reader r(d.body, fmt::format("{} result", what));
  Result res;
  res.ok = r.u8("ok") != 0;
  copyRaw(r.raw(32, "mac"), res.mac);
  res.reason = r.str(kMaxReason, "reason");
  r.expectEnd();
  return res;
}

Challenge makeChallenge(Purpose purpose, int listenerRank) {
  Challenge c;
  c.purpose = purpose;
  c.listenerRank = listenerRank;
  crypto::randomBytes(c.nonceL);
  return c;
}

std::string checkAuth(const Auth& a, std::string_view secret, const Challenge& c, int size) {
  auto expect =
      authMac(secret, 'C', c.purpose, c.nonceL, a.nonceC, a.rank, a.size, c.listenerRank, 0);
  if (a.purpose != c.purpose || !crypto::equalConstantTime(expect, a.mac)) {
    return "failed authentication (wrong job secret or not a strata peer)";
  }
  // A status request may come from a tool that knows the secret but is no rank of the job.
  if (c.purpose == Purpose::Status) return {};
  if (a.size != size) {
    return fmt::format(
        "claims a job of {} ranks, this job has {} (two jobs sharing a port, or "
        "mismatched launch)",
        a.size, size);
  }
  if (a.rank < 0 || a.rank >= size || (c.purpose == Purpose::Mesh && a.rank == c.listenerRank)) {
    return fmt::format("claims an invalid rank {}", a.rank);
  }
  return {};
}

Result acceptResult(std::string_view secret, const Challenge& c, const Auth& a) {
  Result r;
  r.ok = true;
  r.mac = authMac(secret, 'S', c.purpose, c.nonceL, a.nonceC, a.rank, a.size, c.listenerRank, 1);
  return r;
}

void checkChallenge(const Challenge& c, Purpose purpose, int expectedListenerRank,
                    std::string_view what) {
  if (c.purpose != purpose) {
    throw Error(ErrorCode::ProtocolError,
                fmt::format("{}: the listener serves {} connections, expected {}", what,
                            purposeName(c.purpose), purposeName(purpose)));
  }
  if (expectedListenerRank >= 0 && c.listenerRank != expectedListenerRank) {
    throw Error(ErrorCode::ProtocolError,
                fmt::format("{}: reached rank {} but expected rank {} (stale address?)", what,
                            c.listenerRank, expectedListenerRank),
                expectedListenerRank);
  }
}

Auth makeAuth(std::string_view secret, const Challenge& c, int rank, int size) {
  Auth a;
  a.purpose = c.purpose;
  a.rank = rank;
  a.size = size;
  crypto::randomBytes(a.nonceC);
  a.mac = authMac(secret, 'C', c.purpose, c.nonceL, a.nonceC, rank, size, c.listenerRank, 0);
  return a;
}

void checkResult(const Result& r, std::string_view secret, const Challenge& c, const Auth& a,
                 std::string_view what) {
  if (!r.ok) {
    throw Error(
        ErrorCode::AuthFailed,
        fmt::format("{}: rank {} refused the connection: {}", what, c.listenerRank, r.reason),
        c.listenerRank);
  }
  auto expect =
      authMac(secret, 'S', c.purpose, c.nonceL, a.nonceC, a.rank, a.size, c.listenerRank, 1);
  if (!crypto::equalConstantTime(expect, r.mac)) {
    throw Error(ErrorCode::AuthFailed,
                fmt::format("{}: the listener could not prove the job secret (another job on "
                            "this port, or a different STRATA_SECRET)",
                            what),
                c.listenerRank);
  }
}

}  // namespace strata::handshake
