#pragma once

// The network step of the cross-host collectives (docs/collectives-cuda.md, "Across hosts"): a
// rank exchanges bytes with its lanes' peers (the ranks of the same local index on the other
// hosts, or a send/recv's peers) through PortChannels. The kernel copies what it sends into a
// pinned host bounce buffer, pushes a put-with-signal per peer into the proxy FIFO (the proxy
// writes it into the peer's receive bounce buffer over the fabric connection, then raises the
// peer's data counter), waits for each peer's data counter, and either folds the peers' data with
// its own in host order (NetReduce) or copies it out (NetGather). After it has read a peer's slot
// it signals that peer's ack counter through a second channel; a sender reuses a slot (and its own
// bounce half) only after the ack of the chunk that used it two chunks ago (two slots per peer, by
// chunk parity).
//
// Counts (chunks sent to and received from each peer rank) live in NetState, in this rank's
// device memory, so they persist across launches and graph replays as the semaphores' counts do.
// One block runs the step; thread 0 waits and pushes, every thread copies and folds.

#include "kernel_common.hpp"

namespace strata::cuda {

/// One FIFO push, waited for like any peer (the proxy drains the FIFO even for a failed
/// connection, so a full FIFO only means a slow proxy).
template <class Ctx>
STRATA_HOST_DEVICE STRATA_DEVICE_INLINE bool pushTrigger(Ctx& ctx, const Waiter& w,
                                                         const NetArgs& n, int h,
                                                         const ProxyTrigger& t) {
  FifoDeviceHandle fifo = n.fifo;
  uint64_t id = 0;
  return w.until(
      ctx, -1 - n.lane[h].peer, 0, [&] { return fifo.tryPush(t, &id); },
      [] { return uint64_t{0}; });
}

/// Thread 0 waits until *word reaches want (acquire: what the proxy wrote before it is visible
/// to the block after the next barrier).
template <class Ctx>
STRATA_HOST_DEVICE STRATA_DEVICE_INLINE bool waitCount(Ctx& ctx, const Waiter& w, int peer,
                                                       const uint64_t* word, uint64_t want) {
  return w.until(
      ctx, peer, want, [&] { return device::loadAcquire(word) >= want; },
      [&] { return device::loadRelaxed(word); });
}

/// A 16-byte unit folded over the hosts in host order (vec(h): host h's), Op fixed.
template <class T, RedOp Op, class Get>
STRATA_HOST_DEVICE STRATA_DEVICE_INLINE device::Vec16 foldHostsVec(const NetArgs& n, Get&& vec) {
  WordFold<T> lo, hi;
  for (int h = 0; h < n.hosts; ++h) {
    const device::Vec16 v = vec(h);
    if (h == 0) {
      lo.init(v.lo);
      hi.init(v.hi);
    } else {
      lo.add(Op, v.lo);
      hi.add(Op, v.hi);
    }
  }
  return {lo.finish(Op, n.ranksTotal), hi.finish(Op, n.ranksTotal)};
}

/// The network step, chunk by chunk (see the top of this file). reduce: NetReduce (every other
/// host in both masks), else NetGather.
template <class T, class Ctx>
STRATA_HOST_DEVICE void netExchange(Ctx& ctx, const KernelArgs& a, bool reduce) {
  const NetArgs& n = a.net;
  const Waiter w = makeWaiter<Ctx>(a);
  const uint64_t chunks = n.chunk == 0 ? 0 : (n.bytes + n.chunk - 1) / n.chunk;
  // The slot parity of each host at the first chunk, as bits (no per-thread array: on the GPU
  // a runtime-indexed array lives in local memory).
  uint32_t sendParity = 0, recvParity = 0;
  for (int h = 0; h < n.hosts; ++h) {
    sendParity |= static_cast<uint32_t>(n.state->sent[n.lane[h].peer] & 1u) << h;
    recvParity |= static_cast<uint32_t>(n.state->received[n.lane[h].peer] & 1u) << h;
  }
  ctx.sync();  // thread 0 changes the counts only after every thread read them
  bool ok = true;
  for (uint64_t c = 0; c < chunks; ++c) {
    const uint64_t off = c * n.chunk;
    const uint64_t len = n.bytes - off < n.chunk ? n.bytes - off : n.chunk;
    const uint64_t units = (len + 15) / 16;
    const uint64_t end = n.bytes;
    // 1. The slot two chunks back was read by every peer we send to: our bounce half and the
    //    peer's slot are free.
    if (ctx.thread() == 0) {
      for (int h = 0; h < n.hosts && ok; ++h) {
        if ((n.sendMask >> h & 1u) == 0) continue;
        const NetLane& lane = n.lane[h];
        const uint64_t s = n.state->sent[lane.peer];
        if (s >= 2) ok = waitCount(ctx, w, -1 - lane.peer, lane.ackIn, s - 1);
      }
    }
    if (!ctx.syncAnd(ok)) return;
    // 2. Into the bounce slots, one per destination.
    for (int h = 0; h < n.hosts; ++h) {
      if ((n.sendMask >> h & 1u) == 0) continue;
      const uint32_t p = ((sendParity >> h) ^ static_cast<uint32_t>(c)) & 1u;
      char* slot = n.lane[h].sendSlot + p * n.lane[h].parityStride;
      const char* src = n.src[h];
      moveUnits(
          ctx, 0, units, [&](uint64_t i) { return loadUnit16(src, off + i * 16, end); },
          [&](uint64_t i, device::Vec16 v) { device::storeVec16(slot + i * 16, v); });
    }
    ctx.sync();
    // 3. The puts (the push releases the block's stores first), then the peers' data.
    if (ctx.thread() == 0) {
      for (int h = 0; h < n.hosts && ok; ++h) {
        if ((n.sendMask >> h & 1u) == 0) continue;
        const NetLane& lane = n.lane[h];
        const uint64_t parity = ((sendParity >> h) ^ static_cast<uint32_t>(c)) & 1u;
        ok = pushTrigger(ctx, w, n, h,
                         {lane.dstOffset + parity * lane.parityStride,
                          lane.srcOffset + parity * lane.parityStride, units * 16, lane.dataChannel,
                          TriggerType::PutWithSignal});
        n.state->sent[lane.peer] += 1;
      }
      for (int h = 0; h < n.hosts && ok; ++h) {
        if ((n.recvMask >> h & 1u) == 0) continue;
        const NetLane& lane = n.lane[h];
        ok = waitCount(ctx, w, -1 - lane.peer, lane.dataIn, n.state->received[lane.peer] + 1);
      }
    }
    if (!ctx.syncAnd(ok)) return;
    // 4. Use the peers' slots.
    if (reduce) {
      withRedOp(a.op, [&]<RedOp Op>() {
        for (uint64_t i = ctx.thread(); i < units; i += ctx.threads()) {
          const device::Vec16 out = foldHostsVec<T, Op>(n, [&](int h) {
            if (h == n.host) return loadUnit16(n.src[h], off + i * 16, end);
            const uint32_t p = ((recvParity >> h) ^ static_cast<uint32_t>(c)) & 1u;
            return device::loadVec16(n.lane[h].recvSlot + p * n.lane[h].parityStride + i * 16);
          });
          storeUnit16(n.dst[n.host], off + i * 16, end, out);
        }
      });
    } else {
      for (int h = 0; h < n.hosts; ++h) {
        if ((n.recvMask >> h & 1u) == 0) continue;
        const uint32_t p = ((recvParity >> h) ^ static_cast<uint32_t>(c)) & 1u;
        const char* slot = n.lane[h].recvSlot + p * n.lane[h].parityStride;
        char* dst = n.dst[h];
        moveUnits(
            ctx, 0, units, [&](uint64_t i) { return device::loadVec16(slot + i * 16); },
            [&](uint64_t i, device::Vec16 v) { storeUnit16(dst, off + i * 16, end, v); });
      }
    }
    ctx.sync();  // every thread has read the slots
    // 5. Acks: the slots may be written again.
    if (ctx.thread() == 0) {
      for (int h = 0; h < n.hosts && ok; ++h) {
        if ((n.recvMask >> h & 1u) == 0) continue;
        ok = pushTrigger(ctx, w, n, h, {0, 0, 0, n.lane[h].ackChannel, TriggerType::Signal});
        n.state->received[n.lane[h].peer] += 1;
      }
    }
  }
}

}  // namespace strata::cuda
