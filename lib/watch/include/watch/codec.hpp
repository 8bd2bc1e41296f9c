#pragma once
#ifndef STRATA_INTERNAL_HEADERS
#error "watch/codec.hpp is internal to strata: applications include <strata/...> only"
#endif

// The records of the status service (watch/watch.hpp; docs/wire-format.md, "Status
// service"), without any I/O: the request a tool or a rank sends to a status port, the reply,
// and the exchange record every rank allGathers when its bootstrap is watched. service.cpp and
// ask.cpp move them over sockets and the bootstrap; tests/fuzz/fuzz_watch.cpp feeds them arbitrary
// bytes.
//
// Every decoder refuses malformed input with Error(ProtocolError) only. What a decoder accepts
// encodes back to the same bytes (the exchange record: in front of its slot's zero padding).

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <strata/export.hpp>

namespace strata::watch {

/// One call of one thread, as reported to peers and tools.
struct CallReport {
  std::string domain;         ///< "bootstrap", "communicator 0", "connection"
  std::string op;             ///< "allReduce", "allGather", "semaphore wait", ...
  uint64_t seq = 0;           ///< per domain, from 1; 0 for point-to-point calls (not matched)
  double seconds = 0;         ///< how long the call has run
  int32_t waitingFor = -1;    ///< the rank it waits for, -1 when none or not known
  double waitingSeconds = 0;  ///< how long it has waited for that rank without progress
  std::string detail;         ///< "0 of 3 pieces from it received"
  bool failed = false;        ///< the call has failed and this rank is finding out why
};

/// What one rank reports.
struct RankReport {
  int32_t rank = -1;
  int32_t size = 0;
  int32_t pid = 0;
  std::string host;
  uint64_t jobId = 0;
  std::vector<CallReport> calls;  ///< outermost first per thread
};

/// A peer's published facts (exchanged when the scope opens).
struct PeerInfo {
  std::string address;  ///< status service "host:port" ("" when the peer has none)
  std::string host;
  int32_t pid = 0;
};

// ---- record kinds and limits (docs/wire-format.md, "Status service") ----
inline constexpr uint16_t kRequestKind = 90;
inline constexpr uint16_t kAnswerKind = 91;
inline constexpr uint16_t kExchangeKind = 92;
inline constexpr uint16_t kWatchVersion = 1;

/// A request record's body (its limit; a status, list or dump request body is 9 bytes, a revoke
/// request's at most 9 + 4 + 64 + 4 + 4 + 1024 + 4 + 4 x 1024).
inline constexpr size_t kMaxRequest = 8192;
/// A revoke request's reason (bytes: the encoder cuts it, the decoder refuses longer) and
/// suspects (the encoder writes the first 1024, the decoder refuses more).
inline constexpr size_t kMaxRevokeReason = 1024;
inline constexpr size_t kMaxRevokeSuspects = 1024;
/// A whole reply record's body: a dump of a job of 100k ranks (about 200 bytes of report and of
/// text per rank) fits.
inline constexpr size_t kMaxReply = 64u << 20;
/// A peer's answer to a status request: one rank report (at most 16 calls of < 500 bytes).
inline constexpr size_t kMaxPeerReply = 64u << 10;
/// Calls per rank report: the encoder writes the first 16, the decoder refuses more.
inline constexpr size_t kMaxCallsReported = 16;
/// Rank reports per reply: the encoder writes the first 131072, the decoder refuses more.
inline constexpr size_t kMaxReports = 1u << 17;
// Text fields: the encoder cuts each to its limit (bytes), the decoder refuses longer ones.
inline constexpr size_t kMaxError = 4096;
inline constexpr size_t kMaxText = kMaxReply / 2;
inline constexpr size_t kMaxHost = 256;
inline constexpr size_t kMaxDomain = 64;
inline constexpr size_t kMaxOp = 64;
inline constexpr size_t kMaxDetail = 256;

/// Each rank's slot in the exchange allGather (the record, zero-padded).
inline constexpr size_t kExchangeSlot = 512;
/// Exchange fields: the encoder refuses a secret or an address over 128 bytes and cuts the host
/// name to 200; the decoder refuses longer ones. 8 + 3 x 4 + 128 + 128 + 200 + 4 body bytes and
/// the header fit the slot.
inline constexpr size_t kMaxExchangeSecret = 128;
inline constexpr size_t kMaxExchangeAddress = 128;
inline constexpr size_t kExchangeHost = 200;

enum class RequestType : uint8_t { Status = 1, List = 2, Dump = 3, Revoke = 4 };
struct Request {
  RequestType type = RequestType::Status;
  uint64_t jobId = 0;  ///< 0: any (List, or a process with one scope)
  // Revoke only (Communicator::revoke): the communicator's domain ("communicator 0"), the rank
  // that revoked it, why, and the ranks it found lost or stuck. Answered with an empty reply.
  std::string domain;
  int32_t origin = -1;
  std::string reason;
  std::vector<int32_t> suspects;
  /// The ErrorCode the other ranks' calls fail with: Aborted for Communicator::revoke, the cause's
  /// (PeerLost, Timeout) for a revoke after a failed call.
  uint8_t code = 0;
  /// An explicit revoke (Communicator::revoke, ncclCommRevoke): the receiver also ends its
  /// bootstrap calls in progress. On the wire: bit 7 of the code byte.
  bool interrupt = false;
};
/// A status, list or dump request.
inline Request makeRequest(RequestType type, uint64_t jobId) {
  Request r;
  r.type = type;
  r.jobId = jobId;
  return r;
}
STRATA_API std::vector<uint8_t> encodeRequest(const Request& r);
/// A whole record; refuses an unknown type, and for a revoke a domain, reason or suspect list
/// over its limit (the origin and suspects are checked against the scope by the service).
STRATA_API Request decodeRequest(std::span<const uint8_t> record);

/// An answer: the reports of the scopes asked for (Status: one; List: every scope, no calls),
/// or a text (Dump), or an error text.
struct Reply {
  std::vector<RankReport> reports;
  std::string text;
  std::string error;
};
STRATA_API std::vector<uint8_t> encodeReply(const Reply& r);
/// A whole record; refuses more than kMaxCallsReported calls in a report, more than kMaxReports
/// reports, a text field over its limit and a `failed` byte other than 0 or 1.
STRATA_API Reply decodeReply(std::span<const uint8_t> record);

/// One rank's exchange record: the job id rank 0 drew, the status secret (rank 0's, when the
/// launch's job secret or one it made; empty from the other ranks) and the rank's own PeerInfo.
struct Exchange {
  uint64_t jobId = 0;
  std::string secret;
  PeerInfo peer;
};
/// kExchangeSlot bytes. Throws Error(Internal) for a secret or address over 128 bytes.
STRATA_API std::vector<uint8_t> encodeExchange(const Exchange& e);
/// Rank `rank`'s slot (kExchangeSlot bytes in the allGather; any size is checked): the record
/// at its start, the padding after it ignored. Errors name the rank (Error::peer()).
STRATA_API Exchange decodeExchange(std::span<const uint8_t> slot, int rank);

}  // namespace strata::watch
