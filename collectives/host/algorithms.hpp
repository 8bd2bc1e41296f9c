#pragma once

// Host-memory collectives over the Engine's links. Arguments are validated by the
// Communicator; these assume counts, roots and peers in range and buffers that are either
// disjoint or in place as NCCL defines it.

#include <cstddef>

#include <strata/communicator.hpp>

#include "engine.hpp"

namespace strata::collectives {

void allReduce(Engine& e, const void* send, void* recv, size_t count, DataType type, ReduceOp op);
void allGather(Engine& e, const void* send, void* recv, size_t sendCount, DataType type);
void reduceScatter(Engine& e, const void* send, void* recv, size_t recvCount, DataType type,
                   ReduceOp op);
void broadcast(Engine& e, const void* send, void* recv, size_t count, DataType type, int root);
void allToAll(Engine& e, const void* send, void* recv, size_t countPerRank, DataType type);
void send(Engine& e, const void* buf, size_t count, DataType type, int peer);
void recv(Engine& e, void* buf, size_t count, DataType type, int peer);

}  // namespace strata::collectives
