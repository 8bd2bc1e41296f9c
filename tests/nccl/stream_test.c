/* Host buffers with a stream while the CUDA driver is loaded (docs/nccl-api.md, "Memory and
 * streams"): the call first waits for the stream's earlier work. The "driver" is
 * tests/harness/fake_cuda.cpp (argument 1: its path), whose cuStreamSynchronize runs the kernel the
 * test queued (it writes rank + 5 into the send buffer): the allReduce must see those values.
 * With a NULL stream nothing waits. Then what the shim would do on the host with device memory
 * is refused with an error, as is a group whose device sends and receives use two streams. Ranks
 * from strata-run, the id from NCCL_COMM_ID. */
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
  /* What the shim does on the host is refused for device memory with an error, never a fault:
   * pre-mul-sum on a device buffer, a pre-mul-sum scalar in device memory, a send to self. The
   * stand-in calls `device` device memory; nothing touches it. */
  void (*deviceRange)(void*, size_t) = (void (*)(void*, size_t))dlsym(cuda, "fakeCudaDeviceRange");
  static float device[64];
  float host[64], scalar = 2;
  memset(host, 0, sizeof host);
  deviceRange(device, sizeof device);
  ncclRedOp_t premul, devicePremul;
  if (ncclRedOpCreatePreMulSum(&premul, &scalar, ncclFloat32, ncclScalarHostImmediate, comm) !=
          ncclSuccess ||
      ncclRedOpCreatePreMulSum(&devicePremul, device, ncclFloat32, ncclScalarDevice, comm) !=
          ncclSuccess) {
    fprintf(stderr, "FAIL rank %d: ncclRedOpCreatePreMulSum: %s\n", rank, ncclGetLastError(comm));
    ++failures;
  }
  r = ncclAllReduce(device, device, 64, ncclFloat32, premul, comm, NULL);
  if (r != ncclInvalidUsage || !strstr(ncclGetLastError(comm), "pre-mul-sum reduction on device")) {
    fprintf(stderr, "FAIL rank %d: pre-mul-sum on device memory: %d: %s\n", rank, (int)r,
            ncclGetLastError(comm));
    ++failures;
  }
  r = ncclAllReduce(host, host, 64, ncclFloat32, devicePremul, comm, NULL);
  if (r != ncclInvalidUsage || !strstr(ncclGetLastError(comm), "scalar in device memory")) {
    fprintf(stderr, "FAIL rank %d: a device scalar: %d: %s\n", rank, (int)r,
            ncclGetLastError(comm));
    ++failures;
  }
  ncclGroupStart();
  ncclSend(device, 64, ncclFloat32, rank, comm, NULL);
  ncclRecv(host, 64, ncclFloat32, rank, comm, NULL);
  r = ncclGroupEnd();
  if (r != ncclInvalidUsage || !strstr(ncclGetLastError(comm), "send to this rank itself")) {
    fprintf(stderr, "FAIL rank %d: a send to self from device memory: %d: %s\n", rank, (int)r,
            ncclGetLastError(comm));
    ++failures;
  }
  /* A group's sends and receives on device memory run on one stream: two are refused. */
  if (size > 1) {
    int peer = (rank + 1) % size, from = (rank + size - 1) % size;
    ncclGroupStart();
    ncclSend(device, 8, ncclFloat32, peer, comm, (cudaStream_t)0x1);
    ncclRecv(device + 32, 8, ncclFloat32, from, comm, (cudaStream_t)0x2);
    r = ncclGroupEnd();
    if (r != ncclInvalidUsage || !strstr(ncclGetLastError(comm), "several streams")) {
      fprintf(stderr, "FAIL rank %d: grouped device send/recv on two streams: %d: %s\n", rank,
              (int)r, ncclGetLastError(comm));
      ++failures;
    }
  }
  /* Refused before anything moved: the communicator still works on host memory. */
  deviceRange(NULL, 0);
  for (int i = 0; i < 64; ++i) host[i] = 1;
  r = ncclAllReduce(host, host, 64, ncclFloat32, premul, comm, NULL);
  if (r != ncclSuccess || host[0] != (float)(2 * size)) {
    fprintf(stderr, "FAIL rank %d: pre-mul-sum on host memory after the refusals: %d, %g: %s\n",
            rank, (int)r, host[0], ncclGetLastError(comm));
    ++failures;
  }
  ncclCommDestroy(comm);
  printf("%s rank %d\n", failures ? "FAIL" : "PASS", rank);
  return failures ? 1 : 0;
}
