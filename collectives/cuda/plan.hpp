#pragma once

// Host-side planning shared by the module and the host emulation: the scratch layout for a
// configuration, and which kernel, grid and block serve a call. No CUDA here.

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "kernels.hpp"

namespace strata::cuda {

/// The collectives.cuda.* keys, parsed.
struct Tuning {
  uint64_t oneShotMax = 16 << 10;  ///< allReduce bytes per rank up to which one-shot LL8 runs
  uint64_t twoShotMax = 2 << 20;   ///< ... two-shot LL16 (above: direct)
  uint64_t packetsMax = 64 << 10;  ///< other ops: bytes per rank and peer for LL8
  uint64_t staging = 8 << 20;      ///< bytes of the direct algorithms' staging (2 chunks)
  uint32_t maxBlocks = 32;
  uint32_t threads = 512;
  uint64_t netChunk = 512 << 10;  ///< bytes of a bounce slot of the cross-host network step
};

/// The kernels' wait limit (KernelArgs::timeoutNs) from collectives.cuda.wait_limit seconds; 0:
/// never. Not transport.timeout: a rank may reach a call later than that, and that is no error.
inline uint64_t kernelWaitLimitNs(double seconds) {
  return seconds > 0 ? static_cast<uint64_t>(seconds * 1e9) : 0;
}

/// A GPU's UUID (cudaDeviceProp::uuid).
using GpuUuid = std::array<uint8_t, 16>;

/// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as nvidia-smi prints it.
inline std::string uuidText(const GpuUuid& u) {
  std::string out = "GPU-";
  char hex[3];
  for (size_t i = 0; i < u.size(); ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out += '-';
    std::snprintf(hex, sizeof hex, "%02x", u[i]);
    out += hex;
  }
  return out;
}

/// Why the module must not serve ranks that share a GPU, from every rank's GPU UUID (uuids[r]),
/// process (pids[r]) and whether every rank runs under MPS: two processes on one GPU without MPS
/// are time-sliced, so kernels that spin on each other cost a slice (milliseconds) per handshake
/// (NCCL refuses this layout). Ranks that are threads of one process share its context, whose
/// streams run at once. Empty: no two processes share a GPU, or MPS lets them run at once.
inline std::string sharedGpuProblem(const std::vector<GpuUuid>& uuids,
                                    const std::vector<int32_t>& pids, bool mps) {
  if (mps) return {};
  for (size_t a = 0; a < uuids.size(); ++a) {
    for (size_t b = a + 1; b < uuids.size(); ++b) {
      if (uuids[a] != uuids[b] || (a < pids.size() && b < pids.size() && pids[a] == pids[b])) {
        continue;
      }
      return "ranks " + std::to_string(a) + " and " + std::to_string(b) + " use the same GPU (" +
             uuidText(uuids[a]) +
             ") and no MPS daemon serves them: their kernels, which wait for each other, would "
             "be time-sliced (milliseconds per call; NCCL refuses this layout). Give each rank "
             "its own GPU (CUDA_VISIBLE_DEVICES or transport.cuda.device by local rank), or start "
             "MPS (nvidia-cuda-mps-control -d)";
    }
  }
  return {};
}

/// A layout big enough for the packet thresholds at nranks (both parities).
inline ScratchLayout layoutFor(const Tuning& t, int nranks) {
  const uint64_t n = static_cast<uint64_t>(nranks);
  // Slot bytes needed: one-shot 16 B of LL8 per 8 data bytes; two-shot 16 B of LL16 per 8 data
  // bytes of a 1/n segment; copies like one-shot; reduce-scatter like two-shot with the whole
  // per-rank block.
  const uint64_t seg = ScratchLayout::alignUp((t.twoShotMax + n - 1) / n, 8);
  const uint64_t slot = std::max({2 * ScratchLayout::alignUp(t.oneShotMax, 8), 2 * seg,
                                  2 * ScratchLayout::alignUp(t.packetsMax, 8)});
  ScratchLayout l;
  l.packetHalf = ScratchLayout::alignUp(2 * n * slot, 256);
  l.staging = ScratchLayout::alignUp(std::max<uint64_t>(t.staging, 16 * n * 16), 256);
  // Send/recv: the staging's size again, split over the peers.
  l.p2pPeer = ScratchLayout::alignUp(std::max<uint64_t>(t.staging / n, 1), 16 * kMaxBlocks);
  l.p2pPeers = n;
  return l;
}

/// Whether a packet kernel's per-slot data fits the layout.
inline bool fitsPackets(KernelId id, uint64_t bytes, int nranks, const ScratchLayout& l) {
  const uint64_t units = (bytes + 7) / 8, slot = l.slotBytes(nranks);
  switch (id) {
    case KernelId::AllReduceTwoShot:
      return ((units + nranks - 1) / nranks) * 16 <= slot;
    case KernelId::ReduceScatterPackets:
      return units * 16 <= slot;  // bytes: one block
    default:
      return units * 16 <= slot;  // LL8: two packets per 8 bytes
  }
}

/// Grid and block for a kernel and the bytes per rank it moves.
struct Shape {
  uint32_t blocks = 1;
  uint32_t threads = 1;
};

inline Shape shapeFor(KernelId id, uint64_t bytes, int nranks, const Tuning& t,
                      const ScratchLayout& l) {
  const uint64_t threads = std::clamp<uint32_t>(t.threads, 32, kMaxThreads);
  uint64_t work;  // units one thread handles once
  if (usesPackets(id)) {
    work = (bytes + 7) / 8;
  } else {
    // A chunk of the double-buffered staging (kernel_direct.hpp).
    const bool perRank = id == KernelId::AllToAllDirect || id == KernelId::ReduceScatterDirect;
    const uint64_t chunk =
        stagingUnits(l, id == KernelId::AllReduceDirect ? kAllReduceRegions : kCopyRegions,
                     perRank ? nranks : 1);
    work = std::min<uint64_t>((bytes + 15) / 16, chunk);
  }
  Shape s;
  s.threads = static_cast<uint32_t>(threads);
  s.blocks = static_cast<uint32_t>(std::clamp<uint64_t>(
      (work + threads - 1) / threads, 1, std::min<uint32_t>(t.maxBlocks, kMaxBlocks)));
  return s;
}

/// One send or receive of a batch (Communicator::sendRecv), in bytes.
struct P2pItem {
  bool send = true;
  int peer = -1;
  const char* src = nullptr;  ///< a send's data
  char* dst = nullptr;        ///< a receive's buffer
  uint64_t bytes = 0;
};

/// Batch launches: every piece runs with this many blocks (both sides of a pair must cut the
/// same rounds), so that a piece of p2pPieceBytes is exactly one round.
inline uint32_t p2pBatchBlocks(const Tuning& t) {
  return std::clamp<uint32_t>(t.maxBlocks, 1, kMaxBlocks);
}
inline uint64_t p2pPieceBytes(const Tuning& t, const ScratchLayout& l) {
  return p2pBatchBlocks(t) * l.p2pPartBytes();
}

/// The launches of a batch in stream order, each a piece of at most one round of an item (a
/// send kernel of one round returns once its data is staged; the next one to that peer waits
/// until the peer has read it). The items to each peer form one sequence of pieces per
/// direction (messages in order, each cut into rounds), and step k launches piece k of every
/// peer's send sequence, then piece k of every receive sequence. No rank waits for ever: by
/// induction on k, once every rank has finished step k-1, step k's sends wait only for reads
/// of step k-1 (done), and its receives only for the peers' step-k sends, which come before
/// their own step-k receives. Launching whole messages (all sends, then all receives) instead
/// deadlocks as soon as a message is larger than one round and the pattern has a cycle (the
/// emulation shows it: tests/cuda-emu, batch_*).
/// pieceBytes(peer): a round with that peer (the same on both sides of a pair).
template <class PieceBytes>
std::vector<P2pItem> p2pScheduleBy(const std::vector<P2pItem>& items, int nranks,
                                   PieceBytes&& pieceBytesOf) {
  const size_t n = static_cast<size_t>(nranks);
  std::vector<std::vector<P2pItem>> sends(n), recvs(n);
  size_t steps = 0;
  for (const P2pItem& it : items) {
    if (it.bytes == 0 || it.peer < 0 || static_cast<size_t>(it.peer) >= n) continue;
    auto& seq = (it.send ? sends : recvs)[static_cast<size_t>(it.peer)];
    const uint64_t pieceBytes = pieceBytesOf(it.peer);
    for (uint64_t off = 0; off < it.bytes; off += pieceBytes) {
      P2pItem piece = it;
      piece.bytes = std::min(pieceBytes, it.bytes - off);
      if (it.send) piece.src = it.src + off;
      if (!it.send) piece.dst = it.dst + off;
      seq.push_back(piece);
    }
    steps = std::max(steps, seq.size());
  }
  std::vector<P2pItem> out;
  for (size_t k = 0; k < steps; ++k) {
    for (const auto* dir : {&sends, &recvs}) {
      for (const auto& seq : *dir) {
        if (k < seq.size()) out.push_back(seq[k]);
      }
    }
  }
  return out;
}
inline std::vector<P2pItem> p2pSchedule(const std::vector<P2pItem>& items, int nranks,
                                        uint64_t pieceBytes) {
  return p2pScheduleBy(items, nranks, [&](int) { return pieceBytes; });
}

inline std::string toString(KernelId id) {
  switch (id) {
    case KernelId::AllReduceOneShot:
      return "allreduce-oneshot-ll8";
    case KernelId::AllReduceTwoShot:
      return "allreduce-twoshot-ll16";
    case KernelId::AllReduceDirect:
      return "allreduce-direct";
    case KernelId::ReduceScatterPackets:
      return "reducescatter-ll16";
    case KernelId::ReduceScatterDirect:
      return "reducescatter-direct";
    case KernelId::AllGatherPackets:
      return "allgather-ll8";
    case KernelId::AllGatherDirect:
      return "allgather-direct";
    case KernelId::BroadcastPackets:
      return "broadcast-ll8";
    case KernelId::BroadcastDirect:
      return "broadcast-direct";
    case KernelId::AllToAllPackets:
      return "alltoall-ll8";
    case KernelId::AllToAllDirect:
      return "alltoall-direct";
    case KernelId::Send:
      return "send-direct";
    case KernelId::Recv:
      return "recv-direct";
    case KernelId::NetReduce:
      return "net-reduce";
    case KernelId::NetGather:
      return "net-gather";
  }
  return "unknown";
}

}  // namespace strata::cuda
