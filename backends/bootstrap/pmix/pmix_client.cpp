// The pmix backend's side of the PMIx library: the one client connection per process and the
// job identity it gives, and the calls the collectives are built from (fence, put, get), each
// turning a PMIx failure into an Error that names the bootstrap operation.

#include <pmix.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <strata/error.hpp>

#include "base/deadline.hpp"
#include "base/strings.hpp"
#include "pmix_internal.hpp"

namespace strata::pmix {
namespace {

std::string statusText(pmix_status_t rc) {
  const char* s = PMIx_Error_string(rc);
  return s ? s : fmt::format("PMIx status {}", rc);
}

/// PMIX_TIMEOUT takes whole seconds: at least 1, and 0 means none.
int pmixTimeout(double seconds) {
  if (!(seconds > 0)) return 0;
  if (seconds > 1e6) return 1000000;
  return std::max(1, static_cast<int>(std::ceil(seconds)));
}

/// Integer job keys: PMIx types them differently across servers (uint16 local rank, uint32
/// sizes under Open MPI), so any integer type is accepted.
std::optional<int64_t> asInteger(const pmix_value_t& v) {
  switch (v.type) {
    case PMIX_INT8:
      return v.data.int8;
    case PMIX_INT16:
      return v.data.int16;
    case PMIX_INT32:
      return v.data.int32;
    case PMIX_INT64:
      return v.data.int64;
    case PMIX_INT:
      return v.data.integer;
    case PMIX_UINT8:
      return v.data.uint8;
    case PMIX_UINT16:
      return v.data.uint16;
    case PMIX_UINT32:
      return v.data.uint32;
    case PMIX_UINT64:
      return static_cast<int64_t>(v.data.uint64);
    case PMIX_UINT:
      return v.data.uint;
    case PMIX_SIZE:
      return static_cast<int64_t>(v.data.size);
    case PMIX_PROC_RANK:
      return v.data.rank;
    case PMIX_PID:
      return v.data.pid;
    default:
      return std::nullopt;
  }
}

std::optional<int64_t> getInteger(const pmix_proc_t& proc, const char* key) {
  pmix_value_t* v = nullptr;
  pmix_status_t rc = PMIx_Get(&proc, key, nullptr, 0, &v);
  if (rc != PMIX_SUCCESS || v == nullptr) return std::nullopt;
  auto out = asInteger(*v);
  PMIX_VALUE_RELEASE(v);
  return out;
}

std::optional<std::string> getString(const pmix_proc_t& proc, const char* key) {
  pmix_value_t* v = nullptr;
  pmix_status_t rc = PMIx_Get(&proc, key, nullptr, 0, &v);
  if (rc != PMIX_SUCCESS || v == nullptr) return std::nullopt;
  std::optional<std::string> out;
  if (v->type == PMIX_STRING && v->data.string) out = std::string(v->data.string);
  PMIX_VALUE_RELEASE(v);
  return out;
}

/// "0,1,5" -> {0, 1, 5}; nullopt if malformed.
std::optional<std::vector<int>> parseRankList(const std::string& text) {
  std::vector<int> out;
  for (auto part : strings::split(text)) {
    std::string item(part);
    if (item.empty()) return std::nullopt;
    char* stop = nullptr;
    long value = std::strtol(item.c_str(), &stop, 10);
    if (*stop != '\0' || value < 0) return std::nullopt;
    out.push_back(static_cast<int>(value));
  }
  return out;
}

void finalizeAtExit() {
  Session& s = session();
  std::lock_guard lk(s.mu);
  // A forked child shares its parent's connection: finalizing it would cut the parent off.
  if (!s.open || s.closed || s.pid != getpid() || s.aborted) return;
  s.closed = true;
  // A connection dropped without PMIx_Finalize looks like a crashed rank to the server (Slurm
  // then cancels the step): finalize every reference still held, even of leaked bootstraps.
  while (s.refs > 0) {
    PMIx_Finalize(nullptr, 0);
    --s.refs;
  }
}

void queryIdentity(Session& s) {
  pmix_proc_t wild;
  PMIX_LOAD_PROCID(&wild, s.me.nspace, PMIX_RANK_WILDCARD);
  s.rank = static_cast<int>(s.me.rank);
  auto size = getInteger(wild, PMIX_JOB_SIZE);
  if (!size) {
    throw Error(ErrorCode::BackendError,
                "pmix bootstrap: the PMIx server does not provide PMIX_JOB_SIZE; this launcher "
                "is not supported, use bootstrap.backend=tcp");
  }
  s.size = static_cast<int>(*size);
  std::optional<std::vector<int>> peers;
  if (auto text = getString(wild, PMIX_LOCAL_PEERS)) peers = parseRankList(*text);
  auto localSize = getInteger(wild, PMIX_LOCAL_SIZE);
  if (!localSize && peers) localSize = static_cast<int64_t>(peers->size());
  auto localRank = getInteger(s.me, PMIX_LOCAL_RANK);
  if (!localRank && peers) {
    auto it = std::find(peers->begin(), peers->end(), s.rank);
    if (it != peers->end()) localRank = it - peers->begin();
  }
  if (!localSize || !localRank) {
    throw Error(ErrorCode::BackendError,
                fmt::format("pmix bootstrap: the PMIx server gives rank {} neither {} and {} nor "
                            "{}; this launcher is not supported, use bootstrap.backend=tcp",
                            s.rank, PMIX_LOCAL_RANK, PMIX_LOCAL_SIZE, PMIX_LOCAL_PEERS));
  }
  s.localSize = static_cast<int>(*localSize);
  s.localRank = static_cast<int>(*localRank);
  if (s.size < 1 || s.rank < 0 || s.rank >= s.size || s.localSize < 1 || s.localSize > s.size ||
      s.localRank < 0 || s.localRank >= s.localSize) {
    throw Error(ErrorCode::BackendError,
                fmt::format("pmix bootstrap: inconsistent job information from the PMIx server: "
                            "rank {} of {}, local rank {} of {}",
                            s.rank, s.size, s.localRank, s.localSize));
  }
}

/// The state of one nonblocking fence, shared with PMIx's callback (which may come after a
/// local timeout gave up on it).
struct FenceWait {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  pmix_status_t status = PMIX_SUCCESS;
  pmix_info_t* info = nullptr;
  size_t ninfo = 0;
  ~FenceWait() {
    if (info) PMIX_INFO_FREE(info, ninfo);
  }
};

void fenceDone(pmix_status_t status, void* cbdata) {
  auto* holder = static_cast<std::shared_ptr<FenceWait>*>(cbdata);
  {
    std::lock_guard lk((*holder)->mu);
    (*holder)->status = status;
    (*holder)->done = true;
  }
  (*holder)->cv.notify_all();
  delete holder;
}

}  // namespace

Session& session() {
  static Session* s = new Session;  // never destroyed: the atexit handler still needs it
  return *s;
}

/// Every PMIx failure becomes BackendError naming the call; a PMIx timeout becomes Timeout
/// naming the bootstrap operation.
[[noreturn]] void fail(std::string_view what, pmix_status_t rc, double timeout, int peer) {
  if (rc == PMIX_ERR_TIMEOUT) {
    throw Error(ErrorCode::Timeout,
                fmt::format("pmix bootstrap: {} timed out after {} s: not every rank reached it "
                            "in time (a rank may have failed or skipped the call; "
                            "bootstrap.timeout sets the limit)",
                            what, timeout),
                peer);
  }
  throw Error(ErrorCode::BackendError,
              fmt::format("pmix bootstrap: {} failed: {}", what, statusText(rc)), peer);
}

/// Takes one PMIx reference for a new bootstrap; returns its instance number.
uint64_t acquire() {
  Session& s = session();
  std::lock_guard lk(s.mu);
  if (s.closed) {
    throw Error(ErrorCode::BackendError,
                "pmix bootstrap: the process is exiting and has left the PMIx job");
  }
  if (s.open && s.pid != getpid()) {
    throw Error(ErrorCode::NotSupported,
                fmt::format("pmix bootstrap: this process (pid {}) was forked from PMIx client "
                            "pid {}, and a forked child cannot use its parent's PMIx connection. "
                            "Create pmix bootstraps only in the launched processes, or use "
                            "bootstrap.backend=tcp",
                            getpid(), s.pid));
  }
  pmix_proc_t me;
  if (!s.open) {
    pmix_status_t rc = PMIx_Init(&me, nullptr, 0);
    if (rc != PMIX_SUCCESS) {
      throw Error(ErrorCode::BackendError,
                  fmt::format("pmix bootstrap: PMIx_Init failed: {}. Launch with srun --mpi=pmix "
                              "or mpirun, or choose another bootstrap.backend",
                              statusText(rc)));
    }
    s.me = me;
    try {
      queryIdentity(s);
    } catch (...) {
      PMIx_Finalize(nullptr, 0);
      throw;
    }
    s.open = true;
    s.pid = getpid();
    s.refs = 1;  // the process-lifetime reference
    std::atexit(finalizeAtExit);
  }
  // The bootstrap's own reference (PMIx counts them; only the last finalize disconnects).
  pmix_status_t rc = PMIx_Init(&me, nullptr, 0);
  if (rc != PMIX_SUCCESS) fail("PMIx_Init", rc, 0);
  ++s.refs;
  return ++s.instances;
}

void release() noexcept {
  Session& s = session();
  std::lock_guard lk(s.mu);
  if (!s.open || s.closed || s.pid != getpid() || s.refs <= 1) return;
  PMIx_Finalize(nullptr, 0);
  --s.refs;
}

/// One job-wide fence. PMIX_TIMEOUT asks the server to give up; a local deadline a little later
/// makes sure this call returns even if a server ignores it.
void fence(bool collect, double timeout, std::string_view what) {
  auto wait = std::make_shared<FenceWait>();
  int seconds = pmixTimeout(timeout);
  wait->ninfo = seconds > 0 ? 2 : 1;
  PMIX_INFO_CREATE(wait->info, wait->ninfo);
  bool flag = collect;
  PMIX_INFO_LOAD(&wait->info[0], PMIX_COLLECT_DATA, &flag, PMIX_BOOL);
  if (seconds > 0) PMIX_INFO_LOAD(&wait->info[1], PMIX_TIMEOUT, &seconds, PMIX_INT);
  auto* holder = new std::shared_ptr<FenceWait>(wait);
  pmix_status_t rc = PMIx_Fence_nb(nullptr, 0, wait->info, wait->ninfo, fenceDone, holder);
  if (rc != PMIX_SUCCESS) {
    delete holder;
    fail(fmt::format("{} (PMIx_Fence)", what), rc, timeout);
  }
  Deadline deadline = seconds > 0 ? Deadline::after(seconds + 2.0) : Deadline::never();
  std::unique_lock lk(wait->mu);
  while (!wait->done) {
    if (deadline.isNever()) {
      wait->cv.wait(lk);
    } else if (wait->cv.wait_until(lk, deadline.at()) == std::cv_status::timeout && !wait->done) {
      fail(fmt::format("{} (PMIx fence)", what), PMIX_ERR_TIMEOUT, timeout);
    }
  }
  if (wait->status != PMIX_SUCCESS) {
    fail(fmt::format("{} (PMIx fence)", what), wait->status, timeout);
  }
}

void put(const char* key, const std::vector<uint8_t>& value, std::string_view what) {
  pmix_value_t v;
  std::memset(&v, 0, sizeof v);
  v.type = PMIX_BYTE_OBJECT;
  // PMIx_Put copies the value; the buffer stays ours.
  v.data.bo.bytes = const_cast<char*>(reinterpret_cast<const char*>(value.data()));
  v.data.bo.size = value.size();
  pmix_status_t rc = PMIx_Put(PMIX_GLOBAL, key, &v);
  if (rc != PMIX_SUCCESS) fail(fmt::format("{} (PMIx_Put of {})", what, key), rc, 0);
  rc = PMIx_Commit();
  if (rc != PMIX_SUCCESS) fail(fmt::format("{} (PMIx_Commit)", what), rc, 0);
}

std::vector<uint8_t> get(int peer, const char* key, double timeout, std::string_view what) {
  Session& s = session();
  pmix_proc_t proc;
  PMIX_LOAD_PROCID(&proc, s.me.nspace, static_cast<pmix_rank_t>(peer));
  int seconds = pmixTimeout(timeout);
  pmix_info_t info;
  PMIX_INFO_CONSTRUCT(&info);
  if (seconds > 0) PMIX_INFO_LOAD(&info, PMIX_TIMEOUT, &seconds, PMIX_INT);
  pmix_value_t* v = nullptr;
  pmix_status_t rc = PMIx_Get(&proc, key, seconds > 0 ? &info : nullptr, seconds > 0 ? 1 : 0, &v);
  PMIX_INFO_DESTRUCT(&info);
  if (rc != PMIX_SUCCESS || v == nullptr) {
    fail(fmt::format("{} (PMIx_Get of rank {}'s {})", what, peer, key),
         rc == PMIX_SUCCESS ? PMIX_ERR_NOT_FOUND : rc, timeout, peer);
  }
  if (v->type != PMIX_BYTE_OBJECT || v->data.bo.size > kMaxValue) {
    size_t bytes = v->type == PMIX_BYTE_OBJECT ? v->data.bo.size : 0;
    int type = v->type;
    PMIX_VALUE_RELEASE(v);
    throw Error(ErrorCode::ProtocolError,
                fmt::format("pmix bootstrap: {}: rank {}'s {} is not a strata record (PMIx type "
                            "{}, {} bytes)",
                            what, peer, key, type, bytes),
                peer);
  }
  std::vector<uint8_t> out(v->data.bo.bytes, v->data.bo.bytes + v->data.bo.size);
  PMIX_VALUE_RELEASE(v);
  return out;
}

}  // namespace strata::pmix
