#pragma once

// Private to lib/watch: the scope the status service serves, and how asking the peers went.
// The nouns (scope, call, report, answer, culprit, verdict) are defined in base/watch_calls.hpp.

#include <cstdint>
#include <string>
#include <vector>

#include "base/watch_calls.hpp"
#include "net/socket.hpp"
#include "watch/codec.hpp"
#include "watch/watch.hpp"

namespace strata::watch {

/// A scope with a status service: its own listener, the peers' addresses and the secret they
/// take (open() in scope.cpp fills it in after the exchange).
class ServedScope final : public Scope {
 public:
  ServedScope(int rank, int size, std::string host, int32_t pid)
      : Scope(rank, size, std::move(host), pid) {}

  /// Asks every peer (collect) and analyses the answers for the failing call.
  Verdict findCulprits(const CallRecord& failing) noexcept override;

  void setJob(uint64_t id) noexcept { setJobId(id); }

  std::string secret;
  double queryTimeout = 1.0;
  std::vector<PeerInfo> peers;
  net::Fd listener;  ///< the status port (invalid when it could not be opened)
};

/// This rank's report of a scope: every call it is in, and per domain the last that failed
/// (scope.cpp).
RankReport report(Scope& scope);
/// The report of one call record.
CallReport report(const CallRecord& call);

/// Asks every rank of the scope (bounded by `seconds`); the own rank's entry is Kind::Self
/// (ask.cpp).
std::vector<Answer> collect(ServedScope& scope, double seconds);
/// The analysis of a set of answers as text lines (culprits first), for tools (analysis.cpp).
std::string describeJob(const ServedScope& scope, const std::vector<Answer>& answers);

/// The service thread (service.cpp): serves the scope's listener (and this process's unix
/// socket) from add() until remove().
void serve(const std::shared_ptr<ServedScope>& scope);
void stopServing(const Scope* scope);

/// The abstract unix socket name of process `pid`'s status service.
std::string socketName(int32_t pid);

}  // namespace strata::watch
