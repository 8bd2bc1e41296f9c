// The pmix bootstrap's collectives, all over the peer mesh (Bruck allGather, binomial broadcast,
// dissemination barrier), as the tcp bootstrap does: PMIx fences only at creation
// (docs/backends.md, "What comes from where"). Across nodes, Slurm 22.05's PMIx fences broke
// when the job ran many back to back (the slurm-multinode suite: the servers failed with
// UNPACK-PAST-END or INVALID-ARG, or a fence's data was NOT-FOUND), and a fence cannot be
// withdrawn when a revoke must end the call, while a mesh call can.

#include <fmt/format.h>

#include <strata/error.hpp>

#include "pmix_internal.hpp"

namespace strata::pmix {

void PmixBootstrap::allGather(void* data, size_t bytesPerRank) {
  auto& I = *impl_;
  I.checkNotAborted();
  if (I.size == 1) return;
  I.mesh->allGather(data, bytesPerRank);
}

void PmixBootstrap::broadcast(void* data, size_t bytes, int root) {
  auto& I = *impl_;
  if (root < 0 || root >= I.size) {
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("pmix bootstrap: broadcast root {} is not a rank of this job (0..{})",
                            root, I.size - 1));
  }
  I.checkNotAborted();
  if (I.size == 1) return;
  I.mesh->broadcast(data, bytes, root);
}

void PmixBootstrap::barrier() {
  auto& I = *impl_;
  I.checkNotAborted();
  if (I.size == 1) return;
  I.mesh->barrier();
}

}  // namespace strata::pmix
