#pragma once

// Building blocks shared by host threads (g++) and CUDA kernels (nvcc): the STRATA_HOST_DEVICE
// marker, system-scope atomics on 64-bit words and a spin pause.

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
#endif

namespace strata::device {

/// Acquire load of a word another process (or the GPU, or the NIC) writes.
STRATA_HOST_DEVICE STRATA_DEVICE_INLINE uint64_t loadAcquire(const uint64_t* word) {
#if defined(__CUDA_ARCH__)
  return cuda::atomic_ref<uint64_t, cuda::thread_scope_system>(*const_cast<uint64_t*>(word))
      .load(cuda::memory_order_acquire);
#else
  return __atomic_load_n(word, __ATOMIC_ACQUIRE);
#endif
}

/// Release store: every earlier store of this thread is visible before the word changes.
STRATA_HOST_DEVICE STRATA_DEVICE_INLINE void storeRelease(uint64_t* word, uint64_t value) {
#if defined(__CUDA_ARCH__)
  cuda::atomic_ref<uint64_t, cuda::thread_scope_system>(*word).store(value,
                                                                     cuda::memory_order_release);
#else
  __atomic_store_n(word, value, __ATOMIC_RELEASE);
#endif
}

STRATA_HOST_DEVICE STRATA_DEVICE_INLINE uint64_t fetchAdd(uint64_t* word, uint64_t value) {
#if defined(__CUDA_ARCH__)
  return cuda::atomic_ref<uint64_t, cuda::thread_scope_system>(*word).fetch_add(
      value, cuda::memory_order_acq_rel);
#else
  return __atomic_fetch_add(word, value, __ATOMIC_ACQ_REL);
#endif
}

/// A full fence for stores that must be visible to other processes before a later flag
/// (non-temporal stores on the host, system scope on the GPU).
STRATA_HOST_DEVICE STRATA_DEVICE_INLINE void fenceSystem() {
#if defined(__CUDA_ARCH__)
  __threadfence_system();
#else
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
#endif
}

/// One step of a spin loop: a pause instruction on x86, nothing elsewhere.
STRATA_HOST_DEVICE STRATA_DEVICE_INLINE void spinPause() {
#if !defined(__CUDA_ARCH__) && defined(__x86_64__)
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
