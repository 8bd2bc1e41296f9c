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

#include <strata/device.hpp>
#include <strata/export.hpp>
#include <strata/memory.hpp>

namespace strata {

class Connection;

/// A one-directional data path plus a semaphore pair between this rank and one peer, over
/// memory that both processes map.
struct MemoryChannel {
  char* remote = nullptr;             ///< the peer's buffer, mapped here (destination of put)
  char* local = nullptr;              ///< this rank's buffer (source of put, destination of get)
  uint64_t* inbound = nullptr;        ///< this rank's counter, raised by the peer
  uint64_t* remoteInbound = nullptr;  ///< the peer's counter, mapped here
  uint64_t expected = 0;              ///< signals consumed from inbound
  uint64_t outbound = 0;              ///< signals sent to the peer

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
  STRATA_HOST_DEVICE void signal() {
    device::fenceSystem();  // memcpy may use non-temporal stores that release does not order
    device::storeRelease(remoteInbound, ++outbound);
  }
  /// Consumes one pending signal if there is one; never blocks.
  STRATA_HOST_DEVICE bool poll() { return device::pollSignal(inbound, expected); }
  /// Spins until a signal arrives (and consumes it); false after maxSpins polls (< 0: none).
  /// Host code waits with a deadline and a backoff instead (the host collectives engine).
  STRATA_HOST_DEVICE bool wait(int64_t maxSpins = -1) {
    return device::spinWaitSignal(inbound, expected, maxSpins);
  }
};

/// What a PortChannel asks the proxy to do.
enum class TriggerType : uint32_t { Put = 1, Signal = 2, PutWithSignal = 3, Flush = 4 };

/// One FIFO request: 32 bytes, written by the producer before it publishes the slot.
struct ProxyTrigger {
  uint64_t dstOffset = 0;
  uint64_t srcOffset = 0;
  uint64_t bytes = 0;
  uint32_t channel = 0;
  TriggerType type = TriggerType::Put;
};

/// A FIFO slot: the trigger and its sequence word (id + 1 once published).
struct alignas(64) FifoSlot {
  ProxyTrigger trigger;
  uint64_t seq = 0;
};

/// The producer side of the proxy FIFO: a bounded ring of slots, many producers, one consumer.
/// head counts reserved slots, tail counts slots the proxy finished.
struct FifoDeviceHandle {
  FifoSlot* slots = nullptr;
  uint64_t* head = nullptr;
  uint64_t* tail = nullptr;
  uint32_t* wake = nullptr;  ///< futex word the proxy sleeps on (host producers wake it)
  uint32_t* sleeping = nullptr;
  uint32_t size = 0;

  /// Publishes a trigger unless the FIFO is full (back-pressure: false, nothing pushed). id gets
  /// the trigger's sequence number, for done() and sync().
  STRATA_HOST_DEVICE bool tryPush(const ProxyTrigger& trigger, uint64_t* id) {
    uint64_t h = device::loadAcquire(head);
    for (;;) {
      // h may be stale (the proxy may have consumed past it): only a current h is compared,
      // and a stale one fails the exchange below and is reloaded.
      uint64_t t = device::loadAcquire(tail);
      if (h >= t && h - t >= size) return false;
#if defined(__CUDA_ARCH__)
      // System scope: host threads may push into the same FIFO.
      if (cuda::atomic_ref<uint64_t, cuda::thread_scope_system>(*head).compare_exchange_weak(
              h, h + 1, cuda::memory_order_acq_rel, cuda::memory_order_acquire))
        break;
#else
      if (__atomic_compare_exchange_n(head, &h, h + 1, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        break;
#endif
    }
    FifoSlot& slot = slots[h % size];
    slot.trigger = trigger;
    device::storeRelease(&slot.seq, h + 1);
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
  /// Wakes the proxy thread if it sleeps (host producers; a GPU producer is polled).
  STRATA_API void wakeProxy() const noexcept;
#endif
};

/// Data path plus semaphore to one peer through the proxy: put, signal and flush become
/// triggers, executed in order by the ProxyService on the channel's Connection.
struct PortChannel {
  FifoDeviceHandle fifo;
  uint32_t channel = 0;
  uint64_t* inbound = nullptr;  ///< this rank's counter, raised by the peer's signals
  uint64_t expected = 0;

  /// Queues a write of bytes from the channel's source memory + srcOffset to the peer's
  /// destination memory + dstOffset. False (nothing queued) when the FIFO is full.
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
  /// Blocking forms for device code: spin while the FIFO is full.
  STRATA_HOST_DEVICE uint64_t put(uint64_t dstOffset, uint64_t srcOffset, uint64_t bytes) {
    uint64_t id = 0;
    while (!tryPut(dstOffset, srcOffset, bytes, &id)) device::spinPause();
    return id;
  }
  STRATA_HOST_DEVICE uint64_t signal() {
    uint64_t id = 0;
    while (!trySignal(&id)) device::spinPause();
    return id;
  }
  STRATA_HOST_DEVICE uint64_t putWithSignal(uint64_t dstOffset, uint64_t srcOffset,
                                            uint64_t bytes) {
    uint64_t id = 0;
    while (!tryPutWithSignal(dstOffset, srcOffset, bytes, &id)) device::spinPause();
    return id;
  }
  STRATA_HOST_DEVICE bool flush(int64_t maxSpins = -1) {
    uint64_t id = 0;
    while (!tryFlush(&id)) device::spinPause();
    return fifo.sync(id, maxSpins);
  }
  STRATA_HOST_DEVICE bool poll() { return device::pollSignal(inbound, expected); }
  STRATA_HOST_DEVICE bool wait(int64_t maxSpins = -1) {
    return device::spinWaitSignal(inbound, expected, maxSpins);
  }
};

/// The host proxy behind PortChannels: one thread, one bounded FIFO, executing triggers in
/// order on the channels' Connections. It sleeps when the FIFO is empty (host producers wake
/// it) and stops cleanly in stop() or the destructor. An error (Timeout, PeerLost, ...) fails
/// the Connection it happened on: later triggers of that Connection's channels are consumed
/// without effect (producers never block on a dead peer), the other Connections go on.
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
  /// Call before start().
  uint32_t addChannel(std::shared_ptr<Connection> conn, RegisteredMemory dst, RegisteredMemory src,
                      RegisteredMemory peerFlags, uint64_t flagOffset);
  /// The device handle of a channel; inbound is this rank's counter the peer raises.
  PortChannel portChannel(uint32_t channel, uint64_t* inbound);
  FifoDeviceHandle fifo() noexcept;
  /// The FIFO's memory: one page-aligned block holding its control words and slots. A CUDA
  /// module registers it as pinned, mapped memory (cudaHostRegister with
  /// cudaHostRegisterMapped) so that kernels can push into it.
  std::span<std::byte> fifoMemory() noexcept;
  /// The FIFO's handle for a producer that sees fifoMemory() at mappedBase (a kernel: the
  /// device pointer of that mapping).
  FifoDeviceHandle fifo(void* mappedBase) noexcept;
  /// Device work that may push into the FIFO is in flight from begin to end (counted; pair
  /// them). A kernel cannot wake the proxy, so meanwhile it polls (spins, then yields) instead
  /// of sleeping; with no device work it sleeps when idle, as before.
  void beginDeviceWork() noexcept;
  void endDeviceWork() noexcept;
  /// Times the proxy went to sleep on an idle FIFO (diagnostics).
  uint64_t sleeps() const noexcept;
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
