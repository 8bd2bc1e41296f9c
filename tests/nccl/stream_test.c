/* Host buffers with a stream while the CUDA driver is loaded (docs/nccl-api.md, "Memory and
 * streams"): the call first waits for the stream's earlier work. The "driver" is
 * tests/harness/fake_cuda.cpp (argument 1: its path), whose cuStreamSynchronize runs the kernel the
 * test queued (it writes rank + 5 into the send buffer): the allReduce must see those values.
 * With a NULL stream nothing waits. Ranks from strata-run, the id from NCCL_COMM_ID. */
#include <dlfcn.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char** argv) {
  int rank = atoi(getenv("STRATA_RANK") ? getenv("STRATA_RANK") : "0");
  int size = atoi(getenv("STRATA_SIZE") ? getenv("STRATA_SIZE") : "1");
  ncclUniqueId id;
  ncclComm_t comm;
  if (argc < 2 || ncclGetUniqueId(&id) != ncclSuccess ||
      ncclCommInitRank(&comm, size, id, rank) != ncclSuccess) {
    fprintf(stderr, "FAIL rank %d: init: %s\n", rank, ncclGetLastError(NULL));
    return 1;
  }
  void* cuda = dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL);
  if (!cuda) {
    fprintf(stderr, "FAIL rank %d: %s\n", rank, dlerror());
    return 1;
  }
  void (*pending)(float*, size_t, float) =
      (void (*)(float*, size_t, float))dlsym(cuda, "fakeCudaPending");
  int (*syncs)(void) = (int (*)(void))dlsym(cuda, "fakeCudaSyncs");
  float buf[256];
  int failures = 0;
  for (int i = 0; i < 256; ++i) buf[i] = 0;
  pending(buf, 256, (float)(rank + 5));
  ncclResult_t r = ncclAllReduce(buf, buf, 256, ncclFloat32, ncclSum, comm, (cudaStream_t)0x1);
  float want = (float)(size * 5 + size * (size - 1) / 2);
  if (r != ncclSuccess || buf[0] != want || buf[255] != want || syncs() != 1) {
    fprintf(stderr, "FAIL rank %d: allReduce on a stream: %d, %g (want %g), %d syncs: %s\n", rank,
            (int)r, buf[0], want, syncs(), ncclGetLastError(comm));
    ++failures;
  }
  r = ncclAllReduce(buf, buf, 256, ncclFloat32, ncclSum, comm, NULL);
  if (r != ncclSuccess || syncs() != 1) {
    fprintf(stderr, "FAIL rank %d: a NULL stream waited (%d syncs)\n", rank, syncs());
    ++failures;
  }
  ncclCommDestroy(comm);
  printf("%s rank %d\n", failures ? "FAIL" : "PASS", rank);
  return failures ? 1 : 0;
}
