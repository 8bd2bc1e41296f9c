#pragma once

// Host-memory collectives over the Engine's links, one function per algorithm, each taking the
// call as the Communicator validated it: counts, roots and peers in range, buffers either
// disjoint or in place as NCCL defines it. Each derives the call's OpSignature (what its chunk
// headers carry) once, with checked conversions. backend.cpp wraps them as the host backend's
// algorithms.

#include <strata/backend/collectives.hpp>

#include "engine.hpp"

namespace strata::collectives {

using backend::CollectiveRequest;

/// allReduce: every rank sends its whole input to every rank and reduces all of it.
void allReduceOneShot(Engine& e, const CollectiveRequest& call);
/// allReduce: reduce-scatter then all-gather over all ranks through the slots.
void allReduceTwoShot(Engine& e, const CollectiveRequest& call);
/// allReduce within hosts, two-shot across them; needs hierarchicalLayout().
void allReduceHierarchical(Engine& e, const CollectiveRequest& call);
/// True for a job on several hosts with the same number (> 1) of ranks on each.
bool hierarchicalLayout(const Engine& e);

/// allGather, reduceScatter, broadcast and allToAll through the peers' slots.
void allGather(Engine& e, const CollectiveRequest& call);
void reduceScatter(Engine& e, const CollectiveRequest& call);
void broadcast(Engine& e, const CollectiveRequest& call);
void allToAll(Engine& e, const CollectiveRequest& call);
/// send (call.send to call.peer) and recv (call.recv from call.peer).
void send(Engine& e, const CollectiveRequest& call);
void recv(Engine& e, const CollectiveRequest& call);
/// call.batch: its sends, then its receives.
void sendRecv(Engine& e, const CollectiveRequest& call);

// --- single copy (single_copy.cpp): readers copy straight from the owners' buffers ----------
//
// Each rank sends every peer a descriptor of its buffers (docs/wire-format.md, "Single-copy
// descriptors"); a reader then copies what it needs from the peer's buffer (allocHost memory
// through its mapping, zero copy; any other memory with process_vm_readv) and tells the owner
// "done" so that the owner may return. Message offsets within one operation: 0 descriptor,
// 1 "reduced" (allReduce), 2 "done".

/// One rank's descriptor: its buffers and its count of freed allocHost allocations.
struct Desc {
  PeerBuffer send;
  PeerBuffer recv;
  uint64_t frees = 0;
};

/// Every rank's descriptor of one call (own entry: this rank's).
struct Descriptors {
  std::vector<Desc> ranks;
  /// Every buffer a peer reads in this op is allocHost memory, on every rank: the call can
  /// run without process_vm_readv (same decision on every rank).
  bool allShared = false;
};

/// Handles the calls with nothing to move (count 0, one rank); true when done.
bool trivialCall(Engine& e, const CollectiveRequest& call);
/// Sends this rank's descriptor to every peer and waits for theirs (one message round).
Descriptors exchangeDescriptors(Engine& e, const CollectiveRequest& call);
/// Runs a non-trivial allReduce, allGather, reduceScatter, broadcast or allToAll by single
/// copy with the descriptors already exchanged. Needs e.singleCopy() unless d.allShared.
void singleCopy(Engine& e, const CollectiveRequest& call, const Descriptors& d);
/// Encoding of a descriptor (tests and the fuzzer: decode rejects bad input with
/// ProtocolError naming the peer).
std::vector<uint8_t> encodeDesc(const Desc& d);
Desc decodeDesc(const char* payload, size_t bytes, int peer);
/// Bytes of an encoded descriptor.
inline constexpr size_t kDescBytes = 8 + 2 * (8 + 8 + 4 + 8 + 8 + 8);

}  // namespace strata::collectives
