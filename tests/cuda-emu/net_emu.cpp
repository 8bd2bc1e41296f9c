// cuda-net-emu: the cross-host CUDA collectives (collectives/cuda/net_plan.hpp and
// kernel_net.hpp) with their kernel bodies in host threads, over the real proxy FIFO, the real
// ProxyService and a real transport between processes (fabric tcp;ofi_rxm in the tests).
//
// One process per host (strata-run -n H, or srun -N H -n H across the namespace nodes), each
// emulating L local ranks (tests/cuda-emu/emu.hpp: blocks of threads, weak memory over the
// scratch and the bounce buffers); host memory stands in for device memory, so the bounce
// path's copies are host copies. Every process runs the same calls in the same order and checks
// its own ranks' results, bit for bit, against a reference folded in the algorithm's order
// (inside each host in local order, then over the hosts in host order; for integer types this
// is the rank-order fold too, and is checked against it).
//
// usage: cuda-net-emu [--local L[,L1,...]] [--chunk BYTES] [--quick] [--seed S] [--timeout SECONDS]
//                     [--cut] [--stall-report] [--layout block|cyclic]
//   --local  ranks per host: one count for every host, or one per host (different counts: the
//          network step between the hosts' local ranks 0, allToAll as send/recvs).
//   --layout cyclic  places rank l x H + h at local index l of host h (Slurm's
//          --distribution=cyclic) instead of h x L + l: every op runs, each rank's block of
//          allGather, reduceScatter and allToAll at its rank's place (the send/recv patterns,
//          defined by host and local index, are other ranks then).
//   --cut  runs calls until one fails (a test cuts the link between the hosts meanwhile), then
//          prints what each local rank reported and exits 0 when one names a rank on another
//          host, 1 otherwise.
//   --stall-report  prints this host's network counts and collective semaphores whenever
//          nothing moved for 3, 6, 9 ... s, and when it moves again (diagnosing a stall).
//   --timeout  the kernels' wait limit (default 20 s).
// A failure prints each local rank's launch and network counts when the first rank gave up and
// when the monitor stopped the others.
// Exit status: 0 passed, 1 failed.

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <strata/bootstrap.hpp>
#include <strata/config.hpp>
#include <strata/transport.hpp>

#include "collectives/cuda/net_plan.hpp"
#include "collectives/cuda/net_setup.hpp"
#include "collectives/cuda/plan.hpp"
#include "tests/cuda-emu/emu.hpp"
#include "tests/harness/reference_fold.hpp"

using namespace strata;
using namespace strata::cuda;
using strata::cuda::emu::Launch;
using strata::cuda::emu::World;

namespace {

/// Blocks of a one-host launch at most (each launch draws 1 to this many).
constexpr uint32_t kMostBlocks = 3;
/// The grid of send/recv pieces between ranks of one host (p2pBatchBlocks in the module).
constexpr uint32_t kP2pBlocks = 2;

struct Options {
  /// Ranks per host: locals[0] on every host, or locals[h] on host h.
  std::vector<int> locals{2};
  uint64_t chunk = 4096;
  bool quick = false;
  bool cut = false;
  uint64_t seed = 1;
  double timeout = 20;
  bool stallReport = false;
  /// The ranks' placement: host-major (rank = h x L + l), or cyclic (rank = l x H + h: Slurm's
  /// --distribution=cyclic).
  bool cyclic = false;
};

/// The ranks of host h.
int localsOf(const Options& o, int h) {
  return o.locals.size() == 1 ? o.locals[0] : o.locals[static_cast<size_t>(h)];
}

/// Every rank placed as o says (this rank: local index 0 of host 0). Cyclic: local index l of
/// every host that has one, in host order, before local index l + 1 (rank l x H + h when the
/// counts are equal).
NetLayout placed(const Options& o, int hosts) {
  std::vector<std::vector<int>> groups(static_cast<size_t>(hosts));
  int most = 0, next = 0;
  for (int hh = 0; hh < hosts; ++hh) most = std::max(most, localsOf(o, hh));
  if (o.cyclic) {
    for (int ll = 0; ll < most; ++ll) {
      for (int hh = 0; hh < hosts; ++hh) {
        if (ll < localsOf(o, hh)) groups[hh].push_back(next++);
      }
    }
  } else {
    for (int hh = 0; hh < hosts; ++hh) {
      for (int ll = 0; ll < localsOf(o, hh); ++ll) groups[hh].push_back(next++);
    }
  }
  NetLayout g;
  g.hosts = hosts;
  g.place(groups);
  return g;
}

const ElemType kTypes[] = {ElemType::Int8,  ElemType::Uint8,  ElemType::Int32, ElemType::Uint32,
                           ElemType::Int64, ElemType::Uint64, ElemType::Half,  ElemType::BFloat16,
                           ElemType::Float, ElemType::Double};
const RedOp kOps[] = {RedOp::Sum, RedOp::Prod, RedOp::Min, RedOp::Max, RedOp::Avg};

DataType dataType(ElemType t) {
  return static_cast<DataType>(static_cast<int>(t));
}
size_t elemSize(ElemType t) {
  return testing::elemSize(dataType(t));
}

const char* opName(NetOp op) {
  switch (op) {
    case NetOp::AllReduce:
      return "allreduce";
    case NetOp::AllGather:
      return "allgather";
    case NetOp::ReduceScatter:
      return "reducescatter";
    case NetOp::Broadcast:
      return "broadcast";
    case NetOp::AllToAll:
      return "alltoall";
    case NetOp::SendRecv:
      break;
  }
  return "sendrecv";
}

/// The fold of one element in the algorithm's order: each host's ranks in local order (rounded
/// to the type when the host has several ranks: the one-host kernels store their result), then
/// the hosts in host order, Avg dividing by every rank, one rounding at the end.
template <class T, class A>
void foldHierarchical(ReduceOp op, const std::vector<const char*>& in, size_t i, const NetLayout& g,
                      char* out, A (*load)(const char*), void (*store)(A, char*)) {
  const ReduceOp inner = op == ReduceOp::Avg ? ReduceOp::Sum : op;
  const int hosts = g.hosts;
  A total{};
  for (int h = 0; h < hosts; ++h) {
    const int local = g.countOf(h);
    A part = load(in[g.rankOf(h, 0)] + i * sizeof(T));
    for (int l = 1; l < local; ++l) {
      part = testing::fold<A>(inner, part, load(in[g.rankOf(h, l)] + i * sizeof(T)));
    }
    if (local > 1) {  // the host's partial result is stored as T
      char tmp[sizeof(T)];
      store(part, tmp);
      part = load(tmp);
    }
    total = h == 0 ? part : testing::fold<A>(inner, total, part);
  }
  if (op == ReduceOp::Avg) total = static_cast<A>(total / static_cast<A>(g.nranks()));
  store(total, out + i * sizeof(T));
}

template <class T>
T loadT(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <class T>
void storeT(T v, char* p) {
  std::memcpy(p, &v, sizeof v);
}
float loadHalf(const char* p) {
  return collectives::halfToFloat(loadT<uint16_t>(p));
}
void storeHalf(float v, char* p) {
  storeT<uint16_t>(collectives::floatToHalf(v), p);
}
float loadBf16(const char* p) {
  return collectives::bf16ToFloat(loadT<uint16_t>(p));
}
void storeBf16(float v, char* p) {
  storeT<uint16_t>(collectives::floatToBf16(v), p);
}

void reference(ElemType t, RedOp op, const std::vector<const char*>& in, size_t count,
               const NetLayout& g, char* out) {
  const auto r = static_cast<ReduceOp>(static_cast<int>(op));
  for (size_t i = 0; i < count; ++i) {
    switch (t) {
#define STRATA_REF(E, T)                                             \
  case ElemType::E:                                                  \
    foldHierarchical<T, T>(r, in, i, g, out, &loadT<T>, &storeT<T>); \
    break;
      STRATA_REF(Int8, int8_t)
      STRATA_REF(Uint8, uint8_t)
      STRATA_REF(Int32, int32_t)
      STRATA_REF(Uint32, uint32_t)
      STRATA_REF(Int64, int64_t)
      STRATA_REF(Uint64, uint64_t)
      STRATA_REF(Float, float)
      STRATA_REF(Double, double)
#undef STRATA_REF
      case ElemType::Half:
        foldHierarchical<uint16_t, float>(r, in, i, g, out, &loadHalf, &storeHalf);
        break;
      case ElemType::BFloat16:
        foldHierarchical<uint16_t, float>(r, in, i, g, out, &loadBf16, &storeBf16);
        break;
    }
  }
}

bool integral(ElemType t) {
  return t != ElemType::Half && t != ElemType::BFloat16 && t != ElemType::Float &&
         t != ElemType::Double;
}

const char* const kPatternNames[] = {"ring",  "one way", "shift", "crossed",
                                     "snake", "local",   "cycle", "all"};

struct Case {
  NetOp op = NetOp::AllReduce;
  ElemType type = ElemType::Float;
  RedOp redOp = RedOp::Sum;
  uint64_t count = 0;
  int root = 0;
  bool inPlace = false;
  /// SendRecv: who sends to whom.
  ///   Ring: to (h + 1, l), from (h - 1, l), fused (the collective lanes);
  ///   OneWay: host 0's rank l to host 1's rank l;
  ///   Shift: to (h + 1, l + 1), from (h - 1, l - 1), fused (at L > 1 every peer is of another
  ///     local index: pairs of their own);
  ///   Crossed: host 0's rank l to host 1's rank L - 1 - l (pairs, one way);
  ///   Snake: one cycle through every rank, position q at host q mod H, local index
  ///     (q / H + q mod H) mod L: consecutive ranks on different hosts, some of the same local
  ///     index and some not (at H = 2 a rank sends on a pair and receives on its collective lane,
  ///     or the other way round), fused.
  ///   Local: to (h, l + 1), from (h, l - 1) (the one-host kernels; at L = 1 a ring);
  ///   Cycle: rank r to r + 1, from r - 1: inside each host, and across at the hosts' edges
  ///     (a rank there sends to one host and receives from its own: pieces, step by step);
  ///   All: every rank to and from every other (a grouped all-to-all of send/recvs), the block
  ///     from rank q at q in the output.
  /// Different counts per host: Shift without wrapping the local index, Crossed among the local
  /// indices both hosts have, Snake through local index 0 of every host, then 1, ..., and Local
  /// nothing on a host of one rank (peers()).
  enum Pattern { Ring, OneWay, Shift, Crossed, Snake, Local, Cycle, All, kPatterns };
  int pattern = Ring;

  /// SendRecv: the items of rank r's batch, in order: (a send?, the peer).
  std::vector<std::pair<bool, int>> items(int r, const NetLayout& g) const {
    std::vector<std::pair<bool, int>> out;
    const int n = g.nranks();
    if (pattern == All) {
      for (int q = 0; q < n; ++q) {
        if (q == r) continue;
        out.push_back({true, q});
        out.push_back({false, q});
      }
      return out;
    }
    int to = -1, from = -1;
    peers(r, g, &to, &from);
    if (to >= 0) out.push_back({true, to});
    if (from >= 0) out.push_back({false, from});
    return out;
  }

  /// The peers of the one-send-one-receive patterns (-1: nobody); (h, l) is local index l of
  /// host h, whichever rank that is in g's placement. With different counts per host a pattern
  /// leaves out what does not exist (see each), so that a send always has its receive.
  void peers(int r, const NetLayout& g, int* to, int* from) const {
    const int hosts = g.hosts;
    const int h = g.hostOf(r), l = g.localOf(r);
    const int local = g.countOf(h);
    const int n = g.nranks();
    auto at = [&](int hh, int ll) { return ll >= 0 && ll < g.countOf(hh) ? g.rankOf(hh, ll) : -1; };
    *to = -1;
    *from = -1;
    switch (pattern == Local && local == 1 && g.uniform ? Ring : pattern) {
      case Local:  // a host of one rank (different counts): nothing
        if (local > 1) {
          *to = at(h, (l + 1) % local);
          *from = at(h, (l + local - 1) % local);
        }
        break;
      case Cycle:
        *to = (r + 1) % n;
        *from = (r + n - 1) % n;
        break;
      case All:
      case kPatterns:
        break;
      case Ring:
        *to = at((h + 1) % hosts, l);
        *from = at((h + hosts - 1) % hosts, l);
        break;
      case OneWay:
        if (h == 0) *to = at(1, l);
        if (h == 1) *from = at(0, l);
        break;
      case Shift:
        if (g.uniform) {
          *to = at((h + 1) % hosts, (l + 1) % local);
          *from = at((h + hosts - 1) % hosts, (l + local - 1) % local);
        } else {
          *to = at((h + 1) % hosts, l + 1);
          *from = at((h + hosts - 1) % hosts, l - 1);
        }
        break;
      case Crossed: {
        const int m = std::min(g.countOf(0), g.countOf(1));
        if (h == 0 && l < m) *to = at(1, m - 1 - l);
        if (h == 1 && l < m) *from = at(0, m - 1 - l);
        break;
      }
      case Snake: {
        if (g.uniform) {
          auto snake = [&](int q) {
            q = ((q % n) + n) % n;
            const int qh = q % hosts;
            return at(qh, (q / hosts + qh) % local);
          };
          for (int q = 0; q < n; ++q) {
            if (snake(q) != r) continue;
            *to = snake(q + 1);
            *from = snake(q - 1);
          }
          break;
        }
        // Different counts: local index 0 of every host in host order, then 1, ...
        std::vector<int> seq;
        for (int ll = 0; ll < g.mostPerHost(); ++ll) {
          for (int hh = 0; hh < hosts; ++hh) {
            if (ll < g.countOf(hh)) seq.push_back(g.rankOf(hh, ll));
          }
        }
        for (int q = 0; q < n; ++q) {
          if (seq[q] != r) continue;
          *to = seq[(q + 1) % n];
          *from = seq[(q + n - 1) % n];
        }
        break;
      }
    }
  }

  std::string describe() const {
    return std::string(opName(op)) + " type " + std::to_string(static_cast<int>(type)) + " op " +
           std::to_string(static_cast<int>(redOp)) + " count " + std::to_string(count) +
           (op == NetOp::Broadcast ? " root " + std::to_string(root) : "") +
           (op == NetOp::SendRecv ? std::string(" pattern ") + kPatternNames[pattern] : "") +
           (inPlace ? " in place" : "");
  }
};

/// One process: its L emulated ranks, their network peers and the world of one host.
class Host {
 public:
  Host(const Options& o, std::shared_ptr<Context> ctx)
      : o_(o),
        ctx_(std::move(ctx)),
        hosts_(ctx_->size()),
        host_(ctx_->rank()),
        placement_(placed(o, hosts_)),
        L_(placement_.countOf(host_)) {
    Tuning t;
    t.oneShotMax = 1024;
    t.twoShotMax = 4096;
    t.packetsMax = 1024;
    t.staging = 2048;
    // Small staging (many chunks per one-host call), but P2P rounds of 1 KiB (parts of 512 B,
    // kP2pBlocks blocks): rounds of staging / L would cut a send/recv batch into launches of
    // 32-64 B, hundreds per call (cuda-net-emu-2x4 took 31 s instead of 11 here).
    ScratchLayout layout = layoutFor(t, L_);
    layout.p2pPeer = 512 * kMaxBlocks;
    world_ = std::make_unique<World>(L_, layout, static_cast<uint64_t>(o.timeout * 1e9),
                                     o.seed * 7919 + static_cast<uint64_t>(host_));
    world_->preload();
    world_->onFirstAbort = [this](int l) {
      firstAbortCounts_ = "network counts when rank " + std::to_string(rankOf(host_, l)) +
                          " gave up (its launch has ended):\n" + netCounts();
    };
    words_.assign(static_cast<size_t>(2 * L_), 0);
    pairLanes_.resize(static_cast<size_t>(L_));
    states_.resize(static_cast<size_t>(L_));
    std::memset(states_.data(), 0, states_.size() * sizeof(NetState));
    // One set of peers per local rank, made in local-rank order on every host (collective): the
    // process of each host that has local index l (its Context rank is its host).
    for (int l = 0; l < L_; ++l) {
      std::vector<int> peerOf(static_cast<size_t>(hosts_));
      for (int h = 0; h < hosts_; ++h) peerOf[h] = l < placement_.countOf(h) ? h : -1;
      peers_.push_back(std::make_unique<NetPeers>(*ctx_, peerOf, host_, o.chunk, o.timeout));
      NetPeers& p = *peers_.back();
      world_->addWeakRange(p.sendBounce(), p.bounceBytes());
      world_->addWeakRange(p.recvBounce(), p.bounceBytes());
      net_.push_back(p.args(p.hostViews(&words_[2 * l], &states_[l])));
    }
  }

  int hosts() const { return hosts_; }
  int host() const { return host_; }
  int nranks() const { return placement_.nranks(); }
  /// This host's ranks.
  int localRanks() const { return L_; }
  const NetLayout& placement() const { return placement_; }
  /// Local index l of host h in the placement.
  NetLayout layout(int h, int l) const { return placement_.at(h, l); }
  int rankOf(int h, int l) const { return placement_.rankOf(h, l); }
  /// Pairs this host's ranks made (send/recv peers of another local index).
  int pairs() const {
    int n = 0;
    for (const auto& m : pairLanes_) n += static_cast<int>(m.size());
    return n;
  }

  /// Runs cases back to back (one stream per rank) and checks them; false on the first failure
  /// (printed). slowRank: a local rank of this host that sleeps now and then (-1: none).
  bool run(const std::vector<Case>& cases, int slowRank, std::string* failure) {
    const int L = L_;
    const int n = nranks();
    std::vector<Buffers> bufs(cases.size());
    std::vector<std::vector<Launch>> perRank(static_cast<size_t>(L));
    makePairs(cases);
    where_.assign(static_cast<size_t>(L), {});
    for (size_t c = 0; c < cases.size(); ++c) {
      const Case& k = cases[c];
      const size_t es = elemSize(k.type);
      Buffers& b = bufs[c];
      // Every rank's input, the same on every host.
      const bool blocks = k.op == NetOp::ReduceScatter || k.op == NetOp::AllToAll;
      const uint64_t inCount = blocks ? k.count * n : k.count;
      const bool gathers = k.op == NetOp::AllGather || k.op == NetOp::AllToAll ||
                           (k.op == NetOp::SendRecv && k.pattern == Case::All);
      const uint64_t outCount = gathers ? k.count * n : k.count;
      for (int r = 0; r < n; ++r) {
        std::mt19937_64 rng(o_.seed * 1000003 + c * 131 + static_cast<uint64_t>(r));
        b.input.push_back(testing::randomData(rng, dataType(k.type), inCount));
      }
      b.expect = expected(k, b.input);
      for (int l = 0; l < L; ++l) {
        const NetLayout layout = this->layout(host_, l);
        const int rank = layout.rank();
        b.send.emplace_back(b.input[rank]);
        b.recv.emplace_back(outCount * es, static_cast<char>(0x5a));
        NetCall call;
        call.op = k.op;
        call.type = k.type;
        call.redOp = k.redOp;
        call.count = k.count;
        call.elemSize = es;
        call.root = k.root;
        b.work.emplace_back(netWorkspaceBytes(call, layout));
        call.workspace = b.work[l].data();
        call.send = b.send[l].data();
        call.recv = b.recv[l].data();
        if (k.inPlace) {
          // NCCL's in-place forms: the input inside the output.
          char* out = b.recv[l].data();
          const size_t inBytes = b.input[rank].size();
          size_t at = 0;
          if (k.op == NetOp::AllGather) at = rank * k.count * es;
          if (k.op == NetOp::ReduceScatter) {
            b.recv[l].assign(inBytes, 0);  // the output is block `rank` of the input buffer
            out = b.recv[l].data();
            std::memcpy(out, b.input[rank].data(), inBytes);
            call.send = out;
            call.recv = out + rank * k.count * es;
          } else if (k.op != NetOp::Broadcast || rank == k.root) {
            std::memcpy(out + at, b.input[rank].data(), inBytes);
            call.send = out + at;
          } else {
            call.send = out;
          }
        }
        b.outAt.push_back(
            static_cast<size_t>(static_cast<const char*>(call.recv) - b.recv[l].data()));
        // The one-host launches of a call have the same grid on every rank of the host (their
        // semaphores are per block), as the module's are; a random one per call and launch.
        uint64_t localLaunches = 0;
        std::vector<PlannedLaunch> planned;
        if (k.op == NetOp::SendRecv) {
          // The batch's items: sends from the input, receives into the output (All: the block
          // of rank q at q).
          std::vector<P2pItem> items;
          for (auto [isSend, peer] : k.items(rank, layout)) {
            P2pItem it;
            it.send = isSend;
            it.peer = peer;
            it.src = b.send[l].data();
            it.dst = b.recv[l].data() + (k.pattern == Case::All ? peer * k.count * es : 0);
            it.bytes = k.count * es;
            items.push_back(it);
          }
          planned = planCrossHostBatch(items, layout, world_->args(l), net_[l], kP2pBlocks,
                                       [&](int peer) { return &pairLanes_[l].at(peer); });
        } else if (byPairs(call, layout)) {
          // Different counts per host: this rank's own block, then send/recvs with every rank.
          planned = planAllToAllByPairs(call, layout, world_->args(l), net_[l], kP2pBlocks,
                                        [&](int peer) { return &pairLanes_[l].at(peer); });
        } else {
          planned = planCrossHost(call, layout, world_->args(l), net_[l]);
        }
        for (const PlannedLaunch& p : planned) {
          Launch x;
          x.run = true;
          x.id = p.id;
          x.type = p.type;
          x.args = p.args;
          const bool net = p.id == KernelId::NetReduce || p.id == KernelId::NetGather;
          std::mt19937_64 shape(o_.seed * 31 + c * 8191 + (net ? 4096 : localLaunches++));
          x.blocks = net ? 1 : 1 + static_cast<uint32_t>(shape() % kMostBlocks);
          if (p.blocks != 0) x.blocks = p.blocks;  // a send/recv piece: both sides' grid
          x.threads = 2 + static_cast<uint32_t>(shape() % 4);
          perRank[l].push_back(x);
          where_[l].push_back({c, static_cast<int>(p.id)});
        }
      }
    }
    // calls[j][l]: rank l's j-th launch.
    size_t most = 0;
    for (auto& v : perRank) most = std::max(most, v.size());
    std::vector<std::vector<Launch>> calls(most, std::vector<Launch>(static_cast<size_t>(L)));
    for (int l = 0; l < L; ++l) {
      for (size_t j = 0; j < perRank[l].size(); ++j) calls[j][l] = perRank[l][j];
    }
    std::vector<std::vector<Launch>*> seq;
    for (auto& c : calls) seq.push_back(&c);

    firstAbortCounts_.clear();
    stopCounts_.clear();
    begunBefore_.clear();
    for (int l = 0; l < L; ++l) begunBefore_.push_back(world_->rank(l).begun.load());
    for (auto& p : peers_) p->proxy().beginDeviceWork();
    std::atomic<bool> done{false};
    std::thread monitor([&] { watch(done); });
    world_->run(seq, slowRank);
    done = true;
    monitor.join();
    for (auto& p : peers_) p->proxy().endDeviceWork();

    if (std::string why = aborts(); !why.empty()) {
      *failure = why + firstAbortCounts_ + "network counts when the monitor stopped the ranks:\n" +
                 stopCounts_;
      return false;
    }
    for (size_t c = 0; c < cases.size(); ++c) {
      const Case& k = cases[c];
      const size_t es = elemSize(k.type);
      for (int l = 0; l < L; ++l) {
        const int rank = rankOf(host_, l);
        const std::vector<char>& want = bufs[c].expect[rank];
        const char* got = bufs[c].recv[l].data() + bufs[c].outAt[l];
        for (size_t i = 0; i < want.size(); i += es) {
          if (std::memcmp(got + i, want.data() + i, es) != 0) {
            char msg[256];
            std::snprintf(msg, sizeof msg, "%s: rank %d element %zu differs from the reference",
                          k.describe().c_str(), rank, i / es);
            *failure = msg;
            return false;
          }
        }
        if (k.op == NetOp::AllReduce && integral(k.type)) {
          // Integer folds do not depend on the order: the rank-order reference too.
          std::vector<const char*> in;
          for (auto& v : bufs[c].input) in.push_back(v.data());
          std::vector<char> flat(want.size());
          testing::reference(dataType(k.type), static_cast<ReduceOp>(static_cast<int>(k.redOp)), in,
                             k.count, flat.data());
          if (std::memcmp(flat.data(), got, want.size()) != 0) {
            *failure = k.describe() + ": differs from the rank-order reference";
            return false;
          }
        }
      }
    }
    return true;
  }

  /// The pairs the send/recvs of cases need that do not exist yet, made as the module makes
  /// them on first use (NetPeers::addPairs), in the order of (lower rank, higher rank) on every
  /// process: each process makes those of its ranks, one peer at a time.
  void makePairs(const std::vector<Case>& cases) {
    std::set<std::pair<int, int>> want;
    for (const Case& k : cases) {
      NetCall call;
      call.op = k.op;
      const bool everyRank = byPairs(call, placement_);  // allToAll as send/recvs
      if (k.op != NetOp::SendRecv && !everyRank) continue;
      for (int r = 0; r < nranks(); ++r) {
        const NetLayout layout = this->layout(placement_.hostOf(r), placement_.localOf(r));
        std::vector<std::pair<bool, int>> items;
        if (everyRank) {
          for (int q = 0; q < nranks(); ++q) {
            if (q != r) items.push_back({true, q});
          }
        } else {
          items = k.items(r, layout);
        }
        for (auto [isSend, peer] : items) {
          if (needsPair(peer, layout)) want.insert({std::min(r, peer), std::max(r, peer)});
        }
      }
    }
    for (auto [a, b] : want) {
      for (auto [me, peer] : {std::pair{a, b}, std::pair{b, a}}) {
        if (placement_.hostOf(me) != host_) continue;
        const int l = placement_.localOf(me);
        if (pairLanes_[l].contains(peer)) continue;
        peers_[l]->addPairs(*ctx_, {placement_.hostOf(peer)}, {peer});
        const NetPeers::Pair& p = *peers_[l]->pair(peer);
        world_->addWeakRange(static_cast<char*>(p.send.data()), p.send.size());
        world_->addWeakRange(static_cast<char*>(p.recv.data()), p.recv.size());
        pairLanes_[l][peer] = peers_[l]->pairLane(p);
      }
    }
  }

  /// What each local rank's abort record says; empty when none gave up.
  std::string aborts() {
    std::string out;
    for (int l = 0; l < L_; ++l) {
      const AbortRecord& ab = world_->rank(l).abort;
      const uint64_t code = __atomic_load_n(&ab.code, __ATOMIC_ACQUIRE);
      if (code == 0) continue;
      const int rank = rankOf(host_, l);
      const int peer =
          ab.peer < 0 ? static_cast<int>(-1 - ab.peer) : rankOf(host_, static_cast<int>(ab.peer));
      const int peerHost = placement_.hostOf(peer);
      char msg[256];
      std::snprintf(
          msg, sizeof msg,
          "rank %d (host %d): %s waiting for rank %lld (host %d, %s), expected %llu, "
          "saw %llu\n",
          rank, host_, code == AbortRecord::Timeout ? "timed out" : "stopped",
          static_cast<long long>(peer), peerHost, peerHost == host_ ? "this host" : "another host",
          static_cast<unsigned long long>(ab.expected), static_cast<unsigned long long>(ab.seen));
      out += msg;
    }
    return out;
  }

  /// Each local rank's place and network counts, to compare with the other hosts' after a
  /// failure: the launch it is in (the call and KernelId), the chunks it sent to and consumed
  /// from each host (NetState), the data and ack counters the peers' proxies raised here, its
  /// FIFO's pushes and the triggers its proxy executed.
  std::string netCounts() {
    std::string out;
    for (int l = 0; l < L_; ++l) {
      const uint64_t* flags = peers_[l]->flags();
      const uint64_t begun = world_->rank(l).begun.load(std::memory_order_relaxed);
      std::string at = "launch " + std::to_string(begun - begunBefore_[l]);
      if (begun > begunBefore_[l] && begun - begunBefore_[l] <= where_[l].size()) {
        const auto& w = where_[l][begun - begunBefore_[l] - 1];
        at += " (call " + std::to_string(w.first) + ", kernel " + std::to_string(w.second) + ")";
      }
      out += "  rank " + std::to_string(rankOf(host_, l)) + " in " + at + ": pushed " +
             std::to_string(__atomic_load_n(&words_[2 * l], __ATOMIC_ACQUIRE)) + ", executed " +
             std::to_string(peers_[l]->proxy().executed());
      auto counts = [&](int peer, const uint64_t* data, const uint64_t* acks) {
        return ": sent " +
               std::to_string(__atomic_load_n(&states_[l].sent[peer], __ATOMIC_RELAXED)) +
               " received " +
               std::to_string(__atomic_load_n(&states_[l].received[peer], __ATOMIC_RELAXED)) +
               " data in " + std::to_string(__atomic_load_n(data, __ATOMIC_ACQUIRE)) + " acks in " +
               std::to_string(__atomic_load_n(acks, __ATOMIC_ACQUIRE));
      };
      for (int h = 0; h < hosts_; ++h) {
        if (h == host_ || l >= placement_.countOf(h)) continue;
        out += "; host " + std::to_string(h) +
               counts(rankOf(h, l), &flags[NetPeers::dataFlag(h) / 8],
                      &flags[NetPeers::ackFlag(h) / 8]);
      }
      for (const auto& [peer, lane] : pairLanes_[l]) {
        out += "; pair with rank " + std::to_string(peer) + counts(peer, lane.dataIn, lane.ackIn);
      }
      out += "\n";
    }
    return out;
  }

  /// A network wait (naming a rank on another host) among the records, timed out or stopped.
  /// Stopped counts too: which rank of a host times out first is a race. When a rank that had
  /// already moved on to a step inside the host started waiting for a local rank before that
  /// rank began its network wait, the local wait times out first and stops the network wait,
  /// whose record still names the rank on the other host (CI, stop 41: "rank 1 timed out
  /// waiting for rank 0 (this host)", "rank 0 stopped waiting for rank 2 (another host)").
  bool namesRemoteRank() {
    for (int l = 0; l < L_; ++l) {
      const AbortRecord& ab = world_->rank(l).abort;
      const uint64_t code = __atomic_load_n(&ab.code, __ATOMIC_ACQUIRE);
      if ((code == AbortRecord::Timeout || code == AbortRecord::Stopped) && ab.peer < 0 &&
          placement_.hostOf(static_cast<int>(-1 - ab.peer)) != host_) {
        return true;
      }
    }
    return false;
  }

 private:
  struct Buffers {
    std::vector<std::vector<char>> input;             ///< every rank's
    std::vector<std::vector<char>> expect;            ///< every rank's output
    std::vector<std::vector<char>> send, recv, work;  ///< this host's ranks'
    std::vector<size_t> outAt;                        ///< where the output starts in recv
  };

  std::vector<std::vector<char>> expected(const Case& k,
                                          const std::vector<std::vector<char>>& in) const {
    const int n = nranks();
    const size_t es = elemSize(k.type);
    std::vector<std::vector<char>> out(static_cast<size_t>(n));
    std::vector<const char*> ptrs;
    for (auto& v : in) ptrs.push_back(v.data());
    switch (k.op) {
      case NetOp::AllReduce: {
        std::vector<char> r(k.count * es);
        reference(k.type, k.redOp, ptrs, k.count, placement_, r.data());
        for (auto& o : out) o = r;
        break;
      }
      case NetOp::ReduceScatter:
        for (int q = 0; q < n; ++q) {
          std::vector<const char*> blocks;
          for (auto* p : ptrs) blocks.push_back(p + q * k.count * es);
          out[q].resize(k.count * es);
          reference(k.type, k.redOp, blocks, k.count, placement_, out[q].data());
        }
        break;
      case NetOp::AllGather: {
        std::vector<char> r;
        for (auto& v : in) r.insert(r.end(), v.begin(), v.end());
        for (auto& o : out) o = r;
        break;
      }
      case NetOp::Broadcast:
        for (auto& o : out) o = in[k.root];
        break;
      case NetOp::AllToAll:
        for (int r = 0; r < n; ++r) {
          for (int q = 0; q < n; ++q) {
            const char* blk = in[q].data() + r * k.count * es;
            out[r].insert(out[r].end(), blk, blk + k.count * es);
          }
        }
        break;
      case NetOp::SendRecv:
        for (int r = 0; r < n; ++r) {
          if (k.pattern == Case::All) {
            // Block q from rank q; this rank's own block keeps the output's fill.
            for (int q = 0; q < n; ++q) {
              if (q == r) {
                out[r].insert(out[r].end(), k.count * es, static_cast<char>(0x5a));
              } else {
                out[r].insert(out[r].end(), in[q].begin(), in[q].end());
              }
            }
            continue;
          }
          int to = -1, from = -1;
          k.peers(r, placement_, &to, &from);
          if (from >= 0) out[r] = in[from];  // else nothing to check
        }
        break;
    }
    return out;
  }

  /// Each local rank's collective semaphores with each local peer, per block (of the
  /// kMostBlocks a one-host launch here may have): the signals that came in and those its waits
  /// consumed or claimed (a wait in progress has claimed one more than came).
  std::string localSemaphores() {
    std::string out;
    for (int l = 0; l < L_; ++l) {
      strata::cuda::emu::Rank& r = world_->rank(l);
      out += "  local rank " + std::to_string(l) + ":";
      for (uint32_t b = 0; b < kMostBlocks; ++b) {
        out += " block " + std::to_string(b) + " [";
        for (int q = 0; q < L_; ++q) {
          if (q == l) continue;
          const auto* in = reinterpret_cast<const uint64_t*>(
              r.scratch + ScratchLayout::kSemaphores + (b * kMaxRanks + q) * 8);
          out += " from " + std::to_string(q) + ": in " +
                 std::to_string(__atomic_load_n(in, __ATOMIC_RELAXED)) + " claimed " +
                 std::to_string(__atomic_load_n(&r.state[b].expected[q], __ATOMIC_RELAXED));
        }
        out += " ]";
      }
      out += "\n";
    }
    return out;
  }

  /// The module's monitor: a rank that gave up, or a proxy error, stops every rank's waits.
  /// With --stall-report it also prints the host's counts whenever none moved for 3, 6, 9 ...
  /// s, and when they move again.
  void watch(const std::atomic<bool>& done) {
    std::string last;
    auto lastChange = std::chrono::steady_clock::now();
    int reports = 0;
    while (!done) {
      if (o_.stallReport) {
        std::string now = netCounts() + localSemaphores();
        const auto t = std::chrono::steady_clock::now();
        if (now != last) {
          if (reports > 0) {
            std::fprintf(stderr, "cuda-net-emu: host %d: moving again after %d s\n", host_,
                         3 * reports);
          }
          last = std::move(now);
          lastChange = t;
          reports = 0;
        } else if (t - lastChange > std::chrono::seconds(3 * (reports + 1))) {
          ++reports;
          std::fprintf(stderr, "cuda-net-emu: host %d: nothing moved for %d s:\n%s", host_,
                       3 * reports, now.c_str());
        }
      }
      bool stop = false;
      for (int l = 0; l < L_ && !stop; ++l) {
        stop = __atomic_load_n(&world_->rank(l).abortClaim, __ATOMIC_ACQUIRE) != 0;
        try {
          peers_[l]->proxy().check();
        } catch (const Error&) {
          stop = true;
        }
      }
      if (stop) {
        stopCounts_ = netCounts();
        for (int l = 0; l < L_; ++l) world_->stop(l);
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  Options o_;
  std::shared_ptr<Context> ctx_;
  int hosts_, host_;
  NetLayout placement_;  ///< every rank's host and local index (placed(o_, hosts_))
  int L_ = 1;            ///< this host's ranks
  std::unique_ptr<World> world_;
  std::vector<uint64_t> words_;
  std::vector<NetState> states_;
  std::vector<std::unique_ptr<NetPeers>> peers_;
  std::vector<NetArgs> net_;
  /// Per local rank: the lanes of its pairs (send/recv peers of another local index), by rank.
  std::vector<std::map<int, NetLane>> pairLanes_;
  // Diagnostics of a failed batch (netCounts()): when the first rank gave up, and when the
  // monitor stopped the others (by then the rank that gave up may have run on: its later waits
  // fail at once, but pushes and waits that need no waiting still go through).
  std::string firstAbortCounts_, stopCounts_;
  std::vector<uint64_t> begunBefore_;  ///< per local rank: launches begun before this batch
  /// Per local rank, per launch of the batch: its call and KernelId (as a number).
  std::vector<std::vector<std::pair<size_t, int>>> where_;
};

/// The sweep: every op, type and reduction at odd and multi-chunk counts, in place and not,
/// then mixed calls back to back and the same with a slow rank.
/// g: the placement (the same on every host, so every process makes the same calls).
std::vector<std::vector<Case>> batches(const Options& o, const NetLayout& g) {
  const int nranks = g.nranks();
  const auto most = static_cast<uint64_t>(g.mostPerHost());
  std::vector<std::vector<Case>> out;
  // 0 stands for "more than one chunk per peer" (the bytes each rank sends across the hosts).
  const std::vector<uint64_t> counts =
      o.quick ? std::vector<uint64_t>{1, 13, 0} : std::vector<uint64_t>{1, 3, most * 5 + 1, 257, 0};
  for (NetOp op : {NetOp::AllReduce, NetOp::ReduceScatter, NetOp::AllGather, NetOp::Broadcast,
                   NetOp::AllToAll, NetOp::SendRecv}) {
    for (ElemType t : kTypes) {
      std::vector<Case> batch;
      const bool reduces = op == NetOp::AllReduce || op == NetOp::ReduceScatter;
      const uint64_t perPeer = op == NetOp::AllReduce ? o.chunk * most : o.chunk;
      // send/recv: more than two network pieces (of two slots each) per message.
      const uint64_t big =
          op == NetOp::SendRecv ? perPeer * 5 / elemSize(t) + 5 : perPeer * 3 / 2 / elemSize(t) + 5;
      for (RedOp r : kOps) {
        if (!reduces && r != RedOp::Sum) continue;
        for (uint64_t count : counts) {
          // Large counts: every type for allReduce, two types for the others (emulation time).
          if (count == 0 && op != NetOp::AllReduce && t != ElemType::Int8 && t != ElemType::Float) {
            continue;
          }
          if (count == 0) count = big;
          Case c;
          c.op = op;
          c.type = t;
          c.redOp = r;
          c.count = count;
          c.root = static_cast<int>((count + static_cast<uint64_t>(r)) % nranks);
          const bool inPlaceForm = op != NetOp::AllToAll && op != NetOp::SendRecv;
          c.inPlace = inPlaceForm && (count + static_cast<uint64_t>(t)) % 2 == 1;
          c.pattern = static_cast<int>((count + static_cast<uint64_t>(t)) % Case::kPatterns);
          batch.push_back(c);
        }
      }
      out.push_back(batch);
    }
  }
  return out;
}

std::vector<Case> mixed(const Options& o, const NetLayout& g, uint64_t seed, int calls) {
  const int nranks = g.nranks();
  std::mt19937_64 rng(seed);
  std::vector<Case> out;
  for (int i = 0; i < calls; ++i) {
    Case c;
    c.op = static_cast<NetOp>(rng() % 6);
    c.type = kTypes[rng() % 10];
    c.redOp = kOps[rng() % 5];
    c.count = 1 + rng() % (o.chunk / 2);
    c.root = static_cast<int>(rng() % nranks);
    c.inPlace = c.op != NetOp::AllToAll && c.op != NetOp::SendRecv && rng() % 2 == 0;
    c.pattern = static_cast<int>(rng() % Case::kPatterns);
    out.push_back(c);
  }
  return out;
}

int usage() {
  std::fprintf(stderr,
               "usage: cuda-net-emu [--local L[,L1,...]] [--chunk BYTES] [--quick] [--seed S] "
               "[--timeout SECONDS] [--cut] [--stall-report] [--layout block|cyclic]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool hasValue = i + 1 < argc;
    if (a == "--local" && hasValue) {
      o.locals.clear();
      const std::string v = argv[++i];
      for (size_t at = 0; at <= v.size();) {
        const size_t comma = std::min(v.find(',', at), v.size());
        o.locals.push_back(std::atoi(v.substr(at, comma - at).c_str()));
        at = comma + 1;
      }
    } else if (a == "--chunk" && hasValue) {
      o.chunk = std::strtoull(argv[++i], nullptr, 10);
    } else if (a == "--seed" && hasValue) {
      o.seed = std::strtoull(argv[++i], nullptr, 10);
    } else if (a == "--timeout" && hasValue) {
      o.timeout = std::atof(argv[++i]);
    } else if (a == "--quick") {
      o.quick = true;
    } else if (a == "--cut") {
      o.cut = true;
    } else if (a == "--stall-report") {
      o.stallReport = true;
    } else if (a == "--layout" && hasValue) {
      const std::string v = argv[++i];
      if (v != "block" && v != "cyclic") return usage();
      o.cyclic = v == "cyclic";
    } else {
      return usage();
    }
  }
  for (int l : o.locals) {
    if (l < 1 || l > kMaxRanks) return usage();
  }
  if (o.chunk < 16 || o.chunk % 16 != 0 || o.timeout <= 0) return usage();
  if (const char* q = std::getenv("STRATA_EMU_QUICK"); q != nullptr && *q == '1') o.quick = true;
  try {
    const Config cfg = Config::load();
    auto ctx = Context::create(Bootstrap::create(cfg), cfg);
    if (ctx->size() < 2 || ctx->size() > kMaxHosts) {
      std::fprintf(stderr, "cuda-net-emu: needs 2 to %d processes (one per host), got %d\n",
                   kMaxHosts, ctx->size());
      return 1;
    }
    if (o.locals.size() != 1 && static_cast<int>(o.locals.size()) != ctx->size()) {
      std::fprintf(stderr, "cuda-net-emu: --local names %zu hosts' counts, there are %d hosts\n",
                   o.locals.size(), ctx->size());
      return 1;
    }
    Host host(o, ctx);
    const std::string who = "cuda-net-emu: host " + std::to_string(host.host()) + ": ";
    std::string failure;
    if (o.cut) {
      // Calls until one fails (the test cuts the link); then what every local rank reported.
      const auto start = std::chrono::steady_clock::now();
      for (uint64_t i = 0;; ++i) {
        if (!host.run(mixed(o, host.placement(), o.seed + i, 8), -1, &failure)) break;
        if (i == 0) std::printf("%srunning\n", who.c_str());
        std::fflush(stdout);
      }
      const double took =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::printf("%sa call failed after %.1f s:\n%s", who.c_str(), took, failure.c_str());
      const bool ok = host.namesRemoteRank();
      std::printf("%s%s\n", who.c_str(),
                  ok ? "a rank gave up waiting for a rank on another host"
                     : "FAIL: no rank named a rank on another host");
      std::fflush(stdout);
      // The link is down: leave without the teardown's goodbyes to the other host.
      std::_Exit(ok ? 0 : 1);
    }
    const NetLayout& g = host.placement();
    std::string counts = std::to_string(g.countOf(0));
    for (int h = 1; h < g.hosts; ++h) {
      if (!g.uniform) counts += "+" + std::to_string(g.countOf(h));
    }
    int calls = 0;
    for (const auto& batch : batches(o, g)) {
      if (!host.run(batch, -1, &failure)) {
        std::printf("%sFAIL: %s\n", who.c_str(), failure.c_str());
        std::fflush(stdout);
        std::_Exit(1);
      }
      calls += static_cast<int>(batch.size());
    }
    const int rounds = o.quick ? 2 : 6;
    for (int i = 0; i < rounds; ++i) {
      // Back to back, mixed ops, types and algorithms; every other round with a slow rank on
      // host 1.
      const int slow = i % 2 == 1 && host.host() == 1 ? host.localRanks() - 1 : -1;
      const auto cases = mixed(o, g, o.seed * 977 + static_cast<uint64_t>(i), 24);
      if (!host.run(cases, slow, &failure)) {
        std::printf("%sFAIL (mixed round %d%s): %s\n", who.c_str(), i,
                    slow >= 0 ? ", slow rank" : "", failure.c_str());
        std::fflush(stdout);
        std::_Exit(1);
      }
      calls += static_cast<int>(cases.size());
    }
    std::printf(
        "%s%d calls on %d hosts x %s ranks, %s placement (chunk %llu B, %d send/recv pairs of "
        "another local index) passed\n",
        who.c_str(), calls, host.hosts(), counts.c_str(), o.cyclic ? "cyclic" : "host-major",
        static_cast<unsigned long long>(o.chunk), host.pairs());
    ctx->bootstrap().barrier();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cuda-net-emu: %s\n", e.what());
    return 1;
  }
}
