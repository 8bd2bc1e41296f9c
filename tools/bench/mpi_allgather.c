/* MPI_Allgather latency, measured the way `strata-perf bootstrap` measures allGather, for
 * tools/bench/bootstrap_vs_mpi.sh.
 *
 *   mpi_allgather [BYTES_PER_RANK [ITERS [WARMUP]]]     (defaults 64 1000 50)
 *
 * Every rank times each iteration; the value per iteration is the max over ranks (one
 * MPI_Reduce after the timed loop, so nothing runs between timed iterations); rank 0 prints
 * median, p99 (nearest rank) and max. MPI_Init is timed on each rank with a monotonic clock
 * (MPI_Wtime is not usable before it) and reported as min/median/max over ranks.
 * Output: one JSON object per line, fields as in strata-perf's --json output. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double nowUs(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int cmpDouble(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

/* Sorts v in place. */
static void summarize(double* v, size_t n, double* min, double* median, double* p99,
                      double* max) {
  qsort(v, n, sizeof(double), cmpDouble);
  *min = v[0];
  *max = v[n - 1];
  *median = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  size_t rank = (size_t)((99 * n + 99) / 100); /* ceil(0.99 n) */
  if (rank < 1) rank = 1;
  if (rank > n) rank = n;
  *p99 = v[rank - 1];
}

static long argOr(int argc, char** argv, int i, long fallback) {
  if (argc <= i) return fallback;
  char* end = NULL;
  long v = strtol(argv[i], &end, 10);
  if (*end != '\0' || v < 0) {
    fprintf(stderr, "mpi_allgather: '%s' is not a non-negative number\n", argv[i]);
    exit(2);
  }
  return v;
}

int main(int argc, char** argv) {
  double t0 = nowUs();
  MPI_Init(&argc, &argv);
  double initUs = nowUs() - t0;

  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  long bytes = argOr(argc, argv, 1, 64);
  long iters = argOr(argc, argv, 2, 1000);
  long warmup = argOr(argc, argv, 3, 50);
  if (bytes < 1 || iters < 1) {
    if (rank == 0) fprintf(stderr, "mpi_allgather: BYTES and ITERS must be at least 1\n");
    MPI_Finalize();
    return 2;
  }

  char* send = malloc((size_t)bytes);
  char* recv = malloc((size_t)bytes * (size_t)size);
  double* times = malloc(sizeof(double) * (size_t)iters);
  double* maxTimes = malloc(sizeof(double) * (size_t)iters);
  double* inits = malloc(sizeof(double) * (size_t)size);
  if (!send || !recv || !times || !maxTimes || !inits) {
    fprintf(stderr, "mpi_allgather: out of memory\n");
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  for (long i = 0; i < bytes; ++i) send[i] = (char)(rank * 131 + i * 7);

  /* Same shape as strata-perf: barrier, warm-up, barrier, timed loop. */
  MPI_Barrier(MPI_COMM_WORLD);
  for (long i = 0; i < warmup; ++i) {
    MPI_Allgather(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, MPI_COMM_WORLD);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  for (long i = 0; i < iters; ++i) {
    double s = nowUs();
    MPI_Allgather(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, MPI_COMM_WORLD);
    times[i] = nowUs() - s;
  }

  int wrong = 0;
  for (int r = 0; r < size && !wrong; ++r) {
    for (long i = 0; i < bytes; ++i) {
      if (recv[(size_t)r * (size_t)bytes + (size_t)i] != (char)(r * 131 + i * 7)) {
        wrong = 1;
        break;
      }
    }
  }
  int wrongTotal = 0;
  MPI_Reduce(times, maxTimes, (int)iters, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
  MPI_Reduce(&wrong, &wrongTotal, 1, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
  MPI_Gather(&initUs, 1, MPI_DOUBLE, inits, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);

  if (rank == 0) {
    double mn, med, p99, mx;
    summarize(inits, (size_t)size, &mn, &med, &p99, &mx);
    printf(
        "{\"tool\":\"mpi_allgather\",\"mode\":\"mpi\",\"backend\":\"mpi\",\"nranks\":%d,"
        "\"op\":\"init\",\"bytes\":0,\"iters\":1,\"median_us\":%.3f,\"p99_us\":%.3f,"
        "\"max_us\":%.3f,\"min_us\":%.3f}\n",
        size, med, p99, mx, mn);
    summarize(maxTimes, (size_t)iters, &mn, &med, &p99, &mx);
    printf(
        "{\"tool\":\"mpi_allgather\",\"mode\":\"mpi\",\"backend\":\"mpi\",\"nranks\":%d,"
        "\"op\":\"allgather\",\"bytes\":%ld,\"iters\":%ld,\"median_us\":%.3f,\"p99_us\":%.3f,"
        "\"max_us\":%.3f,\"min_us\":%.3f,\"wrong\":%d}\n",
        size, bytes, iters, med, p99, mx, mn, wrongTotal);
    fflush(stdout);
  }
  free(send);
  free(recv);
  free(times);
  free(maxTimes);
  free(inits);
  MPI_Finalize();
  return wrongTotal ? 1 : 0;
}
