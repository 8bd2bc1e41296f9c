// How fast can one process read another's memory on this host? The two mechanisms strata's host
// collectives choose between, measured side by side (docs/benchmarks.md):
//   readv: process_vm_readv of the peer's private buffer (single copy: the kernel pins the
//          peer's pages and copies them, what strata and Open MPI's CMA path do);
//   shm:   memcpy from the peer's memory mapped into this process (a shared memfd: the slot
//          path copies through such memory, in user space);
// and for reference a memcpy of this process's own buffer (local).
// The reader runs on CPU 0 and the owner on CPU 1 (when there are two). Before each copy the
// owner either leaves its buffer alone (clean: the reader may still hold the lines from the last
// round) or rewrites it (dirty: every line must come from the owner's cache), as a benchmark
// that reuses a send buffer and a training step that wrote new gradients would.
//
//   cma_vs_shm [BYTES [ROUNDS]]      (BYTES accepts K/M; default 256K, 2000 rounds)
//
// Prints one line per case: bytes, median and best time per copy in microseconds, GB/s of the
// median (GB = 1e9 B). Build: cc -O2 -o cma_vs_shm cma_vs_shm.c

#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

struct Shared {
  volatile uint64_t request;  // reader -> owner: round number to prepare
  volatile uint64_t ready;    // owner -> reader: round prepared
  volatile int dirty;
  volatile uint64_t ownerAddress;  // the owner's private buffer, for process_vm_readv
  char pad[64];
};

static double nowUs(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static size_t parseSize(const char* s) {
  char* end = NULL;
  double v = strtod(s, &end);
  if (*end == 'K' || *end == 'k') v *= 1024;
  if (*end == 'M' || *end == 'm') v *= 1024 * 1024;
  return (size_t)v;
}

static void pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  sched_setaffinity(0, sizeof set, &set);  // best effort
}

static int cmpDouble(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char** argv) {
  size_t bytes = argc > 1 ? parseSize(argv[1]) : 256 * 1024;
  int rounds = argc > 2 ? atoi(argv[2]) : 2000;
  if (bytes == 0 || rounds < 10) {
    fprintf(stderr, "usage: cma_vs_shm [BYTES [ROUNDS>=10]]\n");
    return 2;
  }
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  struct Shared* ctl = mmap(NULL, sizeof *ctl, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                            -1, 0);
  char* shared = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (ctl == MAP_FAILED || shared == MAP_FAILED) {
    perror("mmap");
    return 1;
  }
  memset(ctl, 0, sizeof *ctl);
  memset(shared, 1, bytes);
  pid_t owner = fork();
  if (owner == 0) {
    if (cpus > 1) pin(1);
    char* mine = aligned_alloc(4096, bytes);
    memset(mine, 2, bytes);
    ctl->ownerAddress = (uint64_t)(uintptr_t)mine;
    __atomic_store_n(&ctl->ready, 0, __ATOMIC_RELEASE);
    for (uint64_t seen = 0;;) {
      uint64_t r;
      while ((r = __atomic_load_n(&ctl->request, __ATOMIC_ACQUIRE)) == seen) sched_yield();
      if (r == UINT64_MAX) _exit(0);
      seen = r;
      if (ctl->dirty) {
        memset(mine, (int)(r & 0x7f), bytes);
        memset(shared, (int)(r & 0x7f), bytes);
      }
      __atomic_store_n(&ctl->ready, r, __ATOMIC_RELEASE);
    }
  }
  if (cpus > 1) pin(0);
  while (__atomic_load_n(&ctl->ownerAddress, __ATOMIC_ACQUIRE) == 0) sched_yield();
  char* dst = aligned_alloc(4096, bytes);
  char* local = aligned_alloc(4096, bytes);
  memset(dst, 0, bytes);
  memset(local, 3, bytes);
  double* t = malloc(sizeof(double) * (size_t)rounds);
  static const char* const kCases[] = {"local", "shm-clean", "readv-clean", "shm-dirty",
                                       "readv-dirty"};
  uint64_t round = 0;
  printf("# %zu B per copy, %d rounds, reader on CPU 0, owner on CPU 1 (%ld CPUs online)\n",
         bytes, rounds, cpus);
  printf("# case          bytes  median_us  best_us  median_GB/s\n");
  for (int c = 0; c < 5; ++c) {
    ctl->dirty = c >= 3;
    for (int i = -rounds / 10; i < rounds; ++i) {  // the first tenth warms up
      ++round;
      __atomic_store_n(&ctl->request, round, __ATOMIC_RELEASE);
      while (__atomic_load_n(&ctl->ready, __ATOMIC_ACQUIRE) != round) sched_yield();
      double t0 = nowUs();
      if (c == 0) {
        memcpy(dst, local, bytes);
      } else if (c == 1 || c == 3) {
        memcpy(dst, shared, bytes);
      } else {
        struct iovec l = {dst, bytes};
        struct iovec r = {(void*)(uintptr_t)ctl->ownerAddress, bytes};
        if (process_vm_readv(owner, &l, 1, &r, 1, 0) != (ssize_t)bytes) {
          fprintf(stderr, "process_vm_readv: %s\n", strerror(errno));
          kill(owner, SIGKILL);
          return 1;
        }
      }
      double us = nowUs() - t0;
      if (i >= 0) t[i] = us;
    }
    qsort(t, (size_t)rounds, sizeof(double), cmpDouble);
    double med = t[rounds / 2];
    printf("%-13s %9zu %10.2f %8.2f %12.2f\n", kCases[c], bytes, med, t[0],
           (double)bytes / med / 1e3);
  }
  __atomic_store_n(&ctl->request, UINT64_MAX, __ATOMIC_RELEASE);
  waitpid(owner, NULL, 0);
  return 0;
}
