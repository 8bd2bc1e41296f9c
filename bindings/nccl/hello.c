/* An NCCL program that knows nothing of strata: an allReduce over host buffers (strata's
 * extension of the NCCL API). Every rank gets the id from NCCL_COMM_ID; rank and size from the
 * launcher (strata-run, srun, mpirun). The build links it against the CUDA toolkit's libnccl;
 * run with LD_LIBRARY_PATH=build/bindings/nccl it runs on strata (README, docs/nccl-api.md). */
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>

static int env(const char* a, const char* b, const char* c) {
  const char* v = getenv(a);
  if (!v) v = getenv(b);
  if (!v) v = getenv(c);
  return v ? atoi(v) : 0;
}

int main(void) {
  int rank = env("STRATA_RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK");
  int size = env("STRATA_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE");
  ncclUniqueId id;
  ncclComm_t comm;
  float x[4] = {(float)rank, (float)rank, (float)rank, (float)rank};
  int version = 0;
  if (ncclGetUniqueId(&id) != ncclSuccess || ncclCommInitRank(&comm, size, id, rank) != ncclSuccess ||
      ncclAllReduce(x, x, 4, ncclFloat32, ncclSum, comm, NULL) != ncclSuccess) {
    fprintf(stderr, "rank %d: %s\n", rank, ncclGetLastError(NULL));
    return 1;
  }
  ncclGetVersion(&version);
  printf("rank %d of %d: allReduce gave %g (want %d), NCCL API %d\n", rank, size, x[0],
         size * (size - 1) / 2, version);
  ncclCommDestroy(comm);
  return x[0] == (float)(size * (size - 1) / 2) ? 0 : 1;
}
