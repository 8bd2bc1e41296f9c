/* STRATA_NCCL_FALLBACK (docs/nccl-api.md): with it, an fp8 allReduce (a datatype strata lacks)
 * goes to the fallback NCCL (tests/nccl/fake_nccl.c writes 0xab); without it, the same call is
 * refused with ncclInvalidArgument and a text naming the variable; a split communicator has the
 * fallback too. "unsupported": a broadcast
 * strata refuses as NotSupported (its forced algorithm cannot run: meson sets
 * STRATA_COLLECTIVES_BROADCAST_ALGORITHM=singlecopy and STRATA_COLLECTIVES_SINGLE_COPY=off)
 * goes to the fallback, while an allReduce stays on strata. Ranks from strata-run, the id from
 * NCCL_COMM_ID. Argument: "fallback", "none" or "unsupported" (what to expect). */
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char** argv) {
  int rank = atoi(getenv("STRATA_RANK") ? getenv("STRATA_RANK") : "0");
  int size = atoi(getenv("STRATA_SIZE") ? getenv("STRATA_SIZE") : "1");
  int expectFallback = argc > 1 && strcmp(argv[1], "fallback") == 0;
  int unsupported = argc > 1 && strcmp(argv[1], "unsupported") == 0;
  ncclUniqueId id;
  ncclComm_t comm;
  if (ncclGetUniqueId(&id) != ncclSuccess ||
      ncclCommInitRank(&comm, size, id, rank) != ncclSuccess) {
    fprintf(stderr, "FAIL rank %d: init: %s\n", rank, ncclGetLastError(NULL));
    return 1;
  }
  int failures = 0;
  if (unsupported) {
    float v[16], x = 1;
    for (int i = 0; i < 16; ++i) v[i] = (float)rank;
    ncclResult_t r = ncclBroadcast(v, v, 16, ncclFloat32, 0, comm, NULL);
    unsigned char* bytes = (unsigned char*)v;
    if (r != ncclSuccess || bytes[0] != 0xab || bytes[63] != 0xab) {
      fprintf(stderr,
              "FAIL rank %d: a broadcast strata refuses, through the fallback: %d, byte "
              "%#x: %s\n",
              rank, (int)r, bytes[0], ncclGetLastError(comm));
      ++failures;
    }
    if (ncclAllReduce(&x, &x, 1, ncclFloat32, ncclSum, comm, NULL) != ncclSuccess ||
        x != (float)size) {
      fprintf(stderr, "FAIL rank %d: an allReduce beside the refused broadcast gave %g\n", rank, x);
      ++failures;
    }
    ncclCommDestroy(comm);
    printf("%s rank %d (unsupported)\n", failures ? "FAIL" : "PASS", rank);
    return failures ? 1 : 0;
  }
  unsigned char buf[64];
  memset(buf, 1, sizeof buf);
  ncclResult_t r = ncclAllReduce(buf, buf, 64, ncclFloat8e4m3, ncclSum, comm, NULL);
  if (expectFallback) {
    if (r != ncclSuccess || buf[0] != 0xab || buf[63] != 0xab) {
      fprintf(stderr, "FAIL rank %d: fp8 allReduce through the fallback: %d, byte %#x: %s\n", rank,
              (int)r, buf[0], ncclGetLastError(comm));
      ++failures;
    }
    /* A communicator from ncclCommSplit has its fallback too (reversed ranks). */
    ncclComm_t child = NULL;
    if (ncclCommSplit(comm, 0, size - rank, &child, NULL) != ncclSuccess || child == NULL) {
      fprintf(stderr, "FAIL rank %d: split: %s\n", rank, ncclGetLastError(comm));
      ++failures;
    } else {
      memset(buf, 1, sizeof buf);
      r = ncclAllReduce(buf, buf, 64, ncclFloat8e5m2, ncclSum, child, NULL);
      if (r != ncclSuccess || buf[0] != 0xab) {
        fprintf(stderr, "FAIL rank %d: fp8 allReduce on a split communicator: %d, byte %#x: %s\n",
                rank, (int)r, buf[0], ncclGetLastError(child));
        ++failures;
      }
      ncclCommDestroy(child);
    }
    /* strata's own types still run on strata (the fake would write 0xab) */
    float x = 1;
    if (ncclAllReduce(&x, &x, 1, ncclFloat32, ncclSum, comm, NULL) != ncclSuccess ||
        x != (float)size) {
      fprintf(stderr, "FAIL rank %d: a float allReduce beside the fallback gave %g\n", rank, x);
      ++failures;
    }
  } else if (r != ncclInvalidArgument ||
             strstr(ncclGetLastError(comm), "STRATA_NCCL_FALLBACK") == NULL) {
    fprintf(stderr, "FAIL rank %d: fp8 allReduce without a fallback: %d: %s\n", rank, (int)r,
            ncclGetLastError(comm));
    ++failures;
  }
  ncclCommDestroy(comm);
  printf("%s rank %d (%s)\n", failures ? "FAIL" : "PASS", rank,
         expectFallback ? "fallback" : "none");
  return failures ? 1 : 0;
}
