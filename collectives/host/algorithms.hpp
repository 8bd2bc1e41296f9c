#pragma once

// Host-memory collectives over the Engine's links. Arguments are validated by the
// Communicator; these assume counts, roots and peers in range and buffers that are either
// disjoint or in place as NCCL defines it. backend.cpp wraps them as the host backend's
// algorithms.

#include <cstddef>

#include <strata/types.hpp>

#include "engine.hpp"

namespace strata::collectives {

/// allReduce: every rank sends its whole input to every rank and reduces all of it.
void allReduceOneShot(Engine& e, const void* send, void* recv, size_t count, DataType type,
                      ReduceOp op);
/// allReduce: reduce-scatter then all-gather over all ranks through the slots.
void allReduceTwoShot(Engine& e, const void* send, void* recv, size_t count, DataType type,
                      ReduceOp op);
/// allReduce within hosts, two-shot across them; needs hierarchicalLayout().
void allReduceHierarchical(Engine& e, const void* send, void* recv, size_t count, DataType type,
                           ReduceOp op);
/// allReduce: two-shot reading the peers' buffers with process_vm_readv; needs e.singleCopy().
void allReduceSingleCopy(Engine& e, const void* send, void* recv, size_t count, DataType type,
                         ReduceOp op);
/// True for a job on several hosts with the same number (> 1) of ranks on each.
bool hierarchicalLayout(const Engine& e);

// The other operations: through the slots, or (singleCopy, needs e.singleCopy()) each reader
// copies straight from the owner's buffer with process_vm_readv.
void allGather(Engine& e, const void* send, void* recv, size_t sendCount, DataType type,
               bool singleCopy);
void reduceScatter(Engine& e, const void* send, void* recv, size_t recvCount, DataType type,
                   ReduceOp op, bool singleCopy);
void broadcast(Engine& e, const void* send, void* recv, size_t count, DataType type, int root,
               bool singleCopy);
void allToAll(Engine& e, const void* send, void* recv, size_t countPerRank, DataType type,
              bool singleCopy);
void send(Engine& e, const void* buf, size_t count, DataType type, int peer);
void recv(Engine& e, void* buf, size_t count, DataType type, int peer);

}  // namespace strata::collectives
