// test-cuda-collectives: the CUDA collectives module (strata-collectives-cuda.so) through the
// public Communicator API on one GPU, every rank a thread of this process with its own stream,
// ranks joined by an in-process bootstrap (ThreadBootstrap below).
//
// For N = 2, 4, 8 ranks (--short: 2 and 4, fewer types and sizes), one Communicator per phase:
//   auto     every op (allReduce, reduceScatter, allGather, broadcast from every root, allToAll,
//            send/recv around a ring) with the size-based choice: sizes on both sides of each
//            threshold, odd counts, in place and out of place, buffers off 16-byte alignment,
//            allReduce past the staging area; allReduce and reduceScatter with every type and op;
//   burst    4 x 12 calls of every op and algorithm enqueued back to back and synchronized once,
//            so that ranks run calls ahead of each other and algorithms switch call to call;
//   graph    3 allReduces (one per algorithm) captured into a CUDA graph on every rank, replayed
//            5 times with new inputs;
//   forced   each of oneshot-ll8, twoshot-ll16, direct-staged forced for every op it has
//            (direct-staged with a 256 KiB staging area, so that the larger calls take several
//            chunks).
// Every result is compared bit for bit with a reference folded in rank order on the host
// (tests/harness/reference_fold.hpp); every call must have been run by the cuda/ algorithm the
// thresholds or the forcing name, with a grid within collectives.cuda.max_blocks (4: 8 ranks'
// kernels of 512-thread blocks stay co-resident on one GPU).
//
// Exit status: 0 when every check passed, 1 when one failed (or the watchdog fired), 77 without
// a CUDA device (one line "SKIP: no CUDA device: ..."). Options:
//   --short          the smaller sweep (compute-sanitizer runs use it);
//   --ranks=2,4      the rank counts to run (even, 2..8);
//   --timeout=S      the watchdog: after S seconds (default 240), or on SIGTERM/SIGINT/SIGHUP,
//                    print what every rank was doing and exit 1;
//   --host           a self-check of this harness without a GPU: the auto and burst phases
//                    (no 16-bit floats: the host collectives round them per step) on host
//                    memory through the host collectives.

#include <cuda_runtime_api.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <vector>

#include <fmt/format.h>
#include <strata/bootstrap.hpp>
#include <strata/communicator.hpp>
#include <strata/config.hpp>
#include <strata/error.hpp>

#include "tests/harness/reference_fold.hpp"

namespace {

using strata::Bootstrap;
using strata::Communicator;
using strata::Config;
using strata::DataType;
using strata::Error;
using strata::ErrorCode;
using strata::ReduceOp;
using strata::testing::elemSize;

using Clock = std::chrono::steady_clock;

// ---- options ------------------------------------------------------------------------------

struct Options {
  bool shortRun = false;
  bool host = false;
  double watchdogSeconds = 240;
  std::vector<int> ranks;
};

Options gOpt;

// ---- the in-process bootstrap -------------------------------------------------------------

/// The message queues of all ranks: one FIFO per (sender, receiver, tag), under one mutex.
class Hub {
 public:
  Hub(int size, double timeoutSeconds) : size_(size), timeout_(timeoutSeconds) {}

  int size() const { return size_; }

  void put(int src, int dst, int tag, const void* data, size_t bytes) {
    const auto* p = static_cast<const uint8_t*>(data);
    std::lock_guard<std::mutex> lock(mu_);
    throwIfAborted();
    queues_[{src, dst, tag}].emplace_back(p, p + bytes);
    cv_.notify_all();
  }

  void take(int src, int dst, int tag, void* data, size_t bytes, const char* what) {
    std::unique_lock<std::mutex> lock(mu_);
    auto& q = queues_[{src, dst, tag}];
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(timeout_);
    for (;;) {
      throwIfAborted();
      if (!q.empty()) break;
      if (cv_.wait_until(lock, deadline) == std::cv_status::timeout) {
        throwIfAborted();
        if (!q.empty()) break;
        throw Error(ErrorCode::Timeout,
                    fmt::format("thread bootstrap: rank {} waited {} s in {} for rank {} (tag {})",
                                dst, timeout_.count(), what, src, tag),
                    src);
      }
    }
    std::vector<uint8_t> m = std::move(q.front());
    q.pop_front();
    if (m.size() != bytes) {
      throw Error(ErrorCode::ProtocolError,
                  fmt::format("thread bootstrap: rank {} expected {} bytes from rank {} with tag "
                              "{} in {}, rank {} sent {}",
                              dst, bytes, src, tag, what, src, m.size()),
                  src);
    }
    if (bytes > 0) std::memcpy(data, m.data(), bytes);
  }

  void abort(int origin, std::string_view reason) noexcept {
    std::lock_guard<std::mutex> lock(mu_);
    if (abortOrigin_ < 0) {
      abortOrigin_ = origin;
      abortReason_ = std::string(reason);
    }
    cv_.notify_all();
  }

  bool aborted() {
    std::lock_guard<std::mutex> lock(mu_);
    return abortOrigin_ >= 0;
  }

 private:
  void throwIfAborted() const {
    if (abortOrigin_ >= 0) {
      throw Error(ErrorCode::Aborted,
                  fmt::format("thread bootstrap: rank {} aborted: {}", abortOrigin_, abortReason_),
                  abortOrigin_);
    }
  }

  const int size_;
  const std::chrono::duration<double> timeout_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::tuple<int, int, int>, std::deque<std::vector<uint8_t>>> queues_;
  int abortOrigin_ = -1;
  std::string abortReason_;
};

/// A Bootstrap whose ranks are threads of this process. Collectives are built on send/recv
/// with tags below 0 (users' tags are >= 0), one at a time per rank.
class ThreadBootstrap final : public Bootstrap {
 public:
  ThreadBootstrap(std::shared_ptr<Hub> hub, int rank) : hub_(std::move(hub)), rank_(rank) {}

  std::string_view backend() const noexcept override { return "thread"; }
  int rank() const noexcept override { return rank_; }
  int size() const noexcept override { return hub_->size(); }
  int localRank() const noexcept override { return rank_; }
  int localSize() const noexcept override { return hub_->size(); }

  void send(int peer, int tag, const void* data, size_t bytes) override {
    checkPeer(peer, tag, "send");
    hub_->put(rank_, peer, tag, data, bytes);
  }
  void recv(int peer, int tag, void* data, size_t bytes) override {
    checkPeer(peer, tag, "recv");
    hub_->take(peer, rank_, tag, data, bytes, "recv");
  }
  void allGather(void* data, size_t bytesPerRank) override {
    std::lock_guard<std::mutex> lock(collectiveMu_);
    gather(data, bytesPerRank, kTagAllGather, "allGather");
  }
  void broadcast(void* data, size_t bytes, int root) override {
    std::lock_guard<std::mutex> lock(collectiveMu_);
    if (root < 0 || root >= size()) {
      throw Error(ErrorCode::InvalidArgument,
                  fmt::format("thread bootstrap: broadcast root {} of {} ranks", root, size()));
    }
    if (root == rank_) {
      for (int q = 0; q < size(); ++q) {
        if (q != rank_) hub_->put(rank_, q, kTagBroadcast, data, bytes);
      }
    } else {
      hub_->take(root, rank_, kTagBroadcast, data, bytes, "broadcast");
    }
  }
  void barrier() override {
    std::lock_guard<std::mutex> lock(collectiveMu_);
    std::vector<uint8_t> slots(static_cast<size_t>(size()));
    gather(slots.data(), 1, kTagBarrier, "barrier");
  }
  void abort(std::string_view reason) noexcept override { hub_->abort(rank_, reason); }

 private:
  static constexpr int kTagAllGather = -1;
  static constexpr int kTagBroadcast = -2;
  static constexpr int kTagBarrier = -3;

  void checkPeer(int peer, int tag, const char* what) const {
    if (peer < 0 || peer >= size() || tag < 0) {
      throw Error(ErrorCode::InvalidArgument,
                  fmt::format("thread bootstrap: {} to peer {} with tag {} ({} ranks, tags >= 0)",
                              what, peer, tag, size()));
    }
  }
  void gather(void* data, size_t bytesPerRank, int tag, const char* what) {
    auto* base = static_cast<uint8_t*>(data);
    for (int q = 0; q < size(); ++q) {
      if (q != rank_) hub_->put(rank_, q, tag, base + bytesPerRank * rank_, bytesPerRank);
    }
    for (int q = 0; q < size(); ++q) {
      if (q != rank_) hub_->take(q, rank_, tag, base + bytesPerRank * q, bytesPerRank, what);
    }
  }

  std::shared_ptr<Hub> hub_;
  const int rank_;
  std::mutex collectiveMu_;
};

// ---- what every rank is doing (for the watchdog) ------------------------------------------

struct Progress {
  std::mutex mu;
  int n = 0;
  std::vector<std::string> what;
  void start(int ranks) {
    std::lock_guard<std::mutex> lock(mu);
    n = ranks;
    what.assign(static_cast<size_t>(ranks), "starting");
  }
  void set(int rank, std::string text) {
    std::lock_guard<std::mutex> lock(mu);
    if (rank >= 0 && rank < static_cast<int>(what.size())) what[rank] = std::move(text);
  }
  std::string dump() {
    std::lock_guard<std::mutex> lock(mu);
    std::string out = fmt::format("N={}:", n);
    for (size_t r = 0; r < what.size(); ++r) out += fmt::format("\n  rank {}: {}", r, what[r]);
    return out;
  }
};
Progress gProgress;

/// Waits for the deadline or SIGTERM/SIGINT/SIGHUP (blocked in every other thread), then
/// prints what each rank was doing and exits 1, so that a hang never blocks gpu-check.
void watchdog(double seconds, sigset_t signals) {
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(seconds));
  int sig = 0;
  for (;;) {
    const auto left = deadline - Clock::now();
    if (left <= Clock::duration::zero()) break;
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
    timespec ts{static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
    sig = sigtimedwait(&signals, nullptr, &ts);
    if (sig > 0) break;
    sig = 0;
  }
  const std::string why = sig > 0 ? fmt::format("terminated by signal {} ({})", sig, strsignal(sig))
                                  : fmt::format("no result after {} s (--timeout)", seconds);
  std::printf("FAIL: test-cuda-collectives: watchdog: %s; what each rank was doing:\n%s\n",
              why.c_str(), gProgress.dump().c_str());
  std::fflush(stdout);
  _exit(1);
}

// ---- CUDA helpers ---------------------------------------------------------------------------

void cudaCheck(cudaError_t e, const char* call) {
  if (e != cudaSuccess) {
    throw std::runtime_error(
        fmt::format("{} failed: {} ({})", call, cudaGetErrorString(e), cudaGetErrorName(e)));
  }
}
#define CUDA_CHECK(call) cudaCheck((call), #call)

/// Buffers and copies of one rank: device memory and the rank's stream, or (--host) host memory.
/// Every copy is ordered on the rank's stream (pageable cudaMemcpy runs on the legacy stream,
/// which does not order with non-blocking streams; cudaDeviceSynchronize would wait for the
/// other ranks' kernels, which may wait for this rank) and goes through pinned bounce buffers,
/// so that a copy never blocks the thread while its stream waits for a peer's kernel.
struct Memory {
  bool device = true;
  cudaStream_t stream = nullptr;

  char* allocate(size_t bytes) const {
    void* p = nullptr;
    if (device) {
      CUDA_CHECK(cudaMalloc(&p, bytes));
    } else {
      p = hostAllocate(bytes);
    }
    return static_cast<char*>(p);
  }
  void release(char* p) const noexcept {
    if (p == nullptr) return;
    if (device) {
      cudaFree(p);
    } else {
      std::free(p);
    }
  }
  /// A bounce buffer: pinned host memory (plain host memory with --host).
  char* allocateBounce(size_t bytes) const {
    void* p = nullptr;
    if (device) {
      CUDA_CHECK(cudaMallocHost(&p, bytes));
    } else {
      p = hostAllocate(bytes);
    }
    return static_cast<char*>(p);
  }
  void releaseBounce(char* p) const noexcept {
    if (p == nullptr) return;
    if (device) {
      cudaFreeHost(p);
    } else {
      std::free(p);
    }
  }
  /// Enqueues a copy of src to dst through bounce, which must not be reused before sync().
  void toDevice(char* dst, const void* src, size_t bytes, char* bounce) const {
    if (bytes == 0) return;
    if (device) {
      std::memcpy(bounce, src, bytes);
      CUDA_CHECK(cudaMemcpyAsync(dst, bounce, bytes, cudaMemcpyHostToDevice, stream));
    } else {
      std::memcpy(dst, src, bytes);
    }
  }
  /// Where bytes at src can be read on the host after sync(): bounce, with the copy enqueued.
  const char* fetch(const char* src, size_t bytes, char* bounce) const {
    if (!device) return src;
    if (bytes > 0) CUDA_CHECK(cudaMemcpyAsync(bounce, src, bytes, cudaMemcpyDeviceToHost, stream));
    return bounce;
  }
  void sync() const {
    if (device) CUDA_CHECK(cudaStreamSynchronize(stream));
  }
  strata::Stream handle() const { return strata::Stream{device ? stream : nullptr}; }

 private:
  static void* hostAllocate(size_t bytes) {
    void* p = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
    if (p == nullptr) throw std::bad_alloc();
    return p;
  }
};

// ---- the cases -------------------------------------------------------------------------------

enum class Op { AllReduce, ReduceScatter, AllGather, Broadcast, AllToAll, SendRecv };

const char* opName(Op op) {
  switch (op) {
    case Op::AllReduce:
      return "allReduce";
    case Op::ReduceScatter:
      return "reduceScatter";
    case Op::AllGather:
      return "allGather";
    case Op::Broadcast:
      return "broadcast";
    case Op::AllToAll:
      return "allToAll";
    case Op::SendRecv:
      return "send/recv";
  }
  return "?";
}

/// The ops as Communicator::algorithms() names them.
std::vector<std::string> apiOps(Op op) {
  if (op == Op::SendRecv) return {"send", "recv"};
  return {opName(op)};
}

/// The config key that forces an algorithm for op.
const char* forceKey(Op op) {
  switch (op) {
    case Op::AllReduce:
      return "collectives.allreduce.algorithm";
    case Op::ReduceScatter:
      return "collectives.reducescatter.algorithm";
    case Op::AllGather:
      return "collectives.allgather.algorithm";
    case Op::Broadcast:
      return "collectives.broadcast.algorithm";
    case Op::AllToAll:
      return "collectives.alltoall.algorithm";
    case Op::SendRecv:
      return "collectives.sendrecv.algorithm";
  }
  return "";
}

/// The CUDA module's algorithms and their ops (collectives/cuda/backend.cpp: ops()).
struct AlgoSpec {
  const char* name;
  std::vector<Op> ops;
  bool packets;
};
const AlgoSpec kAlgos[] = {
    {"oneshot-ll8", {Op::AllReduce, Op::AllGather, Op::Broadcast, Op::AllToAll}, true},
    {"twoshot-ll16", {Op::AllReduce, Op::ReduceScatter}, true},
    {"direct-staged",
     {Op::AllReduce, Op::AllGather, Op::ReduceScatter, Op::Broadcast, Op::AllToAll, Op::SendRecv},
     false},
};

bool hasOp(const AlgoSpec& a, Op op) {
  return std::find(a.ops.begin(), a.ops.end(), op) != a.ops.end();
}

// The thresholds the test sets (the documented defaults), so that env or defaults changing
// cannot move a size to another algorithm behind the test's back.
constexpr size_t kOneShotMax = 16 << 10;
constexpr size_t kTwoShotMax = 2 << 20;
constexpr size_t kPacketsMax = 64 << 10;
constexpr int kMaxBlocks = 4;  // 8 ranks x 4 blocks stay co-resident
/// collectives.cuda.max_blocks: kMaxBlocks, less on a GPU with fewer than 8 x 4 SMs.
int gMaxBlocks = kMaxBlocks;

/// The algorithm auto picks for op at bytes per rank (per peer for allGather/allToAll).
std::string autoAlgorithm(Op op, size_t bytes) {
  switch (op) {
    case Op::AllReduce:
      return bytes <= kOneShotMax   ? "cuda/oneshot-ll8"
             : bytes <= kTwoShotMax ? "cuda/twoshot-ll16"
                                    : "cuda/direct-staged";
    case Op::ReduceScatter:
      return bytes <= kPacketsMax ? "cuda/twoshot-ll16" : "cuda/direct-staged";
    case Op::AllGather:
    case Op::Broadcast:
    case Op::AllToAll:
      return bytes <= kPacketsMax ? "cuda/oneshot-ll8" : "cuda/direct-staged";
    case Op::SendRecv:
      break;
  }
  return "cuda/direct-staged";
}

struct Case {
  Op op = Op::AllReduce;
  DataType type = DataType::Float32;
  ReduceOp redop = ReduceOp::Sum;
  size_t count = 1;
  bool inPlace = false;
  size_t offset = 0;      ///< elements the buffers start past their allocation (alignment)
  int root = 0;           ///< broadcast root; send/recv: the shift around the ring
  bool nullSend = false;  ///< broadcast: non-roots pass a null send buffer
  std::string expect;     ///< "cuda/oneshot-ll8": the algorithm that must run it

  size_t bytes() const { return count * elemSize(type); }
  size_t sendElems(int n) const {
    return op == Op::ReduceScatter || op == Op::AllToAll ? count * n : count;
  }
  size_t recvElems(int n) const {
    return op == Op::AllGather || op == Op::AllToAll ? count * n : count;
  }
  std::string describe() const {
    std::string s = fmt::format("{} {} count {}", opName(op), strata::toString(type), count);
    if (op == Op::AllReduce || op == Op::ReduceScatter)
      s += fmt::format(" {}", strata::toString(redop));
    if (op == Op::Broadcast) s += fmt::format(" root {}{}", root, nullSend ? " (null send)" : "");
    if (op == Op::SendRecv) s += fmt::format(" shift {}", root);
    if (inPlace) s += " in place";
    if (offset) s += fmt::format(" offset {}", offset);
    return s;
  }
};

const DataType kAllTypes[] = {
    DataType::Int8,   DataType::Uint8,   DataType::Int32,    DataType::Uint32,  DataType::Int64,
    DataType::Uint64, DataType::Float16, DataType::BFloat16, DataType::Float32, DataType::Float64};
const DataType kShortTypes[] = {DataType::Int8,    DataType::Int32,    DataType::Int64,
                                DataType::Float16, DataType::BFloat16, DataType::Float32,
                                DataType::Float64};
const ReduceOp kOps[] = {ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max,
                         ReduceOp::Avg};

/// A size: a count of elements (small) or bytes past a threshold (count = bytes / size, odd).
struct Size {
  size_t value;
  bool isBytes;
  size_t count(DataType t) const {
    if (!isBytes) return value;
    return std::max<size_t>(1, value / elemSize(t)) | 1;
  }
};
constexpr Size elems(size_t n) {
  return {n, false};
}
constexpr Size bytesOver(size_t b) {
  return {b + 40, true};
}

/// Builds a phase's cases; every rank builds the same list.
class Cases {
 public:
  Cases(int n, const AlgoSpec* forced) : n_(n), forced_(forced) {}

  std::vector<Case> take() { return std::move(cases_); }

  void add(Op op, DataType t, ReduceOp redop, Size size, bool inPlace, int root = 0,
           bool nullSend = false) {
    if (gOpt.host && (t == DataType::Float16 || t == DataType::BFloat16)) return;
    Case c;
    c.op = op;
    c.type = t;
    c.redop = redop;
    c.count = size.count(t);
    c.inPlace = op != Op::AllToAll && op != Op::SendRecv && inPlace;
    c.offset = (serial_++ % 3 == 1) ? 1 : 0;
    c.root = root;
    c.nullSend = nullSend;
    if (gOpt.host) {
      c.expect.clear();
    } else if (forced_ != nullptr && hasOp(*forced_, op)) {
      c.expect = std::string("cuda/") + forced_->name;
    } else {
      c.expect = autoAlgorithm(op, c.bytes());
    }
    cases_.push_back(std::move(c));
  }

  /// Every type x every op x sizes: counts below bothBelow in place and out of place, the
  /// others alternating (so that each size gets both over the types and ops).
  template <class Types>
  void reducing(Op op, const Types& types, const std::vector<Size>& sizes, size_t bothBelow) {
    size_t ti = 0;
    for (DataType t : types) {
      for (size_t ri = 0; ri < std::size(kOps); ++ri) {
        for (size_t si = 0; si < sizes.size(); ++si) {
          if (sizes[si].count(t) < bothBelow) {
            add(op, t, kOps[ri], sizes[si], false);
            add(op, t, kOps[ri], sizes[si], true);
          } else {
            add(op, t, kOps[ri], sizes[si], (ti + ri + si) % 2 == 0);
          }
        }
      }
      ++ti;
    }
  }

  template <class Types>
  void copying(Op op, const Types& types, const std::vector<Size>& sizes) {
    size_t ti = 0;
    for (DataType t : types) {
      ++ti;
      for (size_t si = 0; si < sizes.size(); ++si) {
        const Size s = sizes[si];
        const size_t k = ti + si;
        if (op == Op::Broadcast) {
          for (int root = 0; root < n_; ++root) {
            if (gOpt.shortRun && forced_ != nullptr && root != 0 && root != n_ - 1) continue;
            const bool inPlace = (k + root) % 2 == 0;
            add(op, t, ReduceOp::Sum, s, inPlace, root, !inPlace && (k + root) % 4 == 1);
          }
        } else if (op == Op::SendRecv) {
          add(op, t, ReduceOp::Sum, s, false, 1);
          if (n_ > 2) add(op, t, ReduceOp::Sum, s, false, n_ - 1);
        } else {
          add(op, t, ReduceOp::Sum, s, k % 2 == 0);
        }
      }
    }
  }

 private:
  int n_;
  const AlgoSpec* forced_;
  std::vector<Case> cases_;
  unsigned serial_ = 0;
};

const std::vector<DataType> kCopyTypes = {DataType::Int8, DataType::Float16, DataType::Int32,
                                          DataType::Float64};
const std::vector<DataType> kShortCopyTypes = {DataType::Int8, DataType::Float64};

std::vector<Case> autoCases(int n) {
  Cases c(n, nullptr);
  const bool s = gOpt.shortRun;
  const auto& copyTypes = s ? kShortCopyTypes : kCopyTypes;
  if (s) {
    c.reducing(Op::AllReduce, kShortTypes,
               {elems(1), elems(4099), bytesOver(kOneShotMax), bytesOver(kTwoShotMax + 4096)}, 0);
    c.reducing(Op::ReduceScatter, kShortTypes, {elems(37), bytesOver(kPacketsMax)}, 0);
    for (Op op : {Op::AllGather, Op::Broadcast, Op::AllToAll, Op::SendRecv}) {
      c.copying(op, copyTypes, {elems(37), bytesOver(kPacketsMax)});
    }
    return c.take();
  }
  c.reducing(
      Op::AllReduce, kAllTypes,
      {elems(1), elems(37), elems(4099), bytesOver(kOneShotMax), bytesOver(kTwoShotMax + 4096)},
      4100);
  // Past the 8 MiB staging area: two chunks of the direct algorithm.
  c.add(Op::AllReduce, DataType::Float32, ReduceOp::Sum, bytesOver(9 << 20), false);
  c.add(Op::AllReduce, DataType::Uint8, ReduceOp::Max, bytesOver(9 << 20), true);
  c.add(Op::AllReduce, DataType::BFloat16, ReduceOp::Avg, bytesOver(9 << 20), false);
  c.reducing(Op::ReduceScatter, kAllTypes,
             {elems(1), elems(37), elems(4099), bytesOver(kPacketsMax)}, 38);
  for (Op op : {Op::AllGather, Op::Broadcast, Op::AllToAll}) {
    c.copying(op, copyTypes,
              {elems(1), elems(37), elems(4099), bytesOver(kPacketsMax), bytesOver(1 << 20)});
  }
  const std::vector<DataType> p2pTypes = {DataType::Int8, DataType::Float32, DataType::Float64};
  c.copying(Op::SendRecv, p2pTypes,
            {elems(1), elems(37), elems(4099), bytesOver(kPacketsMax), bytesOver(9 << 20)});
  return c.take();
}

/// The ops the forced algorithm has, at sizes it can take (the packet algorithms' slots hold
/// at least 256 KiB per rank and peer at 8 ranks with the thresholds above).
std::vector<Case> forcedCases(int n, const AlgoSpec& a) {
  Cases c(n, &a);
  const bool twoShot = std::string_view(a.name) == "twoshot-ll16";
  for (Op op : a.ops) {
    const bool reduces = op == Op::AllReduce || op == Op::ReduceScatter;
    if (gOpt.shortRun) {
      if (reduces) {
        c.reducing(op, kShortTypes, {elems(37), bytesOver(48 << 10)}, 0);
      } else {
        c.copying(op, kShortCopyTypes, {elems(37), bytesOver(48 << 10)});
      }
      continue;
    }
    std::vector<Size> sizes = {elems(1), elems(37), elems(4099), bytesOver(48 << 10)};
    if (reduces) {
      c.reducing(op, kAllTypes, sizes, 38);
      if (op == Op::AllReduce && twoShot) c.reducing(op, kShortTypes, {bytesOver(1 << 20)}, 0);
      if (!a.packets) {
        c.reducing(op, kShortTypes, {bytesOver(op == Op::AllReduce ? kTwoShotMax : kPacketsMax)},
                   0);
      }
    } else {
      if (!a.packets) sizes.push_back(bytesOver(1 << 20));
      c.copying(op, kCopyTypes, sizes);
    }
  }
  return c.take();
}

/// Bursts of calls enqueued back to back (Rank::burstPhase), and the most calls in a group.
constexpr int kBursts = 4;
constexpr size_t kMaxGroup = 16;

/// Burst b: every op and algorithm range, in an order of its own.
std::vector<Case> burstCases(int n, int b) {
  Cases c(n, nullptr);
  c.add(Op::AllReduce, DataType::Float32, ReduceOp::Sum, elems(1001), true);
  c.add(Op::ReduceScatter, DataType::BFloat16, ReduceOp::Avg, elems(37), false);
  c.add(Op::AllGather, DataType::Int8, ReduceOp::Sum, elems(4099), false);
  c.add(Op::Broadcast, DataType::Float16, ReduceOp::Sum, elems(3001), true, b % n);
  c.add(Op::AllToAll, DataType::Float64, ReduceOp::Sum, elems(513), false);
  c.add(Op::AllReduce, DataType::Int32, ReduceOp::Max, elems(40001), false);
  c.add(Op::AllReduce, DataType::Float16, ReduceOp::Sum, bytesOver(kTwoShotMax + 4096), false);
  c.add(Op::AllGather, DataType::Float32, ReduceOp::Sum, bytesOver(kPacketsMax), true);
  c.add(Op::Broadcast, DataType::Int8, ReduceOp::Sum, bytesOver(kPacketsMax), false, n - 1 - b % n);
  c.add(Op::SendRecv, DataType::Float64, ReduceOp::Sum, elems(4099), false, b % 2 ? n - 1 : 1);
  c.add(Op::ReduceScatter, DataType::Int64, ReduceOp::Prod, bytesOver(kPacketsMax), true);
  c.add(Op::AllReduce, DataType::Int64, ReduceOp::Prod, elems(3), false);
  std::vector<Case> cases = c.take();
  std::mt19937_64 rng(1234 + b);
  std::shuffle(cases.begin(), cases.end(), rng);
  return cases;
}

/// The graph's calls: three allReduces, one per algorithm range.
std::vector<Case> graphCases() {
  std::vector<Case> cases(3);
  const std::tuple<DataType, ReduceOp, size_t, bool> calls[] = {
      {DataType::Float32, ReduceOp::Sum, 1001, true},      // 4 KB: oneshot-ll8
      {DataType::BFloat16, ReduceOp::Avg, 300001, false},  // 600 KB: twoshot-ll16
      {DataType::Int32, ReduceOp::Max, 700001, false},     // 2.8 MB: direct-staged
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    std::tie(cases[i].type, cases[i].redop, cases[i].count, cases[i].inPlace) = calls[i];
    cases[i].offset = i;
    cases[i].expect = gOpt.host ? "" : autoAlgorithm(Op::AllReduce, cases[i].bytes());
  }
  return cases;
}

/// Places calls one after another in the send and the recv buffers (4 KiB apart, each past its
/// alignment offset): their byte offsets in *at; returns the bytes each buffer needs.
size_t layout(const std::vector<Case>& cases, int n, std::vector<std::pair<size_t, size_t>>* at) {
  size_t aAt = 0, bAt = 0;
  for (const Case& c : cases) {
    const size_t es = elemSize(c.type), skew = c.offset * es;
    if (at != nullptr) at->emplace_back(aAt + skew, bAt + skew);
    const size_t bBytes = std::max(c.recvElems(n), c.inPlace ? c.sendElems(n) : 0) * es;
    aAt += (c.sendElems(n) * es + skew + 4095) / 4096 * 4096;
    bAt += (bBytes + skew + 4095) / 4096 * 4096;
  }
  return std::max(aAt, bAt);
}

// ---- one world of N ranks -------------------------------------------------------------------

/// Results of one phase, over all ranks.
struct PhaseResult {
  explicit PhaseResult(std::string phase = {}) : name(std::move(phase)) {}
  std::string name;
  long checks = 0;
  long failed = 0;
  bool aborted = false;
  double seconds = 0;
  std::map<std::string, long> algorithms;  ///< rank 0's calls by algorithm
};

struct World {
  int n;
  std::shared_ptr<Hub> hub;
  /// [slot][rank]: every rank's input of a call. Single calls alternate slots 0 and 1 by
  /// parity; the calls of a burst or a graph take slots 2, 3, ...
  std::vector<std::vector<std::vector<char>>> in;
  std::mutex mu;
  std::vector<PhaseResult> phases;  ///< in order of first report
  std::atomic<bool> stop{false};    ///< a rank failed hard: the others leave

  explicit World(int ranks)
      : n(ranks),
        hub(std::make_shared<Hub>(ranks, 60.0)),
        in(2 + kMaxGroup, std::vector<std::vector<char>>(static_cast<size_t>(ranks))) {}

  void merge(const PhaseResult& r, int rank) {
    std::lock_guard<std::mutex> lock(mu);
    auto it = std::find_if(phases.begin(), phases.end(),
                           [&](const PhaseResult& p) { return p.name == r.name; });
    if (it == phases.end()) {
      phases.push_back(PhaseResult{r.name});
      it = phases.end() - 1;
    }
    it->checks += r.checks;
    it->failed += r.failed;
    it->aborted |= r.aborted;
    it->seconds = std::max(it->seconds, r.seconds);
    if (rank == 0) it->algorithms = r.algorithms;
  }
};

std::atomic<int> gPrinted{0};
constexpr int kMaxPrinted = 40;
std::mutex gPrintMu;

void report(const std::string& line) {
  const int k = gPrinted.fetch_add(1);
  if (k >= kMaxPrinted) return;
  std::lock_guard<std::mutex> lock(gPrintMu);
  std::printf("%s\n", line.c_str());
  if (k == kMaxPrinted - 1) std::printf("(further failures are not printed)\n");
  std::fflush(stdout);
}

uint64_t splitmix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

std::string hexElem(const char* p, size_t es) {
  std::string s = "0x";
  for (size_t i = es; i-- > 0;) s += fmt::format("{:02x}", static_cast<uint8_t>(p[i]));
  return s;
}

/// One rank of a world: its communicator, buffers and the running phase's counts.
class Rank {
 public:
  Rank(World& w, int rank, std::shared_ptr<ThreadBootstrap> boot)
      : w_(w), rank_(rank), n_(w.n), boot_(std::move(boot)) {}
  ~Rank() {
    mem_.release(a_);
    mem_.release(b_);
    for (char* p : {bounceIn_, bounceGarbage_, bounceOut_}) mem_.releaseBounce(p);
    if (mem_.stream != nullptr) cudaStreamDestroy(mem_.stream);
  }

  void run() {
    mem_.device = !gOpt.host;
    if (mem_.device) {
      CUDA_CHECK(cudaSetDevice(0));
      CUDA_CHECK(cudaStreamCreateWithFlags(&mem_.stream, cudaStreamNonBlocking));
    }
    std::vector<std::pair<std::string, std::vector<Case>>> phases;
    phases.emplace_back("auto", autoCases(n_));
    if (!gOpt.host) {
      for (const AlgoSpec& a : kAlgos) {
        phases.emplace_back(std::string("forced ") + a.name, forcedCases(n_, a));
      }
    }
    // Buffers for the largest call or group of calls, allocated once: cudaFree synchronizes
    // the device, which would wait for other ranks' kernels.
    size_t cap = layout(graphCases(), n_, nullptr);
    for (int b = 0; b < kBursts; ++b) cap = std::max(cap, layout(burstCases(n_, b), n_, nullptr));
    for (const auto& [name, cases] : phases) {
      for (const Case& c : cases) cap = std::max(cap, layout({c}, n_, nullptr));
    }
    cap_ = cap;
    a_ = mem_.allocate(cap_);
    b_ = mem_.allocate(cap_);
    bounceIn_ = mem_.allocateBounce(cap_);
    bounceGarbage_ = mem_.allocateBounce(cap_);
    bounceOut_ = mem_.allocateBounce(cap_);

    for (size_t p = 0; p < phases.size() && !w_.stop; ++p) {
      const bool isAuto = p == 0;
      const AlgoSpec* forced = isAuto ? nullptr : &kAlgos[p - 1];
      std::unique_ptr<Communicator> comm;
      try {
        comm = Communicator::create(boot_, config(forced));
        checkListing(*comm, forced);
        runPhase(*comm, phases[p].first, phases[p].second);
        if (isAuto && !w_.stop) burstPhase(*comm);
        if (isAuto && !gOpt.host && !w_.stop) graphPhase(*comm);
        // Every rank's kernels are done before any rank destroys its scratch.
        mem_.sync();
        boot_->barrier();
      } catch (const std::exception& e) {
        // The others leave before this rank's communicator goes (its destructor may wait for
        // their kernels, which may wait for this rank until transport.timeout).
        w_.stop = true;
        boot_->abort(e.what());
        throw;
      }
      comm.reset();
      boot_->barrier();
    }
  }

  /// Counts the running phase as cut short (an error here or in another rank).
  void leavePhase() {
    phase_.aborted = true;
    if (!phase_.name.empty()) w_.merge(phase_, rank_);
  }
  /// The rank's part of a failure that ended it early.
  void failPhase(const std::string& why) {
    report(fmt::format("FAIL N={} rank {} [{}]: {}", n_, rank_,
                       phase_.name.empty() ? "set-up" : phase_.name, why));
    leavePhase();
  }

 private:
  Config config(const AlgoSpec* forced) const {
    Config c = Config::load();
    if (gOpt.host) {
      c.set("collectives.modules", "none");
      return c;
    }
    c.set("collectives.modules", "cuda");  // an error at create if it does not load
    c.set("collectives.cuda.max_blocks", std::to_string(gMaxBlocks));
    c.set("collectives.cuda.oneshot_max_bytes", "16K");  // kOneShotMax
    c.set("collectives.cuda.twoshot_max_bytes", "2M");   // kTwoShotMax
    c.set("collectives.cuda.packets_max_bytes", "64K");  // kPacketsMax
    c.set("collectives.cuda.staging_bytes", "8M");
    if (forced != nullptr) {
      for (Op op : forced->ops) c.set(forceKey(op), forced->name);
      if (!forced->packets) c.set("collectives.cuda.staging_bytes", "256K");  // many chunks
    }
    return c;
  }

  /// The module lists the algorithms and ops this test knows, and forcing took (rank 0 checks).
  void checkListing(const Communicator& comm, const AlgoSpec* forced) {
    if (rank_ != 0 || gOpt.host) return;
    std::set<std::string> seen;
    for (const auto& info : comm.algorithms()) {
      if (info.backend != "cuda") continue;
      seen.insert(info.name);
      const AlgoSpec* spec = nullptr;
      for (const AlgoSpec& a : kAlgos) {
        if (info.name == a.name) spec = &a;
      }
      if (spec == nullptr) {
        listingFailure(fmt::format("cuda/{} is not known to this test", info.name));
        continue;
      }
      std::set<std::string> want, have(info.ops.begin(), info.ops.end());
      for (Op op : spec->ops) {
        for (auto& s : apiOps(op)) want.insert(s);
      }
      if (want != have) {
        listingFailure(fmt::format("cuda/{} lists ops [{}], the test expects [{}]", info.name,
                                   fmt::join(have, ", "), fmt::join(want, ", ")));
      }
      std::set<std::string> forcedFor(info.forcedFor.begin(), info.forcedFor.end());
      const std::set<std::string> wantForced =
          forced != nullptr && forced == spec ? want : std::set<std::string>{};
      if (forcedFor != wantForced) {
        listingFailure(fmt::format("cuda/{} is forced for [{}], the test expects [{}]", info.name,
                                   fmt::join(forcedFor, ", "), fmt::join(wantForced, ", ")));
      }
    }
    for (const AlgoSpec& a : kAlgos) {
      if (!seen.count(a.name)) listingFailure(fmt::format("cuda/{} is not listed", a.name));
    }
  }
  void listingFailure(const std::string& why) {
    ++listingFailures_;
    report(fmt::format("FAIL N={} rank {}: Communicator::algorithms(): {}", n_, rank_, why));
  }

  void runPhase(Communicator& comm, const std::string& name, const std::vector<Case>& cases) {
    const auto start = Clock::now();
    phase_ = PhaseResult{name};
    phase_.failed += listingFailures_;
    listingFailures_ = 0;
    for (size_t i = 0; i < cases.size() && !w_.stop; ++i) runCase(comm, cases[i], i);
    finishPhase(start);
  }

  /// Checks the algorithm of the call just made; false (and reported) when wrong.
  bool checkAlgorithm(const Communicator& comm, const Case& c, const std::string& what) {
    const std::string got = comm.lastAlgorithm();
    ++phase_.algorithms[got];
    const std::string prefix = gOpt.host ? "host/" : "cuda/";
    if (got.rfind(prefix, 0) != 0 || (!c.expect.empty() && got != c.expect)) {
      report(fmt::format("FAIL N={} rank {} [{}] {}: ran by '{}', expected {}", n_, rank_,
                         phase_.name, what, got, c.expect.empty() ? prefix + "*" : c.expect));
      return false;
    }
    if (gOpt.host) return true;
    // "<kernel> grid G block B": G within max_blocks keeps every rank's blocks co-resident.
    const std::string shape = comm.lastLaunch();
    unsigned grid = 0, block = 0;
    const size_t at = shape.find(" grid ");
    if (at == std::string::npos ||
        std::sscanf(shape.c_str() + at, " grid %u block %u", &grid, &block) != 2 || grid < 1 ||
        grid > static_cast<unsigned>(gMaxBlocks) || block < 32 || block > 512) {
      report(
          fmt::format("FAIL N={} rank {} [{}] {}: launch '{}' is not within grid 1..{}, "
                      "block 32..512",
                      n_, rank_, phase_.name, what, shape, gMaxBlocks));
      return false;
    }
    return true;
  }

  /// The expected output of rank r for c, from every rank's input.
  void expected(const Case& c, const std::vector<std::vector<char>>& in, std::vector<char>& out) {
    const size_t bytes = c.bytes();
    out.resize(c.recvElems(n_) * elemSize(c.type));
    std::vector<const char*> ins(static_cast<size_t>(n_));
    switch (c.op) {
      case Op::AllReduce:
        for (int q = 0; q < n_; ++q) ins[q] = in[q].data();
        strata::testing::reference(c.type, c.redop, ins, c.count, out.data());
        break;
      case Op::ReduceScatter:
        for (int q = 0; q < n_; ++q) ins[q] = in[q].data() + rank_ * bytes;
        strata::testing::reference(c.type, c.redop, ins, c.count, out.data());
        break;
      case Op::AllGather:
        for (int q = 0; q < n_; ++q) std::memcpy(out.data() + q * bytes, in[q].data(), bytes);
        break;
      case Op::Broadcast:
        std::memcpy(out.data(), in[c.root].data(), bytes);
        break;
      case Op::AllToAll:
        for (int q = 0; q < n_; ++q) {
          std::memcpy(out.data() + q * bytes, in[q].data() + rank_ * bytes, bytes);
        }
        break;
      case Op::SendRecv:
        std::memcpy(out.data(), in[(rank_ - c.root + n_) % n_].data(), bytes);
        break;
    }
  }

  /// Compares bit for bit; reports the first difference.
  bool compare(const std::string& what, DataType t, const char* got,
               const std::vector<char>& want) {
    if (want.empty() || std::memcmp(got, want.data(), want.size()) == 0) return true;
    const size_t es = elemSize(t);
    size_t wrong = 0, first = want.size();
    for (size_t i = 0; i < want.size(); ++i) {
      if (got[i] != want[i]) {
        ++wrong;
        first = std::min(first, i);
      }
    }
    const size_t e = first / es;
    report(fmt::format(
        "FAIL N={} rank {} [{}] {}: {} of {} bytes differ, first in element {}: got {}, "
        "expected {}",
        n_, rank_, phase_.name, what, wrong, want.size(), e, hexElem(got + e * es, es),
        hexElem(want.data() + e * es, es)));
    return false;
  }

  /// A case placed in the buffers: its byte offsets in a_ and b_ (and in the bounce buffers),
  /// the pointers passed to the call, and after the call what to compare.
  struct Placed {
    Case c;
    size_t aAt = 0, bAt = 0;
    char* send = nullptr;
    char* recv = nullptr;
    const char* got = nullptr;
    std::vector<char> want;
  };

  /// Places cases one after another in a_ and b_ (layout()).
  std::vector<Placed> place(const std::vector<Case>& cases) const {
    std::vector<std::pair<size_t, size_t>> at;
    const size_t need = layout(cases, n_, &at);
    if (need > cap_) {
      throw std::logic_error(
          fmt::format("the calls need {} bytes, the buffers have {}", need, cap_));
    }
    std::vector<Placed> out(cases.size());
    for (size_t i = 0; i < cases.size(); ++i) {
      out[i].c = cases[i];
      std::tie(out[i].aAt, out[i].bAt) = at[i];
    }
    return out;
  }

  /// This rank's input for call slot i of a group (call parity alternates single calls).
  std::vector<char>& input(size_t slot) { return w_.in[slot][rank_]; }

  /// Draws this rank's input and the garbage its output buffer starts with.
  std::vector<char> draw(const Case& c, size_t slot) {
    std::mt19937_64 rng(splitmix(splitmix(calls_++ * 1000 + n_) ^ static_cast<uint64_t>(rank_)));
    input(slot) = strata::testing::randomData(rng, c.type, c.sendElems(n_));
    return strata::testing::randomData(rng, c.type, c.recvElems(n_));
  }

  /// Enqueues the copies of input and garbage into the case's buffers; sets its pointers. The
  /// bounce buffers are used at the call's own offsets (inputs at its send offset, which is
  /// reserved in place too), so the calls of a group never share bounce bytes.
  void upload(Placed& p, const std::vector<char>& mine, const std::vector<char>& garbage) {
    const Case& c = p.c;
    p.send = a_ + p.aAt;
    p.recv = b_ + p.bAt;
    if (c.op == Op::ReduceScatter && c.inPlace) {
      mem_.toDevice(p.recv, mine.data(), mine.size(), bounceIn_ + p.aAt);  // output: a window
      p.send = p.recv;
      p.recv = p.send + rank_ * c.bytes();
      return;
    }
    mem_.toDevice(p.recv, garbage.data(), garbage.size(), bounceGarbage_ + p.bAt);
    if (c.inPlace) {
      p.send = c.op == Op::AllGather ? p.recv + rank_ * c.bytes() : p.recv;
      if (c.op != Op::Broadcast || rank_ == c.root) {
        mem_.toDevice(p.send, mine.data(), mine.size(), bounceIn_ + p.aAt);
      }
    } else {
      mem_.toDevice(p.send, mine.data(), mine.size(), bounceIn_ + p.aAt);
    }
  }

  /// Makes the call (send/recv: both, in a deadlock-free order); checks who ran it.
  bool call(Communicator& comm, const Placed& p, const std::string& what) {
    const Case& c = p.c;
    const strata::Stream s = mem_.handle();
    switch (c.op) {
      case Op::AllReduce:
        comm.allReduce(p.send, p.recv, c.count, c.type, c.redop, s);
        break;
      case Op::ReduceScatter:
        comm.reduceScatter(p.send, p.recv, c.count, c.type, c.redop, s);
        break;
      case Op::AllGather:
        comm.allGather(p.send, p.recv, c.count, c.type, s);
        break;
      case Op::Broadcast:
        comm.broadcast(c.nullSend && rank_ != c.root ? nullptr : p.send, p.recv, c.count, c.type,
                       c.root, s);
        break;
      case Op::AllToAll:
        comm.allToAll(p.send, p.recv, c.count, c.type, s);
        break;
      case Op::SendRecv: {
        // A send kernel waits for the matching recv: even ranks send first, odd ranks receive
        // first (the shifts are odd, so every pair is one even and one odd rank).
        const int to = (rank_ + c.root) % n_, from = (rank_ - c.root + n_) % n_;
        bool ok = true;
        for (int step = 0; step < 2; ++step) {
          if ((step == 0) == (rank_ % 2 == 0)) {
            comm.send(p.send, c.count, c.type, to, s);
          } else {
            comm.recv(p.recv, c.count, c.type, from, s);
          }
          ok = checkAlgorithm(comm, c, what) && ok;
        }
        return ok;
      }
    }
    return checkAlgorithm(comm, c, what);
  }

  /// Computes the expected output (overlapping the kernels) and enqueues the copy back.
  void collect(Placed& p, size_t slot) {
    expected(p.c, w_.in[slot], p.want);
    p.got = mem_.fetch(p.recv, p.want.size(), bounceOut_ + p.bAt);
  }

  /// After sync(): one check.
  void verdict(const Placed& p, const std::string& what, bool algoOk) {
    const bool ok = compare(what, p.c.type, p.got, p.want) && algoOk;
    ++phase_.checks;
    if (!ok) ++phase_.failed;
  }

  /// One call, alone: input slots alternate by parity, so one barrier per call suffices (a
  /// rank writes a slot again only after the next call's barrier, when every rank has folded
  /// this call).
  void runCase(Communicator& comm, const Case& c, size_t index) {
    const std::string what = c.describe();
    gProgress.set(rank_, fmt::format("[{}] case {}: {}", phase_.name, index, what));
    const size_t slot = calls_ & 1;
    const std::vector<char> garbage = draw(c, slot);
    boot_->barrier();  // every input is written
    Placed p = place({c}).front();
    upload(p, input(slot), garbage);
    const bool algoOk = call(comm, p, what);
    collect(p, slot);
    mem_.sync();
    verdict(p, what, algoOk);
  }

  /// Several calls enqueued back to back and synchronized once, so that ranks run calls ahead
  /// of each other and algorithms switch from call to call (the epochs and the parity double
  /// buffering on a real GPU). kBursts bursts of twelve calls, each in an order of its own.
  void burstPhase(Communicator& comm) {
    const auto start = Clock::now();
    phase_ = PhaseResult{"burst"};
    for (int b = 0; b < kBursts && !w_.stop; ++b) {
      std::vector<Case> cases = burstCases(n_, b);
      std::vector<Placed> placed = place(cases);
      std::vector<std::vector<char>> garbage;
      for (size_t i = 0; i < placed.size(); ++i) garbage.push_back(draw(placed[i].c, 2 + i));
      boot_->barrier();  // every input is written
      std::vector<bool> algoOk;
      for (size_t i = 0; i < placed.size(); ++i) {
        upload(placed[i], input(2 + i), garbage[i]);
        const std::string what = fmt::format("burst {} call {}: {}", b, i, placed[i].c.describe());
        gProgress.set(rank_, "[burst] " + what);
        algoOk.push_back(call(comm, placed[i], what));
      }
      for (size_t i = 0; i < placed.size(); ++i) collect(placed[i], 2 + i);
      mem_.sync();
      for (size_t i = 0; i < placed.size(); ++i) {
        verdict(placed[i], fmt::format("burst {} call {}: {}", b, i, placed[i].c.describe()),
                algoOk[i]);
      }
      boot_->barrier();  // every rank has folded the inputs before they are replaced
    }
    finishPhase(start);
  }

  /// Three allReduces (one per algorithm) captured into a graph on every rank, replayed five
  /// times with new inputs; every replay's results are checked.
  void graphPhase(Communicator& comm) {
    const auto start = Clock::now();
    phase_ = PhaseResult{"graph"};
    std::vector<Placed> placed = place(graphCases());
    for (Placed& p : placed) {  // the pointers the graph keeps; inputs come before each replay
      p.send = a_ + p.aAt;
      p.recv = b_ + p.bAt;
      if (p.c.inPlace) p.send = p.recv;
    }

    boot_->barrier();  // nobody makes a call that global-mode capture forbids while others capture
    gProgress.set(rank_, "[graph] capturing");
    CUDA_CHECK(cudaStreamBeginCapture(mem_.stream, cudaStreamCaptureModeGlobal));
    bool algoOk = true;
    for (const Placed& p : placed) algoOk = call(comm, p, "captured " + p.c.describe()) && algoOk;
    cudaGraph_t graph = nullptr;
    CUDA_CHECK(cudaStreamEndCapture(mem_.stream, &graph));
    boot_->barrier();
    cudaGraphExec_t exec = nullptr;
    CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));

    for (int rep = 0; rep < 5 && !w_.stop; ++rep) {
      gProgress.set(rank_, fmt::format("[graph] replay {}", rep));
      std::vector<std::vector<char>> garbage;
      for (size_t i = 0; i < placed.size(); ++i) garbage.push_back(draw(placed[i].c, 2 + i));
      boot_->barrier();  // every input is written
      for (size_t i = 0; i < placed.size(); ++i) upload(placed[i], input(2 + i), garbage[i]);
      CUDA_CHECK(cudaGraphLaunch(exec, mem_.stream));
      for (size_t i = 0; i < placed.size(); ++i) collect(placed[i], 2 + i);
      mem_.sync();
      for (const Placed& p : placed) {
        verdict(p, fmt::format("replay {} of {}", rep, p.c.describe()), algoOk);
      }
      boot_->barrier();  // every rank has folded the inputs before they are replaced
    }
    CUDA_CHECK(cudaGraphExecDestroy(exec));
    CUDA_CHECK(cudaGraphDestroy(graph));
    finishPhase(start);
  }

  void finishPhase(Clock::time_point start) {
    phase_.seconds = std::chrono::duration<double>(Clock::now() - start).count();
    w_.merge(phase_, rank_);
    phase_.name.clear();
  }

 private:
  World& w_;
  const int rank_;
  const int n_;
  std::shared_ptr<ThreadBootstrap> boot_;
  Memory mem_;
  char* a_ = nullptr;  ///< send buffers (device memory)
  char* b_ = nullptr;  ///< recv buffers (device memory)
  char* bounceIn_ = nullptr;
  char* bounceGarbage_ = nullptr;
  char* bounceOut_ = nullptr;
  size_t cap_ = 0;
  uint64_t calls_ = 0;
  long listingFailures_ = 0;
  PhaseResult phase_;
};

struct WorldResult {
  bool ok = false;    ///< every check passed
  bool hard = false;  ///< a rank stopped on an error (not a wrong result)
};

/// Runs every phase with n ranks; prints a line per phase.
WorldResult runWorld(int n) {
  World w(n);
  gProgress.start(n);
  std::vector<std::thread> threads;
  std::atomic<int> hardFailures{0};
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&w, r, &hardFailures] {
      auto boot = std::make_shared<ThreadBootstrap>(w.hub, r);
      Rank rank(w, r, boot);
      try {
        rank.run();
        gProgress.set(r, "done");
      } catch (const std::exception& e) {
        // A rank that only saw another's abort says so once, without counting a failure.
        const auto* se = dynamic_cast<const Error*>(&e);
        if (se != nullptr && se->code() == ErrorCode::Aborted && w.stop) {
          gProgress.set(r, "left after another rank's failure");
          rank.leavePhase();
          return;
        }
        ++hardFailures;
        w.stop = true;
        rank.failPhase(e.what());
        gProgress.set(r, std::string("failed: ") + e.what());
        boot->abort(e.what());
      }
    });
  }
  for (auto& t : threads) t.join();

  bool ok = hardFailures == 0;
  for (const PhaseResult& p : w.phases) {
    std::string algos;
    for (const auto& [name, count] : p.algorithms) {
      algos += fmt::format("{}{} {}", algos.empty() ? "" : ", ", name, count);
    }
    const bool pass = p.failed == 0 && !p.aborted;
    ok = ok && pass;
    std::printf("N=%d %-20s %s %ld of %ld checks passed%s in %.1f s (rank 0: %s)\n", n,
                p.name.c_str(), pass ? "PASS" : "FAIL", p.checks - p.failed, p.checks,
                p.aborted ? ", ABORTED" : "", p.seconds, algos.c_str());
  }
  if (w.phases.empty()) std::printf("N=%d FAIL before any phase ran\n", n);
  std::fflush(stdout);
  return {ok && !w.phases.empty(), hardFailures > 0};
}

bool parseArgs(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    if (a == "--short") {
      gOpt.shortRun = true;
    } else if (a == "--host") {
      gOpt.host = true;
    } else if (a.rfind("--timeout=", 0) == 0) {
      gOpt.watchdogSeconds = std::atof(argv[i] + 10);
      if (gOpt.watchdogSeconds <= 0) return false;
    } else if (a.rfind("--ranks=", 0) == 0) {
      std::string list(a.substr(8));
      for (size_t pos = 0; pos < list.size();) {
        size_t end = list.find(',', pos);
        if (end == std::string::npos) end = list.size();
        const int n = std::atoi(list.substr(pos, end - pos).c_str());
        if (n < 2 || n > 8 || n % 2 != 0) return false;  // send/recv pairs even with odd ranks
        gOpt.ranks.push_back(n);
        pos = end + 1;
      }
    } else {
      return false;
    }
  }
  if (gOpt.ranks.empty()) {
    gOpt.ranks = gOpt.shortRun ? std::vector<int>{2, 4} : std::vector<int>{2, 4, 8};
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  // Before any other thread exists (CUDA's included): the watchdog alone takes these signals.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  if (!parseArgs(argc, argv)) {
    std::fprintf(stderr,
                 "usage: %s [--short] [--ranks=2,4,8] [--timeout=SECONDS] [--host]\n"
                 "  (rank counts: even, 2..8)\n",
                 argv[0]);
    return 2;
  }
  // Tests never pick up a user's strata.toml (an explicit STRATA_CONFIG is honoured).
  setenv("STRATA_CONFIG", "/dev/null/none", 0);
  // Every rank's stream needs its own hardware queue: with CUDA's default of 8, streams share
  // queues, and a kernel waiting for a peer can block the peer's kernel queued behind it.
  // Read when the context is created, so set before any CUDA call.
  const char* connections = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");
  const std::string userConnections = connections != nullptr ? connections : "";
  if (!gOpt.host) setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 1);

  std::string device = "host memory (--host: the harness's self-check, host collectives)";
  if (!gOpt.host) {
    int count = 0;
    const cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
      std::printf("SKIP: no CUDA device: cudaGetDeviceCount: %s (%s)\n", cudaGetErrorString(e),
                  cudaGetErrorName(e));
      return 77;
    }
    if (count == 0) {
      std::printf("SKIP: no CUDA device: cudaGetDeviceCount found none\n");
      return 77;
    }
    cudaDeviceProp prop{};
    const cudaError_t pe = cudaGetDeviceProperties(&prop, 0);
    if (pe != cudaSuccess) {
      std::printf("FAIL: cudaGetDeviceProperties(0): %s (%s)\n", cudaGetErrorString(pe),
                  cudaGetErrorName(pe));
      return 1;
    }
    // One 512-thread block per SM (the kernels' register budget): every rank's blocks must fit
    // at once, or a kernel spins for a peer whose kernel cannot start.
    const int most = *std::max_element(gOpt.ranks.begin(), gOpt.ranks.end());
    gMaxBlocks = std::clamp(prop.multiProcessorCount / most, 1, kMaxBlocks);
    device =
        fmt::format("device 0 of {}: {} (sm_{}{}, {} SMs), collectives.cuda.max_blocks {}", count,
                    prop.name, prop.major, prop.minor, prop.multiProcessorCount, gMaxBlocks);
    if (!userConnections.empty() && userConnections != "32") {
      device += fmt::format("; CUDA_DEVICE_MAX_CONNECTIONS {} replaced by 32", userConnections);
    }
  }
  std::thread(watchdog, gOpt.watchdogSeconds, signals).detach();

  std::string ranks;
  for (int n : gOpt.ranks) ranks += (ranks.empty() ? "" : ",") + std::to_string(n);
  std::printf("test-cuda-collectives: %s; N = %s; %s sweep; watchdog %.0f s\n", device.c_str(),
              ranks.c_str(), gOpt.shortRun ? "short" : "full", gOpt.watchdogSeconds);
  std::fflush(stdout);

  const auto start = Clock::now();
  bool ok = true;
  for (int n : gOpt.ranks) {
    const WorldResult r = runWorld(n);
    ok = ok && r.ok;
    if (r.hard) {
      // A rank that failed hard may have left kernels spinning until transport.timeout, and
      // the CUDA context may be broken: the remaining sizes would say nothing new.
      if (gOpt.ranks.back() != n) std::printf("(the remaining rank counts are not run)\n");
      break;
    }
  }
  const double s = std::chrono::duration<double>(Clock::now() - start).count();
  std::printf("%s: test-cuda-collectives in %.1f s\n", ok ? "PASS" : "FAIL", s);
  std::fflush(stdout);
  return ok ? 0 : 1;
}
