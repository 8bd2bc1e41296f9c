#include "fabric_core.hpp"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string_view>

#include <fmt/format.h>

#include "base/backoff.hpp"
#include "base/config_keys.hpp"
#include "base/log.hpp"
#include "fabric_shm_regions.hpp"

namespace strata::fabric {
namespace {

constexpr const char* kLog = "fabric";
// Largest single fi_write we post even when the provider allows more (tcp;ofi_rxm reports
// SIZE_MAX): bounded ops keep EAGAIN retries and completions flowing on very large writes.
constexpr size_t kMaxChunk = size_t{64} << 20;
// Without a wait fd the progress thread sleeps at most this long, whatever its quiet-time
// doubling says: nothing wakes it when data arrives.
constexpr int64_t kMaxSleepWithoutWaitFdUs = 1000;
// The progress thread keeps driving in-flight writes (instead of sleeping on the wait fd) as
// long as one of them was posted or completed within this time.
constexpr auto kBusySpin = std::chrono::milliseconds(20);
// The progress thread's sleep after activity, doubled with each quiet wake-up up to the longest
// (see ProgressThread::loop).
constexpr int64_t kFirstSleepUs = 100;
constexpr int64_t kLongestSleepUs = 1'000'000;
// A waitForCompletion() waits at most this long, so that its caller re-checks its deadline
// and its connection's errors.
constexpr double kMaxCompletionWaitSeconds = 0.001;
// Completions read from the CQ per fi_cq_read().
constexpr size_t kCqBatch = 16;
// Room for a provider's text of a completion error (fi_cq_strerror).
constexpr size_t kCqErrorText = 256;
// First guess of the endpoint address length (fi_getname says when it needs more).
constexpr size_t kAddressGuess = 64;
// Alignment of the internal region (a cache line; aligned_alloc needs a multiple of it).
constexpr size_t kInternalAlign = 64;
// Where libfabric's shm provider creates its regions (shm_open).
constexpr const char* kShmDir = "/dev/shm";

const char* const kAutoProviders[] = {"verbs;ofi_rxm", "efa", "tcp;ofi_rxm"};

struct InfoDeleter {
  void operator()(fi_info* info) const noexcept { fi_freeinfo(info); }
};
using InfoPtr = std::unique_ptr<fi_info, InfoDeleter>;

// The mr_mode bits strata handles (FI_MR_RAW is left out on purpose: keys wider than 64 bits
// would need fi_mr_raw_attr/fi_mr_map_raw, which this transport does not implement).
constexpr uint64_t kMrModeHandled =
    FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_PROV_KEY | FI_MR_ALLOCATED | FI_MR_ENDPOINT;

InfoPtr query(const char* provider, bool hmem, bool deliveryComplete, bool waw) {
  InfoPtr hints(fi_allocinfo());
  if (!hints) throw Error(ErrorCode::SystemError, "fabric transport: fi_allocinfo failed");
  hints->caps = FI_RMA | FI_WRITE | FI_REMOTE_WRITE | (hmem ? FI_HMEM : 0);
  hints->ep_attr->type = FI_EP_RDM;
  hints->mode = FI_CONTEXT | FI_CONTEXT2;
  hints->domain_attr->mr_mode = kMrModeHandled | (hmem ? FI_MR_HMEM : 0);
  // One mutex serializes every call on the domain (the progress thread and the caller), so the
  // provider need not be thread-safe itself.
  hints->domain_attr->threading = FI_THREAD_DOMAIN;
  if (deliveryComplete) hints->tx_attr->op_flags = FI_DELIVERY_COMPLETE;
  // Write-after-write must hold where the writes are issued and where they land.
  if (waw) {
    hints->tx_attr->msg_order = FI_ORDER_WAW;
    hints->rx_attr->msg_order = FI_ORDER_WAW;
  }
  if (provider) hints->fabric_attr->prov_name = strdup(provider);
  fi_info* out = nullptr;
  int rc = fi_getinfo(FI_VERSION(1, 17), nullptr, nullptr, 0, hints.get(), &out);
  if (rc != 0) return nullptr;
  return InfoPtr(out);
}

// What fi_getinfo offers for RDM + RMA at all, for error messages.
std::string offeredProviders() {
  InfoPtr all = query(nullptr, false, false, false);
  std::set<std::string> names;
  for (fi_info* i = all.get(); i; i = i->next) {
    if (i->fabric_attr && i->fabric_attr->prov_name) names.insert(i->fabric_attr->prov_name);
  }
  if (names.empty()) return "none";
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "\"" : ", \"") + n + "\"";
  return out;
}

// Chooses the provider and the strongest completion/ordering guarantees it accepts.
struct Choice {
  InfoPtr info;
  bool deliveryComplete = false;
  bool waw = false;
};

std::optional<Choice> choose(const char* provider, bool hmem) {
  for (int pass = 0; pass < 4; ++pass) {
    bool dc = pass < 2, waw = pass % 2 == 0;
    if (auto info = query(provider, hmem, dc, waw)) {
      Choice c;
      c.deliveryComplete = dc;
      if (waw) {
        // Some providers (shm 1.17) echo a requested msg_order in the returned info although
        // their receive side promises only FI_ORDER_SAS; judge by what they advertise unasked.
        constexpr uint64_t kWaw = FI_ORDER_WAW | FI_ORDER_RMA_WAW;
        InfoPtr plain = query(provider, hmem, dc, false);
        c.waw = plain && (plain->tx_attr->msg_order & kWaw) != 0 &&
                (plain->rx_attr->msg_order & kWaw) != 0;
      }
      c.info = std::move(info);
      return c;
    }
  }
  return std::nullopt;
}

// The interface FI_TCP_IFACE names when the tcp provider's choice is on another one, else
// empty. libfabric 1.17 does not fail when that interface is down, has no carrier or no address:
// it silently offers loopback (127.0.0.1) instead, whose address no other host can reach.
std::string tcpInterfaceMissing(const fi_info* info) {
  const char* wanted = std::getenv("FI_TCP_IFACE");
  if (!wanted || !*wanted || !info || !info->fabric_attr->prov_name) return {};
  if (std::string_view(info->fabric_attr->prov_name).substr(0, 3) != "tcp") return {};
  const char* got = info->domain_attr->name;
  if (got && std::string_view(got) == wanted) return {};
  return wanted;
}

bool isPeerGone(int err) {
  switch (err) {
    case FI_ECONNREFUSED:
    case FI_ECONNRESET:
    case FI_ECONNABORTED:
    case FI_ENOTCONN:
    case FI_EHOSTUNREACH:
    case FI_ENETUNREACH:
    case EPIPE:
    case ESHUTDOWN:
    case ESRCH:
      return true;
    default:
      return false;
  }
}

// The index of this process's next shm endpoint, for its region's name.
std::atomic<uint64_t> nextShmEndpoint{0};

}  // namespace

std::string fiError(ssize_t rc) {
  return fmt::format("{} ({})", fi_strerror(static_cast<int>(rc < 0 ? -rc : rc)), rc);
}

// ---------------------------------------------------------------------------------------------
// FabricCore

FabricCore::FabricCore(const backend::TransportInit& init, std::string provider, bool wantHmem)
    : provider_(std::move(provider)), rank_(init.rank) {
  if (init.config) {
    timeout_ = config::getDouble(*init.config, "transport.timeout");
    probeTimeout_ = config::getDouble(*init.config, "transport.fabric.probe_timeout");
  }
  try {
    open(init, wantHmem);
  } catch (...) {
    close();
    throw;
  }
}

FabricCore::~FabricCore() {
  close();
  if (provider_ == "shm") sweepStaleShmRegions(kShmDir, pidNamespace_);
}

std::string FabricCore::describe() const {
  return fmt::format("fabric transport (rank {}, provider {})", rank_, provider_);
}

void FabricCore::open(const backend::TransportInit& init, bool wantHmem) {
  (void)init;
  std::optional<Choice> choice;
  if (provider_ == "auto") {
    for (int pass = wantHmem ? 0 : 1; pass < 2 && !choice; ++pass) {
      for (const char* p : kAutoProviders) {
        if ((choice = choose(p, pass == 0))) break;
      }
    }
    if (!choice) {
      throw Error(ErrorCode::NotSupported,
                  fmt::format("fabric transport (rank {}): transport.fabric.provider=auto found "
                              "none of verbs;ofi_rxm, efa, tcp;ofi_rxm with RDM endpoints and "
                              "RMA; fi_getinfo offers: {}. Name one of those in "
                              "transport.fabric.provider or leave fabric out of transport.*",
                              rank_, offeredProviders()));
    }
  } else {
    if (wantHmem) choice = choose(provider_.c_str(), true);
    if (!choice) choice = choose(provider_.c_str(), false);
    if (!choice) {
      throw Error(ErrorCode::NotSupported,
                  fmt::format("fabric transport (rank {}): libfabric provider \"{}\" "
                              "(transport.fabric.provider) is not available with RDM endpoints "
                              "and RMA writes; fi_getinfo offers: {}",
                              rank_, provider_, offeredProviders()));
    }
  }
  if (std::string wanted = tcpInterfaceMissing(choice->info.get()); !wanted.empty()) {
    // A link that is down for a moment while the job starts must not leave this rank on
    // loopback for its lifetime (peers then fail with an unexplained EINVAL or a refused
    // connection): wait for the interface up to transport.timeout, then say what is wrong.
    const std::string got = choice->info->domain_attr->name ? choice->info->domain_attr->name : "?";
    STRATA_LOG(Warn, kLog,
               "{}: FI_TCP_IFACE={} is not usable (down, no carrier or no address; libfabric "
               "offers {} instead); waiting up to {} s (transport.timeout) for it",
               describe(), wanted, got, timeout_);
    const auto start = std::chrono::steady_clock::now();
    const std::string chosen = choice->info->fabric_attr->prov_name;
    const bool hmem = (choice->info->caps & FI_HMEM) != 0;
    while (!tcpInterfaceMissing(choice->info.get()).empty()) {
      double waited =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (waited >= timeout_) {
        throw Error(ErrorCode::BackendError,
                    fmt::format("{}: the interface FI_TCP_IFACE={} stayed unusable for {} s "
                                "(transport.timeout): it is down, has no carrier (link down) or "
                                "no address, and libfabric's tcp provider offers only {}, which "
                                "other hosts cannot reach. Check the link (ip link show {}) or "
                                "set FI_TCP_IFACE to an interface that is up",
                                describe(), wanted, timeout_, got, wanted));
      }
      ::usleep(100'000);
      if (auto again = choose(chosen.c_str(), hmem)) *choice = std::move(*again);
    }
    STRATA_LOG(Info, kLog, "{}: FI_TCP_IFACE={} is usable after {:.1f} s", describe(), wanted,
               std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  info_ = choice->info.release();
  deliveryComplete_ = choice->deliveryComplete;
  orderedWaw_ = choice->waw;
  provider_ = info_->fabric_attr->prov_name ? info_->fabric_attr->prov_name : provider_;
  if (provider_ == "shm") {
    pidNamespace_ = pidNamespace();
    sweepStaleShmRegions(kShmDir, pidNamespace_);
  }
  hmem_ = (info_->caps & FI_HMEM) != 0;
  mrMode_ = info_->domain_attr->mr_mode;
  if (mrMode_ & FI_MR_RAW) {
    throw Error(ErrorCode::NotSupported,
                fmt::format("{}: the provider needs FI_MR_RAW (memory keys wider than 64 bits), "
                            "which strata's fabric transport does not implement; choose another "
                            "provider in transport.fabric.provider",
                            describe()));
  }
  if (mrMode_ & ~(kMrModeHandled | FI_MR_HMEM)) {
    STRATA_LOG(Warn, kLog, "{}: unhandled mr_mode bits {:#x}", describe(),
               mrMode_ & ~(kMrModeHandled | FI_MR_HMEM));
  }
  size_t maxMsg = info_->ep_attr->max_msg_size;
  maxChunk_ = std::max<size_t>(1, std::min(maxMsg, kMaxChunk));

  auto check = [&](int rc, const char* what) {
    if (rc != 0) {
      throw Error(ErrorCode::BackendError,
                  fmt::format("{}: {} failed: {}", describe(), what, fiError(rc)));
    }
  };
  check(fi_fabric(info_->fabric_attr, &fabric_, nullptr), "fi_fabric");
  check(fi_domain(fabric_, info_, &domain_, nullptr), "fi_domain");

  fi_cq_attr cqAttr{};
  cqAttr.format = FI_CQ_FORMAT_CONTEXT;
  cqAttr.wait_obj = FI_WAIT_FD;
  if (fi_cq_open(domain_, &cqAttr, &cq_, nullptr) != 0) {
    // No wait fd from this provider: the progress thread then sleeps with back-off.
    cq_ = nullptr;
    cqAttr.wait_obj = FI_WAIT_NONE;
    check(fi_cq_open(domain_, &cqAttr, &cq_, nullptr), "fi_cq_open");
  } else if (fi_control(&cq_->fid, FI_GETWAIT, &waitFd_) != 0) {
    waitFd_ = -1;
  }

  fi_av_attr avAttr{};
  avAttr.type = info_->domain_attr->av_type;
  check(fi_av_open(domain_, &avAttr, &av_, nullptr), "fi_av_open");
  check(fi_endpoint(domain_, info_, &ep_, nullptr), "fi_endpoint");
  if (provider_ == "shm" && pidNamespace_ != 0) {
    // Name the endpoint (and so its file in /dev/shm) with our PID namespace, so that the sweep
    // of another process can tell whether the pid in it is one it can judge. Must precede
    // fi_enable, which creates the region.
    std::string name = shmRegionName(pidNamespace_, ::getpid(), nextShmEndpoint.fetch_add(1));
    int rc = fi_setname(&ep_->fid, name.data(), name.size() + 1);
    if (rc != 0) {
      STRATA_LOG(Warn, kLog,
                 "{}: naming the shm endpoint {} failed ({}); it keeps libfabric's name, which "
                 "the stale-file sweep leaves alone",
                 describe(), name, fiError(rc));
    }
  }
  check(fi_ep_bind(ep_, &cq_->fid, FI_TRANSMIT | FI_RECV), "fi_ep_bind(cq)");
  check(fi_ep_bind(ep_, &av_->fid, 0), "fi_ep_bind(av)");
  check(fi_enable(ep_), "fi_enable");

  size_t len = kAddressGuess;
  address_.resize(len);
  int rc = fi_getname(&ep_->fid, address_.data(), &len);
  if (rc == -FI_ETOOSMALL) {
    address_.resize(len);
    rc = fi_getname(&ep_->fid, address_.data(), &len);
  }
  check(rc, "fi_getname");
  address_.resize(len);

  // aligned_alloc needs a size that is a multiple of the alignment.
  size_t bytes = ((kFirstSlotWord + kSlots) * sizeof(uint64_t) + kInternalAlign - 1) /
                 kInternalAlign * kInternalAlign;
  internal_ = static_cast<uint64_t*>(std::aligned_alloc(kInternalAlign, bytes));
  if (!internal_) throw Error(ErrorCode::SystemError, describe() + ": out of memory");
  std::memset(internal_, 0, bytes);
  internalMr_ = registerRegion(internal_, bytes, FI_REMOTE_WRITE | FI_WRITE, false, 0);
  freeSlots_.reserve(kSlots);
  for (int i = kSlots - 1; i >= 0; --i) freeSlots_.push_back(i);

  STRATA_LOG(Debug, kLog,
             "{}: fabric {} domain {} mr_mode {:#x} delivery_complete {} ordered_waw {} "
             "hmem {} max chunk {} wait fd {} data progress {}",
             describe(), info_->fabric_attr->name ? info_->fabric_attr->name : "?",
             info_->domain_attr->name ? info_->domain_attr->name : "?", mrMode_, deliveryComplete_,
             orderedWaw_, hmem_, maxChunk_, waitFd_,
             static_cast<int>(info_->domain_attr->data_progress));
}

void FabricCore::close() noexcept {
  // Operations still posted when the endpoint closes never complete; their contexts are ours.
  for (OpContext* op : live_) delete op;
  live_.clear();
  if (internalMr_) fi_close(&internalMr_->fid);
  internalMr_ = nullptr;
  if (ep_) fi_close(&ep_->fid);
  if (av_) fi_close(&av_->fid);
  if (cq_) fi_close(&cq_->fid);
  if (domain_) fi_close(&domain_->fid);
  if (fabric_) fi_close(&fabric_->fid);
  ep_ = nullptr;
  av_ = nullptr;
  cq_ = nullptr;
  domain_ = nullptr;
  fabric_ = nullptr;
  if (info_) fi_freeinfo(info_);
  info_ = nullptr;
  std::free(internal_);
  internal_ = nullptr;
}

fid_mr* FabricCore::registerRegion(void* data, size_t bytes, uint64_t access, bool cuda,
                                   int cudaDevice) {
  iovec iov{data, bytes};
  fi_mr_attr attr{};
  attr.mr_iov = &iov;
  attr.iov_count = 1;
  attr.access = access;
  // Without FI_MR_PROV_KEY the application picks keys, unique within the domain.
  attr.requested_key = (mrMode_ & FI_MR_PROV_KEY) ? 0 : nextKey_.fetch_add(1);
  if (cuda) {
    attr.iface = FI_HMEM_CUDA;
    attr.device.cuda = cudaDevice;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  fid_mr* mr = nullptr;
  int rc = fi_mr_regattr(domain_, &attr, 0, &mr);
  if (rc != 0) {
    throw Error(ErrorCode::BackendError,
                fmt::format("{}: fi_mr_regattr of {} bytes at {} ({} memory) failed: {}",
                            describe(), bytes, data, cuda ? "cuda" : "host", fiError(rc)));
  }
  if (mrMode_ & FI_MR_ENDPOINT) {
    rc = fi_mr_bind(mr, &ep_->fid, 0);
    if (rc == 0) rc = fi_mr_enable(mr);
    if (rc != 0) {
      fi_close(&mr->fid);
      throw Error(ErrorCode::BackendError,
                  fmt::format("{}: binding a memory region to the endpoint (FI_MR_ENDPOINT) "
                              "failed: {}",
                              describe(), fiError(rc)));
    }
  }
  return mr;
}

void FabricCore::closeRegion(fid_mr* mr) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  int rc = fi_close(&mr->fid);
  if (rc != 0) STRATA_LOG(Warn, kLog, "{}: closing a memory region: {}", describe(), fiError(rc));
}

uint64_t* FabricCore::slotWord(int slot) noexcept {
  return internal_ + kFirstSlotWord + slot;
}
uint64_t* FabricCore::probeSource() noexcept {
  return internal_ + kProbeSourceWord;
}
void* FabricCore::internalDesc() noexcept {
  return fi_mr_desc(internalMr_);
}

size_t FabricCore::drainLocked() noexcept {
  size_t handled = 0;
  fi_cq_entry entries[kCqBatch];
  auto finish = [&](OpContext* op) {
    if (!op || live_.erase(op) == 0) return;  // not one of ours (or already reaped)
    if (op->slot >= 0) freeSlots_.push_back(op->slot);
    if (op->probe) {
      op->conn->probesCompleted.fetch_add(1);
      op->conn->probeInFlight = false;
    }
    op->conn->outstanding.fetch_sub(1);
    delete op;
    ++handled;
  };
  for (;;) {
    ssize_t n = fi_cq_read(cq_, entries, kCqBatch);
    if (n > 0) {
      for (ssize_t i = 0; i < n; ++i) finish(static_cast<OpContext*>(entries[i].op_context));
      continue;
    }
    if (n == -FI_EAVAIL) {
      fi_cq_err_entry err{};
      if (fi_cq_readerr(cq_, &err, 0) <= 0) break;
      char buf[kCqErrorText] = {};
      const char* detail = fi_cq_strerror(cq_, err.prov_errno, err.err_data, buf, sizeof(buf));
      auto* op = static_cast<OpContext*>(err.op_context);
      if (!op || !live_.count(op)) {
        STRATA_LOG(Warn, kLog, "{}: completion error without an operation: {} ({})", describe(),
                   fi_strerror(err.err), detail ? detail : "");
        ++handled;
        continue;
      }
      // ofi_rxm cancels the writes of a connection that broke (FI_ECANCELED), usually with the
      // socket's errno (ENOTCONN, ECONNRESET) as the provider error, but not always: a
      // connection reset by the network (tests/stress/net_faults.sh cut-allreduce) also gave
      // ENOENT. Nothing else cancels a write while the transport is open, so a canceled write
      // means the connection is gone.
      bool gone = isPeerGone(err.err) || err.err == FI_ECANCELED;
      op->conn->fail(
          Error(gone ? ErrorCode::PeerLost : ErrorCode::BackendError,
                fmt::format("{}: {} to rank {} failed: {} ({}). {}", describe(),
                            op->probe ? "liveness probe write" : "RMA write", op->conn->rank,
                            fi_strerror(err.err), detail ? detail : "",
                            gone ? "The connection broke: the peer process exited or closed "
                                   "its endpoint, or the network between the hosts failed."
                                 : "Check the peer's log and the provider (fi_info -v)."),
                op->conn->rank));
      finish(op);
      continue;
    }
    if (n != -FI_EAGAIN) {
      STRATA_LOG(Warn, kLog, "{}: fi_cq_read: {}", describe(), fiError(n));
    }
    break;
  }
  return handled;
}

size_t FabricCore::progressOnce() noexcept {
  size_t n;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    n = drainLocked();
  }
  if (n) cv_.notify_all();
  // Reading the CQ also lands peers' writes (manual progress), signals included.
  notifyWatchers();
  return n;
}

bool FabricCore::waitWord(const uint64_t* word, uint64_t above, double maxSeconds) {
  auto reached = [&] { return __atomic_load_n(word, __ATOMIC_ACQUIRE) > above; };
  Watch watch{word, above};
  std::unique_lock<std::mutex> lock(watchMutex_);
  if (watchersStopped_) return reached();
  watches_.push_back(&watch);
  watchers_.fetch_add(1);
  auto d = std::chrono::duration<double>(std::max(maxSeconds, 0.0));
  bool ok = watchCv_.wait_for(lock, d, [&] { return reached() || watchersStopped_; }) && reached();
  watches_.erase(std::find(watches_.begin(), watches_.end(), &watch));
  watchers_.fetch_sub(1);
  return ok;
}

void FabricCore::notifyWatchers() {
  if (watchers_.load(std::memory_order_acquire) == 0) return;
  bool any = false;
  {
    std::lock_guard<std::mutex> lock(watchMutex_);
    for (const Watch* w : watches_) {
      if (__atomic_load_n(w->word, __ATOMIC_ACQUIRE) > w->above) any = true;
    }
  }
  if (any) watchCv_.notify_all();
}

void FabricCore::stopWatchers() {
  {
    std::lock_guard<std::mutex> lock(watchMutex_);
    watchersStopped_ = true;
  }
  watchCv_.notify_all();
}

void FabricCore::waitForCompletion(double maxSeconds) {
  auto d = std::chrono::duration<double>(std::clamp(maxSeconds, 0.0, kMaxCompletionWaitSeconds));
  std::unique_lock<std::mutex> lock(cvMutex_);
  cv_.wait_for(lock, d);
}

void FabricCore::postWrite(std::unique_ptr<OpContext> op, const void* src, size_t bytes, void* desc,
                           uint64_t target, uint64_t key, const Deadline& deadline) {
  auto& conn = *op->conn;
  Backoff backoff;
  for (;;) {
    size_t reaped;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ssize_t rc = fi_write(ep_, src, bytes, desc, conn.addr, target, key, &op->ctx);
      if (rc == 0) {
        conn.outstanding.fetch_add(1);
        live_.insert(op.release());
        ++posts_;
      } else if (rc != -FI_EAGAIN) {
        if (op->slot >= 0) freeSlots_.push_back(op->slot);
        throw Error(ErrorCode::BackendError,
                    fmt::format("{}: fi_write of {} bytes to rank {} failed: {}", describe(), bytes,
                                conn.rank, fiError(rc)),
                    conn.rank);
      }
      // The provider's queue is full: reap completions so that it can drain, then retry.
      reaped = op ? drainLocked() : 0;
    }
    if (!op) {
      kickProgress();
      return;
    }
    if (reaped) cv_.notify_all();
    notifyWatchers();
    if (deadline.expired()) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (op->slot >= 0) freeSlots_.push_back(op->slot);
      throw Error(ErrorCode::Timeout,
                  fmt::format("{}: the provider kept refusing a write of {} bytes to rank {} "
                              "(queue full, -FI_EAGAIN) until the deadline (transport.timeout "
                              "= {} s); the peer may not be making progress",
                              describe(), bytes, conn.rank, timeout_),
                  conn.rank);
    }
    backoff.pause();
  }
}

void FabricCore::kickProgress() noexcept {
  if (!progressAsleep_.load()) return;
  int fd = wakeFd_.load();
  uint64_t one = 1;
  if (fd >= 0 && ::write(fd, &one, sizeof(one)) < 0) {
    // EAGAIN: the counter is already non-zero, the thread wakes anyway.
  }
}

int FabricCore::acquireSlot(const Deadline& deadline, int peer) {
  Backoff backoff;
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!freeSlots_.empty()) {
        int s = freeSlots_.back();
        freeSlots_.pop_back();
        return s;
      }
      drainLocked();
    }
    notifyWatchers();
    if (deadline.expired()) {
      throw Error(ErrorCode::Timeout,
                  fmt::format("{}: all {} signal slots stayed busy until the deadline "
                              "(transport.timeout = {} s); signals to the peers do not complete",
                              describe(), kSlots, timeout_),
                  peer);
    }
    backoff.pause();
  }
}

// ---------------------------------------------------------------------------------------------
// ProgressThread

ProgressThread::ProgressThread(std::shared_ptr<FabricCore> core) : core_(std::move(core)) {
  wakeFd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wakeFd_ < 0) {
    throw Error(ErrorCode::SystemError,
                fmt::format("{}: eventfd: {}", core_->describe(), std::strerror(errno)));
  }
  core_->wakeFd_ = wakeFd_;
  thread_ = std::thread([this] { loop(); });
}

ProgressThread::~ProgressThread() {
  stop_ = true;
  uint64_t one = 1;
  if (::write(wakeFd_, &one, sizeof(one)) < 0) {
    // The thread still sees stop_ within its poll timeout.
  }
  if (thread_.joinable()) thread_.join();
  core_->wakeFd_ = -1;
  core_->progressAsleep_ = false;
  ::close(wakeFd_);
}

void ProgressThread::loop() noexcept {
  // Target-side progress: with manual-progress providers (tcp;ofi_rxm) a peer's write lands only
  // while someone drives this endpoint, and the owning thread may be blocked elsewhere.
  // Initiator side: while this process's own writes are in flight, the thread keeps driving
  // them (yielding between passes) as a direct fi_write loop does, so that the caller can sleep
  // in a blocking wait. It sleeps (on the CQ's wait fd and its eventfd, which postWrite() and
  // shutdown write) once nothing is in flight, or nothing was posted or completed for
  // kBusySpin: a stalled peer costs no CPU.
  //
  // The wait fd alone is not enough: with tcp;ofi_rxm (1.17) the tail of an incoming write can
  // stay unread after a wake-up while fi_trywait() says there is nothing to do, and no further
  // readiness comes until the peer sends more. So a sleep after activity lasts kFirstSleepUs and
  // doubles with each quiet wake-up up to 1 s: the tail lands within about 0.1 ms, and an idle
  // endpoint costs a dozen wake-ups per second at most.
  auto& c = *core_;
  auto lastActivity = std::chrono::steady_clock::now();
  uint64_t seenPosts = 0;
  int64_t sleepUs = kFirstSleepUs;
  auto drainWakeFd = [&] {
    uint64_t count;
    while (::read(wakeFd_, &count, sizeof(count)) > 0) {
    }
  };
  while (!stop_.load()) {
    if (c.progressOnce() > 0) {
      lastActivity = std::chrono::steady_clock::now();
      sleepUs = kFirstSleepUs;
    }
    // From here on a new post kicks the eventfd; a post before this store is seen below.
    c.progressAsleep_.store(true);
    bool busy;
    uint64_t posts;
    {
      std::lock_guard<std::mutex> lock(c.mutex_);
      busy = !c.live_.empty();
      posts = c.posts_;
    }
    auto now = std::chrono::steady_clock::now();
    if (posts != seenPosts) {
      seenPosts = posts;
      lastActivity = now;
      sleepUs = kFirstSleepUs;
    }
    if (busy && now - lastActivity < kBusySpin) {
      c.progressAsleep_.store(false);
      std::this_thread::yield();
      continue;
    }
    // Sleep on the wait fd where the provider allows it (fi_trywait), else on the eventfd only.
    pollfd fds[2] = {{wakeFd_, POLLIN, 0}, {c.waitFd_, POLLIN, 0}};
    nfds_t nfds = 1;
    if (c.waitFd_ >= 0) {
      std::lock_guard<std::mutex> lock(c.mutex_);
      fid* f = &c.cq_->fid;
      if (fi_trywait(c.fabric_, &f, 1) == FI_SUCCESS) nfds = 2;
    }
    int64_t us = nfds == 2 ? sleepUs : std::min<int64_t>(sleepUs, kMaxSleepWithoutWaitFdUs);
    timespec ts{static_cast<time_t>(us / 1'000'000), static_cast<long>(us % 1'000'000) * 1000};
    int n = ::ppoll(fds, nfds, &ts, nullptr);
    c.progressAsleep_.store(false);
    if (n > 0) {
      if (fds[0].revents & POLLIN) drainWakeFd();
      lastActivity = std::chrono::steady_clock::now();
      sleepUs = kFirstSleepUs;
    } else {
      sleepUs = std::min(sleepUs * 2, kLongestSleepUs);
    }
  }
}

}  // namespace strata::fabric
