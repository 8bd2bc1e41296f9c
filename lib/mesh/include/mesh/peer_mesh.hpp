#pragma once
#ifndef STRATA_INTERNAL_HEADERS
#error "mesh/peer_mesh.hpp is internal to strata: applications include <strata/...> only"
#endif

// The point-to-point message engine shared by socket-based bootstrap backends (tcp, and the
// pmix backend's data path): one persistent, authenticated TCP connection per peer and
// direction, made lazily on first use and identified by its handshake, never by accept order.
//
// Progress is driven by the calling threads: a thread that waits polls every socket of the
// mesh (accepting and authenticating peers, reading frames into per-(peer, tag) queues,
// writing queued frames), so that two ranks sending large messages to each other never
// deadlock and no background thread is needed. Other waiting threads sleep on a condition
// variable until the driver hands over.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <strata/config.hpp>
#include <strata/error.hpp>
#include <strata/export.hpp>

#include "base/deadline.hpp"
#include "mesh/frames.hpp"
#include "net/socket.hpp"

namespace strata::mesh {

/// Tags below zero are reserved for the engine's own collectives and for backends.
inline constexpr int kTagAllGather = -2;
inline constexpr int kTagBroadcast = -3;
inline constexpr int kTagBarrier = -4;
inline constexpr int kTagSetup = -5;

struct Options {
  std::string backend = "tcp";  ///< for messages
  int rank = 0;
  int size = 1;
  std::string secret;
  double timeout = 30;          ///< seconds per blocking call; <= 0 means no deadline
  double handshakeTimeout = 5;  ///< an accepted connection must authenticate within it
  uint64_t maxMessage = 1ull << 30;
  int spinUs = 0;          ///< poll without sleeping this long before blocking
  bool spinYield = false;  ///< sched_yield() between spinning polls (oversubscribed hosts)
};

/// How long a waiting call spins, from bootstrap.spin_us (-1 = auto) and the number of ranks
/// on this host. Measured on 2 cores (tools/bench/bootstrap_vs_mpi.sh): a pure spin halves
/// small-message latency when every rank has a core and ruins it when ranks share cores; there
/// a short spin that yields between polls still beats sleeping at once.
struct SpinPolicy {
  int us = 0;
  bool yield = false;
};
STRATA_API SpinPolicy spinPolicy(const Config& config, int localSize);

/// Whose interrupts end a call: the object a CallScope names and its interrupt count.
struct InterruptKey {
  const void* owner = nullptr;
  const std::atomic<uint64_t>* count = nullptr;
};

/// A bootstrap whose calls in progress can be ended early (PeerMesh::interrupt, CallScope): the
/// tcp, pmix (its peer mesh, not its fences) and ucx backends, and the bootstrap layer's wrappers,
/// which pass it on to what they wrap (see bootstrap::interruptCalls). A backend without it ends
/// its calls by their deadlines.
class STRATA_API Interruptible {
 public:
  virtual ~Interruptible();
  /// The key of the object whose interrupt ends this bootstrap's calls (a wrapper: what it wraps),
  /// so that a wrapper whose one call makes several calls below (a subset's) holds one CallScope
  /// over all of them: an interrupt between two of them still ends the call.
  virtual InterruptKey interruptKey() const noexcept = 0;
  /// False when the bootstrap underneath cannot (its calls end by their deadlines).
  virtual bool interruptCalls(const Error& why) noexcept = 0;
};

/// What a call that an interrupt ended throws: the interrupt's code and peer, its text after "a
/// call in progress was interrupted:". The bootstrap wrappers pass it on as it is (a subset does
/// not renumber its peer, the watch does not diagnose it): it is the revoke's error, in the
/// revoked communicator's numbering.
class STRATA_API Interrupted : public Error {
 public:
  using Error::Error;
  /// The error of a call of the `backend` bootstrap that the interrupt `why` ended.
  Interrupted(std::string_view backend, const Error& why);
  ~Interrupted() override;
};

/// What a recv throws when the message has another size than the call asked for
/// (ProtocolError naming the sender): both ranks are alive, in calls that differ. The watch looks
/// for no other culprit (a rank that has meanwhile left is not the cause), and the bootstrap
/// wrappers pass it on as it is.
class STRATA_API SizeMismatch : public Error {
 public:
  using Error::Error;
  ~SizeMismatch() override;
};

/// The outermost call this thread is in on an interruptible object (a PeerMesh, the ucx
/// bootstrap) and that object's interrupt count when the call began: an interrupt ends the calls
/// that began before it, not later ones. Each public call of the object holds one.
class STRATA_API CallScope {
 public:
  CallScope(const void* owner, const std::atomic<uint64_t>& interrupts) noexcept;
  /// Over key's object; nothing when key is empty.
  explicit CallScope(const InterruptKey& key) noexcept;
  ~CallScope();
  CallScope(const CallScope&) = delete;
  CallScope& operator=(const CallScope&) = delete;
  /// This thread is in a call on `owner` that began before its last interrupt.
  static bool interrupted(const void* owner, const std::atomic<uint64_t>& interrupts) noexcept;

 private:
  const void* savedOwner_ = nullptr;
  uint64_t savedCount_ = 0;
  bool outer_ = false;
};

class STRATA_API PeerMesh {
 public:
  /// `listener` is a listening socket on the selected interface (invalid when size == 1).
  PeerMesh(Options options, net::Fd listener);
  /// Flushes, says goodbye to every connected peer and closes (see close()).
  ~PeerMesh();
  PeerMesh(const PeerMesh&) = delete;
  PeerMesh& operator=(const PeerMesh&) = delete;

  const Options& options() const;
  std::string listenAddress() const;
  /// The deadline of a call starting now (bootstrap.timeout).
  Deadline callDeadline() const;

  /// Small collectives through rank 0 in two sweeps instead of log2(N) rounds: better when
  /// ranks share CPUs, where each round waits for every process to be scheduled again. The
  /// value must be the same on every rank (it selects the algorithms).
  void setStarCollectives(bool star);

  void setPeerAddress(int rank, const std::string& address);
  void setPeerAddresses(const std::vector<std::string>& addresses);

  /// Point-to-point. `op` names the calling operation in errors ("send", "allGather").
  /// Negative tags are only allowed with internal = true.
  void send(int peer, int tag, const void* data, size_t bytes, const Deadline& deadline,
            std::string_view op = "send", bool internal = false);
  void recv(int peer, int tag, void* data, size_t bytes, const Deadline& deadline,
            std::string_view op = "recv", bool internal = false);

  /// Bruck's algorithm: ceil(log2 N) messages per rank, N-1 blocks sent in total.
  void allGather(void* data, size_t bytesPerRank);
  /// Binomial tree from root.
  void broadcast(void* data, size_t bytes, int root);
  /// Dissemination barrier: ceil(log2 N) rounds of empty messages.
  void barrier();

  /// Tells every connected peer (they forward it) and fails this rank's later calls.
  void abort(std::string_view reason) noexcept;
  /// Ends this rank's calls in progress now (every thread's), which throw `why` (its code and
  /// peer; the text says the call was interrupted); calls that begin later are not affected, and
  /// the peers are told nothing. For Communicator::revoke: a rank blocked in a bootstrap call of
  /// the revoked communicator must not wait for bootstrap.timeout. A collective it ends leaves
  /// this rank out of step with the peers that finished it.
  void interrupt(const Error& why) noexcept;
  /// The key of this mesh's interrupts (CallScope).
  InterruptKey interruptKey() const noexcept;
  /// Flushes queued frames, sends goodbye on every connection and closes them (idempotent).
  void close() noexcept;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata::mesh
