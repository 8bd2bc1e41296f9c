#pragma once
#ifndef STRATA_INTERNAL_HEADERS
#error "mesh/rendezvous.hpp is internal to strata: applications include <strata/...> only"
#endif

// Rank 0's rendezvous, shared by the socket-based bootstrap backends (tcp, ucx): every other
// rank connects to the root address, proves the job secret (handshake.hpp), sends one
// check-in record in its backend's format, and reads one reply.
//
// The server never blocks on one connection: handshakes and records are read from one poll
// loop, each connection on its own deadline, so strangers and stalled peers cannot delay the
// job. Failures are collective: the server sends every rank that checked in the same REJECT
// record (kind 9, backend-neutral), and every client turns it into the same error.

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <strata/export.hpp>

#include "base/deadline.hpp"
#include "net/socket.hpp"

namespace strata::rendezvous {

/// REJECT: {backend str, message str, timed out u8}; understood by every backend's client.
inline constexpr uint16_t kRejectKind = 9;

struct Options {
  std::string backend;  ///< "tcp": for messages, and the backend of a REJECT
  std::string root;     ///< the rendezvous address, for messages
  std::string secret;
  int size = 1;
  /// The rank that serves this rendezvous (the server's own rank; the rank a client expects at
  /// the root address). 0 but for the other roots of a multi-root rendezvous (tcp).
  int self = 0;
  /// The ranks that check in here (possibly none); unset: every rank but `self` (1..size-1
  /// for rank 0).
  std::optional<std::vector<int>> expected;
  uint16_t helloKind = 0;       ///< the check-in record kind this backend expects
  double connectTimeout = 60;   ///< the whole rendezvous; <= 0: no deadline
  double handshakeTimeout = 5;  ///< per connection; <= 0: no deadline
  size_t maxRecord = 4096;      ///< largest check-in body
  /// Log refused connections at debug instead of warn: for a server that expects some, like a
  /// ucx rank 0 on strata-run's socket, where every ucx rank's first UCX attempt lands.
  bool quietRejects = false;
};

/// Rank 0, for a backend that answers the ranks itself: collects one check-in record from each
/// rank 1..size-1 (options.expected) as serve() below does and returns their connections,
/// indexed by rank (the others empty), with nothing sent on them yet. On a failure every
/// connected rank gets the REJECT, and the error is thrown, as in serve().
STRATA_API std::vector<net::Fd> collect(
    int listenFd, const Options& options,
    const std::function<void(int rank, const std::vector<uint8_t>& record)>& onCheckIn);

/// Rank 0. Collects one check-in record from each rank 1..size-1. `onCheckIn(rank, record)`
/// gets the whole record (header included) of an authenticated rank; it stores what it needs
/// and throws Error to fail the job with that message. Then `reply(rank)` gives each rank its
/// reply record. Throws Timeout (naming the missing ranks) or the error of `onCheckIn`, after
/// every connected rank was sent a REJECT.
STRATA_API void serve(
    int listenFd, const Options& options,
    const std::function<void(int rank, const std::vector<uint8_t>& record)>& onCheckIn,
    const std::function<std::vector<uint8_t>(int rank)>& reply);

/// After collect(): sends each connected rank `reply(rank)`. Throws InvalidConfig (and sends the
/// REJECT to the ranks not yet answered) when a rank vanished before its reply.
STRATA_API void answer(std::vector<net::Fd>& ready, const Options& options,
                       const std::function<std::vector<uint8_t>(int rank)>& reply);

/// After collect(), when this server cannot go on (a multi-root server whose own check-in
/// failed): sends every connected rank the REJECT with `message` (best effort).
STRATA_API void rejectAll(std::vector<net::Fd>& ready, const Options& options,
                          const std::string& message, bool timedOut);

/// Ranks 1..size-1 (options.self: the rank that serves rootAddrs). Connects (retrying until
/// connectTimeout), authenticates as `rank`, sends `hello` and returns rank 0's reply record (its
/// kind is the backend's; a REJECT is thrown as the error it carries).
STRATA_API std::vector<uint8_t> checkIn(const std::vector<net::SockAddr>& rootAddrs,
                                        const Options& options, int rank,
                                        const std::vector<uint8_t>& hello);

/// The REJECT record (for backends that run their own server or client around it).
STRATA_API std::vector<uint8_t> encodeReject(const std::string& backend, const std::string& message,
                                             bool timedOut);
/// Throws the error a REJECT record carries (Timeout or InvalidConfig, naming rank `server`).
[[noreturn]] STRATA_API void throwReject(std::span<const uint8_t> record, int server = 0);

/// The error message of a rendezvous that ran out of time: what was waited for, and the
/// ranks that never checked in (the first 16).
STRATA_API std::string timeoutMessage(const std::string& root, double seconds, int count, int size,
                                      const std::vector<int>& missing);

/// The backend whose check-in record has this kind ("tcp", "ucx"), for mismatch messages.
STRATA_API std::string backendOfKind(uint16_t kind);

}  // namespace strata::rendezvous
