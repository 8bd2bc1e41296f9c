/* A program of the NCCL C API that knows nothing of strata: it includes only nccl.h and runs
 * on host buffers (strata's extension) through libstrata-nccl.so. One process per rank under
 * any launcher (rank and size from STRATA_*, SLURM_*, OMPI_COMM_WORLD_*); the id goes through a
 * file (argument 1, written by rank 0) or NCCL_COMM_ID. Every check that fails prints
 * "FAIL rank R: ..." and the exit status is 1; "PASS" per rank otherwise.
 *
 *   nccl_api_test ID_FILE            every op, type and reduce op against references, grouped
 *                                     send/recv, splits, non-blocking init, bad arguments,
 *                                     then an abort by rank 0 (the others fail within the
 *                                     timeout with ncclRemoteError)
 *   nccl_api_test --single K         one process, K ranks: ncclCommInitAll, a group of inits,
 *                                     grouped collectives over the K communicators
 *   nccl_api_test --scalable K ID_FILE
 *                                     ncclCommInitRankScalable with K ids, id k made by the
 *                                     first rank of NCCL's block k and written to ID_FILE.k;
 *                                     then every reduction and the point-to-point checks
 */
#define _DEFAULT_SOURCE
#include <nccl.h>

#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int rank_ = 0, size_ = 1, failures = 0;

#define CHECK(cond, ...)                                 \
  do {                                                   \
    if (!(cond)) {                                       \
      fprintf(stderr, "FAIL rank %d: ", rank_);          \
      fprintf(stderr, __VA_ARGS__);                      \
      fprintf(stderr, " (%s:%d)\n", __FILE__, __LINE__); \
      ++failures;                                        \
    }                                                    \
  } while (0)

#define NCCL_OK(call)                                                                           \
  do {                                                                                          \
    ncclResult_t r_ = (call);                                                                   \
    if (r_ != ncclSuccess) {                                                                    \
      fprintf(stderr, "FAIL rank %d: %s returned %d (%s): %s (%s:%d)\n", rank_, #call, (int)r_, \
              ncclGetErrorString(r_), ncclGetLastError(NULL), __FILE__, __LINE__);              \
      ++failures;                                                                               \
    }                                                                                           \
  } while (0)

static int envInt(const char* a, const char* b, const char* c, int dflt) {
  const char* names[3] = {a, b, c};
  for (int i = 0; i < 3; ++i) {
    const char* v = getenv(names[i]);
    if (v && *v) return atoi(v);
  }
  return dflt;
}

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

/* ---- element types ------------------------------------------------------------------------ */

static size_t typeSize(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8:
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

static float halfToFloat(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
  if (exp == 0) {
    bits = sign;                                    /* the tests use no subnormals */
    if (man) bits = sign | ((uint32_t)(man) << 13); /* never reached */
  } else if (exp == 31) {
    bits = sign | 0x7f800000 | (man << 13);
  } else {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  }
  float f;
  memcpy(&f, &bits, 4);
  return f;
}
static uint16_t floatToHalf(float f) { /* exact for the small integers the tests use */
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000;
  if ((x & 0x7fffffff) == 0) return (uint16_t)sign;
  int exp = (int)((x >> 23) & 0xff) - 112;
  uint32_t man = x & 0x7fffff;
  uint32_t h = ((uint32_t)exp << 10) | (man >> 13);
  uint32_t rem = man & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) ++h;
  return (uint16_t)(sign | h);
}
static float bf16ToFloat(uint16_t b) {
  uint32_t bits = (uint32_t)b << 16;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}
static uint16_t floatToBf16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  x += 0x7fff + ((x >> 16) & 1);
  return (uint16_t)(x >> 16);
}

static double getv(const void* p, size_t i, ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
      return ((const int8_t*)p)[i];
    case ncclUint8:
      return ((const uint8_t*)p)[i];
    case ncclInt32:
      return ((const int32_t*)p)[i];
    case ncclUint32:
      return ((const uint32_t*)p)[i];
    case ncclInt64:
      return (double)((const int64_t*)p)[i];
    case ncclUint64:
      return (double)((const uint64_t*)p)[i];
    case ncclFloat16:
      return halfToFloat(((const uint16_t*)p)[i]);
    case ncclBfloat16:
      return bf16ToFloat(((const uint16_t*)p)[i]);
    case ncclFloat32:
      return ((const float*)p)[i];
    default:
      return ((const double*)p)[i];
  }
}
static void setv(void* p, size_t i, ncclDataType_t t, double v) {
  switch (t) {
    case ncclInt8:
      ((int8_t*)p)[i] = (int8_t)v;
      break;
    case ncclUint8:
      ((uint8_t*)p)[i] = (uint8_t)v;
      break;
    case ncclInt32:
      ((int32_t*)p)[i] = (int32_t)v;
      break;
    case ncclUint32:
      ((uint32_t*)p)[i] = (uint32_t)v;
      break;
    case ncclInt64:
      ((int64_t*)p)[i] = (int64_t)v;
      break;
    case ncclUint64:
      ((uint64_t*)p)[i] = (uint64_t)v;
      break;
    case ncclFloat16:
      ((uint16_t*)p)[i] = floatToHalf((float)v);
      break;
    case ncclBfloat16:
      ((uint16_t*)p)[i] = floatToBf16((float)v);
      break;
    case ncclFloat32:
      ((float*)p)[i] = (float)v;
      break;
    default:
      ((double*)p)[i] = v;
      break;
  }
}
static int isFloat(ncclDataType_t t) {
  return t == ncclFloat16 || t == ncclBfloat16 || t == ncclFloat32 || t == ncclFloat64;
}

/* Rank r's element i: small integers, so that sums and products are exact in every type and
 * in any order (products: 1 or 2, four ranks at most: 16). */
static double input(int r, size_t i, ncclRedOp_t op) {
  if (op == ncclProd) return (double)(1 + ((i + (size_t)r) % 2));
  return (double)((i * 7 + (size_t)r * 3) % 11);
}

static const ncclDataType_t kTypes[] = {ncclInt8,    ncclUint8,  ncclInt32,   ncclUint32,
                                        ncclInt64,   ncclUint64, ncclFloat16, ncclBfloat16,
                                        ncclFloat32, ncclFloat64};
static const ncclRedOp_t kOps[] = {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg};

static double expected(size_t i, ncclRedOp_t op, int n, double scale) {
  double acc = input(0, i, op) * scale;
  for (int r = 1; r < n; ++r) {
    double v = input(r, i, op) * scale;
    if (op == ncclSum || op == ncclAvg || op >= ncclNumOps) acc += v;
    if (op == ncclProd) acc *= v;
    if (op == ncclMax) acc = v > acc ? v : acc;
    if (op == ncclMin) acc = v < acc ? v : acc;
  }
  return acc;
}

static int close_(double got, double want, ncclDataType_t t, ncclRedOp_t op, int n) {
  if (op == ncclAvg) {
    if (!isFloat(t)) return got == floor(want / n);
    double w = want / n;
    return fabs(got - w) <= (t == ncclFloat16 || t == ncclBfloat16 ? 0.02 : 1e-5) * (fabs(w) + 1);
  }
  return got == want;
}

/* ---- the checks ---------------------------------------------------------------------------- */

static void reductions(ncclComm_t comm) {
  const size_t count = 1001;
  for (size_t ti = 0; ti < sizeof kTypes / sizeof kTypes[0]; ++ti) {
    ncclDataType_t t = kTypes[ti];
    size_t es = typeSize(t);
    char* send = malloc(count * es * size_);
    char* recv = malloc(count * es * size_);
    for (size_t oi = 0; oi < 6; ++oi) {
      ncclRedOp_t op = ncclSum;
      double scale = 1;
      int preMul = oi == 5;
      if (preMul) {
        /* 2 as the datatype, resident on the host (immediate) */
        char scalar[8];
        setv(scalar, 0, t, 2.0);
        NCCL_OK(ncclRedOpCreatePreMulSum(&op, scalar, t, ncclScalarHostImmediate, comm));
        scale = 2;
      } else {
        op = kOps[oi];
      }
      ncclRedOp_t refOp = preMul ? ncclSum : op;
      /* allReduce, out of place then in place */
      for (int inPlace = 0; inPlace < 2; ++inPlace) {
        for (size_t i = 0; i < count; ++i) setv(send, i, t, input(rank_, i, refOp));
        memset(recv, 0x5a, count * es);
        char* src = send;
        if (inPlace) {
          memcpy(recv, send, count * es);
          src = recv;
        }
        NCCL_OK(ncclAllReduce(src, recv, count, t, op, comm, NULL));
        size_t bad = 0;
        for (size_t i = 0; i < count; ++i) {
          if (!close_(getv(recv, i, t), expected(i, refOp, size_, scale), t, refOp, size_)) ++bad;
        }
        CHECK(bad == 0, "allReduce type %d op %d%s%s: %zu wrong of %zu", (int)t, (int)op,
              preMul ? " (pre-mul-sum)" : "", inPlace ? " in place" : "", bad, count);
      }
      /* reduce to every root */
      for (int root = 0; root < size_; ++root) {
        for (size_t i = 0; i < count; ++i) setv(send, i, t, input(rank_, i, refOp));
        memset(recv, 0x5a, count * es);
        NCCL_OK(ncclReduce(send, recv, count, t, op, root, comm, NULL));
        if (rank_ == root) {
          size_t bad = 0;
          for (size_t i = 0; i < count; ++i) {
            if (!close_(getv(recv, i, t), expected(i, refOp, size_, scale), t, refOp, size_)) ++bad;
          }
          CHECK(bad == 0, "reduce type %d op %d root %d: %zu wrong", (int)t, (int)op, root, bad);
        }
      }
      /* reduceScatter: block r of the reduction */
      for (size_t i = 0; i < count * size_; ++i) setv(send, i, t, input(rank_, i, refOp));
      memset(recv, 0x5a, count * es);
      NCCL_OK(ncclReduceScatter(send, recv, count, t, op, comm, NULL));
      size_t bad = 0;
      for (size_t i = 0; i < count; ++i) {
        size_t g = (size_t)rank_ * count + i;
        if (!close_(getv(recv, i, t), expected(g, refOp, size_, scale), t, refOp, size_)) ++bad;
      }
      CHECK(bad == 0, "reduceScatter type %d op %d: %zu wrong", (int)t, (int)op, bad);
      if (preMul) NCCL_OK(ncclRedOpDestroy(op, comm));
    }
    free(send);
    free(recv);
  }
}

static void copies(ncclComm_t comm) {
  const size_t count = 777;
  for (size_t ti = 0; ti < sizeof kTypes / sizeof kTypes[0]; ti += 3) {
    ncclDataType_t t = kTypes[ti];
    size_t es = typeSize(t), n = (size_t)size_;
    char* send = malloc(count * es * n);
    char* recv = malloc(count * es * n);
    /* broadcast and bcast from every root */
    for (int root = 0; root < size_; ++root) {
      for (size_t i = 0; i < count; ++i) setv(send, i, t, input(rank_, i, ncclSum));
      memset(recv, 0, count * es);
      NCCL_OK(ncclBroadcast(send, recv, count, t, root, comm, NULL));
      size_t bad = 0;
      for (size_t i = 0; i < count; ++i) bad += getv(recv, i, t) != input(root, i, ncclSum);
      CHECK(bad == 0, "broadcast type %d root %d: %zu wrong", (int)t, root, bad);
      for (size_t i = 0; i < count; ++i) setv(recv, i, t, input(rank_, i, ncclSum));
      NCCL_OK(ncclBcast(recv, count, t, root, comm, NULL));
      bad = 0;
      for (size_t i = 0; i < count; ++i) bad += getv(recv, i, t) != input(root, i, ncclSum);
      CHECK(bad == 0, "bcast type %d root %d: %zu wrong", (int)t, root, bad);
    }
    /* allGather */
    for (size_t i = 0; i < count; ++i) setv(send, i, t, input(rank_, i, ncclSum));
    memset(recv, 0, count * es * n);
    NCCL_OK(ncclAllGather(send, recv, count, t, comm, NULL));
    size_t bad = 0;
    for (size_t r = 0; r < n; ++r) {
      for (size_t i = 0; i < count; ++i)
        bad += getv(recv, r * count + i, t) != input((int)r, i, ncclSum);
    }
    CHECK(bad == 0, "allGather type %d: %zu wrong", (int)t, bad);
    /* allToAll: block j of rank r holds input(r, j * count + i) */
    for (size_t i = 0; i < count * n; ++i) setv(send, i, t, input(rank_, i, ncclSum));
    memset(recv, 0, count * es * n);
    NCCL_OK(ncclAlltoAll(send, recv, count, t, comm, NULL));
    bad = 0;
    for (size_t r = 0; r < n; ++r) {
      for (size_t i = 0; i < count; ++i) {
        bad += getv(recv, r * count + i, t) != input((int)r, (size_t)rank_ * count + i, ncclSum);
      }
    }
    CHECK(bad == 0, "alltoAll type %d: %zu wrong", (int)t, bad);
    /* gather and scatter at every root */
    for (int root = 0; root < size_; ++root) {
      for (size_t i = 0; i < count; ++i) setv(send, i, t, input(rank_, i, ncclSum));
      memset(recv, 0, count * es * n);
      NCCL_OK(ncclGather(send, recv, count, t, root, comm, NULL));
      if (rank_ == root) {
        bad = 0;
        for (size_t r = 0; r < n; ++r) {
          for (size_t i = 0; i < count; ++i)
            bad += getv(recv, r * count + i, t) != input((int)r, i, ncclSum);
        }
        CHECK(bad == 0, "gather type %d root %d: %zu wrong", (int)t, root, bad);
      }
      for (size_t i = 0; i < count * n; ++i) setv(send, i, t, input(rank_, i, ncclSum));
      memset(recv, 0, count * es);
      NCCL_OK(ncclScatter(send, recv, count, t, root, comm, NULL));
      bad = 0;
      for (size_t i = 0; i < count; ++i) {
        bad += getv(recv, i, t) != input(root, (size_t)rank_ * count + i, ncclSum);
      }
      CHECK(bad == 0, "scatter type %d root %d: %zu wrong", (int)t, root, bad);
    }
    free(send);
    free(recv);
  }
}

static void pointToPoint(ncclComm_t comm) {
  const size_t count = 100000; /* 400 KB: more than a slot holds */
  int next = (rank_ + 1) % size_, prev = (rank_ + size_ - 1) % size_;
  float* send = malloc(count * 4 * size_);
  float* recv = malloc(count * 4 * size_);
  for (int order = 0; order < 2; ++order) {
    for (size_t i = 0; i < count; ++i) send[i] = (float)(rank_ * 1000 + (int)(i % 997));
    memset(recv, 0, count * 4);
    NCCL_OK(ncclGroupStart());
    if (order == 0) {
      NCCL_OK(ncclSend(send, count, ncclFloat32, next, comm, NULL));
      NCCL_OK(ncclRecv(recv, count, ncclFloat32, prev, comm, NULL));
    } else {
      NCCL_OK(ncclRecv(recv, count, ncclFloat32, prev, comm, NULL));
      NCCL_OK(ncclSend(send, count, ncclFloat32, next, comm, NULL));
    }
    NCCL_OK(ncclGroupEnd());
    size_t bad = 0;
    for (size_t i = 0; i < count; ++i) bad += recv[i] != (float)(prev * 1000 + (int)(i % 997));
    CHECK(bad == 0, "grouped ring (%s first): %zu wrong", order ? "recv" : "send", bad);
  }
  /* all-to-all from grouped sends and receives (receives first, nested groups) */
  for (size_t i = 0; i < count * size_; ++i) send[i] = (float)(rank_ * 100000 + (int)i);
  memset(recv, 0, count * 4 * size_);
  NCCL_OK(ncclGroupStart());
  for (int p = 0; p < size_; ++p)
    NCCL_OK(ncclRecv(recv + p * count, count, ncclFloat32, p, comm, NULL));
  NCCL_OK(ncclGroupStart());
  for (int p = 0; p < size_; ++p)
    NCCL_OK(ncclSend(send + p * count, count, ncclFloat32, p, comm, NULL));
  NCCL_OK(ncclGroupEnd());
  NCCL_OK(ncclGroupEnd());
  size_t bad = 0;
  for (int p = 0; p < size_; ++p) {
    for (size_t i = 0; i < count; ++i) {
      bad += recv[p * count + i] != (float)(p * 100000 + (int)(rank_ * count + i));
    }
  }
  CHECK(bad == 0, "all-to-all from grouped send/recv: %zu wrong", bad);
  /* ungrouped: even ranks send first, odd ranks receive first */
  if (size_ % 2 == 0) {
    int partner = rank_ ^ 1;
    for (size_t i = 0; i < count; ++i) send[i] = (float)(rank_ + (int)i);
    if (rank_ % 2 == 0) {
      NCCL_OK(ncclSend(send, count, ncclFloat32, partner, comm, NULL));
      NCCL_OK(ncclRecv(recv, count, ncclFloat32, partner, comm, NULL));
    } else {
      NCCL_OK(ncclRecv(recv, count, ncclFloat32, partner, comm, NULL));
      NCCL_OK(ncclSend(send, count, ncclFloat32, partner, comm, NULL));
    }
    bad = 0;
    for (size_t i = 0; i < count; ++i) bad += recv[i] != (float)(partner + (int)i);
    CHECK(bad == 0, "send/recv pair: %zu wrong", bad);
  }
  free(send);
  free(recv);
}

static void waitReady(ncclComm_t comm, const char* what) {
  ncclResult_t state = ncclInProgress;
  double until = now() + 60;
  while (state == ncclInProgress && now() < until) {
    NCCL_OK(ncclCommGetAsyncError(comm, &state));
    if (state == ncclInProgress) usleep(1000);
  }
  CHECK(state == ncclSuccess, "%s: state %d after polling: %s", what, (int)state,
        ncclGetLastError(comm));
}

static void splits(ncclComm_t comm) {
  /* two halves (even and odd ranks), ranked in reverse by key, running different collectives */
  ncclComm_t half = NULL;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  config.commName = "half";
  ncclResult_t r = ncclCommSplit(comm, rank_ % 2, -rank_, &half, &config);
  CHECK(r == ncclSuccess || r == ncclInProgress, "non-blocking split returned %d", (int)r);
  waitReady(half, "split");
  int hn = 0, hr = -1;
  NCCL_OK(ncclCommCount(half, &hn));
  NCCL_OK(ncclCommUserRank(half, &hr));
  int members = (size_ + 1 - rank_ % 2) / 2;
  CHECK(hn == members, "split: %d ranks, want %d", hn, members);
  /* key -rank: the highest parent rank comes first */
  int above = 0;
  for (int q = rank_ + 2; q < size_; q += 2) ++above;
  CHECK(hr == above, "split: new rank %d, want %d", hr, above);
  double v = rank_, out = -1;
  if (rank_ % 2 == 0) {
    NCCL_OK(ncclAllReduce(&v, &out, 1, ncclFloat64, ncclMax, half, NULL));
    double want = (size_ - 1) % 2 == 0 ? size_ - 1 : size_ - 2;
    CHECK(out == want, "even half allReduce max: %g, want %g", out, want);
  } else {
    double* all = calloc((size_t)hn, sizeof(double));
    NCCL_OK(ncclAllGather(&v, all, 1, ncclFloat64, half, NULL));
    for (int i = 0; i < hn; ++i) {
      double want = size_ - 1 - 2 * i - ((size_ - 1) % 2 == 1 ? 0 : 1);
      CHECK(all[i] == want, "odd half allGather [%d]: %g, want %g", i, all[i], want);
    }
    free(all);
  }
  NCCL_OK(ncclCommDestroy(half));
  /* NOCOLOR: no communicator */
  ncclComm_t none = (ncclComm_t)1;
  NCCL_OK(ncclCommSplit(comm, rank_ == 0 ? NCCL_SPLIT_NOCOLOR : 1, 0, &none, NULL));
  if (rank_ == 0) {
    CHECK(none == NULL, "NOCOLOR split gave a communicator");
  } else {
    int n = 0;
    NCCL_OK(ncclCommCount(none, &n));
    CHECK(n == size_ - 1, "split without rank 0: %d ranks", n);
    NCCL_OK(ncclCommDestroy(none));
  }
}

static void badArguments(ncclComm_t comm) {
  float x = 1, y = 0;
  ncclResult_t r = ncclAllReduce(&x, &y, 1, ncclFloat32, ncclSum, NULL, NULL);
  CHECK(r == ncclInvalidArgument, "NULL comm: %d", (int)r);
  CHECK(strlen(ncclGetLastError(NULL)) > 0, "NULL comm: no last error");
  r = ncclAllReduce(&x, &y, 1, (ncclDataType_t)99, ncclSum, comm, NULL);
  CHECK(r == ncclInvalidArgument, "bad type: %d", (int)r);
  CHECK(strstr(ncclGetLastError(comm), "datatype 99") != NULL, "bad type text: %s",
        ncclGetLastError(comm));
  r = ncclAllReduce(&x, &y, 1, ncclFloat8e4m3, ncclSum, comm, NULL);
  CHECK(r == ncclInvalidArgument, "fp8: %d", (int)r);
  r = ncclAllReduce(&x, &y, 1, ncclFloat32, (ncclRedOp_t)99, comm, NULL);
  CHECK(r == ncclInvalidArgument, "bad op: %d", (int)r);
  CHECK(strstr(ncclGetLastError(comm), "op 99") != NULL, "bad op text: %s", ncclGetLastError(comm));
  r = ncclBroadcast(&x, &y, 1, ncclFloat32, size_, comm, NULL);
  CHECK(r == ncclInvalidArgument, "bad root: %d", (int)r);
  r = ncclSend(&x, 1, ncclFloat32, -1, comm, NULL);
  CHECK(r == ncclInvalidArgument, "bad peer: %d", (int)r);
  r = ncclAllReduce(NULL, &y, 1, ncclFloat32, ncclSum, comm, NULL);
  CHECK(r == ncclInvalidArgument, "NULL sendbuff: %d", (int)r);
  r = ncclGroupEnd();
  CHECK(r == ncclInvalidUsage, "GroupEnd without start: %d", (int)r);
  ncclComm_t c = NULL;
  r = ncclCommRevoke(comm, 5);
  CHECK(r == ncclInvalidArgument && strstr(ncclGetLastError(comm), "revokeFlags 5") != NULL,
        "revoke with bad flags: %d %s", (int)r, ncclGetLastError(comm));
  r = ncclCommShrink(comm, NULL, 1, &c, NULL, NCCL_SHRINK_DEFAULT);
  CHECK(r == ncclInvalidArgument, "shrink with a NULL list of 1: %d", (int)r);
  r = ncclCommShrink(comm, NULL, 0, &c, NULL, 7);
  CHECK(r == ncclInvalidArgument, "shrink with bad flags: %d", (int)r);
  r = ncclCommShrink(comm, &rank_, 1, &c, NULL, NCCL_SHRINK_DEFAULT);
  CHECK(r == ncclInvalidArgument && c == NULL, "shrink excluding this rank: %d", (int)r);
  ncclUniqueId junk;
  memset(&junk, 7, sizeof junk);
  r = ncclCommInitRank(&c, 2, junk, 0);
  CHECK(r == ncclInvalidArgument, "junk id: %d", (int)r);
  r = ncclRedOpDestroy(ncclSum, comm);
  CHECK(r == ncclInvalidArgument, "destroy built-in op: %d", (int)r);
  /* the communicator still works after refused arguments */
  NCCL_OK(ncclAllReduce(&x, &y, 1, ncclFloat32, ncclSum, comm, NULL));
  CHECK(y == (float)size_, "allReduce after bad arguments: %g", y);
}

static void misc(ncclComm_t comm) {
  int v = 0;
  NCCL_OK(ncclGetVersion(&v));
  CHECK(v == NCCL_VERSION_CODE, "version %d, want %d", v, NCCL_VERSION_CODE);
  int n = 0, r = -1, d = -1;
  NCCL_OK(ncclCommCount(comm, &n));
  NCCL_OK(ncclCommUserRank(comm, &r));
  NCCL_OK(ncclCommCuDevice(comm, &d));
  CHECK(n == size_ && r == rank_, "count %d rank %d", n, r);
  void* handle = NULL;
  float* mem = NULL;
  NCCL_OK(ncclMemAlloc((void**)&mem, 4096 * sizeof(float)));
  NCCL_OK(ncclCommRegister(comm, mem, 4096 * sizeof(float), &handle));
  for (int i = 0; i < 4096; ++i) mem[i] = (float)(rank_ + 1);
  NCCL_OK(ncclAllReduce(mem, mem, 4096, ncclFloat32, ncclSum, comm, NULL));
  CHECK(mem[4095] == (float)(size_ * (size_ + 1) / 2), "allReduce on ncclMemAlloc: %g", mem[4095]);
  NCCL_OK(ncclCommDeregister(comm, handle));
  CHECK(ncclCommDeregister(comm, handle) == ncclInvalidArgument, "double deregister");
  NCCL_OK(ncclMemFree(mem));
  ncclWindow_t win = (ncclWindow_t)1;
  NCCL_OK(ncclCommWindowRegister(comm, &v, sizeof v, &win, NCCL_WIN_DEFAULT));
  CHECK(win == NULL, "a window where strata has no symmetric kernels");
  NCCL_OK(ncclCommWindowDeregister(comm, win));
  ncclResult_t async = ncclInternalError;
  NCCL_OK(ncclCommGetAsyncError(comm, &async));
  CHECK(async == ncclSuccess, "async error %d", (int)async);
  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclAllReduce(&v, &v, 1, ncclInt32, ncclSum, comm, NULL));
  NCCL_OK(ncclGroupSimulateEnd(&sim));
}

static void countMismatch(ncclComm_t comm) {
  /* every rank calls allReduce, rank r with 100 + r elements, on a communicator of its own
   * (split off, so that the world stays usable): a clear error on every rank, no hang */
  ncclComm_t mm = NULL;
  NCCL_OK(ncclCommSplit(comm, 0, rank_, &mm, NULL));
  float buf[200];
  for (int i = 0; i < 200; ++i) buf[i] = 1;
  double t0 = now();
  ncclResult_t r = ncclAllReduce(buf, buf, 100 + (size_t)rank_, ncclFloat32, ncclSum, mm, NULL);
  CHECK(r == ncclRemoteError || r == ncclInvalidUsage, "mismatched counts: %d", (int)r);
  CHECK(
      strstr(ncclGetLastError(mm), "count") != NULL || strstr(ncclGetLastError(mm), "rank") != NULL,
      "mismatched counts, text: %s", ncclGetLastError(mm));
  fprintf(stderr, "rank %d: mismatched counts: %s after %.1f s: %s\n", rank_, ncclGetErrorString(r),
          now() - t0, ncclGetLastError(mm));
  NCCL_OK(ncclCommDestroy(mm));
}

static void abortTest(ncclComm_t comm) {
  /* rank 0 aborts while the others wait in an allReduce it never joins */
  if (rank_ == 0) {
    usleep(300 * 1000);
    NCCL_OK(ncclCommAbort(comm));
    /* stay alive: the others must learn of the abort, not of this process's exit */
    usleep(10 * 1000 * 1000); /* past the others' transport.timeout (8 s in the tests) */
    return;
  }
  float x = 1, y = 0;
  double t0 = now();
  ncclResult_t r = ncclAllReduce(&x, &y, 1, ncclFloat32, ncclSum, comm, NULL);
  double took = now() - t0;
  CHECK(r == ncclRemoteError, "allReduce against an aborted rank 0: %d (%s)", (int)r,
        ncclGetLastError(comm));
  CHECK(took < 20, "allReduce against an aborted rank 0 took %.1f s", took);
  fprintf(stderr, "rank %d: after rank 0's abort: %s (%.1f s): %s\n", rank_, ncclGetErrorString(r),
          took, ncclGetLastError(comm));
  /* a broken communicator fails at once */
  r = ncclAllReduce(&x, &y, 1, ncclFloat32, ncclSum, comm, NULL);
  CHECK(r == ncclRemoteError, "second call on a broken communicator: %d", (int)r);
  NCCL_OK(ncclCommDestroy(comm));
}

static int single(int k) {
  ncclComm_t* comms = calloc((size_t)k, sizeof(ncclComm_t));
  NCCL_OK(ncclCommInitAll(comms, k, NULL));
  float* bufs = calloc((size_t)k * 64, sizeof(float));
  for (int i = 0; i < k * 64; ++i) bufs[i] = (float)(i / 64 + 1);
  NCCL_OK(ncclGroupStart());
  for (int i = 0; i < k; ++i) {
    NCCL_OK(ncclAllReduce(bufs + i * 64, bufs + i * 64, 64, ncclFloat32, ncclSum, comms[i], NULL));
  }
  NCCL_OK(ncclGroupEnd());
  for (int i = 0; i < k * 64; ++i) {
    CHECK(bufs[i] == (float)(k * (k + 1) / 2), "InitAll allReduce [%d]: %g", i, bufs[i]);
  }
  for (int i = 0; i < k; ++i) NCCL_OK(ncclCommDestroy(comms[i]));
  /* a group of inits, as nccl-tests does with several GPUs per process */
  ncclUniqueId id;
  NCCL_OK(ncclGetUniqueId(&id));
  NCCL_OK(ncclGroupStart());
  for (int i = 0; i < k; ++i) NCCL_OK(ncclCommInitRank(&comms[i], k, id, i));
  NCCL_OK(ncclGroupEnd());
  for (int i = 0; i < k; ++i) {
    int r = -1;
    NCCL_OK(ncclCommUserRank(comms[i], &r));
    CHECK(r == i, "grouped init %d: rank %d", i, r);
  }
  NCCL_OK(ncclGroupStart());
  for (int i = 0; i < k; ++i) {
    NCCL_OK(ncclBroadcast(bufs + i * 64, bufs + i * 64, 64, ncclFloat32, k - 1, comms[i], NULL));
  }
  NCCL_OK(ncclGroupEnd());
  for (int i = 0; i < k; ++i) NCCL_OK(ncclCommDestroy(comms[i]));
  /* An init that cannot complete (rank 1 of 2, and nobody is rank 0) fails within the
   * bootstrap's timeout (1 s here) and leaves no communicator; in a group, a call queued on
   * such a communicator fails with it instead of running. */
  setenv("STRATA_BOOTSTRAP_TIMEOUT", "1", 1);
  setenv("STRATA_BOOTSTRAP_CONNECT_TIMEOUT", "1", 1);
  ncclComm_t lonely = (ncclComm_t)1;
  NCCL_OK(ncclGetUniqueId(&id));
  double t0 = now();
  ncclResult_t r = ncclCommInitRank(&lonely, 2, id, 1);
  CHECK(r != ncclSuccess && lonely == NULL && now() - t0 < 30,
        "an init without rank 0: %d, comm %p, %.1f s", (int)r, (void*)lonely, now() - t0);
  NCCL_OK(ncclGetUniqueId(&id));
  float x = 1;
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclCommInitRank(&lonely, 2, id, 1));
  NCCL_OK(ncclAllReduce(&x, &x, 1, ncclFloat32, ncclSum, lonely, NULL));
  r = ncclGroupEnd();
  CHECK(r != ncclSuccess, "a group whose init failed: %d", (int)r);
  ncclResult_t state = ncclSuccess;
  NCCL_OK(ncclCommGetAsyncError(lonely, &state));
  CHECK(state != ncclSuccess && state != ncclInProgress, "its async error: %d", (int)state);
  NCCL_OK(ncclCommDestroy(lonely));
  unsetenv("STRATA_BOOTSTRAP_TIMEOUT");
  unsetenv("STRATA_BOOTSTRAP_CONNECT_TIMEOUT");
  free(bufs);
  free(comms);
  printf("%s single process, %d ranks\n", failures ? "FAIL" : "PASS", k);
  return failures ? 1 : 0;
}

/* --die: rank 1 is killed (SIGKILL) right after init; every other rank's allReduce fails with
 * ncclRemoteError naming it, well within the transport timeout, and the next call fails at
 * once. Survivors print "PASS survivor". */
static int die(ncclComm_t comm) {
  if (rank_ == 1) raise(SIGKILL);
  usleep(200 * 1000);
  float x = 1, y = 0;
  double t0 = now();
  ncclResult_t r = ncclAllReduce(&x, &y, 1, ncclFloat32, ncclSum, comm, NULL);
  double took = now() - t0;
  CHECK(r == ncclRemoteError && strstr(ncclGetLastError(comm), "rank 1") != NULL,
        "allReduce after rank 1 died: %d: %s", (int)r, ncclGetLastError(comm));
  CHECK(took < 5, "allReduce after rank 1 died took %.1f s", took);
  r = ncclAllReduce(&x, &y, 1, ncclFloat32, ncclSum, comm, NULL);
  CHECK(r == ncclRemoteError, "the next call on the broken communicator: %d", (int)r);
  fprintf(stderr, "rank %d: after rank 1 died: %s in %.2f s: %s\n", rank_, ncclGetErrorString(r),
          took, ncclGetLastError(comm));
  ncclCommDestroy(comm);
  printf("%s survivor rank %d\n", failures ? "FAIL" : "PASS", rank_);
  return failures ? 1 : 0;
}

/* allReduce(sum) of rank + 1 on comm, of n ranks, checked; returns the result code. */
static ncclResult_t sumCheck(ncclComm_t comm, int n, const char* what) {
  float x[64], y[64];
  for (int i = 0; i < 64; ++i) x[i] = (float)(rank_ + 1), y[i] = -1;
  ncclResult_t r = ncclAllReduce(x, y, 64, ncclFloat32, ncclSum, comm, NULL);
  if (r != ncclSuccess) return r;
  int wrong = 0;
  for (int i = 0; i < 64; ++i) wrong += y[i] != (float)(n * (n + 1) / 2);
  CHECK(wrong == 0, "%s: %d wrong elements", what, wrong);
  return r;
}

/* --shrink (under strata-run --keep-going): rank 0 revokes, every rank's next call fails naming
 * it, and ncclCommShrink without exclusions gives a communicator of every rank; then the last rank
 * dies (SIGKILL), the others' calls fail, and ncclCommShrink(NCCL_SHRINK_ABORT) excluding it gives
 * one of the survivors, in their order, whose collectives are right. Survivors print
 * "PASS survivor". */
static int shrinkMode(ncclComm_t comm) {
  float x = 1, y = 0;
  ncclResult_t r;
  /* Every rank's init has completed before rank 0 revokes: a rank still polling its
   * non-blocking init saw the revoke instead (state 6, CI at stop 40). */
  NCCL_OK(ncclAllReduce(&x, &y, 1, ncclFloat32, ncclSum, comm, NULL));
  y = 0;
  if (rank_ == 0) {
    NCCL_OK(ncclCommRevoke(comm, NCCL_REVOKE_DEFAULT));
    ncclResult_t state = ncclInProgress;
    NCCL_OK(ncclCommGetAsyncError(comm, &state));
    CHECK(state == ncclSuccess, "async error after this rank's revoke: %d", (int)state);
    r = ncclAllReduce(&x, &y, 1, ncclFloat32, ncclSum, comm, NULL);
    CHECK(r != ncclSuccess, "allReduce on the revoked communicator succeeded");
  } else {
    double t0 = now();
    for (int i = 0; i < 100000; ++i) {
      r = ncclAllReduce(&x, &y, 1, ncclFloat32, ncclSum, comm, NULL);
      if (r != ncclSuccess) break;
    }
    CHECK(r == ncclRemoteError && strstr(ncclGetLastError(comm), "revoked by rank 0") != NULL,
          "after rank 0's revoke: %d: %s", (int)r, ncclGetLastError(comm));
    fprintf(stderr, "rank %d: revoked in %.3f s: %s\n", rank_, now() - t0, ncclGetLastError(comm));
  }
  ncclComm_t all = NULL;
  NCCL_OK(ncclCommShrink(comm, NULL, 0, &all, NULL, NCCL_SHRINK_DEFAULT));
  if (!all) return 1;
  NCCL_OK(ncclCommDestroy(comm));
  int n = 0, me = -1;
  NCCL_OK(ncclCommCount(all, &n));
  NCCL_OK(ncclCommUserRank(all, &me));
  CHECK(n == size_ && me == rank_, "shrink without exclusions: rank %d of %d", me, n);
  NCCL_OK(sumCheck(all, n, "after the first shrink"));
  const int dead = size_ - 1;
  if (rank_ == dead) raise(SIGKILL);
  for (int i = 0; i < 100000; ++i) {
    r = ncclAllReduce(&x, &y, 1, ncclFloat32, ncclSum, all, NULL);
    if (r != ncclSuccess) break;
  }
  CHECK(r == ncclRemoteError, "after rank %d died: %d", dead, (int)r);
  ncclComm_t rest = NULL;
  int excluded[1] = {dead};
  NCCL_OK(ncclCommShrink(all, excluded, 1, &rest, NULL, NCCL_SHRINK_ABORT));
  if (!rest) return 1;
  NCCL_OK(ncclCommAbort(all));
  NCCL_OK(ncclCommCount(rest, &n));
  NCCL_OK(ncclCommUserRank(rest, &me));
  CHECK(n == size_ - 1 && me == rank_, "shrink without rank %d: rank %d of %d", dead, me, n);
  float v[1000], w[1000];
  for (int round = 0; round < 20; ++round) {
    for (int i = 0; i < 1000; ++i) v[i] = (float)(rank_ + 1 + i % 3), w[i] = -1;
    NCCL_OK(ncclAllReduce(v, w, 1000, ncclFloat32, ncclSum, rest, NULL));
    int wrong = 0;
    for (int i = 0; i < 1000; ++i) wrong += w[i] != (float)(n * (n + 1) / 2 + n * (i % 3));
    CHECK(wrong == 0, "allReduce %d on the shrunk communicator: %d wrong", round, wrong);
  }
  NCCL_OK(ncclCommDestroy(rest));
  printf("%s survivor rank %d\n", failures ? "FAIL" : "PASS", rank_);
  return failures ? 1 : 0;
}

/* Writes id to path atomically (a rename), or reads it, waiting up to 60 s for the file. */
static int writeId(const ncclUniqueId* id, const char* path) {
  char tmp[4096];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE* f = fopen(tmp, "wb");
  if (!f || fwrite(id, sizeof *id, 1, f) != 1 || fclose(f) != 0 || rename(tmp, path) != 0) {
    fprintf(stderr, "FAIL rank %d: cannot write %s\n", rank_, path);
    return 1;
  }
  return 0;
}
static int readId(ncclUniqueId* id, const char* path) {
  double until = now() + 60;
  FILE* f = NULL;
  while (!(f = fopen(path, "rb")) && now() < until) usleep(10000);
  if (!f || fread(id, sizeof *id, 1, f) != 1) {
    fprintf(stderr, "FAIL rank %d: no id in %s\n", rank_, path);
    if (f) fclose(f);
    return 1;
  }
  fclose(f);
  return 0;
}

/* NCCL's blocks: k * (n / K) + min(k, n % K) is the first rank of block k. */
static int blockStart(int k, int n, int roots) {
  return k * (n / roots) + (k < n % roots ? k : n % roots);
}

static int scalable(int roots, const char* prefix) {
  ncclUniqueId* ids = calloc((size_t)roots, sizeof *ids);
  char path[4096];
  for (int k = 0; k < roots; ++k) {
    if (rank_ != blockStart(k, size_, roots)) continue;
    snprintf(path, sizeof path, "%s.%d", prefix, k);
    NCCL_OK(ncclGetUniqueId(&ids[k]));
    if (writeId(&ids[k], path)) return 1;
  }
  for (int k = 0; k < roots; ++k) {
    snprintf(path, sizeof path, "%s.%d", prefix, k);
    if (readId(&ids[k], path)) return 1;
  }
  /* More ids than ranks, and no ids, are refused before any rendezvous. */
  ncclComm_t comm = NULL;
  ncclUniqueId* many = calloc((size_t)size_ + 1, sizeof *many);
  for (int i = 0; i <= size_; ++i) NCCL_OK(ncclGetUniqueId(&many[i]));
  ncclResult_t r = ncclCommInitRankScalable(&comm, size_, rank_, size_ + 1, many, NULL);
  CHECK(r == ncclInvalidArgument && comm == NULL &&
            strstr(ncclGetLastError(NULL), "at most one per rank") != NULL,
        "%d ids for %d ranks: %d: %s", size_ + 1, size_, (int)r, ncclGetLastError(NULL));
  free(many);
  r = ncclCommInitRankScalable(&comm, size_, rank_, 0, ids, NULL);
  CHECK(r == ncclInvalidArgument && comm == NULL, "no ids: %d", (int)r);

  double t0 = now();
  NCCL_OK(ncclCommInitRankScalable(&comm, size_, rank_, roots, ids, NULL));
  if (!comm) return 1;
  int got = -1, count = -1;
  NCCL_OK(ncclCommUserRank(comm, &got));
  NCCL_OK(ncclCommCount(comm, &count));
  CHECK(got == rank_ && count == size_, "scalable init: rank %d of %d", got, count);
  reductions(comm);
  pointToPoint(comm);
  NCCL_OK(ncclCommFinalize(comm));
  NCCL_OK(ncclCommDestroy(comm));
  free(ids);
  printf("%s scalable rank %d of %d, %d roots (init %.3f s)\n", failures ? "FAIL" : "PASS", rank_,
         size_, roots, now() - t0);
  return failures ? 1 : 0;
}

int main(int argc, char** argv) {
  if (argc >= 3 && strcmp(argv[1], "--single") == 0) return single(atoi(argv[2]));
  const int dieMode = argc >= 2 && strcmp(argv[1], "--die") == 0;
  const int shrinkTest = argc >= 2 && strcmp(argv[1], "--shrink") == 0;
  if (dieMode || shrinkTest) {
    --argc;
    ++argv;
  }
  rank_ = envInt("STRATA_RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", 0);
  size_ = envInt("STRATA_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", 1);
  ncclUniqueId id;
  if (argc >= 4 && strcmp(argv[1], "--scalable") == 0) return scalable(atoi(argv[2]), argv[3]);
  const char* idFile = argc >= 2 ? argv[1] : NULL;
  if (getenv("NCCL_COMM_ID") || !idFile) {
    NCCL_OK(ncclGetUniqueId(&id)); /* every rank computes the same id */
  } else if (rank_ == 0) {
    NCCL_OK(ncclGetUniqueId(&id));
    if (writeId(&id, idFile)) return 1;
  } else if (readId(&id, idFile)) {
    return 1;
  }
  ncclComm_t comm = NULL;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = rank_ % 2; /* odd ranks block, even ranks poll */
  config.commName = "world";
  ncclResult_t r = ncclCommInitRankConfig(&comm, size_, id, rank_, &config);
  CHECK(r == ncclSuccess || r == ncclInProgress, "init returned %d: %s", (int)r,
        ncclGetLastError(NULL));
  if (!comm) return 1;
  waitReady(comm, "init");
  if (failures) return 1;
  if (dieMode) return die(comm);
  if (shrinkTest) return shrinkMode(comm);
  misc(comm);
  reductions(comm);
  copies(comm);
  pointToPoint(comm);
  splits(comm);
  badArguments(comm);
  if (size_ > 1) countMismatch(comm);
  if (size_ > 1) {
    abortTest(comm);
  } else {
    NCCL_OK(ncclCommFinalize(comm));
    NCCL_OK(ncclCommDestroy(comm));
  }
  printf("%s rank %d of %d\n", failures ? "FAIL" : "PASS", rank_, size_);
  return failures ? 1 : 0;
}
