#pragma once

// What every CUDA collectives kernel shares: the arguments a launch gets by value, the layout of
// the scratch buffer each rank exposes to its peers, the element arithmetic (every type, every
// op, folded in rank order), and the bounded waits that report to the abort record.
//
// Kernel bodies are templates over a thread context Ctx with:
//   uint32_t thread(), threads(), block(), blocks();  // CUDA's threadIdx.x, blockDim.x, ...
//   void sync();                                      // __syncthreads()
//   bool syncAnd(bool);                               // __syncthreads_and()
//   void spin(uint32_t polls);                        // one step of a wait loop (polls so far)
// so the same code runs as CUDA kernels (context.cuh) and in host threads (tests/cuda-emu).
// Everything that crosses threads goes through <strata/device.hpp>'s leaf primitives, which
// have host twins.

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include <strata/device.hpp>
#include <strata/device_channel.hpp>

#include "base/float16.hpp"
#include "net_args.hpp"

#if defined(__CUDA_ARCH__)
#define STRATA_UNROLL _Pragma("unroll")
#else
#define STRATA_UNROLL
#endif

namespace strata::cuda {

using device::AbortRecord;
using device::EpochFlag;

/// Ranks of one host a kernel serves, and blocks a launch may use (sizes of the state arrays).
constexpr int kMaxRanks = 8;
constexpr int kMaxBlocks = 32;
/// Calls the stall monitor remembers per rank (KernelArgs::started, LaunchBoard).
constexpr uint64_t kCallSlots = 64;
/// Threads per block at most (the kernels' register budget: __launch_bounds__).
constexpr int kMaxThreads = 512;

/// Per-block state in this rank's device memory; it survives launches and graph replays.
struct BlockState {
  uint64_t epoch;                ///< launches of packet kernels so far (the flag source)
  uint64_t expected[kMaxRanks];  ///< collective semaphore counts consumed, per peer
  /// Send/recv, apart from the collectives and per direction (send and recv of one pair may run
  /// at once on two streams): chunks this block staged for each peer, and chunks it consumed
  /// from each peer's P2P slot.
  uint64_t p2pSent[kMaxRanks];
  uint64_t p2pReceived[kMaxRanks];
};

/// This rank's device state: the blocks' state and the abort record's claim word.
struct RankState {
  BlockState blocks[kMaxBlocks];
  uint64_t abortClaim;
};

/// Element types, as the module dispatches them (DataType order).
enum class ElemType : int32_t {
  Int8,
  Uint8,
  Int32,
  Uint32,
  Int64,
  Uint64,
  Half,
  BFloat16,
  Float,
  Double
};
/// Reductions (ReduceOp order).
enum class RedOp : int32_t { Sum, Prod, Min, Max, Avg };

/// The scratch buffer of one rank, as offsets (the same on every rank):
///   [semaphores: kMaxBlocks x kMaxRanks counters, raised by peers]
///   [presence: 2 parities x kMaxBlocks x kMaxRanks LL8 packets (broadcast)]
///   [P2P ready: kMaxBlocks x kMaxRanks counters: chunks each peer staged for this rank]
///   [P2P read: kMaxBlocks x kMaxRanks counters: chunks each peer read from this rank]
///   [packets: 2 parities x packetHalf bytes]   (double buffered by flag parity)
///   [staging: staging bytes]                  (direct algorithms, ready/done handshakes)
///   [P2P slots: p2pPeers x p2pPeer bytes]      (slot q: what this rank sends to rank q, cut into
///                                               kMaxBlocks fixed per-block parts)
struct ScratchLayout {
  static constexpr uint64_t kSemaphores = 0;
  static constexpr uint64_t kAcks = kSemaphores + kMaxBlocks * kMaxRanks * 8;
  static constexpr uint64_t kP2pReady = kAcks + 2 * kMaxBlocks * kMaxRanks * 8;
  static constexpr uint64_t kP2pRead = kP2pReady + kMaxBlocks * kMaxRanks * 8;
  static constexpr uint64_t kPackets = kP2pRead + kMaxBlocks * kMaxRanks * 8;
  uint64_t packetHalf = 0;  ///< bytes per parity; a multiple of 256
  uint64_t staging = 0;     ///< bytes; a multiple of 256
  uint64_t p2pPeer = 0;     ///< bytes of one peer's P2P slot; a multiple of 16 x kMaxBlocks
  uint64_t p2pPeers = 0;    ///< P2P slots (the ranks)

  STRATA_HOST_DEVICE uint64_t stagingOffset() const { return kPackets + 2 * packetHalf; }
  STRATA_HOST_DEVICE uint64_t p2pOffset() const { return stagingOffset() + staging; }
  /// Block `block`'s part of the slot for peer (its own region in every call, whatever the
  /// grid: a block waits only for its own part's reader).
  STRATA_HOST_DEVICE uint64_t p2pPart(int peer, uint32_t block) const {
    return p2pOffset() + static_cast<uint64_t>(peer) * p2pPeer + block * p2pPartBytes();
  }
  STRATA_HOST_DEVICE uint64_t p2pPartBytes() const { return p2pPeer / kMaxBlocks; }
  STRATA_HOST_DEVICE uint64_t total() const { return p2pOffset() + p2pPeers * p2pPeer; }
  /// Bytes of one peer's packet slot: a parity half holds two areas of nranks slots.
  STRATA_HOST_DEVICE uint64_t slotBytes(int nranks) const {
    return (packetHalf / (2 * static_cast<uint64_t>(nranks))) & ~uint64_t{15};
  }
  STRATA_HOST_DEVICE static constexpr uint64_t alignUp(uint64_t v, uint64_t a) {
    return (v + a - 1) / a * a;
  }
};

/// Everything a launch needs, passed by value (__grid_constant__ on the GPU). Nothing in it
/// changes between graph replays: counts and flags live in BlockState and the scratch.
struct KernelArgs {
  int32_t rank = 0;
  int32_t nranks = 1;
  int32_t peer = -1;  ///< broadcast root, send/recv peer
  RedOp op = RedOp::Sum;
  const void* send = nullptr;
  void* recv = nullptr;
  uint64_t count = 0;              ///< elements, as the request counts them
  uint64_t elemSize = 1;           ///< bytes per element
  char* scratch[kMaxRanks] = {};   ///< every rank's scratch, mapped here ([rank]: this rank's)
  BlockState* state = nullptr;     ///< this rank's, kMaxBlocks entries
  AbortRecord* abort = nullptr;    ///< mapped host memory
  uint64_t* abortClaim = nullptr;  ///< device memory: who reported first
  uint64_t timeoutNs = 0;          ///< a wait gives up after this long without progress (0: never)
  /// Mapped host memory the host sets to non-zero to stop every wait of this rank's kernels (a
  /// peer lost, the communicator aborted or destroyed); null: no host stop.
  const uint64_t* stop = nullptr;
  /// Mapped host memory of kCallSlots words: block 0's thread 0 stores `call` at
  /// [call % kCallSlots] when the kernel begins (the stall monitor, stall.hpp); null: not
  /// tracked (send/recv).
  uint64_t* started = nullptr;
  uint64_t call = 0;
  ScratchLayout layout;
  NetArgs net;  ///< the cross-host network step (NetReduce, NetGather)
  /// Where local rank q's block sits, in blocks of bytes(): in send (reduceScatter's input,
  /// allToAll's blocks for q) at sendAt[q], in recv (allGather's and allToAll's output) at
  /// recvAt[q]; block q when !placed. The cross-host plans set them where a host's ranks are
  /// not consecutive ranks of the caller's buffers (net_plan.hpp).
  bool placed = false;
  int16_t sendAt[kMaxRanks] = {};
  int16_t recvAt[kMaxRanks] = {};

  STRATA_HOST_DEVICE uint64_t bytes() const { return count * elemSize; }
  STRATA_HOST_DEVICE uint64_t sendBlock(int q) const {
    return static_cast<uint64_t>(placed ? sendAt[q] : q) * bytes();
  }
  STRATA_HOST_DEVICE uint64_t recvBlock(int q) const {
    return static_cast<uint64_t>(placed ? recvAt[q] : q) * bytes();
  }
};
// Passed by value as a kernel parameter (__grid_constant__): within CUDA's 4 KiB for any GPU.
static_assert(sizeof(KernelArgs) <= 4096, "KernelArgs is a kernel parameter");

// ---- element arithmetic -----------------------------------------------------------------

struct Half {
  uint16_t bits;
};
struct BFloat16 {
  uint16_t bits;
};

using collectives::bf16ToFloat;
using collectives::floatToBf16;
using collectives::floatToHalf;
using collectives::halfToFloat;

/// The accumulator of an element type: fp32 for the 16-bit floats, the type itself otherwise.
template <class T>
struct Arith {
  using Acc = T;
  STRATA_HOST_DEVICE static Acc load(T v) { return v; }
  STRATA_HOST_DEVICE static T store(Acc a) { return a; }
};
template <>
struct Arith<Half> {
  using Acc = float;
  STRATA_HOST_DEVICE static Acc load(Half v) { return halfToFloat(v.bits); }
  STRATA_HOST_DEVICE static Half store(Acc a) { return Half{floatToHalf(a)}; }
};
template <>
struct Arith<BFloat16> {
  using Acc = float;
  STRATA_HOST_DEVICE static Acc load(BFloat16 v) { return bf16ToFloat(v.bits); }
  STRATA_HOST_DEVICE static BFloat16 store(Acc a) { return BFloat16{floatToBf16(a)}; }
};

/// a op b; integers wrap (computed unsigned), floats in the accumulator type; float min and max
/// propagate NaN (the host backend's rule).
template <class A>
STRATA_HOST_DEVICE STRATA_DEVICE_INLINE A combine(RedOp op, A a, A b) {
  if constexpr (std::is_integral_v<A>) {
    using U = std::make_unsigned_t<A>;
    switch (op) {
      case RedOp::Prod:
        return static_cast<A>(static_cast<U>(a) * static_cast<U>(b));
      case RedOp::Min:
        return b < a ? b : a;
      case RedOp::Max:
        return a < b ? b : a;
      default:  // Sum, Avg
        return static_cast<A>(static_cast<U>(a) + static_cast<U>(b));
    }
  } else {
    switch (op) {
      case RedOp::Prod:
        return a * b;
      case RedOp::Min:  // NaN propagates, as in the host backend (collectives/host/reduce.hpp)
        return (b < a || b != b) ? b : a;
      case RedOp::Max:
        return (b > a || b != b) ? b : a;
      default:
        return a + b;
    }
  }
}

/// The elements of one 8-byte word, folded over ranks in rank order.
template <class T>
struct WordFold {
  static_assert(8 % sizeof(T) == 0);
  static constexpr int kLanes = 8 / sizeof(T);
  using Acc = typename Arith<T>::Acc;
  Acc acc[kLanes] = {};

  STRATA_HOST_DEVICE STRATA_DEVICE_INLINE void init(uint64_t word) {
    STRATA_UNROLL
    for (int i = 0; i < kLanes; ++i) acc[i] = Arith<T>::load(lane(word, i));
  }
  STRATA_HOST_DEVICE STRATA_DEVICE_INLINE void add(RedOp op, uint64_t word) {
    STRATA_UNROLL
    for (int i = 0; i < kLanes; ++i) acc[i] = combine(op, acc[i], Arith<T>::load(lane(word, i)));
  }
  /// The result word (Avg: the sum divided by nranks, truncating for integers).
  STRATA_HOST_DEVICE STRATA_DEVICE_INLINE uint64_t finish(RedOp op, int nranks) const {
    uint64_t word = 0;
    STRATA_UNROLL
    for (int i = 0; i < kLanes; ++i) {
      Acc a = acc[i];
      if (op == RedOp::Avg) a = static_cast<Acc>(a / static_cast<Acc>(nranks));
      word |= bitsOf(Arith<T>::store(a)) << (8 * sizeof(T) * i);
    }
    return word;
  }

 private:
  // Lanes by shifts, not through a byte array: an array would live in local memory on the GPU.
  using Bits = std::conditional_t<
      sizeof(T) == 1, uint8_t,
      std::conditional_t<sizeof(T) == 2, uint16_t,
                         std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>>>;
  STRATA_HOST_DEVICE STRATA_DEVICE_INLINE static T lane(uint64_t word, int i) {
    const Bits b = static_cast<Bits>(word >> (8 * sizeof(T) * i));
    T t;
    __builtin_memcpy(&t, &b, sizeof(T));
    return t;
  }
  STRATA_HOST_DEVICE STRATA_DEVICE_INLINE static uint64_t bitsOf(T t) {
    Bits b;
    __builtin_memcpy(&b, &t, sizeof(T));
    return b;
  }
};

/// One 8-byte unit folded over the ranks in rank order: word(r, v) sets rank r's word and
/// returns false when it did not arrive (then so does this, with out unset).
template <class T, class Get>
STRATA_HOST_DEVICE STRATA_DEVICE_INLINE bool foldRanks(const KernelArgs& a, Get&& word,
                                                       uint64_t& out) {
  WordFold<T> f;
  for (int r = 0; r < a.nranks; ++r) {
    uint64_t v = 0;
    if (!word(r, v)) return false;
    if (r == 0) {
      f.init(v);
    } else {
      f.add(a.op, v);
    }
  }
  out = f.finish(a.op, a.nranks);
  return true;
}

/// A 16-byte unit folded over the ranks in rank order (vec(r): rank r's, always present).
template <class T, class Get>
STRATA_HOST_DEVICE STRATA_DEVICE_INLINE device::Vec16 foldRanksVec(const KernelArgs& a, Get&& vec) {
  WordFold<T> lo, hi;
  for (int r = 0; r < a.nranks; ++r) {
    const device::Vec16 v = vec(r);
    if (r == 0) {
      lo.init(v.lo);
      hi.init(v.hi);
    } else {
      lo.add(a.op, v.lo);
      hi.add(a.op, v.hi);
    }
  }
  return {lo.finish(a.op, a.nranks), hi.finish(a.op, a.nranks)};
}

/// Calls f.template operator()<Op>() with the reduction as a compile-time constant, so that
/// the fold's per-element switch on the op disappears (the kernels dispatch once per launch).
template <class F>
STRATA_HOST_DEVICE STRATA_DEVICE_INLINE void withRedOp(RedOp op, F&& f) {
  switch (op) {
    case RedOp::Sum:
      return f.template operator()<RedOp::Sum>();
    case RedOp::Prod:
      return f.template operator()<RedOp::Prod>();
    case RedOp::Min:
      return f.template operator()<RedOp::Min>();
    case RedOp::Max:
      return f.template operator()<RedOp::Max>();
    case RedOp::Avg:
      return f.template operator()<RedOp::Avg>();
  }
}

/// foldRanksVec for the bandwidth-bound loops: the ranks' 16 bytes are loaded kFoldBatch at a
/// time before they are folded (that many independent loads in flight per thread, where a
/// load-then-fold loop has one; all 8 at once took the direct kernels to their 128-register
/// budget), in rank order, with the op fixed at compile time. vec(r) must have no side effects.
constexpr int kFoldBatch = 4;
template <class T, RedOp Op, class Get>
STRATA_HOST_DEVICE STRATA_DEVICE_INLINE device::Vec16 foldRanksVecLoaded(const KernelArgs& a,
                                                                         Get&& vec) {
  WordFold<T> lo, hi;
  STRATA_UNROLL
  for (int r0 = 0; r0 < kMaxRanks; r0 += kFoldBatch) {
    if (r0 >= a.nranks) break;
    device::Vec16 v[kFoldBatch];
    STRATA_UNROLL
    for (int k = 0; k < kFoldBatch; ++k) {
      if (r0 + k < a.nranks) v[k] = vec(r0 + k);
    }
    STRATA_UNROLL
    for (int k = 0; k < kFoldBatch; ++k) {
      if (r0 + k >= a.nranks) break;
      if (r0 + k == 0) {
        lo.init(v[k].lo);
        hi.init(v[k].hi);
      } else {
        lo.add(Op, v[k].lo);
        hi.add(Op, v[k].hi);
      }
    }
  }
  return {lo.finish(Op, a.nranks), hi.finish(Op, a.nranks)};
}

// ---- bounded loads and stores of 8- and 16-byte units -----------------------------------------

// The emulation counts the narrowest accesses (tests/cuda-emu defines STRATA_EMU_COUNT_ACCESSES
// to a counter); on the GPU and in the module this is nothing.
#if defined(STRATA_EMU_COUNT_ACCESSES) && !defined(__CUDA_ARCH__)
#define STRATA_COUNT_BYTE_ACCESS() STRATA_EMU_COUNT_ACCESSES()
#else
#define STRATA_COUNT_BYTE_ACCESS()
#endif

/// Bytes [off, off + 8) of src, zero past end (src needs no alignment): one 8-byte load when
/// aligned, else the widest aligned loads the address allows (a 4- or 2-byte aligned view of an
/// fp32 or fp16 buffer at an offset), bytes only for odd addresses and the tail.
STRATA_HOST_DEVICE STRATA_DEVICE_INLINE uint64_t loadUnit8(const void* src, uint64_t off,
                                                           uint64_t end) {
  const char* p = static_cast<const char*>(src) + off;
  const uintptr_t at = reinterpret_cast<uintptr_t>(p);
  if (off + 8 <= end) {
    if ((at & 7) == 0) return *reinterpret_cast<const uint64_t*>(p);
    if ((at & 3) == 0) {
      const auto* q = reinterpret_cast<const uint32_t*>(p);
      return uint64_t{q[0]} | uint64_t{q[1]} << 32;
    }
    if ((at & 1) == 0) {
      const auto* q = reinterpret_cast<const uint16_t*>(p);
      return uint64_t{q[0]} | uint64_t{q[1]} << 16 | uint64_t{q[2]} << 32 | uint64_t{q[3]} << 48;
    }
  }
  STRATA_COUNT_BYTE_ACCESS();
  uint64_t w = 0;
  for (uint64_t i = 0; i < 8 && off + i < end; ++i) {
    w |= static_cast<uint64_t>(static_cast<uint8_t>(p[i])) << (8 * i);
  }
  return w;
}
STRATA_HOST_DEVICE STRATA_DEVICE_INLINE void storeUnit8(void* dst, uint64_t off, uint64_t end,
                                                        uint64_t w) {
  char* p = static_cast<char*>(dst) + off;
  const uintptr_t at = reinterpret_cast<uintptr_t>(p);
  if (off + 8 <= end) {
    if ((at & 7) == 0) {
      *reinterpret_cast<uint64_t*>(p) = w;
      return;
    }
    if ((at & 3) == 0) {
      auto* q = reinterpret_cast<uint32_t*>(p);
      q[0] = static_cast<uint32_t>(w);
      q[1] = static_cast<uint32_t>(w >> 32);
      return;
    }
    if ((at & 1) == 0) {
      auto* q = reinterpret_cast<uint16_t*>(p);
      for (int i = 0; i < 4; ++i) q[i] = static_cast<uint16_t>(w >> (16 * i));
      return;
    }
  }
  STRATA_COUNT_BYTE_ACCESS();
  for (uint64_t i = 0; i < 8 && off + i < end; ++i) p[i] = static_cast<char>(w >> (8 * i));
}
STRATA_HOST_DEVICE STRATA_DEVICE_INLINE device::Vec16 loadUnit16(const void* src, uint64_t off,
                                                                 uint64_t end) {
  const char* p = static_cast<const char*>(src) + off;
  if (off + 16 <= end && (reinterpret_cast<uintptr_t>(p) & 15) == 0) return device::loadVec16(p);
  return {loadUnit8(src, off, end), off + 8 < end ? loadUnit8(src, off + 8, end) : 0};
}
STRATA_HOST_DEVICE STRATA_DEVICE_INLINE void storeUnit16(void* dst, uint64_t off, uint64_t end,
                                                         device::Vec16 v) {
  char* p = static_cast<char*>(dst) + off;
  if (off + 16 <= end && (reinterpret_cast<uintptr_t>(p) & 15) == 0) {
    device::storeVec16(p, v);
    return;
  }
  storeUnit8(dst, off, end, v.lo);
  if (off + 8 < end) storeUnit8(dst, off + 8, end, v.hi);
}

// ---- waits ----------------------------------------------------------------------------------

/// Waiting for one thread, as long as the peer may still come: polls ready(), and every 256
/// polls checks the abort record (another block gave up), the host's stop word (it saw the
/// peer's process exit, or the communicator was aborted) and the wait's own limit, counted from
/// the wait's start (not the kernel's: a rank that reaches the call late is not an error).
/// seen() (what the wait saw last, for the abort record) is read only when it reports, so that a
/// poll is one load.
struct Waiter {
  const KernelArgs* args;

  template <class Ctx, class Ready, class Seen>
  STRATA_HOST_DEVICE STRATA_DEVICE_INLINE bool until(Ctx& ctx, int peer, uint64_t want, Ready ready,
                                                     Seen seen) const {
    uint64_t deadline = 0;  // set at the first check: fast waits read no clock
    for (uint32_t i = 1;; ++i) {
      if (ready()) return true;
      if ((i & 255u) == 0) {
        if (AbortRecord::raised(args->abortClaim)) return false;
        if (args->stop != nullptr && device::loadAcquire(args->stop) != 0) {
          args->abort->report(args->abortClaim, AbortRecord::Stopped, ctx.block(), peer, want,
                              seen());
          return false;
        }
        if (args->timeoutNs != 0) {
          const uint64_t now = device::nowNs();
          if (deadline == 0) {
            deadline = now + args->timeoutNs;
          } else if (now > deadline) {
            args->abort->report(args->abortClaim, AbortRecord::Timeout, ctx.block(), peer, want,
                                seen());
            return false;
          }
        }
      }
      ctx.spin(i);
    }
  }

  /// The next signal of semaphore s (from peer): one thread waits.
  template <class Ctx>
  STRATA_HOST_DEVICE STRATA_DEVICE_INLINE bool semaphore(Ctx& ctx, const device::DeviceSemaphore& s,
                                                         int peer) const {
    const uint64_t target = s.next();
    return until(
        ctx, peer, target, [&] { return s.arrived(target); },
        [&] { return device::loadRelaxed(s.inbound); });
  }

  /// One packet from peer; data set when it arrived.
  template <class Packet, class Data, class Ctx>
  STRATA_HOST_DEVICE STRATA_DEVICE_INLINE bool packet(Ctx& ctx, const Packet* p, uint32_t flag,
                                                      int peer, Data& data) const {
    return until(
        ctx, peer, flag, [&] { return p->tryRead(flag, data); },
        [&] { return device::loadWord(reinterpret_cast<const uint64_t*>(p)) >> 32; });
  }
};

template <class Ctx>
STRATA_HOST_DEVICE STRATA_DEVICE_INLINE Waiter makeWaiter(const KernelArgs& a) {
  return Waiter{&a};
}

/// The semaphore block `block` of this rank shares with peer: the peer raises our counter
/// (our scratch), we raise theirs (their scratch, mapped here).
STRATA_HOST_DEVICE STRATA_DEVICE_INLINE device::DeviceSemaphore semaphore(const KernelArgs& a,
                                                                          uint32_t block,
                                                                          int peer) {
  const uint64_t mine = ScratchLayout::kSemaphores + (block * kMaxRanks + peer) * 8;
  const uint64_t theirs = ScratchLayout::kSemaphores + (block * kMaxRanks + a.rank) * 8;
  device::DeviceSemaphore s;
  s.inbound = reinterpret_cast<uint64_t*>(a.scratch[a.rank] + mine);
  s.remoteInbound = reinterpret_cast<uint64_t*>(a.scratch[peer] + theirs);
  s.expected = &a.state[block].expected[peer];
  return s;
}

/// Block barrier with some peers (all ranks, or one peer when only is >= 0): every thread's
/// earlier stores reach the peers before they pass it. False (in every thread) when a wait
/// failed.
template <class Ctx>
STRATA_HOST_DEVICE STRATA_DEVICE_INLINE bool peerBarrier(Ctx& ctx, const KernelArgs& a,
                                                         const Waiter& w, int only = -1) {
  ctx.sync();
  bool ok = true;
  for (uint32_t q = ctx.thread(); q < static_cast<uint32_t>(a.nranks) && ok; q += ctx.threads()) {
    const int peer = static_cast<int>(q);
    if (peer == a.rank || (only >= 0 && peer != only)) continue;
    const auto s = semaphore(a, ctx.block(), peer);
    s.signal();
    ok = w.semaphore(ctx, s, peer);
  }
  return ctx.syncAnd(ok);
}

/// One signal to peer, from one thread after the block's stores (the other side waits with
/// waitSignal): the send side of a handshake.
template <class Ctx>
STRATA_HOST_DEVICE STRATA_DEVICE_INLINE void signalPeer(Ctx& ctx, const KernelArgs& a, int peer) {
  ctx.sync();
  if (ctx.thread() == 0) semaphore(a, ctx.block(), peer).signal();
}
template <class Ctx>
STRATA_HOST_DEVICE STRATA_DEVICE_INLINE bool waitSignal(Ctx& ctx, const KernelArgs& a,
                                                        const Waiter& w, int peer) {
  bool ok = true;
  if (ctx.thread() == 0) ok = w.semaphore(ctx, semaphore(a, ctx.block(), peer), peer);
  return ctx.syncAnd(ok);
}

/// The epoch of this launch's packet kernels (all state entries are equal: every packet launch
/// advances every entry once).
template <class Ctx>
STRATA_HOST_DEVICE STRATA_DEVICE_INLINE EpochFlag beginEpoch(Ctx& ctx, const KernelArgs& a) {
  return EpochFlag::of(a.state[ctx.block()].epoch + 1);
}
/// After the block's last packet: advances the entries this block owns (block, block + blocks,
/// ...) so that a later launch with another grid size sees the same epoch in every block.
template <class Ctx>
STRATA_HOST_DEVICE STRATA_DEVICE_INLINE void endEpoch(Ctx& ctx, const KernelArgs& a) {
  ctx.sync();  // every thread has read the epoch
  if (ctx.thread() == 0) {
    const uint64_t next = a.state[ctx.block()].epoch + 1;
    for (uint32_t b = ctx.block(); b < static_cast<uint32_t>(kMaxBlocks); b += ctx.blocks()) {
      a.state[b].epoch = next;
    }
  }
}

/// Units [first, ...) with stride of the whole grid: the same unit goes to the same thread in
/// every phase of a kernel (which makes in-place calls safe).
template <class Ctx>
STRATA_HOST_DEVICE STRATA_DEVICE_INLINE uint64_t gridThread(Ctx& ctx) {
  return static_cast<uint64_t>(ctx.block()) * ctx.threads() + ctx.thread();
}
template <class Ctx>
STRATA_HOST_DEVICE STRATA_DEVICE_INLINE uint64_t gridThreads(Ctx& ctx) {
  return static_cast<uint64_t>(ctx.blocks()) * ctx.threads();
}

}  // namespace strata::cuda
