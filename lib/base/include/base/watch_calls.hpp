#pragma once
#ifndef STRATA_INTERNAL_HEADERS
#error "base/watch_calls.hpp is internal to strata: applications include <strata/...> only"
#endif

// The watch's call records: what every layer tells about the blocking calls its threads are in,
// so that a rank whose call times out, and `strata-info --job`, can learn which rank is really
// stuck (docs/errors.md, "When a job stalls"). This header only records; asking the peers and
// the analysis live in lib/watch, which reaches these records through the Scope it derives.
//
// The watch's nouns, here and in lib/watch:
//   scope    the watch's view of one bootstrap of two or more ranks in this process: its ranks
//            and the calls this process's threads are in on it. lib/watch derives the scope it
//            serves (status port, peers' addresses) from Scope.
//   call     one blocking operation a thread is in (a bootstrap allGather, a collective, a
//            semaphore wait): its domain, operation and sequence number. Calls nest.
//   domain   the sequence a call is numbered in: "bootstrap", "communicator N", "connection".
//   wait     the rank a call waits for now, since when, and what is missing from it.
//   record   what a thread writes about the call it is in (CallRecord).
//   report   a rank's calls as it tells them to a peer or a tool (lib/watch: RankReport).
//   answer   how asking one rank went: its report, or why there is none (lib/watch).
//   culprit  a rank at fault: not answering, exited, unreachable, in another call or in none.
//   verdict  the culprits, most telling first, and the ranks that waited for each, as text.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <strata/error.hpp>
#include <strata/export.hpp>

namespace strata::watch {

/// One call of one thread: written by that thread (Call, Slot, waitingFor), read by the watch
/// (lib/watch) under the scope's lock when it reports the scope's calls. Atomic fields may be read
/// while they change: a report is a snapshot of a moving target.
struct CallRecord {
  std::string domain;
  std::string op;  ///< a Call's; a Slot's call names its op in opStatic instead
  std::atomic<const char*> opStatic{nullptr};
  std::atomic<uint64_t> seq{0};
  std::atomic<int64_t> start{0};   ///< steady clock ticks
  std::atomic<bool> active{true};  ///< a Slot's record between calls: false
  std::atomic<int32_t> waitingFor{-1};
  std::atomic<int64_t> waitSince{0};  ///< steady clock ticks
  std::string detail;                 ///< under the scope's lock
  std::atomic<bool> failed{false};

  std::string opName() const {
    const char* s = opStatic.load(std::memory_order_relaxed);
    return s ? std::string(s) : op;
  }
};

/// What a scope found about a failed call: the first culprit and the verdict.
struct Verdict {
  int culprit = -1;     ///< the first rank at fault; -1: none found
  std::string text;     ///< the verdict as any rank says it ("rank 2 on host h (pid 9) ...")
  std::string ownText;  ///< the same as this rank says it ("rank 3 (this rank) ...")
};

/// The calling thread's innermost call waits for `peer` (no progress since `since`). Cheap; a
/// no-op outside a call.
STRATA_API void waitingFor(int peer, std::string_view detail,
                           std::chrono::steady_clock::time_point since) noexcept;
STRATA_API void waitingFor(int peer, std::string_view detail) noexcept;
/// The calling thread's innermost call made progress (waits for nobody now).
STRATA_API void progressed() noexcept;
/// The calling thread's innermost call failed without a diagnosis of its own (a peer's revoke
/// ended it): it stays reported as failed in that call (as diagnose() leaves a call it
/// diagnosed), so that peers still waiting in it do not take this rank for one in its next call.
STRATA_API void markFailed() noexcept;

class Call;
class Slot;

/// The calls of one bootstrap in this process.
class STRATA_API Scope {
 public:
  Scope(int rank, int size, std::string host, int32_t pid);
  virtual ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  const std::string& host() const noexcept { return host_; }
  int32_t pid() const noexcept { return pid_; }
  /// The job id rank 0 drew (0 until the watch has exchanged it).
  uint64_t jobId() const noexcept { return jobId_.load(std::memory_order_relaxed); }

  /// Calls f(const CallRecord&) under the scope's lock for each call to report: per domain the
  /// last call that failed, then the active calls in start order.
  template <typename F>
  void forEachCall(F&& f) {
    std::lock_guard lk(mu_);
    for (auto& [domain, c] : failed_) f(*c);
    for (auto& c : calls_) f(*c);
  }
  /// The next sequence number of the bootstrap's collectives.
  uint64_t nextBootstrapSeq() noexcept { return ++bootstrapSeq_; }
  /// A job-unique label for the next Communicator created on this scope ("communicator 0").
  std::string nextDomain();

  /// The hook lib/watch fills in: asks the peers what they are doing while this rank's call
  /// `failing` has failed, and names the culprits. Bounded by watch.query_timeout; never
  /// throws. A scope nobody serves finds nothing.
  virtual Verdict findCulprits(const CallRecord& failing) noexcept;

  /// A revoke of one domain of this scope (Communicator::revoke): the rank that revoked, why,
  /// and the ranks it found lost or stuck (what shrink() without arguments excludes).
  struct Revoke {
    int origin = -1;
    std::string reason;
    std::vector<int> suspects;
    /// What the other ranks' calls fail with: Aborted (Communicator::revoke), or the code of the
    /// failure that made `origin` revoke (PeerLost, Timeout), naming suspects.front().
    ErrorCode code = ErrorCode::Aborted;
    /// An explicit revoke (Communicator::revoke): the receivers also end their bootstrap calls
    /// in progress. Not shrink's own revoke, nor one after a failed call.
    bool interrupt = false;
  };
  using RevokeListener = std::function<void(const Revoke&)>;
  /// Calls `listener` for the first revoke of `domain` (on the status service's thread; at once,
  /// on this thread, when it has already arrived). One listener per domain; a later one
  /// replaces it. The listener must not block.
  void listenRevoke(const std::string& domain, RevokeListener listener);
  /// Stops calling the listener of `domain` (a call in progress may still finish).
  void unlistenRevoke(const std::string& domain) noexcept;
  /// A revoke of `domain` arrived (from the status service, or this rank's own revoke). Only
  /// the first one per domain counts: false for later ones.
  bool deliverRevoke(const std::string& domain, const Revoke& revoke);
  /// The first revoke of `domain`, if one arrived.
  std::optional<Revoke> revokeOf(const std::string& domain) const;
  /// Every revoked domain with its first revoke, by domain (strata-info --job says them).
  std::map<std::string, Revoke> revokes() const;
  /// The hook lib/watch fills in: tells every other rank of the scope that `domain` is revoked,
  /// through their status services, in the background (ranks that do not answer are tried
  /// again until they do, have exited, or the scope closes). Never blocks, never throws. A
  /// scope nobody serves tells nobody.
  virtual void broadcastRevoke(const std::string& domain, const Revoke& revoke) noexcept;
  /// This rank's status address ("host:port"; empty when nobody serves the scope): a scope made
  /// from this one (a shrunk communicator's) listens on the same interface.
  virtual std::string statusAddress() const { return {}; }

 protected:
  void setJobId(uint64_t id) noexcept { jobId_.store(id, std::memory_order_relaxed); }

 private:
  friend class Call;
  friend class Slot;
  friend void waitingFor(int, std::string_view, std::chrono::steady_clock::time_point) noexcept;
  friend void waitingFor(int, std::string_view) noexcept;

  const int rank_;
  const int size_;
  const std::string host_;
  const int32_t pid_;
  std::atomic<uint64_t> jobId_{0};
  std::atomic<uint64_t> bootstrapSeq_{0};
  std::atomic<int> communicators_{0};
  std::mutex mu_;
  std::vector<std::shared_ptr<CallRecord>> calls_;  ///< active, in start order
  /// Per domain, the last call that failed, until the next call of that domain starts: a rank
  /// that failed and went on (into a barrier, or its own code) still reports that it was in
  /// that call, so that a slower peer's analysis does not take it for a rank elsewhere.
  std::map<std::string, std::shared_ptr<CallRecord>> failed_;
  mutable std::mutex revokeMu_;
  std::map<std::string, RevokeListener> revokeListeners_;  ///< under revokeMu_
  std::map<std::string, Revoke> revoked_;                  ///< under revokeMu_: first per domain
};

/// While alive, the calling thread is in this call (calls nest). A null scope records nothing.
class STRATA_API Call {
 public:
  Call(std::shared_ptr<Scope> scope, std::string domain, std::string_view op, uint64_t seq);
  ~Call();
  Call(const Call&) = delete;
  Call& operator=(const Call&) = delete;

 private:
  std::shared_ptr<Scope> scope_;
  std::shared_ptr<CallRecord> rec_;
  CallRecord* prev_ = nullptr;
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
    CallRecord* prev_ = nullptr;
    Scope* prevScope_ = nullptr;
  };

 private:
  std::shared_ptr<Scope> scope_;
  std::shared_ptr<CallRecord> rec_;
};

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

/// Asks the peers what they are doing (the scope's findCulprits) and rewrites `e` (a failure of
/// the calling thread's innermost call) to name the culprits first. Returns `e` unchanged when
/// there is no call, the error is not a Timeout, ProtocolError or PeerLost, or nothing more is
/// learned. Never throws. Callers pass PeerLost only where the lost peer may not be the cause
/// (it reported a failure of its own).
STRATA_API Error diagnose(const Error& e) noexcept;

/// What the calling thread's last diagnose() found (culprit -1: nothing).
STRATA_API Verdict lastVerdict() noexcept;

}  // namespace strata::watch
