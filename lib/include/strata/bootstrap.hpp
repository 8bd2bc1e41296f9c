#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <strata/config.hpp>
#include <strata/export.hpp>

namespace strata {

/// Lets the ranks of a job find each other and exchange small records.
///
/// Messages from one sender to one receiver with one tag arrive in the order sent; tags are
/// independent. recv() with a size other than the one sent throws ProtocolError. Every blocking
/// call honours bootstrap.timeout and throws Timeout; a dead peer gives PeerLost; abort() makes
/// the other ranks' calls throw Aborted. Calls from several threads at once are safe.
class STRATA_API Bootstrap {
 public:
  /// Picks the backend from bootstrap.backend (auto|tcp|pmix|ucx), connects, and checks that
  /// every rank made the same choices.
  static std::unique_ptr<Bootstrap> create(const Config& config = Config::load());
  virtual ~Bootstrap();
  virtual std::string_view backend() const noexcept = 0;  ///< "tcp", "pmix", "ucx"
  virtual int rank() const noexcept = 0;
  virtual int size() const noexcept = 0;
  virtual int localRank() const noexcept = 0;  ///< rank among the ranks on this host
  virtual int localSize() const noexcept = 0;
  /// Sends bytes to peer under tag (>= 0); never deadlocks against the peer's send.
  virtual void send(int peer, int tag, const void* data, size_t bytes) = 0;
  /// Receives exactly bytes from peer under tag.
  virtual void recv(int peer, int tag, void* data, size_t bytes) = 0;
  /// In place: slot r (bytesPerRank at offset r * bytesPerRank) holds rank r's contribution.
  virtual void allGather(void* data, size_t bytesPerRank) = 0;
  virtual void broadcast(void* data, size_t bytes, int root) = 0;
  virtual void barrier() = 0;
  /// Makes every other rank's pending and later calls throw Aborted with this rank and reason.
  virtual void abort(std::string_view reason) noexcept = 0;
};

/// Who this process is, given by a framework that runs its own rendezvous (torch.distributed's
/// store, an MPI communicator) instead of by a launcher's environment (STRATA_*, SLURM_*,
/// OMPI_COMM_WORLD_*, which createTcpBootstrap does not read).
struct ExplicitLaunch {
  int rank = 0;
  int size = 1;
  int localRank = 0;  ///< rank among the ranks on this host
  int localSize = 1;
  std::string root;    ///< "host:port" of rank 0's rendezvous listener (from RendezvousListener)
  std::string secret;  ///< the job secret every rank was given; empty: unauthenticated (warned)
  /// Several rendezvous roots sharing the start-up load (ncclCommInitRankScalable), the same
  /// list on every rank; empty or one entry: `root` alone. roots[k] is the listener address of
  /// rank rendezvousBlockStart(k, ...), which serves the ranks of block k; roots[0] replaces
  /// `root` (which must then be empty or the same: InvalidArgument otherwise). Each root
  /// collects its block's addresses and checks in at roots[0] with them.
  std::vector<std::string> roots;
};

/// The first rank of block k when `size` ranks share `roots` rendezvous roots: NCCL's split
/// (blocks of size / roots ranks, the first size % roots of them one rank larger). k == roots
/// gives size.
constexpr int rendezvousBlockStart(int k, int size, int roots) {
  return k * (size / roots) + (k < size % roots ? k : size % roots);
}

/// The block (rendezvous root) of `rank`: the k with
/// rendezvousBlockStart(k) <= rank < rendezvousBlockStart(k + 1).
constexpr int rendezvousBlockOf(int rank, int size, int roots) {
  const int big = size % roots, per = size / roots;
  return rank < big * (per + 1) ? rank / (per + 1) : big + (rank - big * (per + 1)) / per;
}

/// Rank 0's rendezvous socket, bound before its address is published so that no other process
/// can take the port in between: listening on the address of the interface bootstrap.tcp.interface
/// selects (and bootstrap.tcp.family), on bootstrap.tcp.port or an ephemeral port. Without
/// bootstrap.tcp.interface, a non-empty hostHint (a name or address of this host that the other
/// ranks reach, e.g. torch's MASTER_ADDR) picks the interface whose subnet holds it. Closed by
/// the destructor; keep it alive until createTcpBootstrap returns.
class STRATA_API RendezvousListener {
 public:
  explicit RendezvousListener(const Config& config = Config::load(),
                              const std::string& hostHint = {});
  ~RendezvousListener();
  RendezvousListener(RendezvousListener&& other) noexcept;
  RendezvousListener& operator=(RendezvousListener&&) = delete;
  RendezvousListener(const RendezvousListener&) = delete;
  RendezvousListener& operator=(const RendezvousListener&) = delete;
  /// "127.0.0.1:40123" (IPv6 as "[::1]:40123"): what ExplicitLaunch::root should say.
  const std::string& address() const noexcept { return address_; }
  int fd() const noexcept { return fd_; }

 private:
  int fd_ = -1;
  std::string address_;
};

/// The tcp bootstrap for an explicit launch (bootstrap.backend is not consulted). Rank 0 passes
/// the listener whose address it published as launch.root; the other ranks pass nullptr and
/// connect to launch.root. With launch.roots, the first rank of each block passes the listener
/// of its root and the others connect to their block's root. Every other bootstrap.* key applies as
/// with Bootstrap::create.
STRATA_API std::unique_ptr<Bootstrap> createTcpBootstrap(
    const ExplicitLaunch& launch, const Config& config = Config::load(),
    const RendezvousListener* listener = nullptr);

}  // namespace strata
