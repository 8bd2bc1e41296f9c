#pragma once

// The watch: what every rank is doing, for the rank whose call timed out and for
// `strata-info --job` (docs/errors.md, "When a job stalls").
//
// Each process runs one small service thread while it holds a bootstrap of two or more ranks.
// For every such bootstrap (a "scope") it listens on a TCP port of the bootstrap's interface,
// authenticated with the job secret, and on an abstract unix socket "@strata-status.<pid>"
// (same user only) for local tools. Asked, it answers with the calls that the process's threads
// are in on that bootstrap: operation, sequence number, the rank each waits for and since when.
// A thread answers even while the program computes or waits in a collective; a stopped process
// (SIGSTOP, a debugger) does not, which is how it is found.
//
// Before a call reports a Timeout (or a ProtocolError that may be a mismatched call), diagnose()
// asks every peer within watch.query_timeout and puts the rank(s) really at fault first in the
// message: one that does not answer, one in another call, one in no call, one that exited. The
// exchange never blocks longer than that and falls back to the plain message.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <strata/bootstrap.hpp>
#include <strata/config.hpp>
#include <strata/error.hpp>
#include <strata/export.hpp>

#include "base/watch_codec.hpp"

namespace strata {
struct LaunchInfo;
}

namespace strata::watch {

/// How asking one peer went.
struct Answer {
  enum class Kind : uint8_t { Answered, NoAnswer, Exited, Unreachable, Failed, Self };
  Kind kind = Kind::Failed;
  RankState state;
  std::string error;  ///< for NoAnswer/Exited/Unreachable/Failed
};

class Scope;

/// Wraps a freshly created bootstrap: exchanges status addresses (one allGather), registers the
/// scope and reports every call through it. Size-1 bootstraps and watch.enabled=false are
/// returned unwrapped. `inner` stays reachable through unwrap().
STRATA_API std::unique_ptr<Bootstrap> attach(std::unique_ptr<Bootstrap> inner,
                                             const Config& config);
/// The same for a bootstrap whose launch was given explicitly (createTcpBootstrap): its secret
/// and root (the interface hint) come from `launch`.
STRATA_API std::unique_ptr<Bootstrap> attach(std::unique_ptr<Bootstrap> inner, const Config& config,
                                             const LaunchInfo& launch);
/// The backend object behind a bootstrap attach() returned (the same object otherwise).
STRATA_API Bootstrap& unwrap(Bootstrap& b);
/// The scope of a bootstrap returned by attach(), null when it is not watched.
STRATA_API std::shared_ptr<Scope> scopeOf(const Bootstrap* b);

/// A job-unique label for the next Communicator created on this scope ("communicator 0").
STRATA_API std::string nextDomain(Scope& scope);

/// While alive, the calling thread is in this call (calls nest).
class STRATA_API Call {
 public:
  Call(std::shared_ptr<Scope> scope, std::string domain, std::string_view op, uint64_t seq);
  ~Call();
  Call(const Call&) = delete;
  Call& operator=(const Call&) = delete;
  struct Rec;  ///< defined in watch.cpp

 private:
  std::shared_ptr<Scope> scope_;
  std::shared_ptr<Rec> rec_;
  Rec* prev_ = nullptr;
  Scope* prevScope_ = nullptr;
};

/// A domain whose calls come one at a time and must cost next to nothing (a Communicator's
/// collectives): its record is registered once, and each call only stores a few atomics.
class STRATA_API Slot {
 public:
  Slot(std::shared_ptr<Scope> scope, std::string domain);
  ~Slot();
  Slot(const Slot&) = delete;
  Slot& operator=(const Slot&) = delete;

  /// While alive, the calling thread is in call `op` (a string with static lifetime) #seq of
  /// the slot's domain. A call that failed (diagnose()) stays visible, marked failed, until the
  /// next call of the slot begins.
  class STRATA_API Active {
   public:
    Active(Slot* slot, const char* op, uint64_t seq) noexcept;
    ~Active();
    Active(const Active&) = delete;
    Active& operator=(const Active&) = delete;

   private:
    Slot* slot_;
    Call::Rec* prev_ = nullptr;
    Scope* prevScope_ = nullptr;
  };

 private:
  std::shared_ptr<Scope> scope_;
  std::shared_ptr<Call::Rec> rec_;
};

/// The next sequence number of a per-scope domain counter (bootstrap collectives).
STRATA_API uint64_t nextBootstrapSeq(Scope& scope);

/// The calling thread's innermost call waits for `peer` (no progress since `since`). Cheap; a
/// no-op outside a call.
STRATA_API void waitingFor(int peer, std::string_view detail,
                           std::chrono::steady_clock::time_point since) noexcept;
STRATA_API void waitingFor(int peer, std::string_view detail) noexcept;
/// The calling thread's innermost call made progress (waits for nobody now).
STRATA_API void progressed() noexcept;

/// Sets waitingFor for the duration of a blocking wait inside a call.
/// A wait that ends with an exception (its timeout) leaves the record as it is: the call's
/// diagnose() and the peers asking then still learn whom this rank waited for.
class STRATA_API Waiting {
 public:
  Waiting(int peer, std::string_view detail) noexcept : exceptions_(std::uncaught_exceptions()) {
    waitingFor(peer, detail);
  }
  ~Waiting() {
    if (std::uncaught_exceptions() == exceptions_) progressed();
  }
  Waiting(const Waiting&) = delete;
  Waiting& operator=(const Waiting&) = delete;

 private:
  int exceptions_;
};

/// Asks the peers what they are doing and rewrites `e` (a failure of the calling thread's
/// innermost call) to name the rank(s) at fault first. Returns `e` unchanged when there is no
/// call, the scope is not watched, the error is not a Timeout, ProtocolError or PeerLost, or
/// nothing more is learned. Bounded by watch.query_timeout; never throws. Callers pass PeerLost
/// only where the lost peer may not be the cause (it reported a failure of its own).
STRATA_API Error diagnose(const Error& e) noexcept;

/// What the calling thread's last diagnose() found: the first rank at fault (-1: none) and the
/// text naming it (without this rank's own error).
struct Verdict {
  int root = -1;
  std::string text;
};
STRATA_API Verdict lastVerdict() noexcept;

/// Asks every rank of the scope (bounded by `seconds`); the own rank's entry is Kind::Self.
STRATA_API std::vector<Answer> collect(Scope& scope, double seconds);
/// The analysis of a set of answers as text lines (roots first), for tools.
STRATA_API std::string describeJob(Scope& scope, const std::vector<Answer>& answers);

// The records (request, reply, exchange) are in base/watch_codec.hpp.

/// For tools: asks a process's local status socket (abstract "@strata-status.<pid>").
STRATA_API Reply askLocal(int32_t pid, const Request& request, double seconds);
/// For tools: asks a status listener over TCP with the job secret.
STRATA_API Reply askRemote(const std::string& address, const std::string& secret,
                           const Request& request, double seconds);
/// Pids of this host's processes that run a status service (from /proc/net/unix).
STRATA_API std::vector<int32_t> localServices();

}  // namespace strata::watch
