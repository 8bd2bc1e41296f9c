#pragma once

// The host's stop word (backend.cpp): why it is set, the monitor's decision at each turn, what a
// wait it ended reports, and whether teardown may still barrier with the peers. No CUDA here, so
// that tests/cuda-emu runs the module's decisions around its kernels (a rank lost or a revoke in
// the middle of device collectives, then the survivors' shrunk communicator).

#include <cstdint>

namespace strata::cuda {

/// Why the stop word was set (the first reason wins).
enum StopReason : uint64_t {
  kNoStop = 0,
  kPeerLost = 1,   ///< a peer's process is gone
  kDestroyed = 2,  ///< the communicator is being destroyed with work still running
  kJudged = 3,     ///< the stall monitor judged a stall or a mismatch
  kRevoked = 4,    ///< Context::revoke (Communicator::revoke, this rank's or a peer's)
  kNetwork = 5,    ///< the cross-host network step's proxy failed a connection (its peer is
                   ///< unreachable: another host, a cut link)
};

struct StopDecision {
  StopReason why = kNoStop;
  int peer = -1;  ///< the lost peer (kPeerLost)
};

/// One turn of the monitor: a revoked communicator stops at once (its peers may be alive, on
/// another host, or stopped); else the lowest peer whose process is known gone. gone(q) is true
/// only when this host can tell (a peer's pid on this host); a peer on another host is stopped
/// by the revoke that its loss causes on a rank that can tell.
template <class Gone>
StopDecision monitorTurn(bool revoked, int rank, int size, Gone&& gone) {
  if (revoked) return {kRevoked, -1};
  for (int q = 0; q < size; ++q) {
    if (q != rank && gone(q)) return {kPeerLost, q};
  }
  return {};
}

/// What a wait the stop word ended reports (CudaBackend::asyncError).
enum class StoppedBy {
  Revoke,    ///< the communicator's revoke error (its code and culprit)
  PeerLoss,  ///< PeerLost naming the stop word's peer
  Destroy,   ///< Aborted: the communicator was destroyed under the wait
};

inline StoppedBy stoppedBy(uint64_t reason, int64_t stopPeer, int size, bool revokeKnown) {
  if (reason == kRevoked && revokeKnown) return StoppedBy::Revoke;
  if (reason == kPeerLost && stopPeer >= 0 && stopPeer < size) return StoppedBy::PeerLoss;
  return StoppedBy::Destroy;
}

/// Teardown skips its barriers with the peers: a lost peer cannot come, and the peers of a
/// revoked communicator may be dead or stopped (the survivors shrink without them).
inline bool peersMayBeGone(uint64_t reason, bool revoked) {
  return reason == kPeerLost || reason == kRevoked || reason == kNetwork || revoked;
}

}  // namespace strata::cuda
