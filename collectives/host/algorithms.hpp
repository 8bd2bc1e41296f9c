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
/// allReduce: two-shot reading the peers' buffers with process_vm_readv; needs e.singleCopy().
void allReduceSingleCopy(Engine& e, const CollectiveRequest& call);
/// True for a job on several hosts with the same number (> 1) of ranks on each.
bool hierarchicalLayout(const Engine& e);

/// How allGather, reduceScatter, broadcast and allToAll move the data.
enum class Path {
  Slots,       ///< through the peers' slots
  SingleCopy,  ///< each reader copies straight from the owner's buffer (needs e.singleCopy())
};
void allGather(Engine& e, const CollectiveRequest& call, Path path);
void reduceScatter(Engine& e, const CollectiveRequest& call, Path path);
void broadcast(Engine& e, const CollectiveRequest& call, Path path);
void allToAll(Engine& e, const CollectiveRequest& call, Path path);
/// send (call.send to call.peer) and recv (call.recv from call.peer).
void send(Engine& e, const CollectiveRequest& call);
void recv(Engine& e, const CollectiveRequest& call);

}  // namespace strata::collectives
