#pragma once

// The arguments of the cross-host network step (kernel_net.hpp), part of every launch's
// KernelArgs (unused by the one-host kernels).

#include <cstdint>

#include <strata/channel.hpp>

namespace strata::cuda {

/// Hosts a cross-host collective spans at most (the masks and the lanes of a launch).
constexpr int kMaxHosts = 8;
/// Ranks of a cross-host communicator at most (NetState's counts are indexed by rank).
constexpr int kMaxNetRanks = 64;

/// This rank's persistent counts, per peer rank.
struct NetState {
  uint64_t sent[kMaxNetRanks];      ///< chunks this rank put to the rank
  uint64_t received[kMaxNetRanks];  ///< chunks this rank consumed from the rank
};

/// One peer of a launch's network step: where the chunks for it are staged, where its chunks
/// land, the two channels to it and the counters it raises. A collective's lane h is the rank of
/// this rank's local index on host h (NetPeers); a send/recv to any other rank of another host
/// uses that pair's own lane (NetPeers::addPairs). Every slot has two parities, parityStride
/// bytes apart, on both sides.
struct NetLane {
  char* sendSlot = nullptr;        ///< parity 0 of what goes to the peer (this rank's memory)
  const char* recvSlot = nullptr;  ///< parity 0 of what the peer sends (this rank's memory)
  uint64_t srcOffset = 0;          ///< sendSlot's offset in the data channel's source memory
  uint64_t dstOffset = 0;          ///< where this rank's chunks land in the peer's memory
  uint64_t parityStride = 0;
  uint64_t* dataIn = nullptr;  ///< raised by the peer's proxy after each chunk
  uint64_t* ackIn = nullptr;   ///< raised by the peer's proxy after it read a chunk
  uint32_t dataChannel = 0;    ///< puts into the peer's receive slot, with a signal
  uint32_t ackChannel = 0;     ///< signals the peer that a slot was read
  int32_t peer = 0;            ///< the peer's rank (NetState's index; AbortRecord::peer -1 - it)
};

/// The network step of one launch (inside KernelArgs; unused by the one-host kernels).
struct NetArgs {
  int32_t host = 0;        ///< NetReduce: this rank's lane (its host)
  int32_t hosts = 1;       ///< lanes in use (a collective: its hosts)
  int32_t ranksTotal = 1;  ///< the ranks of the whole collective (Avg divides by it)
  uint32_t sendMask = 0;   ///< bit h: this launch sends on lane h
  uint32_t recvMask = 0;   ///< bit h: this launch receives on lane h
  /// What goes on lane h; NetReduce: src[host] is this rank's own contribution.
  const char* src[kMaxHosts] = {};
  /// NetGather: where lane h's bytes go; NetReduce: dst[host] receives the fold.
  char* dst[kMaxHosts] = {};
  uint64_t bytes = 0;  ///< per lane (and the fold's length)
  uint64_t chunk = 0;  ///< bytes per slot, a multiple of 16
  FifoDeviceHandle fifo;
  NetLane lane[kMaxHosts];
  NetState* state = nullptr;
};

}  // namespace strata::cuda
