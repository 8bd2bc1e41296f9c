#pragma once

// Private to lib/watch: the scope the status service serves, and how asking the peers went.
// The nouns (scope, call, report, answer, culprit, verdict) are defined in base/watch_calls.hpp.

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/watch_calls.hpp"
#include "net/socket.hpp"
#include "watch/codec.hpp"
#include "watch/watch.hpp"

namespace strata::watch {

/// A scope with a status service: its own listener, the peers' addresses and the secret they
/// take (open() in scope.cpp fills it in after the exchange).
class ServedScope final : public Scope, public std::enable_shared_from_this<ServedScope> {
 public:
  ServedScope(int rank, int size, std::string host, int32_t pid)
      : Scope(rank, size, std::move(host), pid) {}
  /// Joins revoke senders close() did not (none normally; one that held the last reference
  /// ends here itself and is detached).
  ~ServedScope() override;

  /// Asks every peer (collect) and analyses the answers for the failing call.
  Verdict findCulprits(const CallRecord& failing) noexcept override;
  /// Tells the peers on a thread of its own (revoke.cpp).
  void broadcastRevoke(const std::string& domain, const Revoke& revoke) noexcept override;
  std::string statusAddress() const override {
    return static_cast<size_t>(rank()) < peers.size() ? peers[static_cast<size_t>(rank())].address
                                                      : std::string();
  }

  void setJob(uint64_t id) noexcept { setJobId(id); }

  std::string secret;
  double queryTimeout = 1.0;
  std::vector<PeerInfo> peers;
  net::Fd listener;  ///< the status port (invalid when it could not be opened)
  /// Set by close(): background work for the scope (revoke deliveries) stops.
  mutable std::atomic<bool> closed{false};
  /// The threads telling the peers of this rank's revokes (revoke.cpp); close() joins them.
  mutable std::mutex revokeThreadsMu;
  mutable std::vector<std::thread> revokeThreads;
};

/// This rank's report of a scope: every call it is in, and per domain the last that failed
/// (scope.cpp).
RankReport report(Scope& scope);
/// The report of one call record.
CallReport report(const CallRecord& call);

/// The communicators of the scope this process heard revoked, one line each ("communicator 0:
/// revoked by rank 2: ..."), for strata-info --job; empty when none (revoke.cpp).
std::string describeRevokes(const Scope& scope);
/// Asks every rank of the scope (bounded by `seconds`); the own rank's entry is Kind::Self
/// (ask.cpp).
std::vector<Answer> collect(ServedScope& scope, double seconds);
/// What a reply to one peer means: empty when it is the answer wanted (and `a` filled in from
/// it), else why not.
using TakeReply = std::function<std::string(int peer, Reply& reply, Answer& a)>;
/// Sends `request` to each of `peers` (other ranks; this rank and ranks out of range are left
/// out) at once and reads one reply from each, bounded by `seconds`; the entry of a peer not
/// asked keeps Kind::Failed, this rank's is Kind::Self with no report (ask.cpp).
/// `cancel`, when set, ends the asking early (within 100 ms), as if the time were up.
std::vector<Answer> askEach(ServedScope& scope, const std::vector<int>& peers,
                            const std::vector<uint8_t>& request, double seconds,
                            const TakeReply& take, const std::atomic<bool>* cancel = nullptr);
/// The analysis of a set of answers as text lines (culprits first), for tools (analysis.cpp).
std::string describeJob(const ServedScope& scope, const std::vector<Answer>& answers);

/// The service thread (service.cpp): serves the scope's listener (and this process's unix
/// socket) from add() until remove().
void serve(const std::shared_ptr<ServedScope>& scope);
void stopServing(const Scope* scope);

/// A revoke request from a peer or a tool (service.cpp): checked against the scope and delivered;
/// empty, or why it was refused.
std::string takeRevoke(ServedScope& scope, const Request& request);

/// The abstract unix socket name of process `pid`'s status service.
std::string socketName(int32_t pid);

}  // namespace strata::watch
