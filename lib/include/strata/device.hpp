#pragma once

// Building blocks shared by host threads (g++) and CUDA kernels (nvcc): the STRATA_HOST_DEVICE
// marker, system-scope atomics on 64-bit words, the volatile 8- and 16-byte accesses LL packets
// are made of, a clock and a spin pause. Each has a PTX (or libcu++) body for the GPU and a host
// twin with the same ordering, so code built on them runs in host threads too (cuda-emu).

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define STRATA_HOST_DEVICE __host__ __device__
#define STRATA_DEVICE_INLINE __forceinline__
#else
#define STRATA_HOST_DEVICE
#define STRATA_DEVICE_INLINE inline
#endif

#if defined(__CUDA_ARCH__)
#include <cuda/atomic>
#else
#include <chrono>
#endif

namespace strata::device {

#if !defined(__CUDA_ARCH__)
/// The host emulation's weak-memory model (tests/cuda-emu/emu.hpp): x86 orders stores and loads
/// far more than a GPU does, so without it a missing release or acquire passes in host threads.
/// When set, the host twins of storeVec16 and loadVec16 (the data the kernels hand to peers) and
/// of the packet words (storeWord, storeWordPair, loadWord, loadWordPair) ask it first, and
/// every release (storeRelease, redAddRelease, fetchAdd, fenceSystem) and acquire (loadAcquire,
/// fetchAdd, fenceSystem) tells it. It answers only for the emulation's kernel threads;
/// everything else passes through. Null (the default) costs one load and branch per call.
class WeakMemory {
 public:
  /// Takes a 16-byte store of ordinary data (true) or leaves it to the caller (false).
  virtual bool store16(void* p, const void* value) = 0;
  /// Serves a 16-byte load (true) or leaves it to the caller (false).
  virtual bool load16(const void* p, void* value) = 0;
  /// Takes an 8-byte volatile store (a packet word: seen whole, in no order with others) (true)
  /// or leaves it to the caller (false).
  virtual bool storeWord(uint64_t* p, uint64_t value) = 0;
  /// Serves an 8-byte volatile load of a word this thread stored and has not yet made visible
  /// (true), or leaves it to the caller (false).
  virtual bool loadWord(const uint64_t* p, uint64_t& value) = 0;
  /// Before a release: the calling thread's (and its block's) earlier stores become visible.
  virtual void release() = 0;
  /// After an acquire: the calling thread's block sees memory afresh.
  virtual void acquire() = 0;

 protected:
  ~WeakMemory() = default;
};
inline WeakMemory* weakMemory = nullptr;
namespace detail {
inline void weakRelease() {
  if (weakMemory != nullptr) weakMemory->release();
}
inline void weakAcquire() {
  if (weakMemory != nullptr) weakMemory->acquire();
}
}  // namespace detail
#endif

/// Acquire load of a word another process (or the GPU, or the NIC) writes.
STRATA_HOST_DEVICE STRATA_DEVICE_INLINE uint64_t loadAcquire(const uint64_t* word) {
#if defined(__CUDA_ARCH__)
  return cuda::atomic_ref<uint64_t, cuda::thread_scope_system>(*const_cast<uint64_t*>(word))
      .load(cuda::memory_order_acquire);
#else
  const uint64_t v = __atomic_load_n(word, __ATOMIC_ACQUIRE);
  detail::weakAcquire();
  return v;
#endif
}

/// Release store: every earlier store of this thread is visible before the word changes.
STRATA_HOST_DEVICE STRATA_DEVICE_INLINE void storeRelease(uint64_t* word, uint64_t value) {
#if defined(__CUDA_ARCH__)
  cuda::atomic_ref<uint64_t, cuda::thread_scope_system>(*word).store(value,
                                                                     cuda::memory_order_release);
#else
  detail::weakRelease();
  __atomic_store_n(word, value, __ATOMIC_RELEASE);
#endif
}

STRATA_HOST_DEVICE STRATA_DEVICE_INLINE uint64_t fetchAdd(uint64_t* word, uint64_t value) {
#if defined(__CUDA_ARCH__)
  return cuda::atomic_ref<uint64_t, cuda::thread_scope_system>(*word).fetch_add(
      value, cuda::memory_order_acq_rel);
#else
  detail::weakRelease();
  const uint64_t v = __atomic_fetch_add(word, value, __ATOMIC_ACQ_REL);
  detail::weakAcquire();
  return v;
#endif
}

/// Adds value to a word another process (or GPU) waits on, after every earlier store of this
/// thread: one release reduction at system scope, no separate fence (red.release.sys).
STRATA_HOST_DEVICE STRATA_DEVICE_INLINE void redAddRelease(uint64_t* word, uint64_t value) {
#if defined(__CUDA_ARCH__)
  asm volatile("red.release.sys.global.add.u64 [%0], %1;" ::"l"(word), "l"(value) : "memory");
#else
  detail::weakRelease();
  __atomic_fetch_add(word, value, __ATOMIC_RELEASE);
#endif
}

/// The same without ordering (barriers whose callers order their data otherwise).
STRATA_HOST_DEVICE STRATA_DEVICE_INLINE void redAddRelaxed(uint64_t* word, uint64_t value) {
#if defined(__CUDA_ARCH__)
  asm volatile("red.relaxed.sys.global.add.u64 [%0], %1;" ::"l"(word), "l"(value) : "memory");
#else
  __atomic_fetch_add(word, value, __ATOMIC_RELAXED);
#endif
}

/// Relaxed load of a word another process writes (no ordering of later loads).
STRATA_HOST_DEVICE STRATA_DEVICE_INLINE uint64_t loadRelaxed(const uint64_t* word) {
#if defined(__CUDA_ARCH__)
  uint64_t v;
  asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(word) : "memory");
  return v;
#else
  return __atomic_load_n(word, __ATOMIC_RELAXED);
#endif
}

/// One 8-byte store that a reader sees whole or not at all (an LL8 packet: 4 data + 4 flag
/// bytes). No ordering: the flag inside the word is the synchronisation.
STRATA_HOST_DEVICE STRATA_DEVICE_INLINE void storeWord(uint64_t* word, uint64_t value) {
#if defined(__CUDA_ARCH__)
  asm volatile("st.volatile.global.u64 [%0], %1;" ::"l"(word), "l"(value) : "memory");
#else
  if (weakMemory != nullptr && weakMemory->storeWord(word, value)) return;
  __atomic_store_n(word, value, __ATOMIC_RELAXED);
#endif
}

STRATA_HOST_DEVICE STRATA_DEVICE_INLINE uint64_t loadWord(const uint64_t* word) {
#if defined(__CUDA_ARCH__)
  uint64_t v;
  asm volatile("ld.volatile.global.u64 %0, [%1];" : "=l"(v) : "l"(word) : "memory");
  return v;
#else
  uint64_t v;
  if (weakMemory != nullptr && weakMemory->loadWord(word, v)) return v;
  return __atomic_load_n(word, __ATOMIC_RELAXED);
#endif
}

/// One 16-byte store of two 8-byte halves (an LL16 packet): each half is seen whole, the two
/// halves independently (one v4.u32 store on the GPU, two 8-byte stores on the host).
STRATA_HOST_DEVICE STRATA_DEVICE_INLINE void storeWordPair(uint64_t* words, uint64_t lo,
                                                           uint64_t hi) {
#if defined(__CUDA_ARCH__)
  asm volatile("st.volatile.global.v4.u32 [%0], {%1,%2,%3,%4};" ::"l"(words),
               "r"(static_cast<uint32_t>(lo)), "r"(static_cast<uint32_t>(lo >> 32)),
               "r"(static_cast<uint32_t>(hi)), "r"(static_cast<uint32_t>(hi >> 32))
               : "memory");
#else
  storeWord(words, lo);
  storeWord(words + 1, hi);
#endif
}

STRATA_HOST_DEVICE STRATA_DEVICE_INLINE void loadWordPair(const uint64_t* words, uint64_t& lo,
                                                          uint64_t& hi) {
#if defined(__CUDA_ARCH__)
  uint32_t a, b, c, d;
  asm volatile("ld.volatile.global.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(a), "=r"(b), "=r"(c), "=r"(d)
               : "l"(words)
               : "memory");
  lo = (static_cast<uint64_t>(b) << 32) | a;
  hi = (static_cast<uint64_t>(d) << 32) | c;
#else
  lo = loadWord(words);
  hi = loadWord(words + 1);
#endif
}

/// 16-byte vector load and store of ordinary data (ordered by a semaphore, not by themselves):
/// 16-byte aligned addresses only.
struct alignas(16) Vec16 {
  uint64_t lo, hi;
};
STRATA_HOST_DEVICE STRATA_DEVICE_INLINE Vec16 loadVec16(const void* p) {
#if defined(__CUDA_ARCH__)
  uint4 v = *static_cast<const uint4*>(p);
  return {(static_cast<uint64_t>(v.y) << 32) | v.x, (static_cast<uint64_t>(v.w) << 32) | v.z};
#else
  Vec16 v;
  if (weakMemory != nullptr && weakMemory->load16(p, &v)) return v;
  __builtin_memcpy(&v, p, 16);
  return v;
#endif
}
STRATA_HOST_DEVICE STRATA_DEVICE_INLINE void storeVec16(void* p, Vec16 v) {
#if defined(__CUDA_ARCH__)
  *static_cast<uint4*>(p) =
      make_uint4(static_cast<uint32_t>(v.lo), static_cast<uint32_t>(v.lo >> 32),
                 static_cast<uint32_t>(v.hi), static_cast<uint32_t>(v.hi >> 32));
#else
  if (weakMemory != nullptr && weakMemory->store16(p, &v)) return;
  __builtin_memcpy(p, &v, 16);
#endif
}

/// Nanoseconds of a clock that runs during a kernel (%globaltimer) or on the host (steady);
/// only differences mean anything.
STRATA_HOST_DEVICE STRATA_DEVICE_INLINE uint64_t nowNs() {
#if defined(__CUDA_ARCH__)
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
#else
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
#endif
}

/// A full fence for stores that must be visible to other processes before a later flag
/// (non-temporal stores on the host, system scope on the GPU).
STRATA_HOST_DEVICE STRATA_DEVICE_INLINE void fenceSystem() {
#if defined(__CUDA_ARCH__)
  __threadfence_system();
#else
  detail::weakRelease();
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  detail::weakAcquire();
#endif
}

/// One step of a spin loop: a pause instruction on x86, a short sleep on the GPU (sm_70+), so
/// a spinning warp leaves its issue slots to others.
STRATA_HOST_DEVICE STRATA_DEVICE_INLINE void spinPause() {
#if defined(__CUDA_ARCH__)
  __nanosleep(32);
#elif defined(__x86_64__)
  __builtin_ia32_pause();
#endif
}

/// Consumes one pending signal of a counter the peer raises (expected: the signals consumed so
/// far); never blocks. What MemoryChannel::poll and PortChannel::poll do.
STRATA_HOST_DEVICE STRATA_DEVICE_INLINE bool pollSignal(const uint64_t* inbound,
                                                        uint64_t& expected) {
  if (loadAcquire(inbound) > expected) {
    ++expected;
    return true;
  }
  return false;
}

/// Spins on pollSignal until a signal arrives; false after maxSpins polls (< 0: no limit).
STRATA_HOST_DEVICE STRATA_DEVICE_INLINE bool spinWaitSignal(const uint64_t* inbound,
                                                            uint64_t& expected, int64_t maxSpins) {
  for (int64_t i = 0; maxSpins < 0 || i < maxSpins; ++i) {
    if (pollSignal(inbound, expected)) return true;
    spinPause();
  }
  return false;
}

/// Copies bytes [begin, end) of a transfer split across numThreads cooperating threads, thread
/// threadId taking every numThreads-th 16-byte unit (coalesced on the GPU; on the host a
/// single thread passes 0, 1 and gets one memcpy-like loop). Unaligned heads and tails are
/// copied bytewise.
STRATA_HOST_DEVICE STRATA_DEVICE_INLINE void copySplit(void* dst, const void* src, size_t bytes,
                                                       uint32_t threadId, uint32_t numThreads) {
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
#if !defined(__CUDA_ARCH__)
  if (numThreads <= 1) {
    __builtin_memcpy(d, s, bytes);
    return;
  }
#endif
  // 16-byte units only when both sides share alignment.
  if (((reinterpret_cast<uintptr_t>(d) ^ reinterpret_cast<uintptr_t>(s)) & 15) == 0) {
    size_t head = (16 - (reinterpret_cast<uintptr_t>(d) & 15)) & 15;
    if (head > bytes) head = bytes;
    for (size_t i = threadId; i < head; i += numThreads) d[i] = s[i];
    size_t units = (bytes - head) / 16;
    struct alignas(16) U {
      uint64_t a, b;
    };
    auto* du = reinterpret_cast<U*>(d + head);
    const auto* su = reinterpret_cast<const U*>(s + head);
    for (size_t i = threadId; i < units; i += numThreads) du[i] = su[i];
    for (size_t i = head + units * 16 + threadId; i < bytes; i += numThreads) d[i] = s[i];
  } else {
    for (size_t i = threadId; i < bytes; i += numThreads) d[i] = s[i];
  }
}

}  // namespace strata::device
