#pragma once
#ifndef STRATA_INTERNAL_HEADERS
#error "watch/watch.hpp is internal to strata: applications include <strata/...> only"
#endif

// The watch: what every rank is doing, for the rank whose call timed out and for
// `strata-info --job` (docs/errors.md, "When a job stalls"). Its nouns (scope, call, domain,
// wait, report, answer, culprit, verdict) are defined once, in base/watch_calls.hpp, where the
// layers record their calls.
//
// Each process runs one small service thread while it holds a scope (a bootstrap of two or more
// ranks). For every scope it listens on a TCP port of the bootstrap's interface, authenticated
// with the job secret, and on an abstract unix socket "@strata-status.<pid>" (same user only)
// for local tools. Asked, it answers with the scope's report: the calls this process's threads
// are in, the rank each waits for and since when. It answers even while the program computes or
// waits in a collective; a stopped process (SIGSTOP, a debugger) does not, which is how it is
// found.
//
// Before a call reports a Timeout (or a ProtocolError that may be a mismatched call),
// watch::diagnose() (base/watch_calls.hpp) calls the scope's findCulprits(), which asks every
// peer within watch.query_timeout (ask.cpp) and puts the culprits first (analysis.cpp).
//
// This header is what the layers above use: lib/bootstrap opens and closes a scope per watched
// bootstrap (bootstrap/watched.hpp), tools ask a live job (strata-info --job).

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <strata/export.hpp>

#include "base/watch_calls.hpp"
#include "watch/codec.hpp"

namespace strata::watch {

/// How asking one rank went.
struct Answer {
  enum class Kind : uint8_t { Answered, NoAnswer, Exited, Unreachable, Failed, Self };
  Kind kind = Kind::Failed;
  RankReport report;
  std::string error;  ///< for NoAnswer/Exited/Unreachable/Failed
};

/// What a scope is opened with.
struct OpenOptions {
  int rank = 0;
  int size = 1;
  /// The job secret the status port takes; empty: rank 0 makes one and sends it over the
  /// bootstrap (never the job secret itself).
  std::string secret;
  /// bootstrap.tcp.interface: the status port listens on the interface it selects.
  std::string interface;
  /// Rank 0's rendezvous address ("host:port", may be empty): without an interface, the status
  /// port listens on the interface that reaches it.
  std::string rootHint;
  double queryTimeout = 1.0;  ///< watch.query_timeout
};

/// The one collective open() runs: in place, slot r (bytesPerRank each) is rank r's record.
using AllGather = std::function<void(void* data, size_t bytesPerRank)>;

/// Opens the scope of a fresh bootstrap of two or more ranks: opens its status port (a failure
/// to is warned about, not an error), exchanges every rank's status address, host and pid with
/// one allGather (a malformed record throws ProtocolError naming its rank), and serves the scope
/// from this process's service thread until close().
STRATA_API std::shared_ptr<Scope> open(const OpenOptions& options, const AllGather& allGather);
/// Stops serving a scope open() returned; the service thread stops with the last scope. Calls
/// still recorded on it (a Communicator's Slot) stay harmless.
STRATA_API void close(const Scope& scope) noexcept;

/// For tools: asks a process's local status socket (abstract "@strata-status.<pid>").
STRATA_API Reply askLocal(int32_t pid, const Request& request, double seconds);
/// For tools: asks a status listener over TCP with the job secret.
STRATA_API Reply askRemote(const std::string& address, const std::string& secret,
                           const Request& request, double seconds);
/// Pids of this host's processes that run a status service (from /proc/net/unix).
STRATA_API std::vector<int32_t> localServices();

}  // namespace strata::watch
