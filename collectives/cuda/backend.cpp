// strata-collectives-cuda.so: collectives on CUDA device memory (docs/collectives-cuda.md).
//
// The backend is created with every Communicator (collective over its ranks). When every rank
// has a CUDA device, it allocates each rank's scratch through the Context (the nvlink transport:
// device memory, exported by CUDA IPC), maps the scratch of every rank of its host, and keeps
// per-block state in device memory and the abort record in mapped host memory. When the ranks
// span several hosts, it also sets up the network step to
// the ranks of its local index on the other hosts (net_setup.hpp: a proxy, pinned bounce
// buffers; a send/recv peer of another local index gets a pair of its own on first use), and the
// cross-host algorithm serves every call (net_plan.hpp). Otherwise it serves
// nothing and says why (unsuitable()), so that host-memory use is unaffected.
//
// A call builds the kernel arguments and enqueues one kernel (across hosts: the plan's few) on
// the caller's stream, records an event after it (teardown waits for them), and does not wait.
// Kernels wait for their peers as long as the peers may still come: a rank that reaches a call
// late is not an error. A wait ends early when the host sets the stop word (a monitor thread checks
// the peers' processes every 50 ms; destroying the communicator sets it too), or after
// collectives.cuda.wait_limit without progress; the kernel then writes the abort record and exits,
// and asyncError() turns it into PeerLost or Timeout naming the peer, which
// Communicator::asyncError() and the next call report; the Communicator is then unusable.

#include <cuda_runtime.h>
#include <signal.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <strata/backend/collectives.hpp>
#include <strata/backend/device_guard.hpp>
#include <strata/backend/module.hpp>
#include <strata/bootstrap.hpp>
#include <strata/error.hpp>
#include <strata/memory.hpp>
#include <strata/transport.hpp>
#include <strata/version.hpp>

#include "base/config_keys.hpp"
#include "base/log.hpp"
#include "launch.hpp"
#include "monitor.hpp"
#include "net_plan.hpp"
#include "net_setup.hpp"
#include "stall.hpp"
#include "teardown.hpp"

namespace strata::cuda {
namespace {

using backend::Algorithm;
using backend::BufferKind;
using backend::CollectiveOp;
using backend::CollectiveRequest;

constexpr const char* kLog = "cuda-coll";

static_assert(static_cast<int>(DataType::Float16) == static_cast<int>(ElemType::Half));
static_assert(static_cast<int>(DataType::BFloat16) == static_cast<int>(ElemType::BFloat16));
static_assert(static_cast<int>(DataType::Float64) == static_cast<int>(ElemType::Double));
static_assert(static_cast<int>(ReduceOp::Avg) == static_cast<int>(RedOp::Avg));

Tuning readTuning(const Config& c) {
  Tuning t;
  t.oneShotMax = config::getBytes(c, "collectives.cuda.oneshot_max_bytes");
  t.twoShotMax = config::getBytes(c, "collectives.cuda.twoshot_max_bytes");
  t.packetsMax = config::getBytes(c, "collectives.cuda.packets_max_bytes");
  t.staging = config::getBytes(c, "collectives.cuda.staging_bytes");
  t.maxBlocks = static_cast<uint32_t>(config::getInt(c, "collectives.cuda.max_blocks"));
  t.threads = static_cast<uint32_t>(config::getInt(c, "collectives.cuda.threads"));
  t.netChunk = config::getBytes(c, "collectives.cuda.net_chunk_bytes");
  return t;
}

std::string cudaWhy(const char* what, cudaError_t e) {
  return fmt::format("{}: {} ({})", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

/// Whether work on `stream` is being captured into a graph (a status that cannot be read counts
/// as capturing: the callers then take the path that is safe in a capture).
bool capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  return cudaStreamIsCapturing(stream, &capture) != cudaSuccess ||
         capture != cudaStreamCaptureStatusNone;
}

/// The driver's context calls, through the runtime (the module links no libcuda: a machine
/// without the driver must still load it and say why it serves nothing).
struct RuntimeContextApi {
  using GetFn = int (*)(void**);
  using SetFn = int (*)(void*);
  template <class Fn>
  static Fn entry(const char* name) {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult status{};
    if (cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &status) !=
            cudaSuccess ||
        status != cudaDriverEntryPointSuccess) {
      return nullptr;
    }
    return reinterpret_cast<Fn>(fn);
  }
  static int getContext(void** ctx) {
    static const GetFn fn = entry<GetFn>("cuCtxGetCurrent");
    return fn != nullptr ? fn(ctx) : -1;
  }
  static int setContext(void* ctx) {
    static const SetFn fn = entry<SetFn>("cuCtxSetCurrent");
    return fn != nullptr ? fn(ctx) : -1;
  }
  static int setDevice(int device) { return static_cast<int>(cudaSetDevice(device)); }
};
using DeviceGuard = backend::DeviceGuardT<RuntimeContextApi>;

/// Whether an MPS control daemon runs for this process: CUDA connects to MPS when its control
/// pipe exists ($CUDA_MPS_PIPE_DIRECTORY, default /tmp/nvidia-mps, holds "control").
bool mpsControlRunning() {
  const char* dir = std::getenv("CUDA_MPS_PIPE_DIRECTORY");
  const std::string pipe =
      std::string(dir != nullptr && *dir ? dir : "/tmp/nvidia-mps") + "/control";
  struct stat st {};
  return ::stat(pipe.c_str(), &st) == 0;
}

/// The cross-host plan's name for a request's op.
NetOp netOpOf(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::AllReduce:
      return NetOp::AllReduce;
    case CollectiveOp::AllGather:
      return NetOp::AllGather;
    case CollectiveOp::ReduceScatter:
      return NetOp::ReduceScatter;
    case CollectiveOp::Broadcast:
      return NetOp::Broadcast;
    case CollectiveOp::AllToAll:
      return NetOp::AllToAll;
    case CollectiveOp::Send:
    case CollectiveOp::Recv:
    case CollectiveOp::SendRecv:
      break;
  }
  return NetOp::SendRecv;
}

/// A point-to-point request's sends and receives, in bytes: a sendRecv batch's items, or the one
/// Send or Recv (none for a collective).
std::vector<P2pItem> p2pItems(const CollectiveRequest& r) {
  std::vector<P2pItem> items;
  auto add = [&](bool send, int peer, const void* src, void* dst, uint64_t count, DataType t) {
    P2pItem it;
    it.send = send;
    it.peer = peer;
    it.src = static_cast<const char*>(src);
    it.dst = static_cast<char*>(dst);
    it.bytes = count * sizeOf(t);
    items.push_back(it);
  };
  if (r.op == CollectiveOp::Send || r.op == CollectiveOp::Recv) {
    add(r.op == CollectiveOp::Send, r.peer, r.send, r.recv, r.count, r.type);
  }
  if (r.op == CollectiveOp::SendRecv) {
    for (const PointToPoint& p : r.batch) {
      add(p.kind == PointToPoint::Kind::Send, p.peer, p.send, p.recv, p.count, p.type);
    }
  }
  return items;
}

class CudaBackend;

/// One family of kernels, one kernel per op.
class CudaAlgorithm final : public Algorithm {
 public:
  enum class Family { OneShot, TwoShot, Direct, CrossHost };
  CudaAlgorithm(CudaBackend& be, Family f) : be_(be), family_(f) {}

  std::string_view name() const noexcept override {
    switch (family_) {
      case Family::OneShot:
        return "oneshot-ll8";
      case Family::TwoShot:
        return "twoshot-ll16";
      case Family::Direct:
        break;
      case Family::CrossHost:
        return "cross-host";
    }
    return "direct-staged";
  }
  std::vector<CollectiveOp> ops() const override {
    switch (family_) {
      case Family::OneShot:
        return {CollectiveOp::AllReduce, CollectiveOp::AllGather, CollectiveOp::Broadcast,
                CollectiveOp::AllToAll};
      case Family::TwoShot:
        return {CollectiveOp::AllReduce, CollectiveOp::ReduceScatter};
      case Family::Direct:
      case Family::CrossHost:
        break;
    }
    return {CollectiveOp::AllReduce, CollectiveOp::AllGather, CollectiveOp::ReduceScatter,
            CollectiveOp::Broadcast, CollectiveOp::AllToAll,  CollectiveOp::Send,
            CollectiveOp::Recv,      CollectiveOp::SendRecv};
  }
  std::string describe() const override;
  std::string describeFamily(const Tuning& t) const;
  std::string unsuitable(const CollectiveRequest& r) const override;
  bool prefers(const CollectiveRequest& r) const override;
  void run(const CollectiveRequest& r) override;
  std::string launchShape() const override { return shape_; }

  KernelId kernelFor(CollectiveOp op) const {
    const bool packets = family_ != Family::Direct;
    switch (op) {
      case CollectiveOp::AllReduce:
        return family_ == Family::OneShot   ? KernelId::AllReduceOneShot
               : family_ == Family::TwoShot ? KernelId::AllReduceTwoShot
                                            : KernelId::AllReduceDirect;
      case CollectiveOp::ReduceScatter:
        return packets ? KernelId::ReduceScatterPackets : KernelId::ReduceScatterDirect;
      case CollectiveOp::AllGather:
        return packets ? KernelId::AllGatherPackets : KernelId::AllGatherDirect;
      case CollectiveOp::Broadcast:
        return packets ? KernelId::BroadcastPackets : KernelId::BroadcastDirect;
      case CollectiveOp::AllToAll:
        return packets ? KernelId::AllToAllPackets : KernelId::AllToAllDirect;
      case CollectiveOp::Send:
      case CollectiveOp::SendRecv:  // pieces of Send and Recv (CudaBackend::launchBatch)
        return KernelId::Send;
      case CollectiveOp::Recv:
        return KernelId::Recv;
    }
    return KernelId::AllReduceDirect;
  }

 private:
  CudaBackend& be_;
  Family family_;
  std::string shape_;
};

class CudaBackend final : public backend::CollectivesBackend {
 public:
  explicit CudaBackend(const backend::CollectivesInit& init);
  ~CudaBackend() override;
  std::string_view name() const noexcept override { return "cuda"; }
  std::vector<BufferKind> memoryKinds() const override { return {BufferKind::CudaDevice}; }
  std::vector<Algorithm*> algorithms() override {
    return {&oneShot_, &twoShot_, &direct_, &crossHostAlgo_};
  }
  /// The abort record as Timeout (or PeerLost when the peer process is gone).
  std::optional<Error> asyncError() const override;

  /// Why nothing can run here (empty: ready).
  const std::string& why() const { return why_; }
  const Tuning& tuning() const { return tuning_; }
  const ScratchLayout& layout() const { return base_.layout; }
  int size() const { return size_; }
  /// Ranks on several hosts, served by the cross-host family (net_plan.hpp).
  bool crossHost() const { return crossHost_; }
  const NetLayout& netLayout() const { return net_; }
  /// Enqueues a call across the hosts (planCrossHost's launches); returns what ran.
  std::string launchCrossHost(const CollectiveRequest& r);
  /// Enqueues the kernel (with `shape`, or the one shapeFor gives); returns the launch shape.
  std::string launch(KernelId id, const CollectiveRequest& r,
                     std::optional<Shape> shape = std::nullopt);
  /// Enqueues a batch of sends and receives as one-round pieces in p2pSchedule's order.
  std::string launchBatch(const CollectiveRequest& r);
  /// Records an event after a launch on stream (not while the stream is being captured into a
  /// graph: a graph's launches are the user's to finish before destroying the communicator).
  void trackLaunch(cudaStream_t stream);

 private:
  /// The first agreement, one allGather: throws InvalidConfig on every rank when some rank's
  /// collectives.cuda.* differ from rank 0's (the scratch layout and the kernel choice derive
  /// from them); otherwise as agree().
  int agreeOnStart(const std::string& localError);
  /// Every rank says whether its step worked; returns the first rank that failed, or -1.
  int agree(const std::string& localError);
  std::string probeDevice();
  std::string allocate();
  std::string exchange();
  /// Ranks on several hosts: the network step's peers, bounce buffers (pinned and mapped) and
  /// proxy; collective among the ranks of this local index.
  std::string setUpNet();
  /// Pins host memory the kernels use and maps it (cudaHostRegister); empty or why not.
  std::string pinMapped(void* p, size_t bytes, void** dev);
  /// Send/recv peers of another host and local index: their pairs, made on first use
  /// (collective with each of them: they are in the matching call), pinned and mapped.
  void addPairs(const std::vector<int>& ranks);
  /// Stops the proxy, unregisters the pinned memory and frees the network step's resources.
  void releaseNet() noexcept;
  /// The network step's failure (its proxy's first error), or nullopt.
  std::optional<Error> netError() const;
  /// The rank an abort record's peer names (local index, or -1 - rank across hosts); -1 if none.
  int recordedPeer(int64_t recorded) const;
  void release() noexcept;

  std::shared_ptr<Context> context_;
  int rank_ = 0;
  int size_ = 1;
  // This rank's host: its ranks (in rank order), this rank's index and their number. On one
  // host, every rank; across hosts the one-host kernels run among these.
  std::vector<int> localRanks_;
  int localRank_ = 0;
  int localSize_ = 1;
  // Across hosts (net_plan.hpp, net_setup.hpp).
  bool crossHost_ = false;
  NetLayout net_;
  std::unique_ptr<NetPeers> netPeers_;
  NetArgs netArgs_;
  std::map<int, NetLane> pairLanes_;  ///< addPairs: a send/recv peer's lane, by its rank
  bool netPolling_ = false;           ///< the proxy polls (beginDeviceWork)
  std::vector<void*> pinned_;         ///< host ranges registered with cudaHostRegister
  void* netDevice_ = nullptr;         ///< device memory: NetState, then the FIFO's 2 words
  char* workspace_ = nullptr;         ///< device memory for planCrossHost's workspace
  uint64_t workspaceBytes_ = 0;
  std::vector<void*> oldWorkspaces_;  ///< outgrown, kept until teardown (launches may use them)
  int device_ = -1;
  GpuUuid uuid_{};
  bool mps_ = false;  ///< an MPS control daemon answers here (its pipe exists)
  Tuning tuning_;
  double timeoutSeconds_ = 30;
  std::string why_;
  RegisteredMemory scratch_;
  std::vector<RegisteredMemory> peers_;
  RankState* state_ = nullptr;  ///< device memory
  /// What the host and the kernels share, in mapped host memory: the kernels' abort record and
  /// the host's stop word (with why it was set).
  struct HostWords {
    AbortRecord abort;
    uint64_t stop;                 ///< non-zero: every wait of this rank's kernels gives up
    int64_t stopPeer;              ///< the lost peer (-1: none)
    uint64_t stopReason;           ///< StopReason
    uint64_t started[kCallSlots];  ///< the kernels' KernelArgs::started: calls that began
  };
  HostWords* host_ = nullptr;
  AbortRecord* abortHost_ = nullptr;  ///< &host_->abort
  double waitLimitSeconds_ = 600;
  /// Events recorded after launches not yet known complete (teardown waits for them).
  std::vector<cudaEvent_t> pending_;
  std::vector<cudaEvent_t> spareEvents_;
  // The stall monitor (stall.hpp): every rank's board of device collectives, and this rank's
  // calls in flight, each with an event after its kernel.
  RegisteredMemory board_;  ///< this rank's LaunchBoard (host memory)
  std::vector<RegisteredMemory> peerBoards_;
  std::vector<const LaunchBoard*> boards_;  ///< every rank's, mapped; empty: not monitored
  uint64_t calls_ = 0;                      ///< device collectives issued (the calling thread)
  struct InFlight {
    uint64_t call;
    cudaEvent_t done;
  };
  mutable std::mutex flightMu_;
  std::deque<InFlight> inflight_;         ///< under flightMu_
  std::vector<cudaEvent_t> flightSpare_;  ///< under flightMu_
  StallVerdict verdict_;                  ///< under flightMu_: set once, by the monitor
  // The monitor thread's own.
  uint64_t checkedCall_ = 0, runningCall_ = 0;
  std::chrono::steady_clock::time_point runningSince_;
  /// Publishes call r (not on a capturing stream); returns its number, 0 when not tracked.
  uint64_t publish(const CollectiveRequest& r);
  /// After a tracked launch: an event the monitor polls.
  void trackCall(uint64_t call, cudaStream_t stream);
  /// The monitor's turn: completions, mismatches, stalls.
  void checkCalls();
  // The monitor: checks the peers' processes while the backend lives.
  std::thread monitor_;
  std::mutex monitorMu_;
  std::condition_variable monitorCv_;
  bool monitorQuit_ = false;
  void startMonitor();
  void stopMonitor() noexcept;
  /// Sets the stop word (the first reason wins).
  void raiseStop(StopReason why, int peer) noexcept;
  /// Waits up to `seconds` for every pending launch; true when all completed.
  bool waitPending(double seconds) noexcept;
  /// The teardown: wait for this communicator's work, then barrier, unmap, barrier, free.
  void teardown() noexcept;
  KernelArgs base_;
  CudaAlgorithm oneShot_{*this, CudaAlgorithm::Family::OneShot};
  CudaAlgorithm twoShot_{*this, CudaAlgorithm::Family::TwoShot};
  CudaAlgorithm direct_{*this, CudaAlgorithm::Family::Direct};
  CudaAlgorithm crossHostAlgo_{*this, CudaAlgorithm::Family::CrossHost};
};

std::string CudaAlgorithm::describe() const {
  const Tuning& t = be_.tuning();
  const std::string off = be_.why().empty() ? "" : "; not available here: " + be_.why();
  return describeFamily(t) + off;
}

std::string CudaAlgorithm::describeFamily(const Tuning& t) const {
  switch (family_) {
    case Family::OneShot:
      return fmt::format(
          "device memory, one host: every rank writes its data to every peer as LL8 packets "
          "(one hop); auto: allReduce up to {} B per rank, allGather/broadcast/allToAll up to "
          "{} B",
          t.oneShotMax, t.packetsMax);
    case Family::TwoShot:
      return fmt::format(
          "device memory, one host: LL16 packets to each segment's owner, which folds and "
          "sends the result back (two hops); auto: allReduce up to {} B per rank, "
          "reduceScatter up to {} B",
          t.twoShotMax, t.packetsMax);
    case Family::Direct:
      break;
    case Family::CrossHost:
      return fmt::format(
          "device memory, several hosts, any placement of the ranks: allReduce as "
          "reduce-scatter in the host, the shard across the hosts through PortChannels (the "
          "proxy and the fabric transport, pinned host bounce slots of {} B), all-gather in the "
          "host; broadcast, allGather, reduceScatter and allToAll likewise; with different rank "
          "counts per host, through each host's local rank 0 (allToAll as send/recv); send/recv "
          "with any other rank (a pair of slots of its own on first use with a rank of another "
          "host and local index; batches as one-round pieces); every size",
          t.netChunk);
  }
  return fmt::format(
      "device memory, one host: staged in {} B chunks that peers read with 16-byte loads, "
      "semaphore handshakes per chunk (reduce-scatter + all-gather for allReduce); every size",
      t.staging);
}

std::string CudaAlgorithm::unsuitable(const CollectiveRequest& r) const {
  if (!be_.why().empty()) return be_.why();
  if (family_ == Family::CrossHost) {
    if (!be_.crossHost()) return "the ranks share one host (the one-host algorithms serve them)";
    for (const P2pItem& it : p2pItems(r)) {
      if (std::string why = p2pPeerUnsuitable(it.peer, be_.netLayout()); !why.empty()) return why;
    }
    return {};
  }
  if (be_.crossHost()) return "the ranks span several hosts (cross-host serves them)";
  const KernelId id = kernelFor(r.op);
  if (usesPackets(id) && !fitsPackets(id, r.bytes(), be_.size(), be_.layout())) {
    return fmt::format(
        "{} B per rank do not fit its packet slots ({} B; "
        "collectives.cuda.twoshot_max_bytes sizes them)",
        r.bytes(), be_.layout().slotBytes(be_.size()));
  }
  return {};
}

bool CudaAlgorithm::prefers(const CollectiveRequest& r) const {
  const Tuning& t = be_.tuning();
  switch (family_) {
    case Family::OneShot:
      return r.op == CollectiveOp::AllReduce ? r.bytes() <= t.oneShotMax
                                             : r.bytes() <= t.packetsMax;
    case Family::TwoShot:
      return r.op == CollectiveOp::AllReduce ? r.bytes() <= t.twoShotMax
                                             : r.bytes() <= t.packetsMax;
    case Family::Direct:
    case Family::CrossHost:
      break;
  }
  return true;
}

void CudaAlgorithm::run(const CollectiveRequest& r) {
  if (family_ == Family::CrossHost) {
    shape_ = be_.launchCrossHost(r);
    return;
  }
  shape_ = r.op == CollectiveOp::SendRecv ? be_.launchBatch(r) : be_.launch(kernelFor(r.op), r);
}

CudaBackend::CudaBackend(const backend::CollectivesInit& init)
    : context_(init.context), rank_(init.topology.rank), size_(init.topology.size) {
  tuning_ = readTuning(*init.config);
  timeoutSeconds_ = config::getDouble(*init.config, "transport.timeout");
  waitLimitSeconds_ = config::getDouble(*init.config, "collectives.cuda.wait_limit");
  for (const auto& group : init.topology.hosts) {
    if (std::find(group.begin(), group.end(), rank_) != group.end()) localRanks_ = group;
  }
  if (localRanks_.empty()) localRanks_ = {rank_};
  localSize_ = static_cast<int>(localRanks_.size());
  localRank_ = static_cast<int>(std::find(localRanks_.begin(), localRanks_.end(), rank_) -
                                localRanks_.begin());
  if (init.topology.hosts.size() > 1) {
    if (std::string why = crossHostLayout(init.topology.hosts, rank_, &net_); !why.empty()) {
      why_ = "the ranks are on several hosts and " + why;
    } else if (tuning_.netChunk == 0 || tuning_.netChunk % 16 != 0) {
      why_ = fmt::format("collectives.cuda.net_chunk_bytes is {}, not a positive multiple of 16",
                         tuning_.netChunk);
    } else {
      crossHost_ = true;
    }
  } else if (size_ > kMaxRanks) {
    why_ = fmt::format("{} ranks on one host: the cuda module serves at most {}", size_, kMaxRanks);
  }
  // Each step is local; the ranks then agree, so that all go on or none does. The topology is
  // the same everywhere, so either every rank probes or none does.
  std::string local = why_.empty() ? probeDevice() : std::string();
  int failed = agreeOnStart(local);
  if (!why_.empty()) return;
  if (failed < 0) {
    local = allocate();
    failed = agree(local);
  }
  if (failed < 0) {
    local = exchange();
    failed = agree(local);
  }
  if (failed < 0 && crossHost_) {
    local = setUpNet();
    failed = agree(local);
  }
  if (failed >= 0) {
    why_ = !local.empty()
               ? local
               : fmt::format("rank {} cannot use CUDA collectives (see its log)", failed);
    STRATA_LOG(Debug, kLog, "cuda collectives disabled: {}", why_);
    release();
    return;
  }
  startMonitor();
}

CudaBackend::~CudaBackend() {
  teardown();
  if (abortHost_ != nullptr && abortHost_->code == AbortRecord::Timeout) {
    STRATA_LOG(Error, kLog,
               "a cuda collective of this communicator timed out (rank {} waited for rank {}) "
               "and was never reported by a later call",
               rank_, recordedPeer(abortHost_->peer));
  }
  release();
}

void CudaBackend::startMonitor() {
  monitor_ = std::thread([this] {
    std::unique_lock lk(monitorMu_);
    while (!monitorQuit_) {
      monitorCv_.wait_for(lk, std::chrono::milliseconds(50));
      if (monitorQuit_) break;
      // A revoke first; else a peer process on this host that is gone (monitor.hpp). The
      // kernels' waits give up at their next abort-word poll; nothing more to watch then.
      const StopDecision d =
          monitorTurn(context_->revoked().has_value(), rank_, size_, [this](int q) {
            if (!context_->sameHost(q)) return false;  // another host's pid means nothing here
            const int32_t pid = context_->pid(q);
            return pid > 0 && ::kill(pid, 0) != 0 && errno == ESRCH;
          });
      if (d.why == kPeerLost) {
        STRATA_LOG(Error, kLog,
                   "rank {} (pid {}) has exited: stopping this rank's cuda collectives", d.peer,
                   context_->pid(d.peer));
      }
      if (d.why != kNoStop) {
        raiseStop(d.why, d.peer);
        return;
      }
      if (std::optional<Error> e = netError()) {
        STRATA_LOG(Error, kLog, "stopping this rank's cuda collectives: {}", e->what());
        raiseStop(kNetwork, e->peer());
        return;
      }
      lk.unlock();
      checkCalls();
      lk.lock();
    }
  });
}

void CudaBackend::stopMonitor() noexcept {
  if (!monitor_.joinable()) return;
  {
    std::lock_guard lk(monitorMu_);
    monitorQuit_ = true;
  }
  monitorCv_.notify_all();
  monitor_.join();
}

void CudaBackend::raiseStop(StopReason why, int peer) noexcept {
  if (host_ == nullptr || __atomic_load_n(&host_->stop, __ATOMIC_ACQUIRE) != 0) return;
  host_->stopPeer = peer;
  host_->stopReason = why;
  __atomic_store_n(&host_->stop, uint64_t{1}, __ATOMIC_RELEASE);
}

bool CudaBackend::waitPending(double seconds) noexcept {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  for (;;) {
    size_t open = 0;
    for (cudaEvent_t& ev : pending_) {
      if (ev == nullptr) continue;
      const cudaError_t e = cudaEventQuery(ev);
      if (e == cudaErrorNotReady) {
        ++open;
        continue;
      }
      cudaEventDestroy(ev);  // complete, or an error: either way nothing more runs
      ev = nullptr;
    }
    if (open == 0) {
      pending_.clear();
      return true;
    }
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void CudaBackend::teardown() noexcept {
  if (host_ == nullptr) {
    stopMonitor();
    return;
  }
  DeviceGuard guard(device_);
  // The order is teardownSequence's (teardown.hpp), which the emulation runs too.
  struct Api {
    CudaBackend& be;
    bool stopped() const { return __atomic_load_n(&be.host_->stop, __ATOMIC_ACQUIRE) != 0; }
    // A revoked communicator's peers may be dead or stopped (shrink goes on without them): no
    // barrier with them either.
    bool peerLost() const {
      return peersMayBeGone(be.host_->stopReason, be.context_->revoked().has_value());
    }
    bool waitPending(double seconds) { return be.waitPending(seconds); }
    void raiseStop() { be.raiseStop(kDestroyed, -1); }
    void workDone() {
      be.stopMonitor();
      for (cudaEvent_t ev : be.spareEvents_) cudaEventDestroy(ev);
      be.spareEvents_.clear();
      std::lock_guard lk(be.flightMu_);
      for (const InFlight& f : be.inflight_) cudaEventDestroy(f.done);
      for (cudaEvent_t ev : be.flightSpare_) cudaEventDestroy(ev);
      be.inflight_.clear();
      be.flightSpare_.clear();
    }
    void barrier() { be.context_->bootstrap().barrier(); }
    void unmapPeers() {
      be.releaseNet();
      be.peers_.clear();
      be.boards_.clear();
      be.peerBoards_.clear();
    }
    void leak() {
      STRATA_LOG(Error, kLog,
                 "destroying the communicator: {} cuda collective launch(es) still run 5 s after "
                 "the stop; their memory is not freed (leaked) so that they cannot fault",
                 be.pending_.size());
      be.stopMonitor();
      // Leaked, with the scratch, the state and the mappings: a running kernel may still use
      // them (kept reachable for the process's life, so that leak checkers stay quiet).
      static auto* graveyard = new std::vector<RegisteredMemory>();
      graveyard->push_back(std::move(be.scratch_));
      for (auto& p : be.peers_) graveyard->push_back(std::move(p));
      // The network step's too, with its proxy stopped (nothing more moves).
      if (be.netPeers_) be.netPeers_->proxy().stop();
      static auto* netGraveyard = new std::vector<std::unique_ptr<NetPeers>>();
      netGraveyard->push_back(std::move(be.netPeers_));
      be.pinned_.clear();
      be.pairLanes_.clear();
      be.netDevice_ = nullptr;
      be.workspace_ = nullptr;
      be.oldWorkspaces_.clear();
      be.peers_.clear();
      be.host_ = nullptr;
      be.abortHost_ = nullptr;
      be.state_ = nullptr;
    }
    void warn(const std::string& text) { STRATA_LOG(Warn, kLog, "{}", text); }
  } api{*this};
  teardownSequence(api, size_, timeoutSeconds_);
}

void CudaBackend::release() noexcept {
  releaseNet();
  peers_.clear();
  boards_.clear();
  peerBoards_.clear();
  board_ = RegisteredMemory();
  scratch_ = RegisteredMemory();
  if (state_ != nullptr) cudaFree(state_);
  if (host_ != nullptr) cudaFreeHost(host_);
  state_ = nullptr;
  host_ = nullptr;
  abortHost_ = nullptr;
}

int CudaBackend::agreeOnStart(const std::string& localError) {
  // The seven keys, whether this rank's step worked, its GPU's UUID (two words) and whether it
  // runs under MPS.
  constexpr int kWords = 11;
  uint64_t uuid[2] = {};
  std::memcpy(uuid, uuid_.data(), sizeof uuid);
  const uint64_t mine[kWords] = {tuning_.oneShotMax,
                                 tuning_.twoShotMax,
                                 tuning_.packetsMax,
                                 tuning_.staging,
                                 tuning_.maxBlocks,
                                 tuning_.threads,
                                 tuning_.netChunk,
                                 localError.empty() ? 1u : 0u,
                                 uuid[0],
                                 uuid[1],
                                 mps_ ? 1u : 0u};
  constexpr int kKeyWords = 7;
  static const char* const kKeys[kKeyWords] = {
      "collectives.cuda.oneshot_max_bytes", "collectives.cuda.twoshot_max_bytes",
      "collectives.cuda.packets_max_bytes", "collectives.cuda.staging_bytes",
      "collectives.cuda.max_blocks",        "collectives.cuda.threads",
      "collectives.cuda.net_chunk_bytes"};
  std::vector<uint64_t> all(kWords * static_cast<size_t>(size_));
  std::copy(std::begin(mine), std::end(mine), all.begin() + kWords * rank_);
  context_->bootstrap().allGather(all.data(), sizeof(mine));
  for (int r = 1; r < size_; ++r) {
    for (int k = 0; k < kKeyWords; ++k) {
      if (all[kWords * r + k] != all[k]) {
        throw Error(ErrorCode::InvalidConfig,
                    fmt::format("ranks disagree on {}: rank 0 has {}, rank {} has {}. Every rank "
                                "must use the same value: check the STRATA_* environment and "
                                "strata.toml on every node",
                                kKeys[k], all[k], r, all[kWords * r + k]),
                    r);
      }
    }
  }
  for (int r = 0; r < size_; ++r) {
    if (all[kWords * r + kKeyWords] == 0) return r;
  }
  // Every rank has a device: ranks that share one need MPS (the same verdict on every rank).
  std::vector<GpuUuid> uuids(static_cast<size_t>(size_));
  std::vector<int32_t> pids(static_cast<size_t>(size_));
  bool mps = true;
  for (int r = 0; r < size_; ++r) {
    std::memcpy(uuids[r].data(), &all[kWords * r + kKeyWords + 1], 16);
    pids[r] = context_->pid(r);
    mps = mps && all[kWords * r + kKeyWords + 3] != 0;
  }
  if (std::string why = sharedGpuProblem(uuids, pids, mps); !why.empty()) why_ = std::move(why);
  return -1;
}

int CudaBackend::agree(const std::string& localError) {
  std::vector<uint8_t> ok(static_cast<size_t>(size_));
  ok[rank_] = localError.empty() ? 1 : 0;
  context_->bootstrap().allGather(ok.data(), 1);
  for (int r = 0; r < size_; ++r) {
    if (!ok[r]) return r;
  }
  return -1;
}

std::string CudaBackend::probeDevice() {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) return cudaWhy("no usable CUDA device (cudaGetDeviceCount)", e);
  if (count == 0) return "no CUDA device";
  e = cudaGetDevice(&device_);
  if (e != cudaSuccess) return cudaWhy("cudaGetDevice", e);
  cudaDeviceProp prop{};
  e = cudaGetDeviceProperties(&prop, device_);
  if (e != cudaSuccess) return cudaWhy("cudaGetDeviceProperties", e);
  std::memcpy(uuid_.data(), prop.uuid.bytes, uuid_.size());
  mps_ = mpsControlRunning();
  return {};
}

std::string CudaBackend::allocate() {
  try {
    DeviceGuard guard(device_);
    if (std::string bad = preloadKernels(std::clamp<uint32_t>(tuning_.threads, 32, kMaxThreads));
        !bad.empty()) {
      return bad;
    }
    base_.layout = layoutFor(tuning_, localSize_);
    scratch_ = context_->allocate(base_.layout.total(), MemoryKind::Cuda);
    // Zeroed on a private stream: the legacy stream would wait for every kernel on the device
    // (another communicator's, which may be waiting for this very rank).
    cudaStream_t zero = nullptr;
    cudaError_t e = cudaStreamCreateWithFlags(&zero, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaMemsetAsync(scratch_.data(), 0, base_.layout.total(), zero);
    if (e == cudaSuccess) e = cudaMalloc(reinterpret_cast<void**>(&state_), sizeof(RankState));
    if (e == cudaSuccess) e = cudaMemsetAsync(state_, 0, sizeof(RankState), zero);
    if (e == cudaSuccess) e = cudaStreamSynchronize(zero);  // zeroed before any peer maps it
    if (zero != nullptr) cudaStreamDestroy(zero);
    if (e == cudaSuccess) {
      e = cudaHostAlloc(reinterpret_cast<void**>(&host_), sizeof(HostWords), cudaHostAllocMapped);
    }
    if (e != cudaSuccess) return cudaWhy("allocating the collectives' scratch", e);
    std::memset(host_, 0, sizeof(HostWords));
    host_->stopPeer = -1;
    abortHost_ = &host_->abort;
    void* dev = nullptr;
    e = cudaHostGetDevicePointer(&dev, host_, 0);
    if (e != cudaSuccess) return cudaWhy("mapping the abort record", e);
    base_.abort = &static_cast<HostWords*>(dev)->abort;
    base_.stop = &static_cast<HostWords*>(dev)->stop;
    base_.started = static_cast<HostWords*>(dev)->started;
    board_ = context_->allocate(sizeof(LaunchBoard));
    new (board_.data()) LaunchBoard();
    base_.state = state_->blocks;
    base_.abortClaim = &state_->abortClaim;
    base_.rank = localRank_;
    base_.nranks = localSize_;
    base_.timeoutNs = kernelWaitLimitNs(waitLimitSeconds_);
    base_.scratch[localRank_] = static_cast<char*>(scratch_.data());
    return {};
  } catch (const Error& e) {
    return fmt::format("allocating the collectives' scratch through the context: {}", e.what());
  }
}

std::string CudaBackend::exchange() {
  // Records differ in size: every rank learns the largest, then all pad to it.
  std::vector<uint8_t> mine = scratch_.serialize();
  std::vector<uint64_t> sizes(static_cast<size_t>(size_));
  sizes[rank_] = mine.size();
  context_->bootstrap().allGather(sizes.data(), sizeof(uint64_t));
  const uint64_t most = *std::max_element(sizes.begin(), sizes.end());
  std::vector<uint8_t> all(most * size_);
  std::copy(mine.begin(), mine.end(), all.begin() + most * rank_);
  context_->bootstrap().allGather(all.data(), most);
  // The boards of the stall monitor: host memory every rank of the host maps. Across hosts
  // there are none (no stall monitor: the kernels' wait limit and the proxy's errors remain).
  if (!crossHost_) {
    try {
      std::vector<int> others;
      for (int q = 0; q < size_; ++q) {
        if (q != rank_) others.push_back(q);
      }
      peerBoards_ = context_->exchange(board_, others);
      boards_.assign(static_cast<size_t>(size_), nullptr);
      boards_[rank_] = static_cast<const LaunchBoard*>(board_.data());
      for (size_t i = 0; i < others.size(); ++i) {
        boards_[others[i]] = static_cast<const LaunchBoard*>(peerBoards_[i].hostPointer());
        if (boards_[others[i]] == nullptr) {
          return fmt::format("rank {}'s launch board is not mapped into this process", others[i]);
        }
      }
    } catch (const Error& e) {
      boards_.clear();
      return fmt::format("mapping the peers' launch boards: {}", e.what());
    }
  }
  try {
    // The scratch of this host's ranks (indexed by local rank; all ranks on one host).
    peers_.resize(static_cast<size_t>(localSize_));
    for (int i = 0; i < localSize_; ++i) {
      const int q = localRanks_[i];
      if (q == rank_) continue;
      peers_[i] = RegisteredMemory::deserialize(
          *context_, std::span<const uint8_t>(all.data() + most * q, sizes[q]), q);
      void* p = peers_[i].devicePointer();
      if (p == nullptr) {
        return fmt::format(
            "rank {}'s scratch is not mapped into this process (needs the nvlink "
            "transport: transport.intra_node)",
            q);
      }
      base_.scratch[i] = static_cast<char*>(p);
    }
  } catch (const Error& e) {
    return fmt::format("mapping the peers' scratch: {}", e.what());
  }
  return {};
}

std::string CudaBackend::setUpNet() {
  try {
    DeviceGuard guard(device_);
    std::vector<int> peerOf(static_cast<size_t>(net_.hosts));
    for (int h = 0; h < net_.hosts; ++h) {
      peerOf[h] = net_.local < net_.countOf(h) ? net_.rankOf(h, net_.local) : -1;
    }
    netPeers_ =
        std::make_unique<NetPeers>(*context_, peerOf, net_.host, tuning_.netChunk, timeoutSeconds_);
    // Pinned and mapped: the kernels write the send bounce and the FIFO, read the receive
    // bounce and the counters (which the fabric transport writes).
    NetPeers::Views v;
    void* send = nullptr;
    void* recv = nullptr;
    void* flags = nullptr;
    void* fifo = nullptr;
    std::span<std::byte> fifoMem = netPeers_->proxy().fifoMemory();
    std::string why = pinMapped(netPeers_->sendBounce(), netPeers_->bounceBytes(), &send);
    if (why.empty()) why = pinMapped(netPeers_->recvBounce(), netPeers_->bounceBytes(), &recv);
    if (why.empty()) why = pinMapped(netPeers_->flags(), NetPeers::kFlagBytes, &flags);
    if (why.empty()) why = pinMapped(fifoMem.data(), fifoMem.size(), &fifo);
    if (!why.empty()) return why;
    const size_t deviceBytes = sizeof(NetState) + 2 * sizeof(uint64_t);
    cudaError_t e = cudaMalloc(&netDevice_, deviceBytes);
    cudaStream_t zero = nullptr;
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&zero, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaMemsetAsync(netDevice_, 0, deviceBytes, zero);
    if (e == cudaSuccess) e = cudaStreamSynchronize(zero);
    if (zero != nullptr) cudaStreamDestroy(zero);
    if (e != cudaSuccess) return cudaWhy("allocating the network step's counters", e);
    v.sendBounce = static_cast<char*>(send);
    v.recvBounce = static_cast<const char*>(recv);
    v.flags = static_cast<uint64_t*>(flags);
    v.fifo = fifo;
    v.state = static_cast<NetState*>(netDevice_);
    v.fifoProducerWords =
        reinterpret_cast<uint64_t*>(static_cast<char*>(netDevice_) + sizeof(NetState));
    netArgs_ = netPeers_->args(v);
    // Kernels cannot wake the proxy: while the communicator lives it polls, then naps between
    // calls (ProxyService::beginDeviceWork; docs/collectives-cuda.md).
    netPeers_->proxy().beginDeviceWork();
    netPolling_ = true;
    return {};
  } catch (const Error& e) {
    return fmt::format("setting up the network step across the hosts: {}", e.what());
  }
}

std::string CudaBackend::pinMapped(void* p, size_t bytes, void** dev) {
  // A range pinned by an earlier try (one whose later pinning failed) is only mapped again:
  // registering it twice fails (cudaErrorHostMemoryAlreadyRegistered).
  if (std::find(pinned_.begin(), pinned_.end(), p) == pinned_.end()) {
    const cudaError_t e = cudaHostRegister(p, bytes, cudaHostRegisterMapped);
    if (e != cudaSuccess) return cudaWhy("pinning the network step's host memory", e);
    pinned_.push_back(p);
  }
  const cudaError_t e = cudaHostGetDevicePointer(dev, p, 0);
  return e == cudaSuccess ? std::string() : cudaWhy("mapping the network step's memory", e);
}

void CudaBackend::addPairs(const std::vector<int>& ranks) {
  // A pair made by an earlier call whose pinning failed is not made again; what was not pinned
  // then is tried again (pinMapped skips what was).
  std::vector<int> make;
  for (int r : ranks) {
    if (netPeers_->pair(r) == nullptr) make.push_back(r);
  }
  netPeers_->addPairs(*context_, make, make);  // the Context's ranks are the communicator's
  for (int r : ranks) {
    const NetPeers::Pair* p = netPeers_->pair(r);
    void* send = nullptr;
    void* recv = nullptr;
    void* flags = nullptr;
    std::string why = pinMapped(p->send.data(), p->send.size(), &send);
    if (why.empty()) why = pinMapped(p->recv.data(), p->recv.size(), &recv);
    if (why.empty()) why = pinMapped(p->flags.data(), p->flags.size(), &flags);
    if (!why.empty()) {
      throw Error(ErrorCode::BackendError,
                  fmt::format("cuda collectives: setting up send/recv with rank {}: {}", r, why));
    }
    pairLanes_[r] =
        netPeers_->pairLane(*p, static_cast<char*>(send), static_cast<const char*>(recv),
                            static_cast<uint64_t*>(flags));
  }
}

void CudaBackend::releaseNet() noexcept {
  if (netPeers_) {
    if (netPolling_) netPeers_->proxy().endDeviceWork();
    netPolling_ = false;
    netPeers_->proxy().stop();
  }
  for (void* p : pinned_) cudaHostUnregister(p);
  pinned_.clear();
  pairLanes_.clear();
  netPeers_.reset();
  if (netDevice_ != nullptr) cudaFree(netDevice_);
  netDevice_ = nullptr;
  if (workspace_ != nullptr) cudaFree(workspace_);
  for (void* w : oldWorkspaces_) cudaFree(w);
  workspace_ = nullptr;
  workspaceBytes_ = 0;
  oldWorkspaces_.clear();
}

std::optional<Error> CudaBackend::netError() const {
  if (!netPeers_) return std::nullopt;
  try {
    netPeers_->proxy().check();
  } catch (const Error& e) {
    const int peer = e.peer();
    return Error(
        e.code(),
        fmt::format("cuda collectives: the network step of rank {} failed{}: {}; that "
                    "collective's results are not valid and this communicator cannot "
                    "be used any more",
                    rank_,
                    peer >= 0 && peer < size_ ? fmt::format(" talking to rank {} on host {}", peer,
                                                            context_->hostName(peer))
                                              : std::string(),
                    e.what()),
        peer);
  }
  return std::nullopt;
}

int CudaBackend::recordedPeer(int64_t recorded) const {
  if (recorded < 0) {
    const int64_t rank = -1 - recorded;
    return rank < size_ ? static_cast<int>(rank) : -1;
  }
  return recorded < localSize_ ? localRanks_[static_cast<size_t>(recorded)] : -1;
}

std::string CudaBackend::launchCrossHost(const CollectiveRequest& r) {
  if (!why_.empty()) throw Error(ErrorCode::NotSupported, "cuda collectives: " + why_);
  if (!crossHost_) {
    throw Error(ErrorCode::NotSupported, "cuda collectives: the ranks share one host");
  }
  const auto stream = static_cast<cudaStream_t>(r.stream.handle);
  // A collective is one call; a Send, a Recv or a batch is a list of items (planCrossHostBatch);
  // an allToAll by pairs is both (its items make the pairs, planAllToAllByPairs plans it).
  std::vector<NetCall> calls;
  std::vector<P2pItem> items;
  std::optional<NetCall> byPairsCall;
  switch (r.op) {
    case CollectiveOp::AllReduce:
    case CollectiveOp::AllGather:
    case CollectiveOp::ReduceScatter:
    case CollectiveOp::Broadcast:
    case CollectiveOp::AllToAll: {
      NetCall c;
      c.type = static_cast<ElemType>(static_cast<int>(r.type));
      c.elemSize = sizeOf(r.type);
      c.op = netOpOf(r.op);
      c.redOp = static_cast<RedOp>(static_cast<int>(r.redop));
      c.send = r.send;
      c.recv = r.recv;
      c.count = r.count;
      c.root = r.root;
      if (byPairs(c, net_)) {
        items = allToAllItems(c, net_);
        byPairsCall = c;
      } else {
        calls.push_back(c);
      }
      break;
    }
    case CollectiveOp::Send:
    case CollectiveOp::Recv:
    case CollectiveOp::SendRecv:
      items = p2pItems(r);
      break;
  }
  DeviceGuard guard(device_);
  for (const NetCall& c : calls) {
    if (std::string why = netUnsuitable(c, net_); !why.empty()) {
      throw Error(ErrorCode::NotSupported, "cuda collectives: " + why);
    }
  }
  // A send/recv peer of another host and local index needs its pair, made on its first use.
  std::vector<int> newPairs;
  for (const P2pItem& it : items) {
    if (std::string why = p2pPeerUnsuitable(it.peer, net_); !why.empty()) {
      throw Error(ErrorCode::NotSupported, "cuda collectives: " + why);
    }
    if (it.bytes > 0 && needsPair(it.peer, net_) && !pairLanes_.contains(it.peer) &&
        std::find(newPairs.begin(), newPairs.end(), it.peer) == newPairs.end()) {
      newPairs.push_back(it.peer);
    }
  }
  if (!newPairs.empty()) {
    if (capturing(stream)) {
      throw Error(ErrorCode::NotSupported,
                  fmt::format("cuda collectives: the first send/recv between rank {} and rank {} "
                              "(another host and local index; an allToAll with different rank "
                              "counts per host is send/recvs) sets up their pair, which a stream "
                              "being captured cannot do: run it once before capturing",
                              rank_, newPairs.front()));
    }
    addPairs(newPairs);
  }
  KernelArgs local = base_;
  local.started = nullptr;  // no stall monitor across hosts
  local.call = 0;
  std::vector<PlannedLaunch> planned;
  auto pairLane = [&](int peer) { return &pairLanes_.at(peer); };
  if (byPairsCall) {
    planned =
        planAllToAllByPairs(*byPairsCall, net_, local, netArgs_, p2pBatchBlocks(tuning_), pairLane);
  } else if (!items.empty()) {
    planned = planCrossHostBatch(items, net_, local, netArgs_, p2pBatchBlocks(tuning_), pairLane);
  }
  for (NetCall& c : calls) {
    const uint64_t need = netWorkspaceBytes(c, net_);
    if (need > workspaceBytes_) {
      if (capturing(stream)) {
        throw Error(ErrorCode::NotSupported,
                    fmt::format("cuda collectives: this call needs {} B of workspace, more than "
                                "the {} B allocated so far, and a stream being captured cannot "
                                "allocate: run the call once before capturing it",
                                need, workspaceBytes_));
      }
      void* w = nullptr;
      const cudaError_t e = cudaMalloc(&w, need);
      if (e != cudaSuccess) {
        throw Error(ErrorCode::BackendError,
                    "cuda collectives: " + cudaWhy("allocating the cross-host workspace", e));
      }
      if (workspace_ != nullptr) oldWorkspaces_.push_back(workspace_);  // launches may use it
      workspace_ = static_cast<char*>(w);
      workspaceBytes_ = need;
    }
    c.workspace = workspace_;
    for (const PlannedLaunch& p : planCrossHost(c, net_, local, netArgs_)) planned.push_back(p);
  }
  std::string what;
  size_t launches = 0;
  for (const PlannedLaunch& p : planned) {
    const bool net = p.id == KernelId::NetReduce || p.id == KernelId::NetGather;
    Shape shape = shapeFor(p.id, p.args.bytes(), localSize_, tuning_, base_.layout);
    if (net) shape.blocks = 1;                   // the network step runs in one block
    if (p.blocks != 0) shape.blocks = p.blocks;  // a send/recv piece: both sides' grid
    const int e = launchKernel(p.id, p.type, p.args, shape, r.stream.handle);
    if (e != 0) {
      throw Error(
          ErrorCode::BackendError,
          "cuda collectives: " + cudaWhy(fmt::format("launching {}", toString(p.id)).c_str(),
                                         static_cast<cudaError_t>(e)));
    }
    if (launches++ < 8) what += (what.empty() ? "" : " + ") + toString(p.id);
  }
  trackLaunch(stream);
  // The path, for strata-perf's "algorithm:" lines: only the bounce path exists (no FI_HMEM).
  return fmt::format("cross-host, bounce path: {}{} ({} launches, pinned host slots of {} B)", what,
                     launches > 8 ? " + ..." : "", launches, tuning_.netChunk);
}

std::optional<Error> CudaBackend::asyncError() const {
  if (std::optional<Error> e = netError()) return e;
  {
    std::lock_guard lk(flightMu_);
    if (verdict_.kind != StallVerdict::None) {
      // A stall names the rank a kernel waited for once the stopped waits have written the
      // record (within microseconds of the stop word); until then, the lowest other rank.
      int peer = verdict_.peer;
      std::string waited;
      if (verdict_.kind == StallVerdict::Stall && abortHost_ != nullptr &&
          __atomic_load_n(&abortHost_->code, __ATOMIC_ACQUIRE) == AbortRecord::Stopped &&
          recordedPeer(abortHost_->peer) >= 0) {
        peer = recordedPeer(abortHost_->peer);
        waited = fmt::format("; a kernel of rank {} (block {}) waited for rank {}", rank_,
                             abortHost_->block, peer);
      }
      return Error(
          verdict_.kind == StallVerdict::Mismatch ? ErrorCode::ProtocolError : ErrorCode::Timeout,
          fmt::format("cuda collectives: {}{}; this communicator cannot be used any more",
                      verdict_.text, waited),
          peer);
    }
  }
  if (abortHost_ == nullptr || __atomic_load_n(&abortHost_->code, __ATOMIC_ACQUIRE) == 0) {
    return std::nullopt;
  }
  const int peer = recordedPeer(abortHost_->peer);
  if (abortHost_->code == AbortRecord::Stopped) {
    const std::optional<Error> revoked = context_->revoked();
    const StoppedBy by = stoppedBy(host_->stopReason, host_->stopPeer, size_, revoked.has_value());
    if (by == StoppedBy::Revoke) return revoked;
    const int lost = static_cast<int>(host_->stopPeer);
    if (by == StoppedBy::PeerLoss) {
      return Error(ErrorCode::PeerLost,
                   fmt::format("cuda collectives: rank {} (pid {}) exited while a kernel of rank "
                               "{} (block {}) waited for rank {}; that collective's results are "
                               "not valid and this communicator cannot be used any more",
                               lost, context_->pid(lost), rank_, abortHost_->block, peer),
                   lost);
    }
    return Error(ErrorCode::Aborted,
                 fmt::format("cuda collectives: the communicator was destroyed while a kernel of "
                             "rank {} (block {}) waited for rank {}",
                             rank_, abortHost_->block, peer),
                 peer);
  }
  const int32_t pid =
      peer >= 0 && peer < size_ && context_->sameHost(peer) ? context_->pid(peer) : 0;
  const bool gone = pid > 0 && ::kill(pid, 0) != 0 && errno == ESRCH;
  const std::string where =
      peer >= 0 && !context_->sameHost(peer)
          ? fmt::format(" on host {} (across the network: its host, the link or the proxy)",
                        context_->hostName(peer))
          : std::string();
  return Error(
      gone ? ErrorCode::PeerLost : ErrorCode::Timeout,
      fmt::format("cuda collectives: a kernel of rank {} (block {}) waited for rank {}{} "
                  "with no progress for collectives.cuda.wait_limit = {} s (expected "
                  "flag or count {}, saw {}){}; that collective's results are not valid "
                  "and this communicator cannot be used any more",
                  rank_, abortHost_->block, peer, where, waitLimitSeconds_, abortHost_->expected,
                  abortHost_->seen, gone ? ": the peer process has exited" : ""),
      peer);
}

std::string CudaBackend::launchBatch(const CollectiveRequest& r) {
  if (!why_.empty()) throw Error(ErrorCode::NotSupported, "cuda collectives: " + why_);
  const std::vector<P2pItem> items = p2pItems(r);
  Shape shape;
  shape.blocks = p2pBatchBlocks(tuning_);
  shape.threads = std::clamp<uint32_t>(tuning_.threads, 32, kMaxThreads);
  const std::vector<P2pItem> pieces =
      p2pSchedule(items, size_, p2pPieceBytes(tuning_, base_.layout));
  for (const P2pItem& piece : pieces) {
    CollectiveRequest one;
    one.op = piece.send ? CollectiveOp::Send : CollectiveOp::Recv;
    one.send = piece.src;
    one.recv = piece.dst;
    one.count = piece.bytes;  // pieces in bytes: a round need not hold whole elements of type
    one.type = DataType::Uint8;
    one.peer = piece.peer;
    one.stream = r.stream;
    launch(piece.send ? KernelId::Send : KernelId::Recv, one, shape);
  }
  return fmt::format("{} piece(s) of send-direct/recv-direct grid {} block {}", pieces.size(),
                     shape.blocks, shape.threads);
}

std::string CudaBackend::launch(KernelId id, const CollectiveRequest& r,
                                std::optional<Shape> shape) {
  if (!why_.empty()) throw Error(ErrorCode::NotSupported, "cuda collectives: " + why_);
  if (r.count == 0) return {};
  KernelArgs a = base_;
  a.op = static_cast<RedOp>(static_cast<int>(r.redop));
  a.send = r.send;
  a.recv = r.recv;
  a.count = r.count;
  a.elemSize = sizeOf(r.type);
  a.peer = r.op == CollectiveOp::Broadcast ? r.root : r.peer;
  const Shape s = shape ? *shape : shapeFor(id, r.bytes(), localSize_, tuning_, base_.layout);
  DeviceGuard guard(device_);
  a.call = publish(r);
  if (a.call == 0) a.started = nullptr;
  const int e =
      launchKernel(id, static_cast<ElemType>(static_cast<int>(r.type)), a, s, r.stream.handle);
  if (e != 0) {
    throw Error(ErrorCode::BackendError,
                "cuda collectives: " + cudaWhy(fmt::format("launching {}", toString(id)).c_str(),
                                               static_cast<cudaError_t>(e)));
  }
  trackLaunch(static_cast<cudaStream_t>(r.stream.handle));
  if (a.call != 0) trackCall(a.call, static_cast<cudaStream_t>(r.stream.handle));
  return fmt::format("{} grid {} block {}", toString(id), s.blocks, s.threads);
}

uint64_t CudaBackend::publish(const CollectiveRequest& r) {
  if (boards_.empty() || r.op == CollectiveOp::Send || r.op == CollectiveOp::Recv) return 0;
  if (capturing(static_cast<cudaStream_t>(r.stream.handle))) {
    return 0;  // a graph's launches run later, as often as the user replays them
  }
  const CallSignature sig =
      CallSignature::of(static_cast<int>(r.op), static_cast<int>(r.type),
                        r.op == CollectiveOp::AllReduce || r.op == CollectiveOp::ReduceScatter
                            ? static_cast<int>(r.redop)
                            : 0,
                        r.op == CollectiveOp::Broadcast ? r.root : -1, r.count);
  publishCall(static_cast<LaunchBoard*>(board_.data()), ++calls_, sig);
  return calls_;
}

void CudaBackend::trackCall(uint64_t call, cudaStream_t stream) {
  std::lock_guard lk(flightMu_);
  cudaEvent_t ev = nullptr;
  if (!flightSpare_.empty()) {
    ev = flightSpare_.back();
    flightSpare_.pop_back();
  } else if (cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) != cudaSuccess) {
    return;  // untracked: the call never counts as completed, so no stall is judged after it
  }
  if (cudaEventRecord(ev, stream) != cudaSuccess) {
    flightSpare_.push_back(ev);
    return;
  }
  inflight_.push_back({call, ev});
}

void CudaBackend::checkCalls() {
  if (boards_.empty() || host_ == nullptr) return;
  auto* mine = static_cast<LaunchBoard*>(board_.data());
  uint64_t oldest = 0;
  {
    DeviceGuard guard(device_);
    std::lock_guard lk(flightMu_);
    if (verdict_.kind != StallVerdict::None) return;  // judged once
    uint64_t completed = 0;
    while (!inflight_.empty() && cudaEventQuery(inflight_.front().done) != cudaErrorNotReady) {
      completed = inflight_.front().call;
      flightSpare_.push_back(inflight_.front().done);
      inflight_.pop_front();
    }
    if (completed != 0) __atomic_store_n(&mine->completed, completed, __ATOMIC_RELEASE);
    if (!inflight_.empty()) oldest = inflight_.front().call;
    // The calls in flight whose kernels began (the kernels' words).
    for (const InFlight& f : inflight_) {
      if (__atomic_load_n(&host_->started[f.call % kCallSlots], __ATOMIC_ACQUIRE) == f.call) {
        markBegun(mine, f.call);
      }
    }
  }
  std::vector<BoardView> views;
  views.reserve(boards_.size());
  for (const LaunchBoard* b : boards_) views.push_back(readBoard(b));
  // Every call all ranks have published, once: a mismatch whether or not its kernels ended.
  StallVerdict v;
  for (uint64_t k = checkedCall_ + 1; k <= views[rank_].issued && v.kind == StallVerdict::None;
       ++k) {
    bool known = true;
    for (const BoardView& b : views) known = known && b.issued >= k;
    if (!known) break;
    v = judgeStall(rank_, views, k, -1, 0);
    checkedCall_ = k;
  }
  // This rank's oldest call in flight: how long its kernel has run.
  if (v.kind == StallVerdict::None && oldest != 0 && views[rank_].begun(oldest) &&
      timeoutSeconds_ > 0) {
    const auto now = std::chrono::steady_clock::now();
    if (runningCall_ != oldest) {
      runningCall_ = oldest;
      runningSince_ = now;
    }
    v = judgeStall(rank_, views, oldest, std::chrono::duration<double>(now - runningSince_).count(),
                   timeoutSeconds_);
  }
  if (v.kind == StallVerdict::None) return;
  STRATA_LOG(Error, kLog, "stopping this rank's cuda collectives: {}", v.text);
  {
    std::lock_guard lk(flightMu_);
    verdict_ = v;
  }
  raiseStop(kJudged, v.peer);
}

void CudaBackend::trackLaunch(cudaStream_t stream) {
  if (capturing(stream)) return;
  // Completed events are reused, so that a long job keeps a handful.
  for (cudaEvent_t& ev : pending_) {
    if (ev != nullptr && cudaEventQuery(ev) == cudaSuccess) {
      spareEvents_.push_back(ev);
      ev = nullptr;
    }
  }
  std::erase(pending_, nullptr);
  cudaEvent_t ev = nullptr;
  if (!spareEvents_.empty()) {
    ev = spareEvents_.back();
    spareEvents_.pop_back();
  } else if (cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) != cudaSuccess) {
    return;  // teardown then cannot wait for this launch: it still stops and barriers
  }
  if (cudaEventRecord(ev, stream) != cudaSuccess) {
    cudaEventDestroy(ev);
    return;
  }
  pending_.push_back(ev);
}

std::unique_ptr<backend::CollectivesBackend> create(const backend::CollectivesInit& init) {
  return std::make_unique<CudaBackend>(init);
}

}  // namespace
}  // namespace strata::cuda

extern "C" __attribute__((visibility("default"))) const strata::backend::ModuleInfo*
strata_module_info() {
  static const strata::backend::ModuleInfo info{
      STRATA_MODULE_ABI_VERSION,
      strata::backend::ModuleKind::Collectives,
      "cuda",
      STRATA_VERSION_STRING,
      "collectives on CUDA device memory (LL8/LL16 packets, direct staged kernels)",
      nullptr,
      nullptr,
      nullptr,
      &strata::cuda::create,
      nullptr,
  };
  return &info;
}
