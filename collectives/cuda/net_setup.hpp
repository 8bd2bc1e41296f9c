#pragma once

// The network step's resources of one rank (kernel_net.hpp, docs/collectives-cuda.md "Across
// hosts"): a connection to the rank of the same local index on every other host that has one,
// the send and receive bounce buffers and the counter words (host memory registered with the
// Context, which the fabric transport writes), and a ProxyService with two PortChannels per peer
// (data: puts into the peer's receive bounce and raises its data counter; ack: raises its ack
// counter). Creation is collective among those peers. A send/recv to a rank of another host that is
// not of this rank's local index gets a pair of its own on first use (addPairs, collective with
// that rank only): a connection, two slots each way, two counter words and two channels on the
// running proxy. The CUDA module maps the bounce buffers, the
// counters and the proxy FIFO into the GPU (cudaHostRegister); the host emulation
// (tests/cuda-emu/net_emu.cpp) uses them as they are.

#include <algorithm>
#include <deque>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <strata/channel.hpp>
#include <strata/error.hpp>
#include <strata/transport.hpp>

#include "net_args.hpp"

namespace strata::cuda {

class NetPeers {
 public:
  /// Counter words: data from host h at 8 h, acks from host h at 8 (kMaxHosts + h).
  static constexpr uint64_t kFlagBytes = 2 * kMaxHosts * 8;
  static constexpr uint64_t dataFlag(int h) { return 8 * static_cast<uint64_t>(h); }
  static constexpr uint64_t ackFlag(int h) { return 8 * static_cast<uint64_t>(kMaxHosts + h); }

  /// peerOf[h]: the Context rank of host h's peer (peerOf[host] is ignored; -1: host h has no
  /// rank of this local index, so no lane). chunk: bytes per bounce slot (a multiple of 16).
  /// timeoutSeconds bounds the proxy's flushes.
  NetPeers(Context& ctx, const std::vector<int>& peerOf, int host, uint64_t chunk,
           double timeoutSeconds, uint32_t fifoEntries = 1024)
      : hosts_(static_cast<int>(peerOf.size())), host_(host), chunk_(chunk) {
    if (hosts_ < 2 || hosts_ > kMaxHosts || host < 0 || host >= hosts_ || chunk == 0 ||
        chunk % 16 != 0) {
      throw Error(ErrorCode::InvalidArgument,
                  "network step: " + std::to_string(hosts_) + " hosts (2 to " +
                      std::to_string(kMaxHosts) + "), host " + std::to_string(host) + ", chunk " +
                      std::to_string(chunk) + " bytes (a multiple of 16)");
    }
    std::vector<int> peers;
    for (int h = 0; h < hosts_; ++h) {
      lane_[h] = h != host && peerOf[h] >= 0;
      if (lane_[h]) peers.push_back(peerOf[h]);
    }
    if (!peers.empty()) conns_ = ctx.connect(peers);
    const uint64_t bounce = 2 * static_cast<uint64_t>(hosts_) * chunk;
    sendBounce_ = ctx.allocate(bounce);
    recvBounce_ = ctx.allocate(bounce);
    flags_ = ctx.allocate(kFlagBytes);
    std::vector<RegisteredMemory> recvs, flags;
    if (!peers.empty()) {
      recvs = ctx.exchange(recvBounce_, peers);
      flags = ctx.exchange(flags_, peers);
    }
    proxy_ = std::make_unique<ProxyService>(fifoEntries, timeoutSeconds);
    proxy_->pinTo(ctx.proxyCpus());  // near this rank's NIC (transport.proxy_cpus)
    size_t i = 0;
    for (int h = 0; h < hosts_; ++h) {
      if (!lane_[h]) continue;
      data_[h] = proxy_->addChannel(conns_[i], recvs[i], sendBounce_, flags[i], dataFlag(host));
      ack_[h] = proxy_->addChannel(conns_[i], recvs[i], sendBounce_, flags[i], ackFlag(host));
      ++i;
    }
    proxy_->start();
  }
  ~NetPeers() { proxy_->stop(); }
  NetPeers(const NetPeers&) = delete;
  NetPeers& operator=(const NetPeers&) = delete;

  ProxyService& proxy() { return *proxy_; }
  int hosts() const { return hosts_; }
  int host() const { return host_; }
  uint64_t chunk() const { return chunk_; }
  /// Host memory a kernel reads and writes (the CUDA module registers these as mapped).
  char* sendBounce() const { return static_cast<char*>(sendBounce_.data()); }
  char* recvBounce() const { return static_cast<char*>(recvBounce_.data()); }
  uint64_t* flags() const { return static_cast<uint64_t*>(flags_.data()); }
  uint64_t bounceBytes() const { return sendBounce_.size(); }

  /// Adds a pair per listed peer, collective with each of them (each must list this rank).
  /// ctxPeers: their Context ranks; ranks: their ranks in the collective (NetLane::peer). One
  /// connect and exchange per pair, in ascending order of the peers' ranks: every rank takes
  /// its pairs in the order of (lower rank, higher rank), so a rank waits only for a peer still
  /// at an earlier pair, and a ring of first send/recvs cannot wait on itself. A rank already
  /// paired is an InvalidArgument.
  void addPairs(Context& ctx, const std::vector<int>& ctxPeers, const std::vector<int>& ranks) {
    if (ctxPeers.size() != ranks.size()) {
      throw Error(ErrorCode::InvalidArgument, "network step: one Context rank per paired rank");
    }
    std::vector<size_t> order(ranks.size());
    for (size_t i = 0; i < order.size(); ++i) {
      order[i] = i;
      if (pair(ranks[i]) != nullptr) {
        throw Error(ErrorCode::InvalidArgument,
                    "network step: rank " + std::to_string(ranks[i]) + " is already paired");
      }
    }
    if (ranks.empty()) return;
    std::sort(order.begin(), order.end(), [&](size_t x, size_t y) { return ranks[x] < ranks[y]; });
    for (size_t i : order) {
      const int peer[] = {ctxPeers[i]};
      Pair p;
      p.rank = ranks[i];
      p.conn = ctx.connect(peer).at(0);
      p.send = ctx.allocate(2 * chunk_);
      p.recv = ctx.allocate(2 * chunk_);
      p.flags = ctx.allocate(kPairFlagBytes);
      RegisteredMemory recv = ctx.exchange(p.recv, peer).at(0);
      RegisteredMemory flags = ctx.exchange(p.flags, peer).at(0);
      p.data = proxy_->addChannel(p.conn, recv, p.send, flags, 0);
      p.ack = proxy_->addChannel(p.conn, recv, p.send, flags, 8);
      pairs_.push_back(std::move(p));
    }
  }
  /// A pair: its connection, memory (the CUDA module maps it) and channels.
  struct Pair {
    int rank = -1;
    std::shared_ptr<Connection> conn;
    RegisteredMemory send, recv, flags;  ///< 2 x chunk, 2 x chunk, kPairFlagBytes
    uint32_t data = 0, ack = 0;
  };
  static constexpr uint64_t kPairFlagBytes = 64;  ///< data count at 0, ack count at 8
  /// The pair with that rank, or nullptr.
  const Pair* pair(int rank) const {
    for (const Pair& p : pairs_) {
      if (p.rank == rank) return &p;
    }
    return nullptr;
  }
  /// The lane of a pair as a kernel sees it (views: where the kernel sees its send, receive and
  /// flag memory; the emulation passes the host pointers).
  NetLane pairLane(const Pair& p, char* send, const char* recv, uint64_t* flags) const {
    NetLane lane;
    lane.sendSlot = send;
    lane.recvSlot = recv;
    lane.parityStride = chunk_;
    lane.dataIn = flags;
    lane.ackIn = flags + 1;
    lane.dataChannel = p.data;
    lane.ackChannel = p.ack;
    lane.peer = p.rank;
    return lane;
  }
  NetLane pairLane(const Pair& p) const {
    return pairLane(p, static_cast<char*>(p.send.data()), static_cast<const char*>(p.recv.data()),
                    static_cast<uint64_t*>(p.flags.data()));
  }

  /// Where the kernel sees this rank's memory (device pointers of the mappings; the host
  /// emulation passes the host pointers).
  struct Views {
    char* sendBounce = nullptr;
    const char* recvBounce = nullptr;
    uint64_t* flags = nullptr;
    void* fifo = nullptr;                   ///< proxy().fifoMemory()
    uint64_t* fifoProducerWords = nullptr;  ///< two zeroed words in device memory
    NetState* state = nullptr;              ///< zeroed device memory
  };
  /// The network arguments of a launch, without the call's (planCrossHost fills those).
  NetArgs args(const Views& v) {
    NetArgs n;
    n.hosts = hosts_;
    n.host = host_;
    n.chunk = chunk_;
    n.fifo = proxy_->fifo(v.fifo, v.fifoProducerWords);
    // Lane h: slot (parity, h) of the [2 parities][hosts][chunk] bounce buffers; this rank's
    // chunks land in the peer's receive slot of this host. The peer's rank is the caller's
    // (planCrossHost sets it).
    const uint64_t stride = static_cast<uint64_t>(hosts_) * chunk_;
    for (int h = 0; h < hosts_; ++h) {
      if (!lane_[h]) continue;
      NetLane& lane = n.lane[h];
      lane.sendSlot = v.sendBounce + static_cast<uint64_t>(h) * chunk_;
      lane.recvSlot = v.recvBounce + static_cast<uint64_t>(h) * chunk_;
      lane.srcOffset = static_cast<uint64_t>(h) * chunk_;
      lane.dstOffset = static_cast<uint64_t>(host_) * chunk_;
      lane.parityStride = stride;
      lane.dataChannel = data_[h];
      lane.ackChannel = ack_[h];
      lane.dataIn = v.flags + dataFlag(h) / 8;
      lane.ackIn = v.flags + ackFlag(h) / 8;
    }
    n.state = v.state;
    return n;
  }
  /// The views of a process whose "device" is the host (the emulation).
  Views hostViews(uint64_t* fifoProducerWords, NetState* state) {
    return {sendBounce(),      recvBounce(), flags(), proxy_->fifoMemory().data(),
            fifoProducerWords, state};
  }

 private:
  int hosts_;
  int host_;
  uint64_t chunk_;
  std::vector<std::shared_ptr<Connection>> conns_;
  RegisteredMemory sendBounce_, recvBounce_, flags_;
  std::unique_ptr<ProxyService> proxy_;
  bool lane_[kMaxHosts] = {};  ///< host h has this local index's peer
  uint32_t data_[kMaxHosts] = {};
  uint32_t ack_[kMaxHosts] = {};
  std::deque<Pair> pairs_;  // pair() hands out pointers
};

}  // namespace strata::cuda
