#pragma once

// Direct algorithms: bandwidth-bound sizes. Each rank copies its input, a chunk at a time, into
// its staging area (scratch that every peer maps), and peers read it with 16-byte loads. The
// staging is double buffered: chunk j lives in half j % 2 (allReduce: its inputs in one quarter,
// the results their owners push in another), so one block-level handshake with the peers
// (kernel_common.hpp: peerBarrier) per chunk both says "chunk j is staged" and "chunk j - 1's
// half may be reused", and a rank stages chunk j + 1 while its peers still read chunk j. Chunks
// are split over the blocks, and within a block's slice over the ranks (the reduce-scatter owner
// of each piece); block b only ever reads what block b of a peer wrote, so blocks never wait for
// each other.
//
// Why one handshake per chunk is enough (copies): a rank stages chunk j into half h only after it
// passed handshake j - 1, which every peer reached after it had read chunk j - 2 (the last user of
// half h). The last chunk is still read after the last handshake, so copies end with one more
// (nothing of a peer reads this rank's staging once a kernel has ended: the next kernel, of any
// grid, may stage at once). allReduce needs no extra one: after its last handshake a rank only
// reads its own results.

#include "kernel_common.hpp"
#include "kernel_packets.hpp"

namespace strata::cuda {

/// The slice [begin, end) of a chunk that this block handles: the same region of the staging in
/// every chunk (per = chunk / blocks), cut short in a last, partial chunk of `units` units. A
/// block must never touch staging another block of a peer may still read.
struct Slice {
  uint64_t begin = 0, end = 0;
  template <class Ctx>
  STRATA_HOST_DEVICE STRATA_DEVICE_INLINE static Slice of(Ctx& ctx, uint64_t chunk,
                                                          uint64_t units) {
    const uint64_t per = (chunk + ctx.blocks() - 1) / ctx.blocks();
    Slice s;
    s.begin = per * ctx.block() < units ? per * ctx.block() : units;
    s.end = s.begin + per < units ? s.begin + per : units;
    return s;
  }
  /// Owner r's part of the slice.
  STRATA_HOST_DEVICE STRATA_DEVICE_INLINE Slice part(int r, int n) const {
    const uint64_t len = end - begin, per = (len + n - 1) / n;
    Slice s;
    s.begin = begin + (per * r < len ? per * r : len);
    s.end = s.begin + per < end ? s.begin + per : end;
    return s;
  }
};

STRATA_HOST_DEVICE STRATA_DEVICE_INLINE char* staging(const KernelArgs& a, int rank) {
  return a.scratch[rank] + a.layout.stagingOffset();
}

/// Units [begin, end) of a block's slice, thread by thread, kUnroll at a time: the loads of
/// kUnroll units are issued before any of their stores (several 16-byte loads in flight per
/// thread, where a load-then-store loop keeps one), then the rest one by one.
constexpr int kUnroll = 4;
template <class Ctx, class Load, class Store>
STRATA_HOST_DEVICE STRATA_DEVICE_INLINE void moveUnits(Ctx& ctx, uint64_t begin, uint64_t end,
                                                       Load&& load, Store&& store) {
  const uint64_t t = ctx.threads();
  uint64_t i = begin + ctx.thread();
  for (; i + (kUnroll - 1) * t < end; i += kUnroll * t) {
    device::Vec16 v[kUnroll];
    STRATA_UNROLL
    for (int k = 0; k < kUnroll; ++k) v[k] = load(i + k * t);
    STRATA_UNROLL
    for (int k = 0; k < kUnroll; ++k) store(i + k * t, v[k]);
  }
  for (; i < end; i += t) store(i, load(i));
}

/// This block's slice of the chunk at unit c0 of src (bytes long, any alignment) into a staging
/// region (unit i of the chunk at region + 16 i). The staging never overlaps a user's buffer, so
/// both are __restrict__ (a user's send and recv are not: an in-place call passes one buffer).
template <class Ctx>
STRATA_HOST_DEVICE STRATA_DEVICE_INLINE void stage(Ctx& ctx, char* __restrict__ region,
                                                   const void* __restrict__ src, uint64_t c0,
                                                   Slice slice, uint64_t bytes) {
  moveUnits(
      ctx, slice.begin, slice.end,
      [&](uint64_t i) { return loadUnit16(src, (c0 + i) * 16, bytes); },
      [&](uint64_t i, device::Vec16 v) { device::storeVec16(region + i * 16, v); });
}
/// The reverse: a staging region's slice (this rank's or a peer's) into the chunk of dst.
template <class Ctx>
STRATA_HOST_DEVICE STRATA_DEVICE_INLINE void unstage(Ctx& ctx, void* __restrict__ dst,
                                                     const char* __restrict__ region, uint64_t c0,
                                                     Slice slice, uint64_t bytes) {
  moveUnits(
      ctx, slice.begin, slice.end, [&](uint64_t i) { return device::loadVec16(region + i * 16); },
      [&](uint64_t i, device::Vec16 v) { storeUnit16(dst, (c0 + i) * 16, bytes, v); });
}

/// The staging split into `regions` equal regions of whole 16-byte units, each cut into
/// `perRank` pieces: units per piece (a chunk's units per rank for allToAll and reduceScatter,
/// else per chunk). Shared with the host's grid choice (plan.hpp: shapeFor).
STRATA_HOST_DEVICE STRATA_DEVICE_INLINE uint64_t stagingUnits(const ScratchLayout& l, int regions,
                                                              int perRank) {
  return l.staging / 16 / static_cast<uint64_t>(regions) / static_cast<uint64_t>(perRank);
}
/// Rank r's staging region `index`, the regions `units` 16-byte units each.
STRATA_HOST_DEVICE STRATA_DEVICE_INLINE char* stagingRegion(const KernelArgs& a, int r,
                                                            uint64_t index, uint64_t units) {
  return staging(a, r) + index * units * 16;
}
/// allReduce's regions: inputs of chunks j even, odd; results of chunks j even, odd.
constexpr int kAllReduceRegions = 4;
/// The other direct collectives': chunks j even, odd.
constexpr int kCopyRegions = 2;

/// allReduce, reduce-scatter then all-gather, pipelined in chunks of a quarter of the staging:
/// stage chunk j's input in region j % 2; handshake; the owner of each piece folds it from every
/// rank's staging and pushes the result into every peer's result region 2 + j % 2 (remote
/// stores, as MSCCL++'s rsag pushes) and its own output, and the rank stages chunk j + 1; one
/// handshake; each rank copies the other owners' results from its own result region. Two
/// handshakes for one chunk, j + 1 for j chunks (the old scheme, where peers read the reduced
/// piece from the owner's staging, took three per chunk).
template <class T, class Ctx>
STRATA_HOST_DEVICE void allReduceDirect(Ctx& ctx, const KernelArgs& a) {
  const Waiter w = makeWaiter<Ctx>(a);
  const uint64_t bytes = a.bytes(), units = (bytes + 15) / 16;
  const uint64_t chunk = stagingUnits(a.layout, kAllReduceRegions, 1);
  auto sliceOf = [&](uint64_t c0) {
    return Slice::of(ctx, chunk, units - c0 < chunk ? units - c0 : chunk);
  };
  if (units == 0) return;
  stage(ctx, stagingRegion(a, a.rank, 0, chunk), a.send, 0, sliceOf(0), bytes);
  if (!peerBarrier(ctx, a, w)) return;  // chunk 0 staged
  for (uint64_t c0 = 0, h = 0; c0 < units; c0 += chunk, h ^= 1) {
    const Slice slice = sliceOf(c0);
    const Slice own = slice.part(a.rank, a.nranks);
    withRedOp(a.op, [&]<RedOp Op>() {
      for (uint64_t i = own.begin + ctx.thread(); i < own.end; i += ctx.threads()) {
        const device::Vec16 out = foldRanksVecLoaded<T, Op>(
            a, [&](int r) { return device::loadVec16(stagingRegion(a, r, h, chunk) + i * 16); });
        storeUnit16(a.recv, (c0 + i) * 16, bytes, out);
        for (int k = 1; k < a.nranks; ++k) {
          device::storeVec16(stagingRegion(a, (a.rank + k) % a.nranks, 2 + h, chunk) + i * 16, out);
        }
      }
    });
    const uint64_t next = c0 + chunk;
    if (next < units) {
      stage(ctx, stagingRegion(a, a.rank, h ^ 1, chunk), a.send, next, sliceOf(next), bytes);
    }
    if (!peerBarrier(ctx, a, w)) return;  // chunk c0 pushed, the next one staged
    const char* results = stagingRegion(a, a.rank, 2 + h, chunk);
    for (int k = 1; k < a.nranks; ++k) {
      const int s = (a.rank + k) % a.nranks;
      unstage(ctx, a.recv, results, c0, slice.part(s, a.nranks), bytes);
    }
  }
}

/// reduceScatter through the staging: each rank stages all n blocks of a chunk (region j % 2),
/// owner r folds block r from every rank's staging.
template <class T, class Ctx>
STRATA_HOST_DEVICE void reduceScatterDirect(Ctx& ctx, const KernelArgs& a) {
  const Waiter w = makeWaiter<Ctx>(a);
  const uint64_t bytes = a.bytes(), units = (bytes + 15) / 16;
  const uint64_t chunk = stagingUnits(a.layout, kCopyRegions, a.nranks);
  const uint64_t half = chunk * a.nranks;  // units of a staging half
  const char* in = static_cast<const char*>(a.send);
  for (uint64_t c0 = 0, h = 0; c0 < units; c0 += chunk, h ^= 1) {
    const uint64_t cu = units - c0 < chunk ? units - c0 : chunk;
    const Slice slice = Slice::of(ctx, chunk, cu);
    char* mine = stagingRegion(a, a.rank, h, half);
    for (int s = 0; s < a.nranks; ++s) {
      stage(ctx, mine + s * chunk * 16, in + a.sendBlock(s), c0, slice, bytes);
    }
    if (!peerBarrier(ctx, a, w)) return;  // staged; the peers are done with chunk j - 2
    withRedOp(a.op, [&]<RedOp Op>() {
      for (uint64_t i = slice.begin + ctx.thread(); i < slice.end; i += ctx.threads()) {
        storeUnit16(
            a.recv, (c0 + i) * 16, bytes, foldRanksVecLoaded<T, Op>(a, [&](int r) {
              return device::loadVec16(stagingRegion(a, r, h, half) + (a.rank * chunk + i) * 16);
            }));
      }
    });
  }
  if (units != 0) peerBarrier(ctx, a, w);  // the last chunk read: free for the next kernel
}

/// allGather, broadcast, allToAll through the staging. What rank q stages for rank r sits at
/// block r of q's staging half for allToAll (chunk = half / n), at offset 0 otherwise.
template <class Ctx>
STRATA_HOST_DEVICE void copyDirect(Ctx& ctx, CopyKind k, const KernelArgs& a) {
  const Waiter w = makeWaiter<Ctx>(a);
  const uint64_t bytes = a.bytes(), units = (bytes + 15) / 16;
  const bool perPeer = k == CopyKind::AllToAll;
  const int pieces = perPeer ? a.nranks : 1;
  const uint64_t chunk = stagingUnits(a.layout, kCopyRegions, pieces);
  // Broadcast: the root meets every peer, a peer only the root.
  const int only = k == CopyKind::Broadcast && a.rank != a.peer ? a.peer : -1;
  const uint64_t half = chunk * static_cast<uint64_t>(pieces);  // units of a staging half
  for (uint64_t c0 = 0, h = 0; c0 < units; c0 += chunk, h ^= 1) {
    const uint64_t cu = units - c0 < chunk ? units - c0 : chunk;
    const Slice slice = Slice::of(ctx, chunk, cu);
    char* mine = stagingRegion(a, a.rank, h, half);
    for (int q = 0; q < a.nranks; ++q) {
      const char* src = copySource(k, a, q);
      if (q == a.rank || src == nullptr) continue;
      const uint64_t base = perPeer ? q * chunk : 0;
      stage(ctx, mine + base * 16, src, c0, slice, bytes);
      if (!perPeer) break;  // the same bytes for every peer
    }
    {
      const char* src = copySource(k, a, a.rank);
      char* dst = copyTarget(k, a, a.rank);
      if (src != nullptr && dst != nullptr && src != dst) {
        for (uint64_t i = slice.begin + ctx.thread(); i < slice.end; i += ctx.threads()) {
          storeUnit16(dst, (c0 + i) * 16, bytes, loadUnit16(src, (c0 + i) * 16, bytes));
        }
      }
    }
    // Staged; the peers are done with chunk j - 2 (this half's last use).
    if (!peerBarrier(ctx, a, w, only)) return;
    for (int k2 = 1; k2 < a.nranks; ++k2) {
      const int q = (a.rank + k2) % a.nranks;
      char* dst = copyTarget(k, a, q);
      if (dst == nullptr) continue;
      const char* theirs = stagingRegion(a, q, h, half) + (perPeer ? a.rank * chunk * 16 : 0);
      unstage(ctx, dst, theirs, c0, slice, bytes);
    }
  }
  if (units != 0) peerBarrier(ctx, a, w, only);  // the last chunk read
}

/// Send/recv through the P2P slots, per direction: block b of the sender stages its part of each
/// round into its fixed part of the slot for the receiver (ScratchLayout::p2pPart), raises the
/// receiver's "ready" counter, and before the next use of that part waits until the receiver's
/// "read" count has caught up. The last round is not waited for: a send returns once its data is
/// staged (its buffer may be reused), and the next send to that peer waits for it. So a pair
/// that sends each other a message of at most one round (blocks x part bytes) on one stream,
/// send first, completes; larger ones need a fused send/recv (as NCCL needs a group).
struct P2pRounds {
  uint64_t units = 0;      ///< 16-byte units of the message
  uint64_t partUnits = 0;  ///< units per block and round
  uint64_t roundUnits = 0;
  template <class Ctx>
  STRATA_HOST_DEVICE STRATA_DEVICE_INLINE static P2pRounds of(Ctx& ctx, const KernelArgs& a) {
    P2pRounds r;
    r.units = (a.bytes() + 15) / 16;
    r.partUnits = a.layout.p2pPartBytes() / 16;
    r.roundUnits = r.partUnits * ctx.blocks();
    return r;
  }
  /// This block's units [begin, end) of round starting at unit c0 (empty past the message).
  template <class Ctx>
  STRATA_HOST_DEVICE STRATA_DEVICE_INLINE Slice part(Ctx& ctx, uint64_t c0) const {
    Slice s;
    const uint64_t b = c0 + ctx.block() * partUnits;
    s.begin = b < units ? b : units;
    s.end = s.begin + partUnits < units ? s.begin + partUnits : units;
    return s;
  }
};

/// The counters of P2P traffic between this rank and peer for this block: `ready` (raised by
/// the sender in the receiver's scratch) or `read` (raised by the receiver in the sender's).
STRATA_HOST_DEVICE STRATA_DEVICE_INLINE device::DeviceSemaphore p2pSemaphore(
    const KernelArgs& a, uint32_t block, int peer, uint64_t region, uint64_t* consumed) {
  device::DeviceSemaphore s;
  s.inbound =
      reinterpret_cast<uint64_t*>(a.scratch[a.rank] + region + (block * kMaxRanks + peer) * 8);
  s.remoteInbound =
      reinterpret_cast<uint64_t*>(a.scratch[peer] + region + (block * kMaxRanks + a.rank) * 8);
  s.expected = consumed;
  return s;
}

template <class Ctx>
STRATA_HOST_DEVICE void sendDirect(Ctx& ctx, const KernelArgs& a) {
  const Waiter w = makeWaiter<Ctx>(a);
  const P2pRounds rounds = P2pRounds::of(ctx, a);
  BlockState& st = a.state[ctx.block()];
  const auto ready = p2pSemaphore(a, ctx.block(), a.peer, ScratchLayout::kP2pReady, nullptr);
  const auto read = p2pSemaphore(a, ctx.block(), a.peer, ScratchLayout::kP2pRead, nullptr);
  char* part = a.scratch[a.rank] + a.layout.p2pPart(a.peer, ctx.block());
  for (uint64_t c0 = 0; c0 < rounds.units; c0 += rounds.roundUnits) {
    const Slice mine = rounds.part(ctx, c0);
    if (mine.begin == mine.end) continue;  // the receiver's block skips it too
    bool ok = true;
    if (ctx.thread() == 0) {
      // Every chunk staged in this part before has been read.
      const uint64_t sent = st.p2pSent[a.peer];
      ok = w.until(
          ctx, a.peer, sent, [&] { return read.arrived(sent); },
          [&] { return device::loadRelaxed(read.inbound); });
    }
    if (!ctx.syncAnd(ok)) return;
    moveUnits(
        ctx, mine.begin, mine.end,
        [&](uint64_t i) { return loadUnit16(a.send, i * 16, a.bytes()); },
        [&](uint64_t i, device::Vec16 v) { device::storeVec16(part + (i - mine.begin) * 16, v); });
    ctx.sync();
    if (ctx.thread() == 0) {
      ++st.p2pSent[a.peer];
      ready.signal();
    }
  }
}

template <class Ctx>
STRATA_HOST_DEVICE void recvDirect(Ctx& ctx, const KernelArgs& a) {
  const Waiter w = makeWaiter<Ctx>(a);
  const P2pRounds rounds = P2pRounds::of(ctx, a);
  BlockState& st = a.state[ctx.block()];
  const auto ready =
      p2pSemaphore(a, ctx.block(), a.peer, ScratchLayout::kP2pReady, &st.p2pReceived[a.peer]);
  const auto read = p2pSemaphore(a, ctx.block(), a.peer, ScratchLayout::kP2pRead, nullptr);
  const char* part = a.scratch[a.peer] + a.layout.p2pPart(a.rank, ctx.block());
  for (uint64_t c0 = 0; c0 < rounds.units; c0 += rounds.roundUnits) {
    const Slice mine = rounds.part(ctx, c0);
    if (mine.begin == mine.end) continue;
    bool ok = true;
    if (ctx.thread() == 0) ok = w.semaphore(ctx, ready, a.peer);
    if (!ctx.syncAnd(ok)) return;
    moveUnits(
        ctx, mine.begin, mine.end,
        [&](uint64_t i) { return device::loadVec16(part + (i - mine.begin) * 16); },
        [&](uint64_t i, device::Vec16 v) { storeUnit16(a.recv, i * 16, a.bytes(), v); });
    ctx.sync();  // every thread has read the part
    if (ctx.thread() == 0) read.signal();
  }
}

}  // namespace strata::cuda
