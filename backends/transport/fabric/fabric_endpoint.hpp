#pragma once

// This rank's libfabric endpoint: everything of the libfabric transport that talks to libfabric
// (fabric, domain, RDM endpoint, AV, CQ, memory regions, posting and reaping writes).
// fabric_provider.cpp chooses the provider, fabric_endpoint.cpp opens and closes the objects,
// fabric_progress.cpp posts writes, reaps completions and drives the endpoint in the background
// (fabric_progress.hpp). fabric_transport.{hpp,cpp} build the transport, its memory and its
// connections on it. docs/transport-fabric.md describes the choices.

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#include <signal.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include <strata/backend/transport.hpp>
#include <strata/error.hpp>

#include "base/deadline.hpp"
#include "fabric_provider.hpp"

namespace strata::fabric {

/// "<fi_strerror> (<rc>)" for a libfabric return code.
std::string fiError(ssize_t rc);

class ConnState;

/// One posted operation. fi_context2 comes first because providers that ask for FI_CONTEXT(2)
/// own that space until the completion.
struct OpContext {
  fi_context2 ctx{};
  std::shared_ptr<ConnState> conn;
  int slot = -1;  ///< signal slot to release on completion, or -1
  bool probe = false;
};

/// Everything that talks to libfabric. Shared by the transport, its registrations and its
/// connections, so that the domain outlives the last MR closed through it even if a caller
/// destroys objects in the wrong order.
class Endpoint {
 public:
  /// Opens the objects on the provider `provider` names (transport.fabric.provider).
  Endpoint(const backend::TransportInit& init, std::string provider, bool wantHmem);
  ~Endpoint();
  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;

  /// Reads completions; caller holds mutex. Returns how many entries it handled.
  size_t drainLocked() noexcept;
  /// Drives the CQ once (takes the mutex) and wakes waiters when something completed or a
  /// watched word changed. Returns how many completions it handled.
  size_t progressOnce() noexcept;
  /// progressOnce() for a thread that polls its own words and drives the endpoint while it
  /// waits (Connection::progress, the host collectives' direct links): the progress thread
  /// leaves the endpoint to it while it keeps doing so.
  size_t progressFromCaller() noexcept;
  /// Whether a caller drove the endpoint within the last kCallerDrivesNs.
  bool callerDriving() const noexcept;
  /// Waits for a completion notification or the timeout, whichever comes first.
  void waitForCompletion(double maxSeconds);
  /// Posts one fi_write, retrying -FI_EAGAIN until the deadline. Takes ownership of op.
  void postWrite(std::unique_ptr<OpContext> op, const void* src, size_t bytes, void* desc,
                 uint64_t target, uint64_t key, const Deadline& deadline);
  /// While postWrite() retries a refused write: the error that says the peer is gone (its
  /// connection failed, its pid on this host has exited, or no write to it completed for
  /// probe_timeout), else nothing. Updates the caller's bookkeeping.
  std::optional<Error> refusedPeerLost(ConnState& conn, std::chrono::steady_clock::time_point since,
                                       uint64_t& completionsSeen,
                                       std::chrono::steady_clock::time_point& lastAlive,
                                       std::chrono::steady_clock::time_point& lastPidCheck);
  /// A free signal slot (driving the CQ while all are busy), or Timeout.
  int acquireSlot(const Deadline& deadline, int peer);
  uint64_t* slotWord(int slot) noexcept;
  void* internalDesc() noexcept;
  uint64_t* probeSource() noexcept;

  /// Blocks until *word > above (true), maxSeconds pass or stopWatchers() (false). The progress
  /// thread and every other thread that drives the CQ wake it through notifyWatchers().
  bool waitWord(const uint64_t* word, uint64_t above, double maxSeconds);
  /// Wakes the waitWord() callers whose word has reached its value. Cheap without waiters.
  void notifyWatchers();
  /// Wakes every waitWord() caller for good (the transport is shutting down).
  void stopWatchers();
  /// Wakes the progress thread if it sleeps (after a new write was posted: providers with
  /// manual progress send the rest of a large write only while someone drives the endpoint).
  void kickProgress() noexcept;
  /// Wakes the progress thread from any sleep or nap (a write to its eventfd).
  void wakeProgressThread() noexcept;

  std::string describe() const;  ///< "fabric transport (rank R, provider P)"
  fid_mr* registerRegion(void* data, size_t bytes, uint64_t access, bool cuda, int cudaDevice);
  void closeRegion(fid_mr* mr) noexcept;

  std::mutex mutex_;  ///< serializes every call on the domain's objects
  std::condition_variable cv_;
  std::mutex cvMutex_;
  fi_info* info_ = nullptr;
  fid_fabric* fabric_ = nullptr;
  fid_domain* domain_ = nullptr;
  fid_ep* ep_ = nullptr;
  fid_av* av_ = nullptr;
  fid_cq* cq_ = nullptr;
  int waitFd_ = -1;  ///< the CQ's wait fd (FI_WAIT_FD), or -1
  std::string provider_;
  NicWish nic_;  ///< the NIC lib/topology chose (TransportInit)
  int rank_ = -1;
  double timeout_ = 30;      ///< transport.timeout (its default applies without a config)
  double probeTimeout_ = 5;  ///< transport.fabric.probe_timeout (likewise)
  uint64_t mrMode_ = 0;
  bool orderedWaw_ = false;
  bool deliveryComplete_ = false;
  bool hmem_ = false;
  size_t maxChunk_ = 0;
  std::vector<uint8_t> address_;
  uint64_t pidNamespace_ = 0;  ///< shm provider: this process's PID namespace, 0 if unknown
  std::atomic<uint64_t> nextKey_{1};

  // Internal region: word 0 is the probe target peers write to, word 1 the probe source,
  // words 2.. are signal slots (updateAndSync's source must live until completion).
  static constexpr int kSlots = 256;
  static constexpr size_t kProbeSourceWord = 1;
  static constexpr size_t kFirstSlotWord = 2;
  uint64_t* internal_ = nullptr;
  fid_mr* internalMr_ = nullptr;
  std::vector<int> freeSlots_;           ///< guarded by mutex_
  std::unordered_set<OpContext*> live_;  ///< posted, not yet completed; guarded by mutex_

  std::atomic<size_t> registrations_{0}, imports_{0}, connections_{0};

  uint64_t posts_ = 0;           ///< writes posted so far; guarded by mutex_
  std::atomic<int> wakeFd_{-1};  ///< eventfd of the progress thread (owned by the transport)
  /// steady_clock nanoseconds of the last progressFromCaller() (0: never).
  std::atomic<int64_t> callerProgressNs_{0};
  std::atomic<bool> progressAsleep_{false};  ///< the progress thread is about to sleep or sleeps

  /// A thread in waitWord(): the word it waits on and the value it must exceed.
  struct Watch {
    const uint64_t* word;
    uint64_t above;
  };
  std::mutex watchMutex_;
  std::condition_variable watchCv_;
  std::vector<const Watch*> watches_;  ///< guarded by watchMutex_
  std::atomic<int> watchers_{0};       ///< watches_.size(), readable without the lock
  bool watchersStopped_ = false;       ///< guarded by watchMutex_

 private:
  void open(bool wantHmem);
  void close() noexcept;
};

/// Per-peer state that outlives the connection object while operations are in flight.
class ConnState {
 public:
  int rank = -1;
  fi_addr_t addr = FI_ADDR_UNSPEC;
  uint64_t probeKey = 0;
  uint64_t probeTarget = 0;
  bool sameHost = false;
  int32_t pid = 0;
  std::atomic<int64_t> outstanding{0};
  std::atomic<bool> probeInFlight{false};
  /// Every write to this peer that completed without error (probes and data): while these
  /// advance the peer is alive, however long a probe waits behind the data.
  std::atomic<uint64_t> completions{0};
  std::mutex errorMutex;
  std::optional<Error> error;  ///< the first failed completion
  /// A peer on this host (its pid known) whose process has exited.
  bool processExited() const noexcept {
    return sameHost && pid > 0 && ::kill(pid, 0) != 0 && errno == ESRCH;
  }
  void fail(Error e) {
    std::lock_guard<std::mutex> lock(errorMutex);
    if (!error) error = std::move(e);
  }
  bool failed() {
    std::lock_guard<std::mutex> lock(errorMutex);
    return error.has_value();
  }
  void rethrow() {
    std::lock_guard<std::mutex> lock(errorMutex);
    if (error) throw *error;
  }
};

}  // namespace strata::fabric
