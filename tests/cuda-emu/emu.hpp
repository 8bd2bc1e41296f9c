#pragma once

// The host emulation of the CUDA collectives' kernels: ranks as groups of host threads in one
// process, each rank with its own scratch (which every rank "maps": it is plain memory here),
// block state and abort record. Each rank runs its own sequence of launches in order, like a
// CUDA stream, concurrently with the other ranks (so kernels that wait on each other are
// co-resident, as on a GPU, and a rank can run calls ahead of another); blocks are groups of
// threads with a std::barrier for __syncthreads. The thread context adds random yields at every
// sync and spin, and can make one rank slow. A rank may also run several streams at once
// (runStreams), and its launches follow CUDA's lazy-loading rule (since CUDA 12.2 the default):
// the first launch of a kernel in a process loads it and waits until none of that process's
// launches is running, unless the kernels were loaded at set-up (World::preload, what the module
// does).

#include <atomic>
#include <barrier>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "collectives/cuda/kernels.hpp"

namespace strata::cuda::emu {

struct Block {
  explicit Block(uint32_t threads) : bar(threads) {}
  std::barrier<> bar;
  std::atomic<bool> fail{false};
};

class Thread {
 public:
  Thread(uint32_t t, uint32_t nt, uint32_t b, uint32_t nb, Block* blk, uint64_t seed, bool slow)
      : t_(t), nt_(nt), b_(b), nb_(nb), blk_(blk), rng_(seed | 1), slow_(slow) {}
  uint32_t thread() const { return t_; }
  uint32_t threads() const { return nt_; }
  uint32_t block() const { return b_; }
  uint32_t blocks() const { return nb_; }
  void sync() {
    jitter();
    blk_->bar.arrive_and_wait();
  }
  bool syncAnd(bool ok) {
    if (!ok) blk_->fail.store(true, std::memory_order_relaxed);
    sync();
    const bool all = !blk_->fail.load(std::memory_order_relaxed);
    sync();  // nobody sets fail for a later syncAnd before everyone read it
    return all;
  }
  void spin() {
    jitter();
    std::this_thread::yield();
  }

 private:
  void jitter() {
    rng_ ^= rng_ << 13;
    rng_ ^= rng_ >> 7;
    rng_ ^= rng_ << 17;
    if (slow_ && (rng_ & 3) == 0) {
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    } else if ((rng_ & 15) == 0) {
      std::this_thread::yield();
    }
  }
  uint32_t t_, nt_, b_, nb_;
  Block* blk_;
  uint64_t rng_;
  bool slow_;
};

/// One rank's memory: scratch (zeroed, 256-byte aligned), block state, abort record.
struct Rank {
  explicit Rank(uint64_t bytes)
      : scratch(static_cast<char*>(std::aligned_alloc(256, ScratchLayout::alignUp(bytes, 256)))) {
    std::memset(scratch, 0, bytes);
    std::memset(state, 0, sizeof(state));
    abortClaim = 0;
    std::memset(&abort, 0, sizeof(abort));
  }
  ~Rank() { std::free(scratch); }
  Rank(const Rank&) = delete;
  Rank& operator=(const Rank&) = delete;
  char* scratch;
  BlockState state[kMaxBlocks];
  AbortRecord abort;
  uint64_t abortClaim;
  uint64_t stop = 0;  ///< the host's stop word (set with a release store: World::stop)

  // The process's module: which kernels are loaded, and how many launches run now.
  std::mutex mu;
  std::condition_variable idle;
  bool loaded[kKernelIds] = {};
  int running = 0;
  int lazyLoads = 0;        ///< launches that had to load their kernel
  int loadsThatWaited = 0;  ///< ... and found launches of this rank running

  /// A launch of kernel id begins: a kernel not loaded yet is loaded first, which waits until
  /// no launch of this rank runs (the lazy-loading rule).
  void beginLaunch(KernelId id) {
    std::unique_lock lk(mu);
    const int k = static_cast<int>(id);
    if (!loaded[k]) {
      ++lazyLoads;
      if (running > 0) ++loadsThatWaited;
      idle.wait(lk, [&] { return running == 0; });
      loaded[k] = true;
    }
    ++running;
  }
  void endLaunch() {
    std::lock_guard lk(mu);
    if (--running == 0) idle.notify_all();
  }
};

/// What one rank launches.
struct Launch {
  bool run = false;
  KernelId id = KernelId::AllReduceOneShot;
  ElemType type = ElemType::Float;
  KernelArgs args;
  uint32_t blocks = 1, threads = 4;
};

class World {
 public:
  World(int nranks, ScratchLayout layout, uint64_t timeoutNs, uint64_t seed = 1)
      : n_(nranks), layout_(layout), timeoutNs_(timeoutNs), seed_(seed) {
    for (int r = 0; r < n_; ++r) ranks_.push_back(std::make_unique<Rank>(layout.total()));
    startDelay_.resize(static_cast<size_t>(n_));
  }
  int size() const { return n_; }
  Rank& rank(int r) { return *ranks_[r]; }
  const ScratchLayout& layout() const { return layout_; }
  /// Arguments with this rank's memory filled in.
  KernelArgs args(int r) const {
    KernelArgs a;
    a.rank = r;
    a.nranks = n_;
    for (int q = 0; q < n_; ++q) a.scratch[q] = ranks_[q]->scratch;
    a.state = ranks_[r]->state;
    a.abort = &ranks_[r]->abort;
    a.abortClaim = &ranks_[r]->abortClaim;
    a.stop = &ranks_[r]->stop;
    a.timeoutNs = timeoutNs_;
    a.layout = layout_;
    return a;
  }
  /// Loads every kernel in every rank now, as the module does at set-up (backend.cpp:
  /// preloadKernels); without it each rank's first launch of a kernel waits for its running
  /// launches.
  void preload() {
    for (auto& r : ranks_) {
      std::lock_guard lk(r->mu);
      for (bool& l : r->loaded) l = true;
    }
  }
  /// Rank r starts its streams this much later than the others (a rank that reaches the call
  /// late: checkpointing, a slow data loader).
  void delayStart(int r, std::chrono::microseconds d) { startDelay_[r] = d; }
  /// What the module's host side does when it finds a peer lost: sets rank r's stop word.
  void stop(int r) { __atomic_store_n(&ranks_[r]->stop, uint64_t{1}, __ATOMIC_RELEASE); }
  /// Sets every block's epoch (flags near the 32-bit wrap).
  void setEpoch(uint64_t e) {
    for (auto& r : ranks_) {
      for (auto& s : r->state) s.epoch = e;
    }
  }
  /// Runs a sequence of calls as streams do: each rank runs its launches in order (a launch
  /// starts when its previous one finished), independently of the other ranks, so a fast rank
  /// can be calls ahead of a slow one; blocks of one launch run at once. calls[c][r] is rank
  /// r's launch of call c. slowRank's threads sleep now and then, and before each launch.
  void run(const std::vector<std::vector<Launch>*>& calls, int slowRank = -1) {
    runStreams({calls}, slowRank);
  }
  /// Several streams per rank: streams[k] is stream k's sequence of calls (as run() takes it);
  /// every rank runs all its streams at once, each in order. Stream k starts k x startGap
  /// late, so that stream 0's first launch is running when stream 1's begins.
  void runStreams(const std::vector<std::vector<std::vector<Launch>*>>& streams, int slowRank = -1,
                  std::chrono::microseconds startGap = std::chrono::microseconds(0)) {
    std::vector<std::thread> drivers;
    for (int r = 0; r < n_; ++r) {
      for (size_t k = 0; k < streams.size(); ++k) {
        drivers.emplace_back(
            [this, r, k, &streams, slowRank, startGap, seed = seed_ + 7919 * r + 104729 * k] {
              if (k > 0) std::this_thread::sleep_for(startGap * static_cast<int>(k));
              runStream(r, streams[k], slowRank, seed);
            });
      }
    }
    for (auto& d : drivers) d.join();
    seed_ += 1000003;
  }
  /// One call on every rank (launches[r]: rank r's; those without run set sit out).
  void launch(std::vector<Launch>& launches, int slowRank = -1) { run({&launches}, slowRank); }

 private:
  void runStream(int r, const std::vector<std::vector<Launch>*>& calls, int slowRank, uint64_t s) {
    Rank& rank = *ranks_[r];
    if (startDelay_[r].count() > 0) std::this_thread::sleep_for(startDelay_[r]);
    for (auto* call : calls) {
      Launch& l = (*call)[r];
      if (!l.run) continue;
      if (r == slowRank) std::this_thread::sleep_for(std::chrono::microseconds(100));
      rank.beginLaunch(l.id);
      std::vector<std::unique_ptr<Block>> blocks;
      std::vector<std::thread> threads;
      for (uint32_t b = 0; b < l.blocks; ++b) {
        blocks.push_back(std::make_unique<Block>(l.threads));
        Block* blk = blocks.back().get();
        for (uint32_t t = 0; t < l.threads; ++t) {
          const uint64_t ts = ++s * 0x9e3779b97f4a7c15ull;
          threads.emplace_back([&l, t, b, blk, ts, slow = r == slowRank] {
            Thread ctx(t, l.threads, b, l.blocks, blk, ts, slow);
            runKernelDynamic(l.id, l.type, ctx, l.args);
          });
        }
      }
      for (auto& t : threads) t.join();
      rank.endLaunch();
    }
  }

  int n_;
  ScratchLayout layout_;
  uint64_t timeoutNs_;
  uint64_t seed_;
  std::vector<std::unique_ptr<Rank>> ranks_;
  std::vector<std::chrono::microseconds> startDelay_;
};

}  // namespace strata::cuda::emu
