/* MPI_Allreduce / MPI_Allgather bus bandwidth, measured the way nccl-tests and `strata-perf
 * allreduce|allgather` measure it, for tools/bench/coll_vs_peers.sh.
 *
 *   mpi_coll allreduce|allgather MINBYTES MAXBYTES FACTOR [ITERS [WARMUP]]
 *
 * Sizes go MINBYTES, MINBYTES*FACTOR, ... up to MAXBYTES (suffixes K, M, G = powers of 1024).
 * Data type float, reduce op sum, out-of-place. ITERS 0 (the default) means 200 iterations up to
 * 64 KiB and 200 * 64 KiB / size above (at least 5); WARMUP defaults to ITERS / 10 (at least 2).
 *
 * Per size: barrier, warm-up, barrier, timed loop; each rank's time is its average per
 * iteration, and the reported time is the max over ranks (MPI_Reduce MAX to rank 0), as in
 * nccl-tests. size is the whole buffer in bytes (allgather: the total received), count its
 * elements; allgather rounds count down to a multiple of the rank count like nccl-tests and
 * skips a size whose per-rank count would be 0. algbw = size / time (GB/s, GB = 1e9 B),
 * busbw = algbw * 2(n-1)/n for allreduce and * (n-1)/n for allgather. The result of the last
 * iteration is checked on every rank (sums of small integers are exact in float); "wrong" is
 * the number of wrong elements summed over ranks. Rank 0 prints one JSON line per size with the
 * fields of `strata-perf --json`. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { kAllreduce, kAllgather };

static void usage(void) {
  fprintf(stderr,
          "usage: mpi_coll allreduce|allgather MINBYTES MAXBYTES FACTOR [ITERS [WARMUP]]\n");
}

/* A byte count with an optional K/M/G suffix (powers of 1024); -1 when malformed. */
static long long parseBytes(const char* s) {
  char* end = NULL;
  long long v = strtoll(s, &end, 10);
  if (end == s || v < 0) return -1;
  long long mult = 1;
  if (*end == 'K' || *end == 'k')
    mult = 1LL << 10, ++end;
  else if (*end == 'M' || *end == 'm')
    mult = 1LL << 20, ++end;
  else if (*end == 'G' || *end == 'g')
    mult = 1LL << 30, ++end;
  if (*end != '\0') return -1;
  return v * mult;
}

/* Rank r's element i: small positive integers, so the float sum over ranks is exact. */
static float valueOf(int r, size_t i) {
  return (float)((r + 1) * (int)(i % 7 + 1));
}

static long defaultIters(long long bytes) {
  const long long kFull = 64 << 10; /* up to here the full count, then fewer with size */
  if (bytes <= kFull) return 200;
  long long n = 200 * kFull / bytes;
  return n < 5 ? 5 : (long)n;
}

static void runOnce(int op, const float* send, float* recv, size_t count, size_t sendCount) {
  if (op == kAllreduce) {
    MPI_Allreduce(send, recv, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  } else {
    MPI_Allgather(send, (int)sendCount, MPI_FLOAT, recv, (int)sendCount, MPI_FLOAT, MPI_COMM_WORLD);
  }
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, nranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);

  int op = -1;
  if (argc >= 2 && strcmp(argv[1], "allreduce") == 0) op = kAllreduce;
  if (argc >= 2 && strcmp(argv[1], "allgather") == 0) op = kAllgather;
  long long minBytes = argc >= 3 ? parseBytes(argv[2]) : -1;
  long long maxBytes = argc >= 4 ? parseBytes(argv[3]) : -1;
  long long factor = argc >= 5 ? parseBytes(argv[4]) : -1;
  long long itersArg = argc >= 6 ? parseBytes(argv[5]) : 0;
  long long warmupArg = argc >= 7 ? parseBytes(argv[6]) : -2;
  if (op < 0 || argc < 5 || argc > 7 || minBytes < 1 || maxBytes < minBytes || factor < 2 ||
      itersArg < 0 || warmupArg == -1) {
    if (rank == 0) usage();
    MPI_Finalize();
    return 2;
  }

  const size_t maxCount = (size_t)maxBytes / sizeof(float);
  const size_t maxSend = op == kAllreduce ? maxCount : maxCount / (size_t)nranks;
  float* send = malloc((maxSend ? maxSend : 1) * sizeof(float));
  float* recv = malloc((maxCount ? maxCount : 1) * sizeof(float));
  if (!send || !recv) {
    fprintf(stderr, "mpi_coll: rank %d: out of memory for %lld B buffers\n", rank, maxBytes);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  /* Allgather: rank r's element i lands at r * sendCount + i, so one formula serves both. */
  for (size_t i = 0; i < maxSend; ++i) send[i] = valueOf(rank, i);

  int anyWrong = 0;
  for (long long bytes = minBytes; bytes <= maxBytes; bytes *= factor) {
    size_t count = (size_t)bytes / sizeof(float);
    size_t sendCount = count;
    if (op == kAllgather) {
      sendCount = count / (size_t)nranks;
      count = sendCount * (size_t)nranks;
    }
    if (sendCount == 0) continue;
    const long iters = itersArg > 0 ? (long)itersArg : defaultIters(bytes);
    const long warmup = warmupArg >= 0 ? (long)warmupArg : (iters / 10 < 2 ? 2 : iters / 10);

    /* Stale results of the previous size must not pass the check. */
    memset(recv, 0, count * sizeof(float));
    MPI_Barrier(MPI_COMM_WORLD);
    for (long it = 0; it < warmup; ++it) runOnce(op, send, recv, count, sendCount);
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    for (long it = 0; it < iters; ++it) runOnce(op, send, recv, count, sendCount);
    const double avgUs = (MPI_Wtime() - t0) * 1e6 / (double)iters;
    double maxUs = 0;
    MPI_Reduce(&avgUs, &maxUs, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);

    long wrong = 0;
    const float sumScale = (float)(nranks * (nranks + 1) / 2);
    for (size_t i = 0; i < count; ++i) {
      float want = op == kAllreduce ? sumScale * (float)(int)(i % 7 + 1)
                                    : valueOf((int)(i / sendCount), i % sendCount);
      if (recv[i] != want) ++wrong;
    }
    long wrongTotal = 0;
    MPI_Reduce(&wrong, &wrongTotal, 1, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
    if (wrongTotal) anyWrong = 1;

    if (rank == 0) {
      const double size = (double)count * sizeof(float);
      const double algbw = size / maxUs / 1e3;
      const double busFactor =
          op == kAllreduce ? 2.0 * (nranks - 1) / nranks : (double)(nranks - 1) / nranks;
      printf(
          "{\"tool\":\"openmpi\",\"label\":\"openmpi\",\"op\":\"%s\",\"nranks\":%d,"
          "\"backend\":\"mpi\",\"memory\":\"host\",\"size\":%zu,\"count\":%zu,"
          "\"type\":\"float\",\"redop\":\"%s\",\"root\":-1,\"inplace\":false,"
          "\"time_us\":%.3f,\"algbw\":%.6g,\"busbw\":%.6g,\"wrong\":%ld}\n",
          op == kAllreduce ? "allreduce" : "allgather", nranks, count * sizeof(float), count,
          op == kAllreduce ? "sum" : "none", maxUs, algbw, algbw * busFactor, wrongTotal);
      fflush(stdout);
    }
    if (bytes > maxBytes / factor) break; /* the next step would overflow or pass the end */
  }

  free(send);
  free(recv);
  MPI_Finalize();
  return anyWrong ? 1 : 0;
}
