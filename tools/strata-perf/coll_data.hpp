#pragma once

// Input patterns and result checks of the collective modes (strata-perf allreduce, ...), for
// every DataType on host memory. The inputs are small positive integers, exact in every type
// (bfloat16 holds integers up to 256 exactly), so integer results are exact and float results
// differ from the reference only by the final rounding (and Avg's division).

#include <cstddef>
#include <cstdint>

#include <strata/types.hpp>

namespace strata::perf {

enum class CollKind { AllReduce, AllGather, ReduceScatter, Broadcast, AllToAll, SendRecv };

/// nccl-tests' op names without "_perf": "allreduce", ...
const char* collName(CollKind kind);
bool isReducing(CollKind kind);
/// busbw = algbw * factor (nccl-tests' PERFORMANCE.md): allreduce 2(n-1)/n; allgather,
/// reducescatter, alltoall (n-1)/n; broadcast and sendrecv 1.
double busBwFactor(CollKind kind, int nranks);

/// Everything a rank needs to fill its buffers and check its result for one measurement.
struct CollCase {
  CollKind kind = CollKind::AllReduce;
  DataType type = DataType::Float32;
  ReduceOp op = ReduceOp::Sum;  ///< ignored by the non-reducing kinds
  int root = 0;                 ///< broadcast only
  int rank = 0;
  int nranks = 1;
  size_t count = 0;  ///< the count argument of the call (per rank for allgather, ...)
  int seed = 0;      ///< varies the pattern between the timed and the checked iteration
};

/// Elements of the send and of the receive buffer for one call (out of place).
size_t sendElements(const CollCase& c);
size_t recvElements(const CollCase& c);

/// Fills this rank's send buffer (sendElements(c) elements) with its input.
void fillSend(const CollCase& c, void* send);
/// In place: fills the shared buffer (recvElements(c) elements, or sendElements(c) for
/// reducescatter, whose in-place buffer is the send buffer) so that its input part holds this
/// rank's input.
void fillInPlace(const CollCase& c, void* buffer);
/// Fills a buffer with a value that no correct result has (0), so that elements a collective
/// fails to write show as wrong.
void poison(DataType type, void* buffer, size_t elements);

/// Number of wrong elements of this rank's result (recvElements(c) elements at result). Integer
/// types must match exactly; floats within a relative tolerance (looser for half and bfloat16).
int64_t countWrong(const CollCase& c, const void* result);

}  // namespace strata::perf
