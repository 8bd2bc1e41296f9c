#pragma once

// For tests of one transport through the plugin SDK alone, with no core (tests/transport/shm,
// tests/transport/fabric): the SDK's names, and the two ranks on one host those tests play, in
// one process or in a parent and its child (header-only).

#include <sys/types.h>

#include <cstdint>

#include <strata/backend/transport.hpp>
#include <strata/config.hpp>

namespace strata::testing {

/// What the core passes to a transport's factory for rank `rank` of two ranks on one host.
inline backend::TransportInit pairInit(int rank, uint64_t hostId = 0,
                                       const Config* config = nullptr) {
  backend::TransportInit init;
  init.config = config;
  init.rank = rank;
  init.size = 2;
  init.localRank = rank;
  init.localSize = 2;
  init.hostId = hostId;
  return init;
}

/// Rank `rank` in process `pid` on this host, as the core describes a peer to a transport.
inline backend::PeerInfo sameHostPeer(int rank, pid_t pid, uint64_t hostId = 0) {
  backend::PeerInfo p;
  p.rank = rank;
  p.sameHost = true;
  p.hostId = hostId;
  p.hostName = "localhost";
  p.pid = pid;
  return p;
}

}  // namespace strata::testing

using strata::backend::LocalRef;
using strata::backend::PeerInfo;
using strata::backend::RemoteRef;
using strata::backend::Transport;
using strata::backend::TransportInit;
