#pragma once

// Device-ready channels: the handles the CUDA collectives' kernels use (and, through the same
// code, host threads in the cuda-emu suite). See docs/collectives-cuda.md.
//
// - DeviceSemaphore: a semaphore whose state lives in memory. The peer raises this rank's inbound
//   counter; the count this rank has consumed lives in `expected`, a word in device (or mapped)
//   memory, so a handle passed by value to every launch keeps its count across launches and CUDA
//   graph replays.
// - LL8Packet / LL16Packet: data and a 32-bit flag in one 8-byte word (LL8: 4 data bytes) or in
//   each half of a 16-byte word (LL16: 8 data bytes). A reader spins until the flag it expects
//   appears; 8-byte store atomicity is the only ordering needed, so packets need no fence and no
//   semaphore.
// - Flags: EpochFlag turns a 64-bit epoch (advanced inside the kernel, one per block) into the
//   packet flag and the parity of the double-buffered packet scratch.
// - AbortRecord: what a kernel writes when a bounded spin expires; the host reads it.
// - DeviceChannel: the peer's memory mapped here, the packet buffers both ways and a semaphore.

#include <cstddef>
#include <cstdint>

#include <strata/device.hpp>

namespace strata::device {

/// A semaphore with its consumed count in memory (one per block and peer where blocks work
/// independently).
struct DeviceSemaphore {
  uint64_t* inbound = nullptr;        ///< this rank's counter, raised by the peer
  uint64_t* remoteInbound = nullptr;  ///< the peer's counter, mapped here
  uint64_t* expected = nullptr;       ///< signals consumed from inbound (device memory)

  /// Raises the peer's counter after every earlier store of this thread (and, after a block
  /// barrier, of the block): one release reduction at system scope.
  STRATA_HOST_DEVICE STRATA_DEVICE_INLINE void signal() const { redAddRelease(remoteInbound, 1); }
  /// For barriers whose data is ordered otherwise.
  STRATA_HOST_DEVICE STRATA_DEVICE_INLINE void relaxedSignal() const {
    redAddRelaxed(remoteInbound, 1);
  }
  /// Claims the next signal: the count wait() must see. Call once per wait, from one thread.
  STRATA_HOST_DEVICE STRATA_DEVICE_INLINE uint64_t next() const { return ++*expected; }
  /// True once the signal numbered `target` has arrived (acquire: the peer's data is visible).
  STRATA_HOST_DEVICE STRATA_DEVICE_INLINE bool arrived(uint64_t target) const {
    return loadAcquire(inbound) >= target;
  }
  STRATA_HOST_DEVICE STRATA_DEVICE_INLINE bool relaxedArrived(uint64_t target) const {
    return loadRelaxed(inbound) >= target;
  }
  /// Spins until the next signal arrives; false after maxSpins polls (< 0: no limit). The
  /// count is consumed either way (a failed wait leaves the semaphore out of step: the caller
  /// must abort).
  STRATA_HOST_DEVICE STRATA_DEVICE_INLINE bool wait(int64_t maxSpins = -1) const {
    const uint64_t target = next();
    for (int64_t i = 0; maxSpins < 0 || i < maxSpins; ++i) {
      if (arrived(target)) return true;
      spinPause();
    }
    return false;
  }
};

/// The flag and scratch parity of one launch, from the block's 64-bit epoch. The flag is never
/// 0 (zeroed scratch never looks written) and two epochs of the same parity in a row never share
/// a flag, across the 32-bit wrap too (the epoch itself does not wrap).
struct EpochFlag {
  uint32_t flag = 1;
  uint32_t parity = 0;
  STRATA_HOST_DEVICE STRATA_DEVICE_INLINE static EpochFlag of(uint64_t epoch) {
    EpochFlag f;
    f.flag = static_cast<uint32_t>(epoch % 0xffffffffull) + 1u;
    f.parity = static_cast<uint32_t>(epoch & 1u);
    return f;
  }
};

/// LL8: 4 data bytes and a 4-byte flag in one 8-byte word.
struct alignas(8) LL8Packet {
  uint64_t word;

  STRATA_HOST_DEVICE STRATA_DEVICE_INLINE void write(uint32_t data, uint32_t flag) {
    storeWord(&word, (static_cast<uint64_t>(flag) << 32) | data);
  }
  /// One poll: true (and data) when the packet carries flag.
  STRATA_HOST_DEVICE STRATA_DEVICE_INLINE bool tryRead(uint32_t flag, uint32_t& data) const {
    uint64_t w = loadWord(&word);
    if (static_cast<uint32_t>(w >> 32) != flag) return false;
    data = static_cast<uint32_t>(w);
    return true;
  }
};

/// LL16: two halves of 4 data bytes and a 4-byte flag, written with one 16-byte store.
struct alignas(16) LL16Packet {
  uint64_t words[2];

  /// data: 8 bytes, low 4 in the first half.
  STRATA_HOST_DEVICE STRATA_DEVICE_INLINE void write(uint64_t data, uint32_t flag) {
    const uint64_t f = static_cast<uint64_t>(flag) << 32;
    storeWordPair(words, f | (data & 0xffffffffull), f | (data >> 32));
  }
  STRATA_HOST_DEVICE STRATA_DEVICE_INLINE bool tryRead(uint32_t flag, uint64_t& data) const {
    uint64_t lo, hi;
    loadWordPair(words, lo, hi);
    if (static_cast<uint32_t>(lo >> 32) != flag || static_cast<uint32_t>(hi >> 32) != flag) {
      return false;
    }
    data = (lo & 0xffffffffull) | (hi << 32);
    return true;
  }
};

/// Data bytes a packet carries.
template <class Packet>
constexpr size_t kPacketPayload = sizeof(Packet) / 2;

/// Spins on packet `index` until it carries flag; false after maxSpins polls (< 0: no limit).
template <class Packet, class Data>
STRATA_HOST_DEVICE STRATA_DEVICE_INLINE bool readPacket(const Packet* packets, size_t index,
                                                        uint32_t flag, int64_t maxSpins,
                                                        Data& data) {
  for (int64_t i = 0; maxSpins < 0 || i < maxSpins; ++i) {
    if (packets[index].tryRead(flag, data)) return true;
    spinPause();
  }
  return false;
}

/// Writes bytes of src (a multiple of 8, 8-byte aligned) as packets with flag into dst,
/// threadId of numThreads cooperating threads taking every numThreads-th packet.
template <class Packet>
STRATA_HOST_DEVICE STRATA_DEVICE_INLINE void putPackets(Packet* dst, const void* src, size_t bytes,
                                                        uint32_t flag, uint32_t threadId,
                                                        uint32_t numThreads) {
  constexpr size_t kPayload = kPacketPayload<Packet>;
  const size_t n = bytes / kPayload;
  for (size_t i = threadId; i < n; i += numThreads) {
    if constexpr (kPayload == 4) {
      dst[i].write(static_cast<const uint32_t*>(src)[i], flag);
    } else {
      dst[i].write(static_cast<const uint64_t*>(src)[i], flag);
    }
  }
}

/// Reads the packets putPackets wrote into dst; false when one did not arrive within maxSpins
/// polls (the rest of this thread's share is then left unread).
template <class Packet>
STRATA_HOST_DEVICE STRATA_DEVICE_INLINE bool unpackPackets(void* dst, const Packet* src,
                                                           size_t bytes, uint32_t flag,
                                                           uint32_t threadId, uint32_t numThreads,
                                                           int64_t maxSpins) {
  constexpr size_t kPayload = kPacketPayload<Packet>;
  const size_t n = bytes / kPayload;
  for (size_t i = threadId; i < n; i += numThreads) {
    if constexpr (kPayload == 4) {
      uint32_t v;
      if (!readPacket(src, i, flag, maxSpins, v)) return false;
      static_cast<uint32_t*>(dst)[i] = v;
    } else {
      uint64_t v;
      if (!readPacket(src, i, flag, maxSpins, v)) return false;
      static_cast<uint64_t*>(dst)[i] = v;
    }
  }
  return true;
}

/// What a kernel reports when it gives up, in mapped host memory (the host reads it while the
/// kernel may still run). The first reporter wins a claim word that lives in device memory (GPU
/// atomics on mapped host memory are not atomic over PCIe); it stores the fields, then the code
/// (release), so a host that sees the code sees the fields.
struct AbortRecord {
  /// Timeout: a wait saw no progress for the wait limit. Stopped: the host set the stop word
  /// (a peer was lost, the communicator aborted or destroyed), and this wait gave up.
  enum Code : uint32_t { None = 0, Timeout = 1, Stopped = 2 };
  uint64_t code;  ///< Code, stored last
  int64_t block;  ///< the block that gave up
  /// the peer it waited for: its index among the ranks of this host, or, for the cross-host
  /// network step, -1 - its rank (a rank on another host)
  int64_t peer;
  uint64_t expected;  ///< the flag or count it waited for
  uint64_t seen;      ///< what it saw last

  /// Records a timeout unless another thread already claimed the record (claim: a device-memory
  /// word, 0 until the first report).
  STRATA_HOST_DEVICE STRATA_DEVICE_INLINE void report(uint64_t* claim, uint32_t what, int64_t blk,
                                                      int64_t who, uint64_t want, uint64_t got) {
    if (fetchAdd(claim, 1) != 0) return;
    block = blk;
    peer = who;
    expected = want;
    seen = got;
    storeRelease(&code, what);
  }
  /// True once some thread claimed the record (cheap enough to poll every few hundred spins).
  STRATA_HOST_DEVICE STRATA_DEVICE_INLINE static bool raised(const uint64_t* claim) {
    return loadRelaxed(claim) != 0;
  }
};

/// A peer as one block of a kernel sees it: the peer's memory mapped here, the packet buffers
/// both ways, and a semaphore.
struct DeviceChannel {
  char* remote = nullptr;              ///< the peer's memory (its scratch), mapped here
  void* remotePackets = nullptr;       ///< where this rank writes packets for the peer
  const void* localPackets = nullptr;  ///< where the peer writes packets for this rank
  DeviceSemaphore semaphore;

  /// Element access to the peer's memory, 16-byte vectors where T is.
  template <class T>
  STRATA_HOST_DEVICE STRATA_DEVICE_INLINE T read(size_t index) const {
    return reinterpret_cast<const T*>(remote)[index];
  }
  template <class T>
  STRATA_HOST_DEVICE STRATA_DEVICE_INLINE void write(size_t index, const T& value) const {
    reinterpret_cast<T*>(remote)[index] = value;
  }
  STRATA_HOST_DEVICE STRATA_DEVICE_INLINE Vec16 readVec(size_t byteOffset) const {
    return loadVec16(remote + byteOffset);
  }
  STRATA_HOST_DEVICE STRATA_DEVICE_INLINE void writeVec(size_t byteOffset, Vec16 v) const {
    storeVec16(remote + byteOffset, v);
  }
  template <class Packet>
  STRATA_HOST_DEVICE STRATA_DEVICE_INLINE void putPackets(size_t packetOffset, const void* src,
                                                          size_t bytes, uint32_t flag,
                                                          uint32_t threadId,
                                                          uint32_t numThreads) const {
    device::putPackets(static_cast<Packet*>(remotePackets) + packetOffset, src, bytes, flag,
                       threadId, numThreads);
  }
  template <class Packet, class Data>
  STRATA_HOST_DEVICE STRATA_DEVICE_INLINE bool readPacket(size_t index, uint32_t flag,
                                                          int64_t maxSpins, Data& data) const {
    return device::readPacket(static_cast<const Packet*>(localPackets), index, flag, maxSpins,
                              data);
  }
  template <class Packet>
  STRATA_HOST_DEVICE STRATA_DEVICE_INLINE bool unpackPackets(void* dst, size_t packetOffset,
                                                             size_t bytes, uint32_t flag,
                                                             uint32_t threadId, uint32_t numThreads,
                                                             int64_t maxSpins) const {
    return device::unpackPackets(dst, static_cast<const Packet*>(localPackets) + packetOffset,
                                 bytes, flag, threadId, numThreads, maxSpins);
  }
};

}  // namespace strata::device
