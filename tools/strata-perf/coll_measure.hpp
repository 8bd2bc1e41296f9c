#pragma once

// One measurement of a collective mode (strata-perf allreduce, ...): the call a CollCase stands
// for, issued on the buffers in or out of place, timed over its iterations after a warm-up, and
// checked on an extra iteration of fresh inputs, as nccl-tests does.

#include <cstddef>
#include <cstdint>

#include <strata/communicator.hpp>
#include <strata/types.hpp>

#include "coll_buffers.hpp"
#include "coll_data.hpp"
#include "nccl_api.hpp"

namespace strata::perf {

/// In place as NCCL defines it; alltoall has no in-place form in strata's API (send and recv
/// must not overlap), and a blocking in-place sendrecv would overwrite the data before sending
/// it.
bool hasInPlace(CollKind kind);

/// Bytes of the larger of the call's two buffers: a row's size.
size_t wholeBytes(const CollCase& c);

/// The count argument of the call for `bytes` of the whole buffer, nccl-tests' convention:
/// allgather, reducescatter and alltoall split the buffer between the ranks.
size_t countFor(CollKind kind, size_t bytes, DataType type, int nranks);

/// How the calls of a row are issued.
struct Issue {
  bool check = false;
  Target at;
  bool blocking = false;  ///< device memory, -z 1: synchronize after each call (graph launch)
  int graph = 0;          ///< -G: launches of a graph that holds the timed calls
  NcclApi* nccl = nullptr;  ///< --api nccl: the calls go through this library
  bool grouped = false;     ///< --api nccl-group: alltoall as grouped send/recv
};

struct Measured {
  double us = 0;  ///< per iteration on this rank
  int64_t wrong = 0;
};

/// Times `iters` calls of `c` after `warmup` untimed ones (a barrier between), and with
/// how.check counts the wrong elements of one more call on fresh inputs (seeded by ++rep).
Measured measure(Communicator& comm, CollCase c, const Buffers& buf, bool inPlace, size_t iters,
                 size_t warmup, const Issue& how, int& rep);

}  // namespace strata::perf
