// Progress of this rank's endpoint (fabric_endpoint.hpp): posting writes and signal slots,
// reaping completions, waking the threads that wait for a word or a completion, and the
// background thread that drives the endpoint (fabric_progress.hpp).

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include <fmt/format.h>

#include "base/backoff.hpp"
#include "base/log.hpp"
#include "base/process.hpp"
#include "fabric_endpoint.hpp"
#include "fabric_progress.hpp"

namespace strata::fabric {
namespace {

constexpr const char* kLog = "fabric";
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
// A caller that drove the endpoint (progressFromCaller) within this time is still driving it:
// the progress thread does not spin beside it, it looks again after kCallerNapUs.
constexpr int64_t kCallerDrivesNs = 1'000'000;
constexpr int64_t kCallerNapUs = 500;
// While the provider refuses a write, the same-host peer's pid is checked this often.
constexpr auto kRefusedPidCheck = std::chrono::milliseconds(10);
// A waitForCompletion() waits at most this long, so that its caller re-checks its deadline
// and its connection's errors.
constexpr double kMaxCompletionWaitSeconds = 0.001;
// Completions read from the CQ per fi_cq_read().
constexpr size_t kCqBatch = 16;
// Room for a provider's text of a completion error (fi_cq_strerror).
constexpr size_t kCqErrorText = 256;

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

}  // namespace

size_t Endpoint::drainLocked() noexcept {
  size_t handled = 0;
  fi_cq_entry entries[kCqBatch];
  auto finish = [&](OpContext* op) {
    if (!op || live_.erase(op) == 0) return;  // not one of ours (or already reaped)
    if (op->slot >= 0) freeSlots_.push_back(op->slot);
    if (op->probe) op->conn->probeInFlight = false;
    op->conn->completions.fetch_add(1);
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

size_t Endpoint::progressOnce() noexcept {
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

namespace {
int64_t steadyNs() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

size_t Endpoint::progressFromCaller() noexcept {
  callerProgressNs_.store(steadyNs(), std::memory_order_relaxed);
  return progressOnce();
}

bool Endpoint::callerDriving() const noexcept {
  int64_t last = callerProgressNs_.load(std::memory_order_relaxed);
  return last != 0 && steadyNs() - last < kCallerDrivesNs;
}

bool Endpoint::waitWord(const uint64_t* word, uint64_t above, double maxSeconds) {
  // A caller that drove the endpoint and now blocks leaves it to the progress thread: wake it
  // from its nap rather than let the word wait for it.
  if (callerProgressNs_.exchange(0) != 0) wakeProgressThread();
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

void Endpoint::notifyWatchers() {
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

void Endpoint::stopWatchers() {
  {
    std::lock_guard<std::mutex> lock(watchMutex_);
    watchersStopped_ = true;
  }
  watchCv_.notify_all();
}

void Endpoint::waitForCompletion(double maxSeconds) {
  auto d = std::chrono::duration<double>(std::clamp(maxSeconds, 0.0, kMaxCompletionWaitSeconds));
  std::unique_lock<std::mutex> lock(cvMutex_);
  cv_.wait_for(lock, d);
}

void Endpoint::postWrite(std::unique_ptr<OpContext> op, const void* src, size_t bytes, void* desc,
                         uint64_t target, uint64_t key, const Deadline& deadline) {
  auto& conn = *op->conn;
  Backoff backoff;
  // While the provider refuses the write: when the peer looked alive last (a write to it
  // completed), and when its pid was last checked.
  const auto refusedSince = std::chrono::steady_clock::now();
  uint64_t completionsSeen = conn.completions.load();
  auto lastAlive = refusedSince;
  auto lastPidCheck = refusedSince;
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
    // A dead peer fills the queue and never drains it: say so now, not at the deadline. (The
    // caller may be the thread that would otherwise find it lost: the host collectives post
    // from their own loop.)
    if (auto lost = refusedPeerLost(conn, refusedSince, completionsSeen, lastAlive, lastPidCheck)) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (op->slot >= 0) freeSlots_.push_back(op->slot);
      conn.fail(std::move(*lost));
      conn.rethrow();
    }
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

std::optional<Error> Endpoint::refusedPeerLost(
    ConnState& conn, std::chrono::steady_clock::time_point since, uint64_t& completionsSeen,
    std::chrono::steady_clock::time_point& lastAlive,
    std::chrono::steady_clock::time_point& lastPidCheck) {
  {
    std::lock_guard<std::mutex> lock(conn.errorMutex);
    if (conn.error) return *conn.error;  // failed meanwhile (a completion error, checkPeer)
  }
  const auto now = std::chrono::steady_clock::now();
  if (conn.sameHost && now - lastPidCheck > kRefusedPidCheck) {
    lastPidCheck = now;
    if (conn.processExited()) {
      return Error(ErrorCode::PeerLost,
                   fmt::format("{}: rank {} (pid {}) has exited (its writes were refused, "
                               "-FI_EAGAIN, since {:.1f} s ago)",
                               describe(), conn.rank, conn.pid,
                               std::chrono::duration<double>(now - since).count()),
                   conn.rank);
    }
  }
  // A write to the peer completing shows it alive. With none of its writes in flight the
  // refusal comes from the endpoint's queue (writes to other peers), which says nothing of this
  // one.
  const uint64_t done = conn.completions.load();
  if (done != completionsSeen || conn.outstanding.load() == 0) {
    completionsSeen = done;
    lastAlive = now;
  }
  const double quiet = std::chrono::duration<double>(now - lastAlive).count();
  if (probeTimeout_ > 0 && quiet > probeTimeout_) {
    return Error(ErrorCode::PeerLost,
                 fmt::format("{}: rank {} completed no write in {:.1f} s while the provider "
                             "refused new ones (queue full, -FI_EAGAIN) "
                             "(transport.fabric.probe_timeout); the peer is gone or unreachable",
                             describe(), conn.rank, quiet),
                 conn.rank);
  }
  return std::nullopt;
}

void Endpoint::kickProgress() noexcept {
  if (progressAsleep_.load()) wakeProgressThread();
}

void Endpoint::wakeProgressThread() noexcept {
  int fd = wakeFd_.load();
  uint64_t one = 1;
  if (fd >= 0 && ::write(fd, &one, sizeof(one)) < 0) {
    // EAGAIN: the counter is already non-zero, the thread wakes anyway.
  }
}

int Endpoint::acquireSlot(const Deadline& deadline, int peer) {
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

ProgressThread::ProgressThread(std::shared_ptr<Endpoint> endpoint, std::vector<int> cpus)
    : endpoint_(std::move(endpoint)), cpus_(std::move(cpus)) {
  wakeFd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wakeFd_ < 0) {
    throw Error(ErrorCode::SystemError,
                fmt::format("{}: eventfd: {}", endpoint_->describe(), std::strerror(errno)));
  }
  endpoint_->wakeFd_ = wakeFd_;
  thread_ = std::thread([this] { loop(); });
}

ProgressThread::~ProgressThread() {
  stop_ = true;
  uint64_t one = 1;
  if (::write(wakeFd_, &one, sizeof(one)) < 0) {
    // The thread still sees stop_ within its poll timeout.
  }
  if (thread_.joinable()) thread_.join();
  endpoint_->wakeFd_ = -1;
  endpoint_->progressAsleep_ = false;
  ::close(wakeFd_);
}

void ProgressThread::loop() noexcept {
  process::startThread("strata-fabric", cpus_, kLog,
                       endpoint_->describe() + ": the progress thread");
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
  auto& c = *endpoint_;
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
    // A caller drives the endpoint while it waits (the host collectives' direct links): another
    // thread spinning beside it on the same CPUs only slows both. Nap (a post does not kick: the
    // nap is short) and look again; once the caller stops, within kCallerDrivesNs, this thread
    // takes over.
    if (c.callerDriving()) {
      pollfd nap{wakeFd_, POLLIN, 0};
      timespec ts{0, kCallerNapUs * 1000};
      if (::ppoll(&nap, 1, &ts, nullptr) > 0) drainWakeFd();
      lastActivity = std::chrono::steady_clock::now();
      sleepUs = kFirstSleepUs;
      continue;
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
