#pragma once

// The arguments of the cross-host network step (kernel_net.hpp), part of every launch's
// KernelArgs (unused by the one-host kernels).

#include <cstdint>

#include <strata/channel.hpp>

namespace strata::cuda {

/// Hosts a cross-host collective spans at most (the masks and per-host arrays).
constexpr int kMaxHosts = 8;

/// This rank's persistent counts, per host (index: the host).
struct NetState {
  uint64_t sent[kMaxHosts];      ///< chunks this rank put to the host's rank
  uint64_t received[kMaxHosts];  ///< chunks this rank consumed from the host's rank
};

/// The network step of one launch (inside KernelArgs; unused by the one-host kernels).
struct NetArgs {
  int32_t host = 0;                  ///< this rank's host index
  int32_t hosts = 1;                 ///< hosts of the collective
  int32_t ranksTotal = 1;            ///< the ranks of the whole collective (Avg divides by it)
  uint32_t sendMask = 0;             ///< bit h: this launch sends to host h's peer
  uint32_t recvMask = 0;             ///< bit h: this launch receives from host h's peer
  int32_t peerRank[kMaxHosts] = {};  ///< -1 - the peer's rank (AbortRecord::peer)
  /// What goes to host h; NetReduce: src[host] is this rank's own contribution.
  const char* src[kMaxHosts] = {};
  /// NetGather: where host h's bytes go; NetReduce: dst[host] receives the fold.
  char* dst[kMaxHosts] = {};
  uint64_t bytes = 0;  ///< per peer (and the fold's length)
  /// Pinned host memory, mapped here: [2 parities][hosts][chunk], slot (p, h) holds what goes
  /// to host h. The proxy reads it (the channels' source memory).
  char* sendBounce = nullptr;
  /// The same shape, written by the peers' proxies: slot (p, h) holds what host h sent.
  const char* recvBounce = nullptr;
  uint64_t chunk = 0;  ///< bytes per slot, a multiple of 16
  FifoDeviceHandle fifo;
  uint32_t dataChannel[kMaxHosts] = {};  ///< puts into host h's receive bounce, with a signal
  uint32_t ackChannel[kMaxHosts] = {};   ///< signals host h that a slot was read
  uint64_t* dataIn[kMaxHosts] = {};      ///< raised by host h's proxy after each chunk
  uint64_t* ackIn[kMaxHosts] = {};       ///< raised by host h's proxy after it read a chunk
  NetState* state = nullptr;

  STRATA_HOST_DEVICE uint64_t slot(uint32_t parity, int h) const {
    return (static_cast<uint64_t>(parity) * static_cast<uint64_t>(hosts) +
            static_cast<uint64_t>(h)) *
           chunk;
  }
};

}  // namespace strata::cuda
