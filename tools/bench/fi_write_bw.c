// Direct libfabric RDM fi_write bandwidth between two processes on this machine: the reference
// for strata's fabric transport (same provider, same sizes, same completion level).
// Build: cc -O2 -o fi_write_bw fi_write_bw.c -lfabric
//
//   fi_write_bw PROVIDER MIN MAX [FACTOR [ITERS [WINDOW]]]     e.g. fi_write_bw "tcp;ofi_rxm" 64K
//   64M
//
// The process forks; the two ends exchange addresses and memory keys through a socketpair
// (no network for the set-up). The parent writes ITERS messages of S bytes into the child's
// buffer with at most WINDOW (default: the provider's tx queue size) writes outstanding, and
// times from the first fi_write to the last completion. The child only drives its endpoint
// (manual-progress providers such as tcp;ofi_rxm move data only then). For each size it prints
//   bytes iters time_us gbps
// time_us per message, GB = 1e9 B. ITERS default as strata-perf: 1000, 1000 * 64 KiB / S above
// 64 KiB, at least 20; one untimed batch first. Like strata's fabric transport it asks for
// FI_DELIVERY_COMPLETE (and falls back as it does). Set FI_TCP_IFACE=lo for tcp: loopback only.

#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#define CHECK(call)                                                                 \
  do {                                                                              \
    int rc_ = (int)(call);                                                          \
    if (rc_) {                                                                      \
      fprintf(stderr, "fi_write_bw: %s: %s (%d)\n", #call, fi_strerror(-rc_), rc_); \
      exit(1);                                                                      \
    }                                                                               \
  } while (0)

struct Peer {  // what crosses the socketpair; both ends are this binary on this machine
  uint64_t base;
  uint64_t key;
  size_t addrLen;
  char addr[256];
};

static struct fi_info* info;
static struct fid_fabric* fabric;
static struct fid_domain* domain;
static struct fid_ep* ep;
static struct fid_av* av;
static struct fid_cq* cq;
static struct fid_mr* mr;
static int waitFd = -1;
// FI_WRITE_BW_IDLE_SLEEP_US: sleep this long whenever the initiator's CQ read finds nothing
// (default 0, spin). Sleeping imitates a caller that drives progress only now and then, to see
// how much a provider with manual progress depends on it.
static unsigned idleSleepUs;

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
      fprintf(stderr, "fi_write_bw: bad size '%s'\n", text);
      exit(2);
  }
  return (size_t)v;
}

static void fullIo(int fd, void* data, size_t bytes, int out) {
  char* p = data;
  while (bytes) {
    ssize_t n = out ? write(fd, p, bytes) : read(fd, p, bytes);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      fprintf(stderr, "fi_write_bw: socketpair %s failed\n", out ? "write" : "read");
      exit(1);
    }
    p += n;
    bytes -= (size_t)n;
  }
}

// The same choice as strata's fabric transport: delivery complete and write-after-write order
// when the provider accepts them.
static struct fi_info* query(const char* provider, int dc, int waw) {
  struct fi_info* hints = fi_allocinfo();
  hints->caps = FI_RMA | FI_WRITE | FI_REMOTE_WRITE;
  hints->ep_attr->type = FI_EP_RDM;
  hints->mode = FI_CONTEXT | FI_CONTEXT2;
  hints->domain_attr->mr_mode =
      FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_PROV_KEY | FI_MR_ALLOCATED | FI_MR_ENDPOINT;
  hints->domain_attr->threading = FI_THREAD_DOMAIN;
  if (dc) hints->tx_attr->op_flags = FI_DELIVERY_COMPLETE;
  if (waw) hints->tx_attr->msg_order = FI_ORDER_WAW;
  hints->fabric_attr->prov_name = strdup(provider);
  struct fi_info* out = NULL;
  int rc = fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, hints, &out);
  fi_freeinfo(hints);
  return rc ? NULL : out;
}

static void openEndpoint(const char* provider, void* buf, size_t bytes, uint64_t requestedKey,
                         struct Peer* me) {
  for (int pass = 0; pass < 4 && !info; ++pass) info = query(provider, pass < 2, pass % 2 == 0);
  if (!info) {
    fprintf(stderr, "fi_write_bw: provider \"%s\" offers no RDM endpoint with RMA\n", provider);
    exit(1);
  }
  CHECK(fi_fabric(info->fabric_attr, &fabric, NULL));
  CHECK(fi_domain(fabric, info, &domain, NULL));
  // A wait fd lets the target block between completions instead of spinning (as strata's
  // progress thread does), so it leaves the core to the initiator on a small machine.
  struct fi_cq_attr cqAttr = {.format = FI_CQ_FORMAT_CONTEXT, .wait_obj = FI_WAIT_FD};
  if (fi_cq_open(domain, &cqAttr, &cq, NULL) != 0 || fi_control(&cq->fid, FI_GETWAIT, &waitFd)) {
    if (cq) fi_close(&cq->fid);
    cq = NULL;
    waitFd = -1;
    cqAttr.wait_obj = FI_WAIT_NONE;
    CHECK(fi_cq_open(domain, &cqAttr, &cq, NULL));
  }
  struct fi_av_attr avAttr = {.type = info->domain_attr->av_type};
  CHECK(fi_av_open(domain, &avAttr, &av, NULL));
  CHECK(fi_endpoint(domain, info, &ep, NULL));
  CHECK(fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV));
  CHECK(fi_ep_bind(ep, &av->fid, 0));
  CHECK(fi_enable(ep));
  me->addrLen = sizeof(me->addr);
  CHECK(fi_getname(&ep->fid, me->addr, &me->addrLen));
  CHECK(fi_mr_reg(domain, buf, bytes, FI_WRITE | FI_REMOTE_WRITE, 0, requestedKey, 0, &mr, NULL));
  if (info->domain_attr->mr_mode & FI_MR_ENDPOINT) {
    CHECK(fi_mr_bind(mr, &ep->fid, 0));
    CHECK(fi_mr_enable(mr));
  }
  me->base = (uint64_t)(uintptr_t)buf;
  me->key = fi_mr_key(mr);
}

// FI_CONTEXT mode: the provider owns an op's context until its completion, so every write in
// flight has its own; completions give them back through a free list.
static struct fi_context2* contexts;
static struct fi_context2** freeList;
static size_t freeCount;

// Reads completions; returns how many, exits on an error completion.
static size_t reap(void) {
  struct fi_cq_entry entries[64];
  ssize_t n = fi_cq_read(cq, entries, 64);
  if (n > 0) {
    if (freeList) {
      for (ssize_t i = 0; i < n; ++i) freeList[freeCount++] = entries[i].op_context;
    }
    return (size_t)n;
  }
  if (n == -FI_EAVAIL) {
    struct fi_cq_err_entry err = {0};
    fi_cq_readerr(cq, &err, 0);
    fprintf(stderr, "fi_write_bw: write failed: %s\n", fi_strerror(err.err));
    exit(1);
  }
  return 0;
}

static double batch(void* buf, size_t bytes, size_t iters, fi_addr_t dest, uint64_t target,
                    uint64_t key) {
  void* desc = fi_mr_desc(mr);
  size_t posted = 0, done = 0;
  double t0 = nowUs();
  while (done < iters) {
    while (posted < iters && freeCount > 0) {
      struct fi_context2* ctx = freeList[freeCount - 1];
      ssize_t rc = fi_write(ep, buf, bytes, desc, dest, target, key, ctx);
      if (rc == -FI_EAGAIN) break;
      --freeCount;
      if (rc) {
        fprintf(stderr, "fi_write_bw: fi_write: %s\n", fi_strerror((int)-rc));
        exit(1);
      }
      ++posted;
    }
    size_t got = reap();
    done += got;
    if (!got && idleSleepUs) {
      struct timespec ts = {0, (long)idleSleepUs * 1000};
      nanosleep(&ts, NULL);
    }
  }
  return nowUs() - t0;
}

int main(int argc, char** argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: fi_write_bw PROVIDER MIN MAX [FACTOR [ITERS [WINDOW]]]\n");
    return 2;
  }
  const char* provider = argv[1];
  size_t minBytes = parseBytes(argv[2]), maxBytes = parseBytes(argv[3]);
  size_t factor = argc > 4 ? (size_t)strtoull(argv[4], NULL, 10) : 2;
  size_t fixedIters = argc > 5 ? (size_t)strtoull(argv[5], NULL, 10) : 0;
  size_t window = argc > 6 ? (size_t)strtoull(argv[6], NULL, 10) : 0;
  if (minBytes == 0 || maxBytes < minBytes || factor < 2) {
    fprintf(stderr, "fi_write_bw: need 0 < MIN <= MAX and FACTOR >= 2\n");
    return 2;
  }
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) {
    perror("fi_write_bw: socketpair");
    return 1;
  }
  fflush(stdout);
  pid_t child = fork();
  if (child < 0) {
    perror("fi_write_bw: fork");
    return 1;
  }
  const int isTarget = child == 0;
  int sock = sv[isTarget ? 1 : 0];
  close(sv[isTarget ? 0 : 1]);

  void* buf = NULL;
  if (posix_memalign(&buf, 4096, maxBytes) != 0) return 1;
  memset(buf, isTarget ? 0 : 0x5a, maxBytes);
  struct Peer me = {0}, peer = {0};
  openEndpoint(provider, buf, maxBytes, isTarget ? 2 : 1, &me);
  fullIo(sock, &me, sizeof(me), 1);
  fullIo(sock, &peer, sizeof(peer), 0);
  fi_addr_t dest = FI_ADDR_UNSPEC;
  if (fi_av_insert(av, peer.addr, 1, &dest, 0, NULL) != 1) {
    fprintf(stderr, "fi_write_bw: fi_av_insert failed\n");
    return 1;
  }

  if (isTarget) {
    // Drive the endpoint until the initiator says it is done: block on the CQ's wait fd when
    // fi_trywait allows, else yield so that a shared core still runs the initiator.
    for (;;) {
      reap();
      struct pollfd p[2] = {{sock, POLLIN, 0}, {waitFd, POLLIN, 0}};
      struct fid* f = &cq->fid;
      if (waitFd >= 0 && fi_trywait(fabric, &f, 1) == FI_SUCCESS) {
        if (poll(p, 2, 100) > 0 && (p[0].revents & POLLIN)) break;
      } else {
        if (poll(p, 1, 0) > 0) break;
        sched_yield();
      }
    }
    char byte;
    fullIo(sock, &byte, 1, 0);
    if (((unsigned char*)buf)[maxBytes - 1] != 0x5a) {
      fprintf(stderr, "fi_write_bw: the last byte of the target buffer is wrong\n");
      return 1;
    }
    return 0;
  }

  if (getenv("FI_WRITE_BW_IDLE_SLEEP_US"))
    idleSleepUs = (unsigned)atoi(getenv("FI_WRITE_BW_IDLE_SLEEP_US"));
  if (!window) window = info->tx_attr->size ? info->tx_attr->size : 64;
  contexts = calloc(window, sizeof(*contexts));
  freeList = calloc(window, sizeof(*freeList));
  for (freeCount = 0; freeCount < window; ++freeCount) freeList[freeCount] = &contexts[freeCount];
  uint64_t target = (info->domain_attr->mr_mode & FI_MR_VIRT_ADDR) ? peer.base : 0;
  printf("# provider %s  delivery_complete %s  window %zu  max_msg_size %zu\n",
         info->fabric_attr->prov_name,
         (info->tx_attr->op_flags & FI_DELIVERY_COMPLETE) ? "yes" : "no", window,
         info->ep_attr->max_msg_size);
  printf("# bytes iters time_us gbps\n");
  for (size_t bytes = minBytes;;
       bytes = bytes * factor > maxBytes && bytes < maxBytes ? maxBytes : bytes * factor) {
    size_t iters = fixedIters;
    if (!iters) {
      iters = bytes <= 65536 ? 1000 : 1000 * 65536 / bytes;
      if (iters < 20) iters = 20;
    }
    size_t warm = iters / 10 ? iters / 10 : 2;
    batch(buf, bytes, warm, dest, target, peer.key);
    double us = batch(buf, bytes, iters, dest, target, peer.key);
    printf("%zu %zu %.3f %.3f\n", bytes, iters, us / (double)iters,
           (double)bytes * (double)iters / us / 1e3);
    fflush(stdout);
    if (bytes >= maxBytes) break;
  }
  // The last write of the largest size covered the whole buffer: let the target check it.
  char byte = 'q';
  fullIo(sock, &byte, 1, 1);
  int status = 0;
  waitpid(child, &status, 0);
  fi_close(&mr->fid);
  fi_close(&ep->fid);
  fi_close(&av->fid);
  fi_close(&cq->fid);
  fi_close(&domain->fid);
  fi_close(&fabric->fid);
  fi_freeinfo(info);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}
