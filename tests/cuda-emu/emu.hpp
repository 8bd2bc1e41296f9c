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
// does). The rest of the GPU's scheduler can be modelled too: a finite pool of SM slots per GPU
// (World::smSlots: a block runs only while it holds one, dispatched in block order as slots
// free up), and a fixed number of hardware queues per GPU (World::hardwareQueues, as
// CUDA_DEVICE_MAX_CONNECTIONS: stream k feeds queue k % queues, and a launch waits until the
// launches before it in its queue have finished, whatever their stream).

#include <algorithm>
#include <atomic>
#include <barrier>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <unordered_map>
#include <vector>

#include "collectives/cuda/kernels.hpp"

namespace strata::cuda::emu {

/// A GPU's weak memory, for the data kernels hand to peers (16-byte stores and loads of the
/// ranks' scratch; <strata/device.hpp>'s WeakMemory hook):
///   - a thread's stores wait in its own buffer (a later store to the same address replaces the
///     earlier one; the thread reads its own), and now and then one of them, at random, becomes
///     visible early (out of order);
///   - a block barrier hands them to the block (its threads then see them: CTA scope);
///   - a release (a semaphore signal, a release store, a fence) by any thread of the block
///     makes the thread's and the block's stores visible to everyone;
///   - a block's loads of the scratch come from the block's cache (what it read before), which
///     only an acquire by one of its threads drops (and, now and then, an eviction);
///   - the end of a kernel makes everything visible and drops the cache;
///   - packet words (8-byte volatile stores: LL8 packets, each half of an LL16 packet) wait in the
///     thread's own word buffer and land one by one in a random order (the two halves of a pair
///     too): now and then at a store, all of them when the thread waits (spin), syncs or
///     releases; volatile loads read memory (and the thread's own words).
/// So a kernel whose signal forgets its release, or whose wait forgets its acquire, reads stale
/// data here as it would on a GPU (x86 alone would hide both), and so does a packet reader that
/// trusts one flag for data another word carries. Accesses to memory outside the
/// scratch, and threads that are not the emulation's kernel threads, pass through.
class WeakModel final : public device::WeakMemory {
 public:
  struct Entry {
    char* p;
    device::Vec16 v;
  };
  struct BlockMem {
    std::mutex mu;
    std::vector<Entry> pending;  ///< stores handed over at a barrier, not yet visible
    std::unordered_map<const char*, device::Vec16> cache;
  };
  struct Word {
    uint64_t* p;
    uint64_t v;
  };
  struct ThreadMem {
    BlockMem* block = nullptr;
    std::vector<Entry> buf;
    std::vector<Word> words;  ///< packet words not yet visible
    uint64_t rng = 1;
  };
  static inline thread_local ThreadMem* current = nullptr;

  void addRange(const char* base, size_t bytes) { ranges_.push_back({base, base + bytes}); }

  bool store16(void* p, const void* value) override {
    ThreadMem* t = current;
    if (t == nullptr || !shared(p)) return false;
    device::Vec16 v;
    __builtin_memcpy(&v, value, 16);
    auto it = std::find_if(t->buf.begin(), t->buf.end(), [&](const Entry& e) { return e.p == p; });
    if (it != t->buf.end()) {
      it->v = v;
    } else {
      t->buf.push_back({static_cast<char*>(p), v});
    }
    if (next(t) % 8 == 0) {  // one store becomes visible early, out of order
      const size_t k = next(t) % t->buf.size();
      std::lock_guard lk(t->block->mu);
      write(t->buf[k]);
      t->block->cache.erase(t->buf[k].p);  // the SM's own store updates its cache
      // Older stores of the block to that address are superseded.
      std::erase_if(t->block->pending, [&](const Entry& e) { return e.p == t->buf[k].p; });
      t->buf.erase(t->buf.begin() + static_cast<std::ptrdiff_t>(k));
    }
    return true;
  }

  bool load16(const void* p, void* value) override {
    ThreadMem* t = current;
    if (t == nullptr || !shared(p)) return false;
    const char* c = static_cast<const char*>(p);
    for (auto it = t->buf.rbegin(); it != t->buf.rend(); ++it) {
      if (it->p == c) {
        __builtin_memcpy(value, &it->v, 16);
        return true;
      }
    }
    std::lock_guard lk(t->block->mu);
    for (auto it = t->block->pending.rbegin(); it != t->block->pending.rend(); ++it) {
      if (it->p == c) {
        __builtin_memcpy(value, &it->v, 16);
        return true;
      }
    }
    auto hit = t->block->cache.find(c);
    if (hit != t->block->cache.end() && next(t) % 32 != 0) {  // else: evicted
      __builtin_memcpy(value, &hit->second, 16);
      return true;
    }
    const device::Vec16 v = read(c);
    t->block->cache[c] = v;
    __builtin_memcpy(value, &v, 16);
    return true;
  }

  bool storeWord(uint64_t* p, uint64_t value) override {
    ThreadMem* t = current;
    if (t == nullptr || !shared(p)) return false;
    auto it =
        std::find_if(t->words.begin(), t->words.end(), [&](const Word& w) { return w.p == p; });
    if (it != t->words.end()) {
      it->v = value;
    } else {
      t->words.push_back({p, value});
    }
    if (next(t) % 4 == 0) {  // one word lands early, out of order
      const size_t k = next(t) % t->words.size();
      __atomic_store_n(t->words[k].p, t->words[k].v, __ATOMIC_RELAXED);
      t->words.erase(t->words.begin() + static_cast<std::ptrdiff_t>(k));
    }
    return true;
  }

  bool loadWord(const uint64_t* p, uint64_t& value) override {
    ThreadMem* t = current;
    if (t == nullptr) return false;
    for (const Word& w : t->words) {
      if (w.p == p) {
        value = w.v;
        return true;
      }
    }
    return false;
  }

  /// The thread's packet words land, in a random order (a waiting thread's stores drain: the
  /// peers it waits for may be waiting for them).
  static void landWords() {
    ThreadMem* t = current;
    if (t == nullptr || t->words.empty()) return;
    for (size_t i = t->words.size(); i > 1; --i) std::swap(t->words[i - 1], t->words[next(t) % i]);
    for (const Word& w : t->words) __atomic_store_n(w.p, w.v, __ATOMIC_RELAXED);
    t->words.clear();
  }

  void release() override {
    ThreadMem* t = current;
    if (t == nullptr) return;
    landWords();
    std::lock_guard lk(t->block->mu);
    // The block's (barrier-ordered, older) stores first, then the thread's own.
    t->block->pending.insert(t->block->pending.end(), t->buf.begin(), t->buf.end());
    t->buf.clear();
    shuffleAndWrite(t, *t->block);
  }

  void acquire() override {
    ThreadMem* t = current;
    if (t == nullptr) return;
    std::lock_guard lk(t->block->mu);
    t->block->cache.clear();
  }

  /// At a block barrier: the thread's stores become the block's.
  static void barrier() {
    landWords();
    ThreadMem* t = current;
    if (t == nullptr || t->buf.empty()) return;
    std::lock_guard lk(t->block->mu);
    t->block->pending.insert(t->block->pending.end(), t->buf.begin(), t->buf.end());
    t->buf.clear();
  }

  /// After every thread of the block has ended (each handed its stores over: barrier()):
  /// everything is visible.
  static void kernelEnd(BlockMem& b) {
    std::lock_guard lk(b.mu);
    for (const Entry& e : b.pending) write(e);  // in order: the last store of an address wins
    b.pending.clear();
    b.cache.clear();
  }

 private:
  bool shared(const void* p) const {
    const char* c = static_cast<const char*>(p);
    for (const auto& [lo, hi] : ranges_) {
      if (c >= lo && c < hi) return true;
    }
    return false;
  }
  static uint64_t next(ThreadMem* t) {
    t->rng ^= t->rng << 13;
    t->rng ^= t->rng >> 7;
    t->rng ^= t->rng << 17;
    return t->rng;
  }
  // Relaxed 8-byte atomics: the model's own accesses race by design (that is what it models),
  // and ThreadSanitizer must not report them.
  static void write(const Entry& e) {
    __atomic_store_n(reinterpret_cast<uint64_t*>(e.p), e.v.lo, __ATOMIC_RELAXED);
    __atomic_store_n(reinterpret_cast<uint64_t*>(e.p) + 1, e.v.hi, __ATOMIC_RELAXED);
  }
  static device::Vec16 read(const char* p) {
    return {__atomic_load_n(reinterpret_cast<const uint64_t*>(p), __ATOMIC_RELAXED),
            __atomic_load_n(reinterpret_cast<const uint64_t*>(p) + 1, __ATOMIC_RELAXED)};
  }
  /// Makes the block's pending stores visible in a random order (under the block's lock): of
  /// several stores to one address only the last counts, and the block's cache of each address
  /// is updated (an SM sees its own stores).
  static void shuffleAndWrite(ThreadMem* t, BlockMem& b) {
    std::unordered_map<const char*, size_t> last;
    for (size_t i = 0; i < b.pending.size(); ++i) last[b.pending[i].p] = i;
    std::vector<Entry> out;
    for (size_t i = 0; i < b.pending.size(); ++i) {
      if (last[b.pending[i].p] == i) out.push_back(b.pending[i]);
    }
    for (size_t i = out.size(); i > 1; --i) std::swap(out[i - 1], out[next(t) % i]);
    for (const Entry& e : out) {
      write(e);
      b.cache.erase(e.p);
    }
    b.pending.clear();
  }
  std::vector<std::pair<const char*, const char*>> ranges_;
};

struct Block {
  explicit Block(uint32_t threads) : bar(threads), live(threads) {}
  std::barrier<> bar;
  std::atomic<bool> fail{false};
  std::atomic<uint32_t> live;  ///< threads still running (the last frees the SM slot)
  WeakModel::BlockMem mem;
};

/// A GPU's SM slots: how many blocks can be resident at once (unlimited unless set).
class SmSlots {
 public:
  explicit SmSlots(int slots) : free_(slots) {}
  void acquire() {
    std::unique_lock lk(mu_);
    if (free_ == 0) ++waits_;
    cv_.wait(lk, [&] { return free_ > 0; });
    --free_;
  }
  void release() {
    {
      std::lock_guard lk(mu_);
      ++free_;
    }
    cv_.notify_all();
  }
  /// Blocks that had to wait for a slot.
  int waits() {
    std::lock_guard lk(mu_);
    return waits_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int free_;
  int waits_ = 0;
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
    WeakModel::barrier();
    blk_->bar.arrive_and_wait();
  }
  bool syncAnd(bool ok) {
    if (!ok) blk_->fail.store(true, std::memory_order_relaxed);
    sync();
    const bool all = !blk_->fail.load(std::memory_order_relaxed);
    sync();  // nobody sets fail for a later syncAnd before everyone read it
    return all;
  }
  /// One step of a wait loop: a yield for the first kYieldPolls polls of a wait, then a short
  /// sleep, so that threads that wait long leave the CPUs to those that work (the proxy thread,
  /// the other ranks' kernels): on a host with fewer CPUs than emulated threads, yielding alone
  /// kept every waiting thread runnable and a run took minutes.
  void spin(uint32_t polls) {
    WeakModel::landWords();
    jitter();
    if (polls < kYieldPolls) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(kSleepUs));
    }
  }
  static constexpr uint32_t kYieldPolls = 256;
  static constexpr int kSleepUs = 20;

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
  std::atomic<uint64_t> begun{0};  ///< launches begun (diagnostics)
  int lazyLoads = 0;               ///< launches that had to load their kernel
  int loadsThatWaited = 0;         ///< ... and found launches of this rank running

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
    begun.fetch_add(1, std::memory_order_relaxed);
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
    gpuLock_.resize(static_cast<size_t>(n_));
    slots_.resize(static_cast<size_t>(n_));
    queues_.resize(static_cast<size_t>(n_));
    // Weak memory over every rank's scratch, unless STRATA_EMU_WEAK_MEMORY=0.
    const char* weak = std::getenv("STRATA_EMU_WEAK_MEMORY");
    if (weak == nullptr || *weak != '0') {
      for (auto& r : ranks_) weak_.addRange(r->scratch, layout.total());
      device::weakMemory = &weak_;
    }
  }
  ~World() {
    if (device::weakMemory == &weak_) device::weakMemory = nullptr;
  }
  int size() const { return n_; }
  /// More memory under the weak-memory model (the network step's bounce buffers), unless the
  /// model is off.
  void addWeakRange(const char* base, size_t bytes) {
    if (device::weakMemory == &weak_) weak_.addRange(base, bytes);
  }
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
  /// Ranks r and q are processes on one GPU without MPS: the GPU runs one of their launches at a
  /// time (time-slicing, which on real hardware hands the GPU over only every few milliseconds;
  /// here never during a launch, the worst case). Ranks not put on a shared GPU have their own.
  void shareGpuWithoutMps(int r, int q) {
    auto g = std::make_shared<std::mutex>();
    gpuLock_[r] = g;
    gpuLock_[q] = g;
  }
  /// Every rank's GPU holds at most `slots` resident blocks (ranks sharing a GPU without MPS
  /// run one launch at a time anyway).
  void smSlots(int slots) {
    for (auto& p : slots_) p = std::make_shared<SmSlots>(slots);
  }
  /// Blocks of rank r that waited for an SM slot.
  int slotWaits(int r) { return slots_[r] ? slots_[r]->waits() : 0; }
  /// Every rank's GPU has `queues` hardware queues (CUDA_DEVICE_MAX_CONNECTIONS): stream k
  /// feeds queue k % queues, in which launches run one after another in the order they were
  /// issued.
  void hardwareQueues(int queues) {
    for (auto& q : queues_) {
      q.clear();
      for (int i = 0; i < queues; ++i) q.push_back(std::make_unique<std::mutex>());
    }
  }
  /// Rank r starts its streams this much later than the others (a rank that reaches the call
  /// late: checkpointing, a slow data loader).
  void delayStart(int r, std::chrono::microseconds d) { startDelay_[r] = d; }
  /// What the module's host side does when it finds a peer lost: sets rank r's stop word.
  void stop(int r) { __atomic_store_n(&ranks_[r]->stop, uint64_t{1}, __ATOMIC_RELEASE); }
  /// Called (from rank r's stream) right after the launch in which the first rank of a run
  /// gave up has ended, while the other ranks still sit where they waited (diagnostics).
  std::function<void(int)> onFirstAbort;
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
    abortSeen_ = false;
    std::vector<std::thread> drivers;
    for (int r = 0; r < n_; ++r) {
      for (size_t k = 0; k < streams.size(); ++k) {
        drivers.emplace_back(
            [this, r, k, &streams, slowRank, startGap, seed = seed_ + 7919 * r + 104729 * k] {
              if (k > 0) std::this_thread::sleep_for(startGap * static_cast<int>(k));
              runStream(r, static_cast<int>(k), streams[k], slowRank, seed);
            });
      }
    }
    for (auto& d : drivers) d.join();
    seed_ += 1000003;
  }
  /// One call on every rank (launches[r]: rank r's; those without run set sit out).
  void launch(std::vector<Launch>& launches, int slowRank = -1) { run({&launches}, slowRank); }
  /// Rank r alone runs its launches of `calls` on one stream (after its delayStart), as its host
  /// enqueued them, and returns when they are done: for tests that drive each rank's host side
  /// themselves (teardown), one thread per rank.
  void runRank(int r, const std::vector<std::vector<Launch>*>& calls) {
    runStream(r, 0, calls, -1, seed_ + 7919 * r);
  }

 private:
  void runStream(int r, int stream, const std::vector<std::vector<Launch>*>& calls, int slowRank,
                 uint64_t s) {
    Rank& rank = *ranks_[r];
    SmSlots* slots = slots_[r].get();
    if (startDelay_[r].count() > 0) std::this_thread::sleep_for(startDelay_[r]);
    for (auto* call : calls) {
      Launch& l = (*call)[r];
      if (!l.run) continue;
      if (r == slowRank) std::this_thread::sleep_for(std::chrono::microseconds(100));
      std::unique_lock<std::mutex> queue;
      if (!queues_[r].empty()) {
        queue = std::unique_lock<std::mutex>(*queues_[r][stream % queues_[r].size()]);
      }
      rank.beginLaunch(l.id);
      std::unique_lock<std::mutex> gpu;
      if (gpuLock_[r]) gpu = std::unique_lock<std::mutex>(*gpuLock_[r]);
      std::vector<std::unique_ptr<Block>> blocks;
      std::vector<std::thread> threads;
      for (uint32_t b = 0; b < l.blocks; ++b) {
        if (slots) slots->acquire();  // dispatched in block order as SM slots free up
        blocks.push_back(std::make_unique<Block>(l.threads));
        Block* blk = blocks.back().get();
        for (uint32_t t = 0; t < l.threads; ++t) {
          const uint64_t ts = ++s * 0x9e3779b97f4a7c15ull;
          threads.emplace_back([&l, t, b, blk, ts, slots, slow = r == slowRank] {
            WeakModel::ThreadMem mem{&blk->mem, {}, {}, ts | 1};
            WeakModel::current = &mem;
            Thread ctx(t, l.threads, b, l.blocks, blk, ts, slow);
            runKernelDynamic(l.id, l.type, ctx, l.args);
            WeakModel::barrier();  // the kernel's end: its stores are the block's
            WeakModel::current = nullptr;
            if (blk->live.fetch_sub(1) == 1 && slots) slots->release();
          });
        }
      }
      for (auto& t : threads) t.join();
      for (auto& blk : blocks) WeakModel::kernelEnd(blk->mem);
      if (gpu.owns_lock()) gpu.unlock();
      rank.endLaunch();
      if (queue.owns_lock()) queue.unlock();
      if (onFirstAbort && __atomic_load_n(&rank.abortClaim, __ATOMIC_ACQUIRE) != 0 &&
          !abortSeen_.exchange(true)) {
        onFirstAbort(r);
      }
    }
  }

  int n_;
  ScratchLayout layout_;
  uint64_t timeoutNs_;
  uint64_t seed_;
  std::vector<std::unique_ptr<Rank>> ranks_;
  std::vector<std::chrono::microseconds> startDelay_;
  std::vector<std::shared_ptr<std::mutex>> gpuLock_;  ///< per rank: its GPU's, when shared
  std::vector<std::shared_ptr<SmSlots>> slots_;       ///< per rank: its GPU's, when limited
  std::vector<std::vector<std::unique_ptr<std::mutex>>> queues_;  ///< per rank, when modelled
  WeakModel weak_;
  std::atomic<bool> abortSeen_{false};
};

}  // namespace strata::cuda::emu
