#pragma once

// Channels: the handles that collectives (host threads now, CUDA kernels later) use to move data
// to a peer and signal it. They are plain structs whose methods are STRATA_HOST_DEVICE, so the
// same code compiles with g++ and nvcc.
//
// - MemoryChannel: direct loads and stores into a peer's buffer that is mapped into this process
//   (shm now, NVLink later), and a semaphore pair in mapped memory.
// - PortChannel: put/signal/flush requests pushed as triggers into a FIFO; a host proxy thread
//   (ProxyService) executes them on a Connection (fabric, or any transport).
//
// Semaphores are monotonic 64-bit counters: the signaller stores its running count into the
// peer's word (release), the waiter compares its word with the count it has consumed.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include <strata/device.hpp>
#include <strata/export.hpp>
#include <strata/memory.hpp>

namespace strata {

class Connection;

/// A one-directional data path plus a semaphore pair between this rank and one peer, over
/// memory that both processes map. The count of signals consumed lives in memory (expected), so
/// a handle passed by value to every kernel launch (or copied anywhere) keeps it; signals add
/// to the peer's counter, so the handle keeps no count of its own.
struct MemoryChannel {
  char* remote = nullptr;             ///< the peer's buffer, mapped here (destination of put)
  char* local = nullptr;              ///< this rank's buffer (source of put, destination of get)
  uint64_t* inbound = nullptr;        ///< this rank's counter, raised by the peer
  uint64_t* remoteInbound = nullptr;  ///< the peer's counter, mapped here
  uint64_t* expected = nullptr;  ///< signals consumed from inbound (device memory for a kernel)

  /// Copies bytes from local + srcOffset to remote + dstOffset; threadId of numThreads
  /// cooperating threads takes its share (numThreads = 1: one thread copies everything).
  STRATA_HOST_DEVICE void put(uint64_t dstOffset, uint64_t srcOffset, size_t bytes,
                              uint32_t threadId = 0, uint32_t numThreads = 1) const {
    device::copySplit(remote + dstOffset, local + srcOffset, bytes, threadId, numThreads);
  }
  /// put() from any address of this process.
  STRATA_HOST_DEVICE void putFrom(uint64_t dstOffset, const void* src, size_t bytes,
                                  uint32_t threadId = 0, uint32_t numThreads = 1) const {
    device::copySplit(remote + dstOffset, src, bytes, threadId, numThreads);
  }
  /// Copies bytes from remote + srcOffset to local + dstOffset.
  STRATA_HOST_DEVICE void get(uint64_t srcOffset, uint64_t dstOffset, size_t bytes,
                              uint32_t threadId = 0, uint32_t numThreads = 1) const {
    device::copySplit(local + dstOffset, remote + srcOffset, bytes, threadId, numThreads);
  }
  /// get() into any address of this process.
  STRATA_HOST_DEVICE void getTo(void* dst, uint64_t srcOffset, size_t bytes, uint32_t threadId = 0,
                                uint32_t numThreads = 1) const {
    device::copySplit(dst, remote + srcOffset, bytes, threadId, numThreads);
  }
  /// Raises the peer's counter after every earlier store of this thread (one thread signals,
  /// after the cooperating threads have synchronized).
  STRATA_HOST_DEVICE void signal() const {
    device::fenceSystem();  // memcpy may use non-temporal stores that release does not order
    device::redAddRelease(remoteInbound, 1);
  }
  /// Consumes one pending signal if there is one; never blocks.
  STRATA_HOST_DEVICE bool poll() const { return device::pollSignal(inbound, *expected); }
  /// Spins until a signal arrives (and consumes it); false after maxSpins polls (< 0: none).
  /// Host code waits with a deadline and a backoff instead (the host collectives engine).
  STRATA_HOST_DEVICE bool wait(int64_t maxSpins = -1) const {
    return device::spinWaitSignal(inbound, *expected, maxSpins);
  }
};

/// What a PortChannel asks the proxy to do. Invalid: a trigger whose fields did not fit a FIFO
/// entry (packTrigger); the proxy fails its channel with a clear error.
enum class TriggerType : uint32_t {
  Put = 1,
  Signal = 2,
  PutWithSignal = 3,
  Flush = 4,
  Invalid = 7
};

/// One request, as producers state it.
struct ProxyTrigger {
  uint64_t dstOffset = 0;
  uint64_t srcOffset = 0;
  uint64_t bytes = 0;
  uint32_t channel = 0;
  TriggerType type = TriggerType::Put;
};

/// The limits of a FIFO entry: offsets below 2^40 (1 TiB), sizes below 2^33 (8 GiB; the
/// blocking PortChannel puts split larger ones), channels below 1023 (1023 names none).
inline constexpr uint64_t kTriggerMaxOffset = (uint64_t{1} << 40) - 1;
inline constexpr uint64_t kTriggerMaxBytes = (uint64_t{1} << 33) - 1;
inline constexpr uint32_t kTriggerNoChannel = 1023;

/// A FIFO entry: a trigger in 16 bytes, published with one 16-byte store (MSCCL++'s layout:
/// a GPU pushes with one PCIe write, no atomic on host memory). Bit 63 of each half is set in
/// a published entry and the proxy zeroes an entry before its slot is reused, so a consumer
/// that sees only one half (a 16-byte store may reach host memory as two 8-byte writes) waits
/// for the other.
///   fst: valid(63) | bytes bits 0-22 (40-62) | srcOffset (0-39)
///   snd: valid(63) | bytes bits 23-32 (53-62) | type (50-52) | channel (40-49) | dstOffset (0-39)
struct alignas(16) PackedTrigger {
  uint64_t fst = 0;
  uint64_t snd = 0;
};

inline constexpr uint64_t kTriggerValid = uint64_t{1} << 63;

/// The entry for t; a trigger that does not fit the limits above (or has no known type)
/// becomes an Invalid one for the same channel (or for none).
STRATA_HOST_DEVICE STRATA_DEVICE_INLINE PackedTrigger packTrigger(const ProxyTrigger& t) {
  const uint32_t type = static_cast<uint32_t>(t.type);
  const bool knownType = type >= 1 && type <= 4;
  const bool fits = knownType && t.dstOffset <= kTriggerMaxOffset &&
                    t.srcOffset <= kTriggerMaxOffset && t.bytes <= kTriggerMaxBytes &&
                    t.channel < kTriggerNoChannel;
  const uint64_t channel = t.channel < kTriggerNoChannel ? t.channel : kTriggerNoChannel;
  const uint64_t bytes = fits ? t.bytes : 0;
  PackedTrigger p;
  p.fst = kTriggerValid | ((bytes & 0x7fffff) << 40) | (fits ? t.srcOffset : 0);
  p.snd = kTriggerValid | ((bytes >> 23) << 53) |
          (uint64_t{fits ? type : static_cast<uint32_t>(TriggerType::Invalid)} << 50) |
          (channel << 40) | (fits ? t.dstOffset : 0);
  return p;
}

/// Decodes a published entry; false while either half is not published.
STRATA_HOST_DEVICE STRATA_DEVICE_INLINE bool unpackTrigger(const PackedTrigger& p,
                                                           ProxyTrigger* t) {
  if ((p.fst & kTriggerValid) == 0 || (p.snd & kTriggerValid) == 0) return false;
  t->srcOffset = p.fst & kTriggerMaxOffset;
  t->dstOffset = p.snd & kTriggerMaxOffset;
  t->bytes = ((p.fst >> 40) & 0x7fffff) | (((p.snd >> 53) & 0x3ff) << 23);
  t->channel = static_cast<uint32_t>((p.snd >> 40) & 0x3ff);
  t->type = static_cast<TriggerType>((p.snd >> 50) & 0x7);
  return true;
}

/// Publishes an entry: every earlier store of this thread first (release, system scope), then
/// the 16 bytes (one v2.u64 store on the GPU: each half is one 8-byte access).
STRATA_HOST_DEVICE STRATA_DEVICE_INLINE void publishTrigger(PackedTrigger* slot,
                                                            const PackedTrigger& p) {
#if defined(__CUDA_ARCH__)
  asm volatile("fence.acq_rel.sys;\n\tst.relaxed.sys.global.v2.u64 [%0], {%1,%2};" ::"l"(slot),
               "l"(p.fst), "l"(p.snd)
               : "memory");
#else
  device::detail::weakRelease();
  __atomic_store_n(&slot->fst, p.fst, __ATOMIC_RELEASE);
  __atomic_store_n(&slot->snd, p.snd, __ATOMIC_RELEASE);
#endif
}

/// The producer side of the proxy FIFO: a bounded ring of 16-byte entries, many producers,
/// one consumer (the proxy). Producers reserve a slot by a compare-and-swap on head, which lives
/// in the producers' own memory: host memory for host threads (ProxyService::fifo()), device
/// memory for kernels (fifo(mappedBase, deviceWords)), so no atomic ever crosses PCIe (a GPU
/// atomic on host memory is not atomic with the CPU's on x86). The entries and tail are host
/// memory, mapped into the GPU for kernels; only the proxy writes tail. tailCache, next to
/// head, is the producers' copy of tail: they read host memory only when it says full.
/// Host threads and kernels push into two separate rings of one ProxyService.
struct FifoDeviceHandle {
  PackedTrigger* triggers = nullptr;
  uint64_t* head = nullptr;       ///< slots reserved (producers' memory)
  uint64_t* tailCache = nullptr;  ///< a copy of tail that may lag it (producers' memory)
  uint64_t* tail = nullptr;       ///< slots the proxy finished (host memory)
  uint32_t* wake = nullptr;       ///< futex word the proxy sleeps on (host producers wake it);
  uint32_t* sleeping = nullptr;   ///< both null in a kernel's handle
  uint32_t size = 0;

  /// Publishes a trigger unless the FIFO is full (back-pressure: false, nothing pushed). id gets
  /// the trigger's sequence number, for done() and sync().
  STRATA_HOST_DEVICE bool tryPush(const ProxyTrigger& trigger, uint64_t* id) {
    uint64_t h = device::loadAcquire(head);
    for (;;) {
      // h may be stale (the proxy may have consumed past it): only a current h is compared,
      // and a stale one fails the exchange below and is reloaded. Tails only grow, so a
      // stale tail (the cache) is only more careful.
      uint64_t t = device::loadRelaxed(tailCache);
      if (h < t || h - t >= size) {
        t = device::loadAcquire(tail);
        if (h >= t && h - t >= size) return false;
        device::storeWord(tailCache, t);
      }
#if defined(__CUDA_ARCH__)
      if (cuda::atomic_ref<uint64_t, cuda::thread_scope_system>(*head).compare_exchange_weak(
              h, h + 1, cuda::memory_order_acq_rel, cuda::memory_order_acquire))
        break;
#else
      if (__atomic_compare_exchange_n(head, &h, h + 1, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        break;
#endif
    }
    publishTrigger(&triggers[h % size], packTrigger(trigger));
#if !defined(__CUDA_ARCH__)
    wakeProxy();
#endif
    *id = h;
    return true;
  }
  /// True once the proxy has executed trigger id (for a Flush: the writes before it landed).
  STRATA_HOST_DEVICE bool done(uint64_t id) const {
    return device::loadAcquire(tail) > id;
  }
  /// Spins until done(id); false after maxSpins polls (< 0: no limit).
  STRATA_HOST_DEVICE bool sync(uint64_t id, int64_t maxSpins = -1) const {
    for (int64_t i = 0; maxSpins < 0 || i < maxSpins; ++i) {
      if (done(id)) return true;
      device::spinPause();
    }
    return false;
  }
#if !defined(__CUDA_ARCH__)
  /// Wakes the proxy thread if it sleeps (host producers; a kernel's handle has no futex and
  /// the proxy polls while device work is in flight).
  STRATA_API void wakeProxy() const noexcept;
#endif
};

/// Data path plus semaphore to one peer through the proxy: put, signal and flush become
/// triggers, executed in order by the ProxyService on the channel's Connection. The count of
/// signals consumed lives in memory (expected), so a handle passed by value to every launch
/// keeps it.
struct PortChannel {
  FifoDeviceHandle fifo;
  uint32_t channel = 0;
  uint64_t* inbound = nullptr;   ///< this rank's counter, raised by the peer's signals
  uint64_t* expected = nullptr;  ///< signals consumed from inbound (device memory for a kernel)

  /// Queues a write of bytes (at most kTriggerMaxBytes) from the channel's source memory +
  /// srcOffset to the peer's destination memory + dstOffset. False (nothing queued) when the
  /// FIFO is full.
  STRATA_HOST_DEVICE bool tryPut(uint64_t dstOffset, uint64_t srcOffset, uint64_t bytes,
                                 uint64_t* id) {
    return fifo.tryPush({dstOffset, srcOffset, bytes, channel, TriggerType::Put}, id);
  }
  /// Queues a signal that reaches the peer after every earlier put of this channel.
  STRATA_HOST_DEVICE bool trySignal(uint64_t* id) {
    return fifo.tryPush({0, 0, 0, channel, TriggerType::Signal}, id);
  }
  STRATA_HOST_DEVICE bool tryPutWithSignal(uint64_t dstOffset, uint64_t srcOffset, uint64_t bytes,
                                           uint64_t* id) {
    return fifo.tryPush({dstOffset, srcOffset, bytes, channel, TriggerType::PutWithSignal}, id);
  }
  /// Queues a flush; done(id) then means every earlier put has landed and its source may be
  /// reused.
  STRATA_HOST_DEVICE bool tryFlush(uint64_t* id) {
    return fifo.tryPush({0, 0, 0, channel, TriggerType::Flush}, id);
  }
  /// Blocking forms for device code: spin while the FIFO is full. Puts larger than one entry
  /// holds are split; the id is the last piece's.
  STRATA_HOST_DEVICE uint64_t put(uint64_t dstOffset, uint64_t srcOffset, uint64_t bytes) {
    return pushPieces(dstOffset, srcOffset, bytes, TriggerType::Put);
  }
  STRATA_HOST_DEVICE uint64_t signal() {
    uint64_t id = 0;
    while (!trySignal(&id)) device::spinPause();
    return id;
  }
  STRATA_HOST_DEVICE uint64_t putWithSignal(uint64_t dstOffset, uint64_t srcOffset,
                                            uint64_t bytes) {
    return pushPieces(dstOffset, srcOffset, bytes, TriggerType::PutWithSignal);
  }
  STRATA_HOST_DEVICE bool flush(int64_t maxSpins = -1) {
    uint64_t id = 0;
    while (!tryFlush(&id)) device::spinPause();
    return fifo.sync(id, maxSpins);
  }
  STRATA_HOST_DEVICE bool poll() { return device::pollSignal(inbound, *expected); }
  STRATA_HOST_DEVICE bool wait(int64_t maxSpins = -1) {
    return device::spinWaitSignal(inbound, *expected, maxSpins);
  }

 private:
  /// Pushes a put of any size as entries of at most kTriggerMaxBytes; with a signal, only the
  /// last piece carries it.
  STRATA_HOST_DEVICE uint64_t pushPieces(uint64_t dstOffset, uint64_t srcOffset, uint64_t bytes,
                                         TriggerType last) {
    uint64_t id = 0;
    for (;;) {
      const bool final = bytes <= kTriggerMaxBytes;
      const ProxyTrigger t{dstOffset, srcOffset, final ? bytes : kTriggerMaxBytes, channel,
                           final ? last : TriggerType::Put};
      while (!fifo.tryPush(t, &id)) device::spinPause();
      if (final) return id;
      dstOffset += kTriggerMaxBytes;
      srcOffset += kTriggerMaxBytes;
      bytes -= kTriggerMaxBytes;
    }
  }
};

/// The host proxy behind PortChannels: one thread, two bounded rings (host producers, kernels),
/// executing each ring's triggers in order on the channels' Connections. It sleeps when the FIFO is
/// empty (host producers wake it) and stops cleanly in stop() or the destructor. An error (Timeout,
/// PeerLost, ...) fails the Connection it happened on: later triggers of that Connection's channels
/// are consumed without effect (producers never block on a dead peer), the other Connections go on.
/// check() rethrows the first error of any channel, check(channel) only one that concerns that
/// channel. A trigger naming no channel stops every later trigger.
class STRATA_API ProxyService {
 public:
  /// fifoSize slots (a power of two is not required); timeoutSeconds bounds each flush.
  explicit ProxyService(uint32_t fifoSize = 1024, double timeoutSeconds = 30);
  ~ProxyService();
  ProxyService(const ProxyService&) = delete;
  ProxyService& operator=(const ProxyService&) = delete;

  /// A channel from src (local memory) to dst (a remote view from conn's peer); signals
  /// store a running count into the 8-byte word at peerFlags + flagOffset (a remote view).
  /// At most kTriggerNoChannel channels. May be called while the proxy runs (from any thread):
  /// the channel is usable once this returns.
  uint32_t addChannel(std::shared_ptr<Connection> conn, RegisteredMemory dst, RegisteredMemory src,
                      RegisteredMemory peerFlags, uint64_t flagOffset);
  /// The handle of a channel for host producers (fifo()). inbound is this rank's counter the
  /// peer raises, expected the word that counts the signals consumed from it: the caller sets
  /// it (0 for a fresh counter) and keeps both alive. A kernel's handle takes fifo(base, words)
  /// instead of this fifo, and expected in device memory.
  PortChannel portChannel(uint32_t channel, uint64_t* inbound, uint64_t* expected);
  /// The ring for host producers (its head and tail cache in this block).
  FifoDeviceHandle fifo() noexcept;
  /// The FIFO's memory: one page-aligned block holding the control words and both rings. A
  /// CUDA module registers it as pinned, mapped memory (cudaHostRegister with
  /// cudaHostRegisterMapped) so that kernels can push into it.
  std::span<std::byte> fifoMemory() noexcept;
  /// The ring for kernels, which see fifoMemory() at mappedBase (the device pointer of that
  /// mapping): its entries and tail there, its head and tail cache at producerWords, two
  /// 8-byte words in device memory that the module zeroed before the first push. Throws
  /// InvalidArgument for a null or misaligned producerWords.
  FifoDeviceHandle fifo(void* mappedBase, uint64_t* producerWords);
  /// Device work that may push into the FIFO is in flight from begin to end (counted; pair
  /// them). A kernel cannot wake the proxy, so meanwhile it polls (spins, then yields) for 2 ms
  /// after the last entry and then naps, 50 us at a time up to 20 ms idle, 200 us up to 200 ms,
  /// then 1 ms (a push after a pause waits at most one nap and the timer's slack); with no
  /// device work it sleeps when idle (1 ms at a time, or until a host producer wakes it).
  void beginDeviceWork() noexcept;
  void endDeviceWork() noexcept;
  /// Times the proxy went to sleep on an idle FIFO (diagnostics).
  uint64_t sleeps() const noexcept;
  /// Times it napped on an idle FIFO while device work was registered (diagnostics).
  uint64_t naps() const noexcept;
  /// Binds the proxy thread to these CPUs when it starts (Context::proxyCpus; those outside
  /// the process's mask are left out, and none inside binds nothing, with a warning). Call
  /// before start(); empty: unbound.
  void pinTo(std::vector<int> cpus);
  void start();
  /// Executes what is queued, then stops the thread. Idempotent; never throws.
  void stop() noexcept;
  /// Rethrows the proxy's first error, if any.
  void check() const;
  /// Rethrows the error that failed this channel's Connection (or every channel), if any.
  void check(uint32_t channel) const;
  /// Triggers executed so far (diagnostics).
  uint64_t executed() const noexcept;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata
