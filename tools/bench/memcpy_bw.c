// Single-thread memcpy bandwidth, the reference for strata's shm transport (one memcpy per
// write into the peer's mapping). Build: cc -O2 -o memcpy_bw memcpy_bw.c
//
//   memcpy_bw MIN MAX [FACTOR [ITERS [POOL_MIB]]]
//
// For each size S = MIN, MIN*FACTOR, ..., MAX (MAX always included) it prints one line
//   bytes iters hot_us hot_gbps cold_us cold_gbps
// hot: the same source and destination every time, as strata-perf p2p writes the same buffers
// (large sizes then run from the last-level cache where it is big enough); cold: source and
// destination rotate through a pool of POOL_MIB MiB (default 1024, above the last-level cache)
// so that large copies come from and go to DRAM. ITERS: copies per size (default as
// strata-perf: 1000, and 1000 * 64 KiB / S above 64 KiB, at least 20); time per copy is the
// median of 5 timed runs of ITERS copies after one untimed run. GB = 1e9 B.

#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define RUNS 5

static double nowUs(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static size_t parseBytes(const char* text) {
  char* end = NULL;
  unsigned long long v = strtoull(text, &end, 10);
  switch (*end) {
    case 'k':
    case 'K':
      v <<= 10;
      break;
    case 'm':
    case 'M':
      v <<= 20;
      break;
    case 'g':
    case 'G':
      v <<= 30;
      break;
    case '\0':
      break;
    default:
      fprintf(stderr, "memcpy_bw: bad size '%s' (use 64, 8K, 1M, 2G)\n", text);
      exit(2);
  }
  return (size_t)v;
}

static int cmpDouble(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

// Keeps the compiler from dropping copies whose result nobody reads.
static volatile unsigned char sink;

// Median over RUNS of the time per copy; slot i of the pool is at i * stride.
static double timeCopies(unsigned char* src, unsigned char* dst, size_t slots, size_t stride,
                         size_t bytes, size_t iters) {
  double runs[RUNS];
  for (int r = -1; r < RUNS; ++r) {
    double t0 = nowUs();
    for (size_t i = 0; i < iters; ++i) {
      size_t slot = i % slots;
      memcpy(dst + slot * stride, src + slot * stride, bytes);
    }
    double us = nowUs() - t0;
    sink = dst[(iters - 1) % slots * stride];
    if (r >= 0) runs[r] = us / (double)iters;
  }
  qsort(runs, RUNS, sizeof(double), cmpDouble);
  return runs[RUNS / 2];
}

static void* mapBytes(size_t bytes) {
  void* p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    perror("memcpy_bw: mmap");
    exit(1);
  }
  memset(p, 1, bytes);  // touch every page so that page faults stay out of the timing
  return p;
}

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: memcpy_bw MIN MAX [FACTOR [ITERS [POOL_MIB]]]\n");
    return 2;
  }
  size_t minBytes = parseBytes(argv[1]), maxBytes = parseBytes(argv[2]);
  size_t factor = argc > 3 ? (size_t)strtoull(argv[3], NULL, 10) : 2;
  size_t fixedIters = argc > 4 ? (size_t)strtoull(argv[4], NULL, 10) : 0;
  size_t poolBytes = (argc > 5 ? (size_t)strtoull(argv[5], NULL, 10) : 1024) << 20;
  if (minBytes == 0 || maxBytes < minBytes || factor < 2) {
    fprintf(stderr, "memcpy_bw: need 0 < MIN <= MAX and FACTOR >= 2\n");
    return 2;
  }
  // Half the pool for sources, half for destinations, each slot page-aligned.
  size_t half = poolBytes / 2;
  if (half < maxBytes) half = maxBytes;
  unsigned char* src = mapBytes(half);
  unsigned char* dst = mapBytes(half);

  printf("# bytes iters hot_us hot_gbps cold_us cold_gbps   (pool %zu MiB)\n", 2 * half >> 20);
  for (size_t bytes = minBytes;;
       bytes = bytes * factor > maxBytes && bytes < maxBytes ? maxBytes : bytes * factor) {
    size_t iters = fixedIters;
    if (!iters) {
      iters = bytes <= 65536 ? 1000 : 1000 * 65536 / bytes;
      if (iters < 20) iters = 20;
    }
    size_t stride = (bytes + 4095) & ~(size_t)4095;
    size_t slots = half / stride;
    double hot = timeCopies(src, dst, 1, stride, bytes, iters);
    // Cold: enough copies to cycle the whole pool at least once per run.
    size_t coldIters = iters < slots ? slots : iters;
    double cold = timeCopies(src, dst, slots, stride, bytes, coldIters);
    printf("%zu %zu %.3f %.3f %.3f %.3f\n", bytes, iters, hot, (double)bytes / hot / 1e3, cold,
           (double)bytes / cold / 1e3);
    fflush(stdout);
    if (bytes >= maxBytes) break;
  }
  return 0;
}
