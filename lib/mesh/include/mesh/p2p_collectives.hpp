#pragma once
#ifndef STRATA_INTERNAL_HEADERS
#error "mesh/p2p_collectives.hpp is internal to strata: applications include <strata/...> only"
#endif

// The bootstrap collectives built over point-to-point messages, written once for every
// message engine (mesh::PeerMesh under tcp and pmix, the ucx backend's UCX tags). The engine
// binds one call in a Messenger: the operation's name for its errors ("allGather"), the call's
// deadline and its tags; these functions only decide who sends what to whom, in which order.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string_view>

#include <strata/export.hpp>

namespace strata::p2p {

/// One collective call's messages. `round` numbers the exchanges of the call from 0, for
/// engines that tag every round apart; others ignore it. Both block until done (a send may
/// return once the engine holds the data) and throw the engine's errors.
struct Messenger {
  int rank = 0;
  int size = 1;
  std::function<void(int peer, uint32_t round, const void* data, size_t bytes)> send;
  std::function<void(int peer, uint32_t round, void* data, size_t bytes)> recv;
};

/// The argument checks every backend makes before it starts a collective: InvalidArgument for
/// a null buffer or a root out of range; false when there is nothing to exchange (one rank, or
/// nothing to gather).
STRATA_API bool allGatherNeeded(int size, const void* data, size_t bytesPerRank);
STRATA_API bool broadcastNeeded(int size, const void* data, size_t bytes, int root);
STRATA_API bool barrierNeeded(int size);
/// The check every engine makes before a point-to-point call: InvalidArgument, naming `op`,
/// for a peer out of range or this rank itself.
STRATA_API void checkPeer(int rank, int size, int peer, std::string_view op);

enum class AllGatherAlgorithm {
  Bruck,  ///< ceil(log2 N) rounds, N-1 blocks sent per rank in all, through a scratch copy
  Ring,   ///< N-1 rounds of one block to the successor (for engines whose sends are buffered)
  Star,   ///< every rank to rank 0, which returns the whole table: two sweeps
};

/// In place: slot r of `data` (bytesPerRank each) is rank r's block.
STRATA_API void allGather(const Messenger& m, AllGatherAlgorithm algorithm, void* data,
                          size_t bytesPerRank);
/// Binomial tree from `root` (ceil(log2 N) rounds), or with star the root sends to every rank.
STRATA_API void broadcast(const Messenger& m, bool star, void* data, size_t bytes, int root);
/// Dissemination (ceil(log2 N) rounds of empty messages, round i to rank + 2^i), or with star
/// every rank checks in at rank 0, which then releases them.
STRATA_API void barrier(const Messenger& m, bool star);

}  // namespace strata::p2p
