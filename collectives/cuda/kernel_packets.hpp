#pragma once

// Packet (LL) algorithms: latency-bound sizes. Data travels as LL8 or LL16 packets written
// straight into the peers' scratch; a reader spins on each packet's flag, so there is no
// semaphore and no fence on the way. Flags come from the per-block epoch (kernel_common.hpp), and
// the packet scratch is double buffered by the epoch's parity: a rank can be one call ahead of a
// peer (it cannot finish call k+1 before every peer has started it, hence finished call k), so
// call k+1 writes the other half while the peer may still read call k's.
//
// Slots: in a parity half, area 0 holds nranks slots (slot q: what rank q sent here), area 1
// another nranks (the two-shot's results). Each slot is layout.slotBytes(nranks) bytes.

#include "kernel_common.hpp"

namespace strata::cuda {

using device::LL16Packet;
using device::LL8Packet;

/// Packets peer q writes for this rank (or this rank for q: pass q's scratch), area 0 or 1.
template <class Packet>
STRATA_HOST_DEVICE STRATA_DEVICE_INLINE Packet* packetSlot(const KernelArgs& a, char* scratch,
                                                           uint32_t parity, int area, int slot) {
  const uint64_t off =
      ScratchLayout::kPackets + parity * a.layout.packetHalf +
      (static_cast<uint64_t>(area) * a.nranks + slot) * a.layout.slotBytes(a.nranks);
  return reinterpret_cast<Packet*>(scratch + off);
}

/// An 8-byte unit as two LL8 packets (index 2u and 2u + 1), written with one 16-byte store and
/// read with one 16-byte load: the pair has LL16's layout (two halves of 4 data and 4 flag
/// bytes; slots are 16-byte aligned), and each half carries its own flag, so a reader that sees
/// both flags has both halves whichever order they landed in.
STRATA_HOST_DEVICE STRATA_DEVICE_INLINE LL16Packet* pairLL8(LL8Packet* slot, uint64_t u) {
  static_assert(sizeof(LL16Packet) == 2 * sizeof(LL8Packet));
  return reinterpret_cast<LL16Packet*>(slot + 2 * u);
}
STRATA_HOST_DEVICE STRATA_DEVICE_INLINE void putUnitLL8(LL8Packet* slot, uint64_t u, uint64_t w,
                                                        uint32_t flag) {
  pairLL8(slot, u)->write(w, flag);
}
template <class Ctx>
STRATA_HOST_DEVICE STRATA_DEVICE_INLINE bool readUnitLL8(Ctx& ctx, const Waiter& w,
                                                         const LL8Packet* slot, uint64_t u,
                                                         uint32_t flag, int peer, uint64_t& out) {
  return w.packet(ctx, pairLL8(const_cast<LL8Packet*>(slot), u), flag, peer, out);
}

/// Folds unit u in rank order: this rank's own value from `own`, each peer r's from the LL16
/// packet `index` that r put in step 0 of this rank's scratch. false when a wait gave up.
template <class T, class Ctx>
STRATA_HOST_DEVICE STRATA_DEVICE_INLINE bool foldLL16(Ctx& ctx, const KernelArgs& a,
                                                      const Waiter& w, const EpochFlag& ef,
                                                      const void* own, uint64_t u, uint64_t index,
                                                      uint64_t& out) {
  const uint64_t bytes = a.bytes();
  char* self = a.scratch[a.rank];
  return foldRanks<T>(
      a,
      [&](int r, uint64_t& v) {
        if (r == a.rank) {
          v = loadUnit8(own, u * 8, bytes);
          return true;
        }
        return w.packet(ctx, packetSlot<LL16Packet>(a, self, ef.parity, 0, r) + index, ef.flag, r,
                        v);
      },
      out);
}

/// allReduce, one shot: every rank sends its whole input to every peer as LL8 packets; each
/// rank folds all inputs in rank order. One packet hop; for the smallest sizes.
template <class T, class Ctx>
STRATA_HOST_DEVICE void allReduceOneShot(Ctx& ctx, const KernelArgs& a) {
  const Waiter w = makeWaiter<Ctx>(a);
  const EpochFlag ef = beginEpoch(ctx, a);
  const uint64_t bytes = a.bytes(), units = (bytes + 7) / 8;
  const uint64_t first = gridThread(ctx), stride = gridThreads(ctx);
  char* self = a.scratch[a.rank];
  for (uint64_t u = first; u < units; u += stride) {
    const uint64_t v = loadUnit8(a.send, u * 8, bytes);
    for (int i = 1; i < a.nranks; ++i) {
      const int q = (a.rank + i) % a.nranks;  // spread the writes over the peers
      putUnitLL8(packetSlot<LL8Packet>(a, a.scratch[q], ef.parity, 0, a.rank), u, v, ef.flag);
    }
  }
  bool ok = true;
  for (uint64_t u = first; u < units && ok; u += stride) {
    uint64_t out = 0;
    ok = foldRanks<T>(
        a,
        [&](int r, uint64_t& v) {
          if (r == a.rank) {
            v = loadUnit8(a.send, u * 8, bytes);
            return true;
          }
          return readUnitLL8(ctx, w, packetSlot<LL8Packet>(a, self, ef.parity, 0, r), u, ef.flag, r,
                             v);
        },
        out);
    if (ok) storeUnit8(a.recv, u * 8, bytes, out);
  }
  if (!ctx.syncAnd(ok)) return;
  endEpoch(ctx, a);
}

/// allReduce, two shot: rank s owns segment s; every rank sends segment s to its owner as LL16
/// packets (a reduce-scatter), the owner folds in rank order and sends the result to every peer
/// as LL16 packets (an all-gather). Two hops, each rank moves 2/n of the data.
template <class T, class Ctx>
STRATA_HOST_DEVICE void allReduceTwoShot(Ctx& ctx, const KernelArgs& a) {
  const Waiter w = makeWaiter<Ctx>(a);
  const EpochFlag ef = beginEpoch(ctx, a);
  const uint64_t bytes = a.bytes(), units = (bytes + 7) / 8;
  const uint64_t seg = (units + a.nranks - 1) / a.nranks;
  const uint64_t first = gridThread(ctx), stride = gridThreads(ctx);
  char* self = a.scratch[a.rank];
  for (uint64_t u = first; u < units; u += stride) {
    const int s = static_cast<int>(u / seg);
    if (s == a.rank) continue;
    packetSlot<LL16Packet>(a, a.scratch[s], ef.parity, 0, a.rank)[u - s * seg].write(
        loadUnit8(a.send, u * 8, bytes), ef.flag);
  }
  bool ok = true;
  // Phase 2 walks every unit with the thread that wrote it in phase 1 (and skips those outside
  // the own segment), so the packets a block waits for come from the same block of each peer:
  // no block depends on another being resident. Spreading the own segment over every thread
  // instead deadlocks when the grid does not fit the GPU at once (the cuda-emu suite's SM-slot
  // case caught it).
  const uint64_t mineEnd = (a.rank + 1) * seg < units ? (a.rank + 1) * seg : units;
  for (uint64_t u = first; u < units && ok; u += stride) {
    if (u < a.rank * seg || u >= mineEnd) continue;
    const uint64_t i = u - a.rank * seg;
    uint64_t result = 0;
    ok = foldLL16<T>(ctx, a, w, ef, a.send, u, i, result);
    if (!ok) break;
    storeUnit8(a.recv, u * 8, bytes, result);
    for (int k = 1; k < a.nranks; ++k) {
      const int q = (a.rank + k) % a.nranks;
      packetSlot<LL16Packet>(a, a.scratch[q], ef.parity, 1, a.rank)[i].write(result, ef.flag);
    }
  }
  for (uint64_t u = first; u < units && ok; u += stride) {
    const int s = static_cast<int>(u / seg);
    if (s == a.rank) continue;
    uint64_t v = 0;
    ok = w.packet(ctx, packetSlot<LL16Packet>(a, self, ef.parity, 1, s) + (u - s * seg), ef.flag, s,
                  v);
    if (ok) storeUnit8(a.recv, u * 8, bytes, v);
  }
  if (!ctx.syncAnd(ok)) return;
  endEpoch(ctx, a);
}

/// reduceScatter with LL16 packets: block s of every rank's input goes to rank s, which folds in
/// rank order into its output.
template <class T, class Ctx>
STRATA_HOST_DEVICE void reduceScatterPackets(Ctx& ctx, const KernelArgs& a) {
  const Waiter w = makeWaiter<Ctx>(a);
  const EpochFlag ef = beginEpoch(ctx, a);
  const uint64_t bytes = a.bytes(), units = (bytes + 7) / 8;
  const uint64_t first = gridThread(ctx), stride = gridThreads(ctx);
  const char* in = static_cast<const char*>(a.send);
  for (uint64_t u = first; u < units; u += stride) {
    for (int k = 1; k < a.nranks; ++k) {
      const int s = (a.rank + k) % a.nranks;
      packetSlot<LL16Packet>(a, a.scratch[s], ef.parity, 0, a.rank)[u].write(
          loadUnit8(in + a.sendBlock(s), u * 8, bytes), ef.flag);
    }
  }
  bool ok = true;
  for (uint64_t u = first; u < units && ok; u += stride) {
    uint64_t out = 0;
    ok = foldLL16<T>(ctx, a, w, ef, in + a.sendBlock(a.rank), u, u, out);
    if (ok) storeUnit8(a.recv, u * 8, bytes, out);
  }
  if (!ctx.syncAnd(ok)) return;
  endEpoch(ctx, a);
}

/// The copy operations, with the bytes each rank sends and where each lands.
enum class CopyKind : int32_t { AllGather, Broadcast, AllToAll };

/// What this rank sends to rank `to` (nullptr: nothing); a.peer is broadcast's root.
STRATA_HOST_DEVICE STRATA_DEVICE_INLINE const char* copySource(CopyKind k, const KernelArgs& a,
                                                               int to) {
  const char* s = static_cast<const char*>(a.send);
  switch (k) {
    case CopyKind::AllGather:
      return s;
    case CopyKind::Broadcast:
      return a.rank == a.peer ? s : nullptr;
    case CopyKind::AllToAll:
      return s + a.sendBlock(to);
  }
  return nullptr;
}
/// Where this rank puts what rank `from` sends (nullptr: nothing).
STRATA_HOST_DEVICE STRATA_DEVICE_INLINE char* copyTarget(CopyKind k, const KernelArgs& a,
                                                         int from) {
  char* r = static_cast<char*>(a.recv);
  switch (k) {
    case CopyKind::AllGather:
    case CopyKind::AllToAll:
      return r + a.recvBlock(from);
    case CopyKind::Broadcast:
      return from == a.peer ? r : nullptr;
  }
  return nullptr;
}

/// This rank's own block: a local copy, none when in place.
template <class Ctx>
STRATA_HOST_DEVICE STRATA_DEVICE_INLINE void copyOwn(Ctx& ctx, CopyKind k, const KernelArgs& a) {
  const char* src = copySource(k, a, a.rank);
  char* dst = copyTarget(k, a, a.rank);
  if (src == nullptr || dst == nullptr || src == dst) return;
  const uint64_t bytes = a.bytes(), units = (bytes + 15) / 16;
  for (uint64_t u = gridThread(ctx); u < units; u += gridThreads(ctx)) {
    storeUnit16(dst, u * 16, bytes, loadUnit16(src, u * 16, bytes));
  }
}

/// allGather, broadcast, allToAll with LL8 packets: each rank writes what a peer gets into the
/// peer's slot for it; each rank unpacks its slots.
///
/// The double buffering needs every packet kernel to receive something from every peer (then no
/// rank finishes call k+1 before every peer has started it, hence finished call k). Broadcast's
/// ranks receive only from the root, so each block also sends a presence packet to every peer
/// at its start and waits for every peer's at its end. Without them a non-root could finish a
/// broadcast while a third rank still reads the call before, and run into that rank's packets
/// two calls ahead (the cuda-emu suite caught exactly that).
template <class Ctx>
STRATA_HOST_DEVICE void copyPackets(Ctx& ctx, CopyKind k, const KernelArgs& a) {
  const Waiter w = makeWaiter<Ctx>(a);
  const EpochFlag ef = beginEpoch(ctx, a);
  const uint64_t bytes = a.bytes(), units = (bytes + 7) / 8;
  const uint64_t first = gridThread(ctx), stride = gridThreads(ctx);
  char* self = a.scratch[a.rank];
  auto presence = [&](char* scratch, int from) {
    return reinterpret_cast<LL8Packet*>(
        scratch + ScratchLayout::kAcks +
        ((static_cast<uint64_t>(ef.parity) * kMaxBlocks + ctx.block()) * kMaxRanks + from) * 8);
  };
  if (k == CopyKind::Broadcast) {
    for (uint32_t q = ctx.thread(); q < static_cast<uint32_t>(a.nranks); q += ctx.threads()) {
      if (static_cast<int>(q) != a.rank) presence(a.scratch[q], a.rank)->write(0, ef.flag);
    }
  }
  for (int i = 1; i < a.nranks; ++i) {
    const int q = (a.rank + i) % a.nranks;
    const char* src = copySource(k, a, q);
    if (src == nullptr) continue;
    LL8Packet* slot = packetSlot<LL8Packet>(a, a.scratch[q], ef.parity, 0, a.rank);
    for (uint64_t u = first; u < units; u += stride) {
      putUnitLL8(slot, u, loadUnit8(src, u * 8, bytes), ef.flag);
    }
  }
  copyOwn(ctx, k, a);
  bool ok = true;
  for (int i = 1; i < a.nranks && ok; ++i) {
    const int q = (a.rank + a.nranks - i) % a.nranks;
    char* dst = copyTarget(k, a, q);
    if (dst == nullptr) continue;
    const LL8Packet* slot = packetSlot<LL8Packet>(a, self, ef.parity, 0, q);
    for (uint64_t u = first; u < units && ok; u += stride) {
      uint64_t v = 0;
      ok = readUnitLL8(ctx, w, slot, u, ef.flag, q, v);
      if (ok) storeUnit8(dst, u * 8, bytes, v);
    }
  }
  if (k == CopyKind::Broadcast) {
    for (uint32_t q = ctx.thread(); q < static_cast<uint32_t>(a.nranks) && ok; q += ctx.threads()) {
      if (static_cast<int>(q) == a.rank) continue;
      uint32_t v = 0;
      ok = w.packet(ctx, presence(self, static_cast<int>(q)), ef.flag, static_cast<int>(q), v);
    }
  }
  if (!ctx.syncAnd(ok)) return;
  endEpoch(ctx, a);
}

}  // namespace strata::cuda
