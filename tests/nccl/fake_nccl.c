/* A stand-in for a real NCCL (tests/nccl, STRATA_NCCL_FALLBACK): what strata's NCCL API sends
 * to its fallback lands here. Ids carry 0x5a bytes (init checks them, so rank 0's id must have
 * reached every rank); the collectives write 0xab into every byte of the receive buffer. */
#include <nccl.h>
#include <stdint.h>
#include <string.h>

static size_t typeBytes(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8:
    case ncclFloat8e4m3:
    case ncclFloat8e5m2:
      return 1;
    case ncclFloat16:
    case ncclBfloat16:
      return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4;
    default:
      return 8;
  }
}

ncclResult_t ncclGetVersion(int* v) {
  *v = 99999;
  return ncclSuccess;
}
ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  memset(id->internal, 0x5a, sizeof id->internal);
  return ncclSuccess;
}
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  for (size_t i = 0; i < sizeof id.internal; ++i) {
    if ((unsigned char)id.internal[i] != 0x5a) return ncclInvalidArgument;
  }
  if (rank < 0 || rank >= nranks) return ncclInvalidArgument;
  *comm = (ncclComm_t)(uintptr_t)(0x1000 + rank);
  return ncclSuccess;
}
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  (void)comm;
  return ncclSuccess;
}
const char* ncclGetErrorString(ncclResult_t r) {
  return r == ncclSuccess ? "fake: ok" : "fake: error";
}
ncclResult_t ncclAllReduce(const void* s, void* r, size_t count, ncclDataType_t t, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
  (void)s, (void)op, (void)comm, (void)stream;
  memset(r, 0xab, count * typeBytes(t));
  return ncclSuccess;
}
ncclResult_t ncclAllGather(const void* s, void* r, size_t count, ncclDataType_t t, ncclComm_t comm,
                           cudaStream_t stream) {
  (void)s, (void)comm, (void)stream;
  memset(r, 0xab, count * typeBytes(t)); /* the test's receive buffer is larger: its own block */
  return ncclSuccess;
}
ncclResult_t ncclReduceScatter(const void* s, void* r, size_t count, ncclDataType_t t,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  (void)s, (void)op, (void)comm, (void)stream;
  memset(r, 0xab, count * typeBytes(t));
  return ncclSuccess;
}
ncclResult_t ncclBroadcast(const void* s, void* r, size_t count, ncclDataType_t t, int root,
                           ncclComm_t comm, cudaStream_t stream) {
  (void)s, (void)root, (void)comm, (void)stream;
  memset(r, 0xab, count * typeBytes(t));
  return ncclSuccess;
}
