#pragma once

// The cross-host collectives as sequences of launches on the caller's stream (host code): the
// one-host direct kernels among the ranks of a host, and the network step (kernel_net.hpp)
// among the ranks of one local index across the hosts. docs/collectives-cuda.md ("Across
// hosts") gives the algorithms; the host emulation (tests/cuda-emu/net_emu.cpp) runs exactly
// these launches.
//
// The ranks are placed on the hosts in any way (NetLayout maps a rank to its host and local
// index and back): where a host's ranks are not consecutive ranks (Slurm's
// --distribution=cyclic), the one-host kernels find each rank's block through KernelArgs::
// sendAt / recvAt, and allToAll's network step moves one block per launch. With the same count
// on every host, the network step runs between the ranks of each local index; with different
// counts, between each host's local rank 0 only, and allToAll is a grouped send/recv with every
// rank (byPairs). crossHostLayout and netUnsuitable say why a layout or a call is not served.

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <strata/error.hpp>

#include "kernels.hpp"
#include "plan.hpp"

namespace strata::cuda {

static_assert(kMaxHosts * kMaxRanks <= kMaxNetRanks, "NetState counts every rank");

/// Where this rank sits among the hosts, and where every rank does. Unless place() was given
/// the ranks of each host: the same count on every host (localRanks), host-major (rank = host x
/// localRanks + local).
struct NetLayout {
  int hosts = 1;
  /// The ranks of this rank's host (of every host when uniform).
  int localRanks = 1;
  int host = 0;
  int local = 0;
  /// Every rank's position (host h's ranks at startOf(h) .. startOf(h) + countOf(h) - 1, in
  /// local order) is its rank: Slurm's --distribution=block.
  bool hostMajor = true;
  /// Every host has localRanks ranks.
  bool uniform = true;
  /// Not host-major: rankAtPos[startOf(h) + l] is the rank of local index l on host h, and
  /// posOfRank[rank] that position.
  std::array<int16_t, kMaxNetRanks> rankAtPos{};
  std::array<int16_t, kMaxNetRanks> posOfRank{};
  /// Not uniform: host h's positions are firstPos[h] .. firstPos[h + 1] - 1.
  std::array<int16_t, kMaxHosts + 1> firstPos{};

  /// The ranks of host h.
  int countOf(int h) const { return uniform ? localRanks : firstPos[h + 1] - firstPos[h]; }
  /// The most ranks of any host.
  int mostPerHost() const {
    int most = 0;
    for (int h = 0; h < hosts; ++h) most = countOf(h) > most ? countOf(h) : most;
    return most;
  }
  int startOf(int h) const { return uniform ? h * localRanks : firstPos[h]; }
  int nranks() const { return uniform ? hosts * localRanks : firstPos[hosts]; }
  /// The rank of local index l on host h (l < countOf(h)).
  int rankOf(int h, int l) const {
    const int pos = startOf(h) + l;
    return hostMajor ? pos : rankAtPos[static_cast<size_t>(pos)];
  }
  int rank() const { return rankOf(host, local); }
  /// The host and the local index of rank r; -1 when there is no rank r.
  int hostOf(int r) const {
    if (!exists(r)) return -1;
    const int pos = position(r);
    if (uniform) return pos / localRanks;
    int h = 0;
    while (pos >= firstPos[h + 1]) ++h;
    return h;
  }
  int localOf(int r) const { return exists(r) ? position(r) - startOf(hostOf(r)) : -1; }
  bool exists(int r) const { return r >= 0 && r < nranks() && r < kMaxNetRanks; }
  /// startOf(h) + l for rank r of local index l on host h (r exists).
  int position(int r) const { return hostMajor ? r : posOfRank[static_cast<size_t>(r)]; }
  /// The same placement seen from local index l of host h.
  NetLayout at(int h, int l) const {
    NetLayout g = *this;
    g.host = h;
    g.local = l;
    g.localRanks = countOf(h);
    return g;
  }
  /// Places the ranks: groups[h][l] is the rank of local index l on host h (hosts groups of 1
  /// to kMaxRanks ranks, each rank of 0 .. nranks() - 1 once: the caller checked). localRanks
  /// becomes host's count.
  void place(const std::vector<std::vector<int>>& groups) {
    hostMajor = true;
    uniform = true;
    int pos = 0;
    for (int h = 0; h < hosts; ++h) {
      const auto& g = groups[static_cast<size_t>(h)];
      firstPos[static_cast<size_t>(h)] = static_cast<int16_t>(pos);
      if (g.size() != groups[0].size()) uniform = false;
      for (int r : g) {
        rankAtPos[static_cast<size_t>(pos)] = static_cast<int16_t>(r);
        posOfRank[static_cast<size_t>(r)] = static_cast<int16_t>(pos);
        if (r != pos) hostMajor = false;
        ++pos;
      }
    }
    firstPos[static_cast<size_t>(hosts)] = static_cast<int16_t>(pos);
    localRanks = static_cast<int>(groups[static_cast<size_t>(host)].size());
  }
};

/// Why ranks grouped by host (each group in rank order, groups by first rank) cannot run the
/// cross-host collectives; empty when they can. layout gets this rank's place.
inline std::string crossHostLayout(const std::vector<std::vector<int>>& groups, int rank,
                                   NetLayout* layout) {
  const int hosts = static_cast<int>(groups.size());
  if (hosts < 2) return "the ranks share one host";
  if (hosts > kMaxHosts) {
    return "the ranks span " + std::to_string(hosts) + " hosts, more than the " +
           std::to_string(kMaxHosts) + " the network step serves";
  }
  int n = 0;
  for (const auto& g : groups) {
    if (g.empty() || static_cast<int>(g.size()) > kMaxRanks) {
      return "a host has " + std::to_string(g.size()) + " ranks (1 to " +
             std::to_string(kMaxRanks) + " per host are served)";
    }
    n += static_cast<int>(g.size());
  }
  std::vector<bool> seen(static_cast<size_t>(n), false);
  NetLayout out;
  out.hosts = hosts;
  out.host = -1;
  for (int h = 0; h < hosts; ++h) {
    for (int l = 0; l < static_cast<int>(groups[h].size()); ++l) {
      const int r = groups[h][l];
      if (r < 0 || r >= n || seen[static_cast<size_t>(r)]) {
        return "the hosts' rank lists are not a partition of ranks 0 to " + std::to_string(n - 1);
      }
      seen[static_cast<size_t>(r)] = true;
      if (r == rank) {
        out.host = h;
        out.local = l;
      }
    }
  }
  if (out.host < 0) return "rank " + std::to_string(rank) + " is on none of the hosts";
  out.place(groups);
  *layout = out;
  return {};
}

enum class NetOp { AllReduce, AllGather, ReduceScatter, Broadcast, AllToAll, SendRecv };

/// One cross-host call as the caller states it (counts as the seam counts them: AllReduce and
/// Broadcast the whole buffer, AllGather, ReduceScatter and AllToAll one rank's block, SendRecv
/// each message). SendRecv: a send to sendTo and a receive from recvFrom (either may be -1; a
/// fused send/recv: both at once), ranks on other hosts. A peer of this rank's local index
/// takes its collective lane; any other takes the lane of its pair (NetPeers::addPairs), which
/// the caller passes in sendLane / recvLane.
struct NetCall {
  NetOp op = NetOp::AllReduce;
  ElemType type = ElemType::Float;
  RedOp redOp = RedOp::Sum;
  const void* send = nullptr;
  void* recv = nullptr;
  uint64_t count = 0;
  uint64_t elemSize = 1;
  int root = 0;                       ///< Broadcast: the root's rank
  int sendTo = -1;                    ///< SendRecv: the rank this rank sends to (-1: none)
  int recvFrom = -1;                  ///< SendRecv: the rank this rank receives from (-1: none)
  const NetLane* sendLane = nullptr;  ///< SendRecv: sendTo's pair, when not of this local index
  const NetLane* recvLane = nullptr;  ///< SendRecv: recvFrom's pair, likewise
  char* workspace = nullptr;          ///< netWorkspaceBytes() of device memory
};

struct PlannedLaunch {
  KernelId id = KernelId::NetReduce;
  ElemType type = ElemType::Uint8;
  KernelArgs args;
  /// The grid the launch needs (a send/recv piece on this host: both sides cut the same
  /// rounds); 0: the caller's choice.
  uint32_t blocks = 0;
};

/// Bytes of workspace a call needs.
inline uint64_t netWorkspaceBytes(const NetCall& c, const NetLayout& l) {
  if (!l.uniform) {
    return c.op == NetOp::ReduceScatter ? static_cast<uint64_t>(l.nranks()) * c.count * c.elemSize
                                        : 0;
  }
  if (c.op == NetOp::ReduceScatter && l.localRanks > 1) {
    return static_cast<uint64_t>(l.hosts) * c.count * c.elemSize;
  }
  if (c.op == NetOp::AllToAll) {
    return static_cast<uint64_t>(l.hosts) * l.localRanks * c.count * c.elemSize;
  }
  return 0;
}

/// Why a send/recv with rank peer cannot run across the hosts (empty: it can; -1: no peer).
inline std::string p2pPeerUnsuitable(int peer, const NetLayout& l) {
  if (peer < 0) return {};
  if (peer >= l.nranks()) return "peer rank " + std::to_string(peer) + " does not exist";
  if (peer == l.rank()) {
    return "send/recv of device memory to this rank itself (rank " + std::to_string(peer) +
           ") is not served";
  }
  return {};
}

/// Why call c cannot run across the hosts (empty: it can).
inline std::string netUnsuitable(const NetCall& c, const NetLayout& l) {
  if (c.op != NetOp::SendRecv) return {};
  for (int peer : {c.sendTo, c.recvFrom}) {
    if (std::string why = p2pPeerUnsuitable(peer, l); !why.empty()) return why;
  }
  return {};
}

/// Whether a send/recv peer needs a pair of its own (not this rank's collective lane).
inline bool needsPair(int peer, const NetLayout& l) {
  return peer >= 0 && l.hostOf(peer) != l.host && l.localOf(peer) != l.local;
}

/// Whether call c runs as a grouped send/recv with every other rank (allToAll with different
/// rank counts per host: each rank's block goes straight to its rank, as NCCL's all-to-all
/// does; the caller makes the pairs and plans it with planCrossHostBatch).
inline bool byPairs(const NetCall& c, const NetLayout& l) {
  return c.op == NetOp::AllToAll && !l.uniform;
}

/// The send/recv items of an allToAll by pairs on this rank: block q of send to rank q, block
/// q of recv from rank q, for every other rank q (planAllToAllByPairs copies its own).
inline std::vector<P2pItem> allToAllItems(const NetCall& c, const NetLayout& l) {
  std::vector<P2pItem> items;
  const uint64_t b = c.count * c.elemSize;
  const auto* send = static_cast<const char*>(c.send);
  auto* recv = static_cast<char*>(c.recv);
  for (int q = 0; q < l.nranks(); ++q) {
    if (q == l.rank() || b == 0) continue;
    const uint64_t at = static_cast<uint64_t>(q) * b;
    items.push_back({.send = true, .peer = q, .src = send + at, .bytes = b});
    items.push_back({.send = false, .peer = q, .dst = recv + at, .bytes = b});
  }
  return items;
}

/// A copy of bytes from src to dst on this rank alone (local: its one-host arguments): a
/// one-rank all-gather, which only copies its own block.
inline PlannedLaunch planSelfCopy(const KernelArgs& local, const void* src, void* dst,
                                  uint64_t bytes) {
  PlannedLaunch p;
  p.id = KernelId::AllGatherDirect;
  p.type = ElemType::Uint8;
  p.args = local;
  p.args.scratch[0] = local.scratch[local.rank];
  p.args.rank = 0;
  p.args.nranks = 1;
  p.args.send = src;
  p.args.recv = dst;
  p.args.count = bytes;
  p.args.elemSize = 1;
  return p;
}

/// The launches of call c on this rank. local: the one-host arguments of this rank (rank and
/// nranks its local ones, its host's scratch, state, abort record, timeout); net: the network
/// step's resources (bounce buffers, FIFO, channels, counters, peers).
inline std::vector<PlannedLaunch> planCrossHost(const NetCall& c, const NetLayout& l,
                                                const KernelArgs& local, const NetArgs& net) {
  std::vector<PlannedLaunch> out;
  if (byPairs(c, l)) {
    throw Error(ErrorCode::InvalidArgument,
                "allToAll with different rank counts per host runs as send/recv "
                "(planAllToAllByPairs), not planCrossHost");
  }
  if (c.count == 0) return out;
  out.reserve(kMaxHosts + kMaxRanks + 4);  // netLaunch and localLaunch hand out pointers into it
  const uint64_t es = c.elemSize;
  const auto* send = static_cast<const char*>(c.send);
  auto* recv = static_cast<char*>(c.recv);
  const uint32_t others = ((1u << l.hosts) - 1u) & ~(1u << l.host);
  // Inside a host Avg is a sum: the network step divides by every rank.
  const RedOp localOp = c.redOp == RedOp::Avg ? RedOp::Sum : c.redOp;
  // Block q of a one-host launch among host h's ranks: block rankOf(h, q) of the caller's
  // buffer (KernelArgs::sendAt / recvAt; identity: block q of the launch's pointer).
  auto ranksOf = [&](int h, int16_t* at) {
    for (int q = 0; q < l.localRanks; ++q) at[q] = static_cast<int16_t>(l.rankOf(h, q));
  };
  auto identity = [&](int16_t* at) {
    for (int q = 0; q < l.localRanks; ++q) at[q] = static_cast<int16_t>(q);
  };
  auto localLaunch = [&](KernelId id, const void* s, void* r, uint64_t count, RedOp op,
                         int peer = -1) -> KernelArgs& {
    PlannedLaunch p;
    p.id = id;
    p.type = c.type;
    p.args = local;
    p.args.send = s;
    p.args.recv = r;
    p.args.count = count;
    p.args.elemSize = es;
    p.args.op = op;
    p.args.peer = peer;
    out.push_back(p);
    return out.back().args;
  };
  auto netLaunch = [&](KernelId id, uint32_t sendMask, uint32_t recvMask, uint64_t bytes) {
    PlannedLaunch p;
    p.id = id;
    p.type = id == KernelId::NetReduce ? c.type : ElemType::Uint8;
    p.args = local;
    p.args.op = c.redOp;
    p.args.count = bytes / es;
    p.args.elemSize = es;
    p.args.net = net;
    p.args.net.host = l.host;
    p.args.net.hosts = l.hosts;
    p.args.net.ranksTotal = l.nranks();
    p.args.net.sendMask = sendMask;
    p.args.net.recvMask = recvMask;
    p.args.net.bytes = bytes;
    // Lane h: the rank of this local index on host h (-1: host h has none).
    for (int h = 0; h < l.hosts; ++h) {
      p.args.net.lane[h].peer = l.local < l.countOf(h) ? l.rankOf(h, l.local) : -1;
    }
    out.push_back(p);
    return &out.back().args.net;
  };
  if (!l.uniform && c.op != NetOp::SendRecv) {
    // Different rank counts per host: through each host's local rank 0 (its leader; every
    // host has one), the network step among the leaders only.
    const bool leader = l.local == 0;
    const int L = l.localRanks;
    const uint64_t b = c.count * es;
    // All-reduce of count elements from in into out: in the host, the leaders' all-reduce
    // across, broadcast in the host.
    auto allReduceByLeaders = [&](const char* in, char* to, uint64_t count) {
      const char* s = in;
      if (L > 1) {
        localLaunch(KernelId::AllReduceDirect, in, to, count, localOp);
        s = to;
      }
      if (leader) {
        NetArgs* n = netLaunch(KernelId::NetReduce, others, others, count * es);
        for (int h = 0; h < l.hosts; ++h) n->src[h] = s;
        n->dst[l.host] = to;
      }
      if (L > 1) localLaunch(KernelId::BroadcastDirect, to, to, count, localOp, 0);
    };
    switch (c.op) {
      case NetOp::AllReduce:
        allReduceByLeaders(send, recv, c.count);
        break;
      case NetOp::Broadcast: {
        // On the root's host to its leader first (unless the root leads), across the leaders,
        // then in every other host (and the root's, when the root leads).
        const int rootHost = l.hostOf(c.root), rootLocal = l.localOf(c.root);
        const bool isRoot = c.root == l.rank();
        const bool first = l.host == rootHost && rootLocal != 0;
        if (first) {
          localLaunch(KernelId::BroadcastDirect, isRoot ? send : recv, recv, c.count, localOp,
                      rootLocal);
        }
        if (leader) {
          NetArgs* n = l.host == rootHost ? netLaunch(KernelId::NetGather, others, 0, b)
                                          : netLaunch(KernelId::NetGather, 0, 1u << rootHost, b);
          for (int h = 0; h < l.hosts; ++h) n->src[h] = isRoot ? send : recv;
          n->dst[rootHost] = recv;
        }
        if (!first && (L > 1 || (isRoot && c.send != c.recv))) {
          localLaunch(KernelId::BroadcastDirect, isRoot ? send : recv, recv, c.count, localOp, 0);
        }
        break;
      }
      case NetOp::AllGather: {
        // The host's blocks in the host, each at its rank's place; the leaders exchange their
        // hosts' blocks (launch q: every host's block of local index q); the leader's whole
        // output to the host.
        auto at = [&](int h, int q) { return recv + static_cast<uint64_t>(l.rankOf(h, q)) * b; };
        KernelArgs& a = localLaunch(KernelId::AllGatherDirect, send, recv, c.count, localOp);
        a.placed = true;
        ranksOf(l.host, a.recvAt);
        if (leader) {
          for (int q = 0; q < l.mostPerHost(); ++q) {
            uint32_t from = 0;
            for (int h = 0; h < l.hosts; ++h) {
              if (h != l.host && q < l.countOf(h)) from |= 1u << h;
            }
            NetArgs* n = netLaunch(KernelId::NetGather, q < L ? others : 0, from, b);
            for (int h = 0; h < l.hosts; ++h) {
              if (q < L) n->src[h] = at(l.host, q);
              if (from >> h & 1u) n->dst[h] = at(h, q);
            }
          }
        }
        if (L > 1) {
          localLaunch(KernelId::BroadcastDirect, recv, recv, c.count * l.nranks(), localOp, 0);
        }
        break;
      }
      case NetOp::ReduceScatter:
        // allReduce of the whole input into the workspace, then this rank's block of it.
        allReduceByLeaders(send, c.workspace, c.count * l.nranks());
        out.push_back(
            planSelfCopy(local, c.workspace + static_cast<uint64_t>(l.rank()) * b, recv, b));
        break;
      case NetOp::AllToAll:
      case NetOp::SendRecv:
        break;  // by pairs (refused above); send/recv below
    }
    return out;
  }
  switch (c.op) {
    case NetOp::AllReduce: {
      // Reduce-scatter inside the host, the shard across the hosts, all-gather inside the
      // host; a tail of fewer than localRanks elements: all-reduce inside, then across.
      const uint64_t shard = l.localRanks > 1 ? c.count / l.localRanks : 0;
      const uint64_t done = shard * l.localRanks;
      if (shard > 0) {
        char* mine = recv + l.local * shard * es;
        localLaunch(KernelId::ReduceScatterDirect, send, mine, shard, localOp);
        NetArgs* n = netLaunch(KernelId::NetReduce, others, others, shard * es);
        for (int h = 0; h < l.hosts; ++h) n->src[h] = mine;
        n->dst[l.host] = mine;
        localLaunch(KernelId::AllGatherDirect, mine, recv, shard, localOp);
      }
      if (c.count > done) {
        const char* s = send + done * es;
        char* r = recv + done * es;
        if (l.localRanks > 1) {
          localLaunch(KernelId::AllReduceDirect, s, r, c.count - done, localOp);
          s = r;
        }
        NetArgs* n = netLaunch(KernelId::NetReduce, others, others, (c.count - done) * es);
        for (int h = 0; h < l.hosts; ++h) n->src[h] = s;
        n->dst[l.host] = r;
      }
      break;
    }
    case NetOp::AllGather: {
      // Across the hosts first (rank (h, local) gets every host's block of its local index),
      // then one all-gather inside the host per host, each block at its rank's place.
      const uint64_t b = c.count * es;
      auto at = [&](int h, int q) { return recv + static_cast<uint64_t>(l.rankOf(h, q)) * b; };
      NetArgs* n = netLaunch(KernelId::NetGather, others, others, b);
      for (int h = 0; h < l.hosts; ++h) {
        n->src[h] = send;
        n->dst[h] = at(h, l.local);
      }
      for (int h = 0; h < l.hosts; ++h) {
        if (l.localRanks == 1 && h != l.host) continue;  // already in place
        KernelArgs& a = localLaunch(KernelId::AllGatherDirect, h == l.host ? send : at(h, l.local),
                                    recv, c.count, localOp);
        a.placed = true;
        ranksOf(h, a.recvAt);
      }
      break;
    }
    case NetOp::ReduceScatter: {
      // Inside the host, the blocks of every host's ranks; across the hosts, each rank's block
      // from the ranks of its local index.
      const uint64_t b = c.count * es;
      auto partial = [&](int h) -> const char* {
        return l.localRanks > 1 ? c.workspace + h * b
                                : send + static_cast<uint64_t>(l.rankOf(h, 0)) * b;
      };
      if (l.localRanks > 1) {
        for (int h = 0; h < l.hosts; ++h) {
          KernelArgs& a = localLaunch(KernelId::ReduceScatterDirect, send, c.workspace + h * b,
                                      c.count, localOp);
          a.placed = true;
          ranksOf(h, a.sendAt);
        }
      }
      NetArgs* n = netLaunch(KernelId::NetReduce, others, others, b);
      for (int h = 0; h < l.hosts; ++h) n->src[h] = partial(h);
      n->dst[l.host] = recv;
      break;
    }
    case NetOp::Broadcast: {
      // The root to the ranks of its local index on the other hosts, then inside every host
      // from that local index.
      const int rootHost = l.hostOf(c.root), rootLocal = l.localOf(c.root);
      const bool isRoot = c.root == l.rank();
      if (l.local == rootLocal) {
        NetArgs* n = l.host == rootHost
                         ? netLaunch(KernelId::NetGather, others, 0, c.count * es)
                         : netLaunch(KernelId::NetGather, 0, 1u << rootHost, c.count * es);
        for (int h = 0; h < l.hosts; ++h) n->src[h] = send;
        n->dst[rootHost] = recv;
      }
      if (l.localRanks > 1 || (isRoot && c.send != c.recv)) {
        localLaunch(KernelId::BroadcastDirect, isRoot ? c.send : recv, recv, c.count, localOp,
                    rootLocal);
      }
      break;
    }
    case NetOp::AllToAll: {
      // Across the hosts, the blocks for host h's ranks go to (h, local), into block h of the
      // workspace (host h's blocks for local index q at q); then on every host one all-to-all
      // among its ranks per source host h, what local index q sent landing at rank (h, q)'s
      // place. Host-major, host h's blocks are one piece of the send buffer (one launch);
      // otherwise they are apart, a launch per local index.
      const uint64_t b = c.count * es;
      const uint64_t hostBlock = b * l.localRanks;
      const int pieces = l.hostMajor ? 1 : l.localRanks;
      for (int q = 0; q < pieces; ++q) {
        NetArgs* n = netLaunch(KernelId::NetGather, others, others, hostBlock / pieces);
        for (int h = 0; h < l.hosts; ++h) {
          n->src[h] = send + static_cast<uint64_t>(l.rankOf(h, q)) * b;
          n->dst[h] = c.workspace + h * hostBlock + q * b;
        }
      }
      for (int h = 0; h < l.hosts; ++h) {
        KernelArgs& a =
            localLaunch(KernelId::AllToAllDirect, h == l.host ? send : c.workspace + h * hostBlock,
                        recv, c.count, localOp);
        a.placed = true;
        if (h == l.host) {
          ranksOf(h, a.sendAt);
        } else {
          identity(a.sendAt);
        }
        ranksOf(h, a.recvAt);
      }
      break;
    }
    case NetOp::SendRecv: {
      // Lane 0: the send's peer; lane 1 the receive's (lane 0 too when it is the same rank).
      auto laneOf = [&](int peer, const NetLane* pair) {
        const int host = l.hostOf(peer);
        if (host < 0) {
          throw Error(ErrorCode::InvalidArgument,
                      "cross-host send/recv: no rank " + std::to_string(peer));
        }
        if (host == l.host) {
          throw Error(ErrorCode::InvalidArgument,
                      "cross-host send/recv: rank " + std::to_string(peer) +
                          " shares this rank's host (planCrossHostBatch serves it)");
        }
        if (!needsPair(peer, l)) {
          NetLane lane = net.lane[host];
          lane.peer = peer;
          return lane;
        }
        if (pair == nullptr || pair->peer != peer) {
          throw Error(ErrorCode::InvalidArgument,
                      "cross-host send/recv: rank " + std::to_string(peer) +
                          " is not of this rank's local index and has no pair lane");
        }
        return *pair;
      };
      const bool same = c.sendTo >= 0 && c.sendTo == c.recvFrom;
      const uint32_t to = c.sendTo >= 0 ? 1u : 0u;
      const uint32_t from = c.recvFrom < 0 ? 0u : same ? 1u : 2u;
      NetArgs* n = netLaunch(KernelId::NetGather, to, from, c.count * es);
      n->host = -1;  // no lane of its own: nothing is folded
      n->hosts = 2;
      for (NetLane& lane : n->lane) lane = NetLane{};
      if (c.sendTo >= 0) {
        n->lane[0] = laneOf(c.sendTo, c.sendLane);
        n->src[0] = send;
      }
      if (c.recvFrom >= 0) {
        const int at = same ? 0 : 1;
        n->lane[at] = laneOf(c.recvFrom, c.recvLane);
        n->dst[at] = recv;
      }
      break;
    }
  }
  return out;
}

/// A send/recv batch when the ranks span several hosts (a Send, a Recv, or Communicator::
/// sendRecv's items, with any other ranks). One send and one receive of equal size (or only
/// one of them), both with ranks of other hosts, are one NetGather launch (its chunks each way
/// wait only for the other side's earlier ones). Anything else runs as pieces of at most one
/// round per peer in p2pSchedule's order (step k: piece k of every send, then of every
/// receive), so that a batch with a cycle cannot wait on itself: with a rank of this host, the
/// one-host Send/Recv kernels (a round: localBlocks x the P2P part, the grid localBlocks on
/// both sides); with a rank of another host, a NetGather of at most two bounce slots (a send's
/// chunk waits for the ack of the chunk two before it, which its receiver gave in an earlier
/// step). pairLane(rank): the lane of that rank's pair (needsPair), or nullptr.
template <class PairLane>
std::vector<PlannedLaunch> planCrossHostBatch(const std::vector<P2pItem>& items, const NetLayout& l,
                                              const KernelArgs& local, const NetArgs& net,
                                              uint32_t localBlocks, PairLane&& pairLane) {
  std::vector<PlannedLaunch> out;
  const P2pItem* onlySend = nullptr;
  const P2pItem* onlyRecv = nullptr;
  int sends = 0, recvs = 0;
  for (const P2pItem& it : items) {
    if (it.bytes == 0) continue;
    if (it.peer < 0 || it.peer >= l.nranks() || it.peer == l.rank()) {
      throw Error(ErrorCode::InvalidArgument,
                  "cross-host send/recv: no rank " + std::to_string(it.peer) + " to exchange with");
    }
    if (it.send) {
      ++sends;
      onlySend = &it;
    } else {
      ++recvs;
      onlyRecv = &it;
    }
  }
  auto remote = [&](int peer) { return l.hostOf(peer) != l.host; };
  auto netPiece = [&](const P2pItem* snd, const P2pItem* rcv, uint64_t bytes) {
    NetCall c;
    c.op = NetOp::SendRecv;
    c.type = ElemType::Uint8;
    c.elemSize = 1;
    c.count = bytes;
    if (snd != nullptr) {
      c.send = snd->src;
      c.sendTo = snd->peer;
      if (needsPair(snd->peer, l)) c.sendLane = pairLane(snd->peer);
    }
    if (rcv != nullptr) {
      c.recv = rcv->dst;
      c.recvFrom = rcv->peer;
      if (needsPair(rcv->peer, l)) c.recvLane = pairLane(rcv->peer);
    }
    for (PlannedLaunch& p : planCrossHost(c, l, local, net)) out.push_back(p);
  };
  if (sends + recvs == 0) return out;
  if (sends <= 1 && recvs <= 1 && (onlySend == nullptr || remote(onlySend->peer)) &&
      (onlyRecv == nullptr || remote(onlyRecv->peer)) &&
      (onlySend == nullptr || onlyRecv == nullptr || onlySend->bytes == onlyRecv->bytes)) {
    netPiece(onlySend, onlyRecv, onlySend != nullptr ? onlySend->bytes : onlyRecv->bytes);
    return out;
  }
  const uint64_t localPiece = static_cast<uint64_t>(localBlocks) * local.layout.p2pPartBytes();
  const uint64_t netPieceBytes = 2 * net.chunk;
  if (localPiece == 0 || netPieceBytes == 0) {
    throw Error(ErrorCode::InvalidArgument, "cross-host send/recv: no P2P slots or bounce slots");
  }
  const std::vector<P2pItem> pieces = p2pScheduleBy(
      items, l.nranks(), [&](int peer) { return remote(peer) ? netPieceBytes : localPiece; });
  for (const P2pItem& piece : pieces) {
    if (remote(piece.peer)) {
      netPiece(piece.send ? &piece : nullptr, piece.send ? nullptr : &piece, piece.bytes);
      continue;
    }
    PlannedLaunch p;
    p.id = piece.send ? KernelId::Send : KernelId::Recv;
    p.type = ElemType::Uint8;
    p.args = local;
    p.args.send = piece.src;
    p.args.recv = piece.dst;
    p.args.count = piece.bytes;
    p.args.elemSize = 1;
    p.args.peer = l.localOf(piece.peer);
    p.blocks = localBlocks;
    out.push_back(p);
  }
  return out;
}

/// An allToAll by pairs (byPairs) on this rank: its own block copied, then send/recvs with
/// every other rank (allToAllItems, whose pairs the caller made) as planCrossHostBatch plans
/// them.
template <class PairLane>
std::vector<PlannedLaunch> planAllToAllByPairs(const NetCall& c, const NetLayout& l,
                                               const KernelArgs& local, const NetArgs& net,
                                               uint32_t localBlocks, PairLane&& pairLane) {
  std::vector<PlannedLaunch> out;
  const uint64_t b = c.count * c.elemSize;
  if (b == 0) return out;
  const uint64_t at = static_cast<uint64_t>(l.rank()) * b;
  out.push_back(planSelfCopy(local, static_cast<const char*>(c.send) + at,
                             static_cast<char*>(c.recv) + at, b));
  for (const PlannedLaunch& p : planCrossHostBatch(allToAllItems(c, l), l, local, net, localBlocks,
                                                   std::forward<PairLane>(pairLane))) {
    out.push_back(p);
  }
  return out;
}

}  // namespace strata::cuda
