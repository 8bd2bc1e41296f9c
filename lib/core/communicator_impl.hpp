#pragma once

// What the Communicator's files share: its state (Communicator::Impl) and the tables the
// selection builds once at creation. communicator.cpp checks the arguments and runs the call,
// selection.cpp loads the collectives backends and picks an algorithm per call,
// failure_note.cpp leaves and reads the notes between the ranks of a host.

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include <strata/backend/collectives.hpp>
#include <strata/bootstrap.hpp>
#include <strata/communicator.hpp>
#include <strata/config.hpp>
#include <strata/error.hpp>
#include <strata/transport.hpp>

#include "base/watch_calls.hpp"

namespace strata {
namespace core {

struct FaultState;

/// One algorithm of one backend that can run an op.
struct Candidate {
  backend::Algorithm* algorithm = nullptr;
  backend::CollectivesBackend* backend = nullptr;
  uint32_t kinds = 0;    ///< the backend's memory kinds (kindBit)
  std::string fullName;  ///< "host/twoshot"
};

struct OpTable {
  std::vector<Candidate> candidates;  ///< in selection order
  const Candidate* forced = nullptr;
  std::string forcedBy;  ///< "collectives.algorithm = twoshot"
};

/// Op tables, indexed by CollectiveOp's value.
inline constexpr size_t kOpSlots = 9;

}  // namespace core

/// What a revoke touches: shared with the watch's listener, which may outlive the Impl.
struct core::FaultState {
  std::weak_ptr<Context> context;
  mutable std::mutex mu;
  std::set<int> lost;  ///< under mu: ranks found lost or stuck (lostRanks())
  void addLost(std::span<const int> ranks, int size);

  /// The communicator's first revoke (this rank's or a peer's; later ones do nothing): stops the
  /// context and, for an explicit revoke (`interrupt`: Communicator::revoke), ends this rank's
  /// bootstrap calls in progress (bootstrap::interruptCalls), all under revokeMu, so that a shrink
  /// that begins after it (shrinkBegins) is not interrupted. Neither shrink's own revoke nor an
  /// automatic one after a failed call interrupts: a rank still finishing a bootstrap call that
  /// the others finished (a barrier before their shrink, or where they meet it after their
  /// failure) must not be pulled out of it, and a call that needs a lost rank fails by itself.
  void revokeFirst(const Error& why, bool interrupt);
  /// Waits for a first revoke in progress on another thread to finish.
  void shrinkBegins() { std::lock_guard lk(revokeMu); }
  std::mutex revokeMu;
  bool revoked = false;  ///< under revokeMu
  /// The communicator's bootstrap while the Impl lives (~Impl clears it under revokeMu first).
  Bootstrap* bootstrap = nullptr;
};

struct Communicator::Impl {
  ~Impl();
  std::shared_ptr<Bootstrap> bootstrap;
  std::shared_ptr<Context> context;
  int rank = 0;
  int size = 1;
  // Declared after context: destroyed before it.
  std::vector<std::unique_ptr<backend::CollectivesBackend>> backends;
  std::array<core::OpTable, core::kOpSlots> ops;
  /// Why the cuda module is not loaded (for the NotSupported message on device memory).
  std::string cudaMissing;
  /// Held for a whole call: broken and last are read and written under it.
  mutable std::mutex mu;
  /// Set by the first error while data moved: the pair counters may be out of step, so every
  /// later call fails at once instead of mixing up data.
  mutable std::optional<Error> broken;    // asyncError() const may set it
  const core::Candidate* last = nullptr;  ///< what the last call chose
  /// The watch's record of its calls (base/watch_calls.hpp): this communicator's label and call
  /// count.
  std::unique_ptr<watch::Slot> slot;
  uint64_t calls = 0;
  // Fault tolerance (fault_tolerance.cpp).
  Config config;                        ///< what it was created with (shrink's too)
  std::shared_ptr<watch::Scope> scope;  ///< the bootstrap's watch scope, or null
  std::string domain;                   ///< "communicator 0": its name in that scope
  std::shared_ptr<core::FaultState> fault = std::make_shared<core::FaultState>();
  bool revokeOnError = true;                         ///< collectives.revoke_on_error
  int shrinks = 0;                                   ///< shrink() calls so far (their tags differ)
  std::unique_ptr<RendezvousListener> growListener;  ///< rank 0, between growInvitation and grow
  std::string growSecret;
  int growSize = 0;

  // selection.cpp
  void loadBackends(const Config& config);
  void resolveForced(const Config& config);
  const core::Candidate& select(const backend::CollectiveRequest& r, const char* what) const;
  // communicator.cpp
  void run(const backend::CollectiveRequest& r, const char* what);
  // failure_note.cpp
  void leaveNote(const Error& e) const noexcept;
  Error explain(const Error& e) const;
  // fault_tolerance.cpp
  /// Listens for the peers' revokes of this communicator (after create).
  void listenRevokes();
  /// Revokes from this rank: locally and, through the watch, on every other rank.
  /// `code`: what the other ranks' calls fail with (Aborted, or the cause's, naming
  /// suspects.front()).
  /// `interrupt`: an explicit revoke (Communicator::revoke), which also ends every rank's bootstrap
  /// calls in progress; not shrink's own, nor one after a failed call.
  void revokeHere(const std::string& reason, std::vector<int> suspects,
                  ErrorCode code = ErrorCode::Aborted, bool interrupt = false) noexcept;
  /// After a call failed with `e`: record the lost rank, and revoke when
  /// collectives.revoke_on_error says so (PeerLost, a diagnosed Timeout).
  void afterFailure(const Error& e) noexcept;
};

}  // namespace strata
