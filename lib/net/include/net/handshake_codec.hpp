#pragma once
#ifndef STRATA_INTERNAL_HEADERS
#error "net/handshake_codec.hpp is internal to strata: applications include <strata/...> only"
#endif

// The records and checks of the connection handshake (docs/wire-format.md, "Handshake"),
// without any I/O: the socket engines of handshake.hpp and the ucx backend, which carries the
// same records in UCX tag messages, both build on these.
//
//   listener -> connector  CHALLENGE {purpose, listenerRank, nonceL}
//   connector -> listener  AUTH      {purpose, rank, size, nonceC, mac_c}
//   listener -> connector  RESULT    {ok, mac_s, reason}

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <strata/export.hpp>

namespace strata::handshake {

/// Status: the status service of lib/watch (watch/watch.hpp) (any rank, or a tool, may ask).
enum class Purpose : uint8_t { Rendezvous = 1, Mesh = 2, Status = 3 };

using Nonce = std::array<uint8_t, 32>;
using Mac = std::array<uint8_t, 32>;

/// Record kinds and version (wire::encodeRecord), and the body sizes.
inline constexpr uint16_t kChallengeKind = 1;
inline constexpr uint16_t kAuthKind = 2;
inline constexpr uint16_t kResultKind = 3;
inline constexpr uint16_t kVersion = 1;
inline constexpr size_t kChallengeBody = 1 + 4 + 32;
inline constexpr size_t kMaxChallengeBody = 64;  ///< what a connector accepts to read
inline constexpr size_t kAuthBody = 1 + 4 + 4 + 32 + 32;
inline constexpr size_t kMaxReason = 512;
inline constexpr size_t kMaxResultBody = 1 + 32 + 4 + kMaxReason;

/// The proof each side sends: HMAC-SHA256(secret, "strata-auth-v1" | side | purpose | nonceL |
/// nonceC | rank | size | listenerRank | ok), side 'C' for the connector and 'S' for the listener.
STRATA_API Mac authMac(std::string_view secret, char side, Purpose purpose, const Nonce& nonceL,
                       const Nonce& nonceC, int rank, int size, int listenerRank, uint8_t ok);

struct Challenge {
  Purpose purpose = Purpose::Rendezvous;
  int32_t listenerRank = -1;
  Nonce nonceL{};
};

struct Auth {
  Purpose purpose = Purpose::Rendezvous;
  int32_t rank = -1;
  int32_t size = 0;
  Nonce nonceC{};
  Mac mac{};
};

struct Result {
  bool ok = false;
  Mac mac{};           ///< zeros when refused
  std::string reason;  ///< why it was refused (encoded cut to kMaxReason)
};

/// Whole records (header + body).
STRATA_API std::vector<uint8_t> encode(const Challenge& challenge);
STRATA_API std::vector<uint8_t> encode(const Auth& auth);
STRATA_API std::vector<uint8_t> encode(const Result& result);

/// Throw ProtocolError naming `what` for a wrong kind, version or length, truncation or
/// trailing bytes.
STRATA_API Challenge decodeChallenge(std::span<const uint8_t> record, std::string_view what);
STRATA_API Auth decodeAuth(std::span<const uint8_t> record, std::string_view what);
STRATA_API Result decodeResult(std::span<const uint8_t> record, std::string_view what);

// ---- the listener's side ----

/// A challenge with a fresh random nonce.
STRATA_API Challenge makeChallenge(Purpose purpose, int listenerRank);
/// Why `auth` is refused (wrong secret or purpose, another job size, an invalid rank), or ""
/// when it is accepted. `size` is the listener's job size.
STRATA_API std::string checkAuth(const Auth& auth, std::string_view secret,
                                 const Challenge& challenge, int size);
/// The RESULT for an accepted `auth`, with the listener's proof.
STRATA_API Result acceptResult(std::string_view secret, const Challenge& challenge,
                               const Auth& auth);

// ---- the connector's side ----

/// Throws ProtocolError naming `what` when the listener serves another purpose or is not the
/// rank expected (expectedListenerRank < 0: any).
STRATA_API void checkChallenge(const Challenge& challenge, Purpose purpose,
                               int expectedListenerRank, std::string_view what);
/// The AUTH answering `challenge` as `rank` of `size`, with a fresh random nonce.
STRATA_API Auth makeAuth(std::string_view secret, const Challenge& challenge, int rank, int size);
/// Throws AuthFailed naming `what` and the listener when it refused us or could not prove the
/// secret.
STRATA_API void checkResult(const Result& result, std::string_view secret,
                            const Challenge& challenge, const Auth& auth, std::string_view what);

}  // namespace strata::handshake
