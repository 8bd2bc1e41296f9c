#pragma once

// The network step's resources of one rank (kernel_net.hpp, docs/collectives-cuda.md "Across
// hosts"): a connection to the rank of the same local index on every other host, the send and
// receive bounce buffers and the counter words (host memory registered with the Context, which
// the fabric transport writes), and a ProxyService with two PortChannels per peer (data: puts
// into the peer's receive bounce and raises its data counter; ack: raises its ack counter).
// Creation is collective among those peers. The CUDA module maps the bounce buffers, the
// counters and the proxy FIFO into the GPU (cudaHostRegister); the host emulation
// (tests/cuda-emu/net_emu.cpp) uses them as they are.

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

  /// peerOf[h]: the Context rank of host h's peer (peerOf[host] is ignored). chunk: bytes per
  /// bounce slot (a multiple of 16). timeoutSeconds bounds the proxy's flushes.
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
      if (h != host) peers.push_back(peerOf[h]);
    }
    conns_ = ctx.connect(peers);
    const uint64_t bounce = 2 * static_cast<uint64_t>(hosts_) * chunk;
    sendBounce_ = ctx.allocate(bounce);
    recvBounce_ = ctx.allocate(bounce);
    flags_ = ctx.allocate(kFlagBytes);
    auto recvs = ctx.exchange(recvBounce_, peers);
    auto flags = ctx.exchange(flags_, peers);
    proxy_ = std::make_unique<ProxyService>(fifoEntries, timeoutSeconds);
    proxy_->pinTo(ctx.proxyCpus());  // near this rank's NIC (transport.proxy_cpus)
    size_t i = 0;
    for (int h = 0; h < hosts_; ++h) {
      if (h == host) continue;
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
    n.sendBounce = v.sendBounce;
    n.recvBounce = v.recvBounce;
    n.fifo = proxy_->fifo(v.fifo, v.fifoProducerWords);
    for (int h = 0; h < hosts_; ++h) {
      if (h == host_) continue;
      n.dataChannel[h] = data_[h];
      n.ackChannel[h] = ack_[h];
      n.dataIn[h] = v.flags + dataFlag(h) / 8;
      n.ackIn[h] = v.flags + ackFlag(h) / 8;
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
  uint32_t data_[kMaxHosts] = {};
  uint32_t ack_[kMaxHosts] = {};
};

}  // namespace strata::cuda
