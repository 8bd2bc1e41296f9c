#include "pmix_bootstrap.hpp"

#include <pmix.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <future>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include <strata/backend/module.hpp>
#include <strata/error.hpp>
#include <strata/version.hpp>

#include "base/config_keys.hpp"
#include "base/crypto.hpp"
#include "base/deadline.hpp"
#include "base/log.hpp"
#include "base/strings.hpp"
#include "base/wire.hpp"
#include "mesh/peer_mesh.hpp"
#include "net/netif.hpp"
#include "net/socket.hpp"

extern char** environ;

namespace strata::pmix {
namespace {

constexpr const char* kSub = "pmix";
constexpr size_t kMaxAddress = 64;  // "[ipv6]:port" fits
constexpr size_t kMaxSecret = 256;
// Record header (12) + op u8 + instance u64 + seq u64 + rank i32 + payload length u32.
constexpr size_t kValueOverhead = wire::kRecordHeaderSize + 1 + 8 + 8 + 4 + 4;
constexpr size_t kCreatePayloadMax = 4 + kMaxAddress + 4 + kMaxSecret;
// Values are padded to one of these sizes, and the size is part of the key. libpmix 4.2.2's
// shared-memory store (used under Slurm and Open MPI alike) loses a key that is put again with
// a different size: peers then get NOT-FOUND. Same key, same size avoids that.
constexpr size_t kValueClasses[] = {128, 512, 2048, 8192};
constexpr size_t kMaxValue = 8192;
static_assert(kValueOverhead + kInlineMax <= kMaxValue);
static_assert(kValueOverhead + kCreatePayloadMax <= kMaxValue);

size_t valueClass(size_t payloadBound) {
  for (size_t c : kValueClasses) {
    if (kValueOverhead + payloadBound <= c) return c;
  }
  return kMaxValue;
}

enum class Op : uint8_t { Create = 1, AllGather = 2, Broadcast = 3 };

const char* opName(Op op) {
  switch (op) {
    case Op::Create:
      return "create";
    case Op::AllGather:
      return "allGather";
    case Op::Broadcast:
      return "broadcast";
  }
  return "?";
}

std::string statusText(pmix_status_t rc) {
  const char* s = PMIx_Error_string(rc);
  return s ? s : fmt::format("PMIx status {}", rc);
}

/// Every PMIx failure becomes BackendError naming the call; a PMIx timeout becomes Timeout
/// naming the bootstrap operation.
[[noreturn]] void fail(std::string_view what, pmix_status_t rc, double timeout, int peer = -1) {
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

// One PMIx client connection per process, shared by every PmixBootstrap in it.
//
// It is opened by the first bootstrap and kept until the process exits (an atexit handler drops
// the last reference), although each bootstrap still takes and drops its own reference with
// PMIx_Init/PMIx_Finalize. Measured under Slurm 22.05 and Open MPI 4.1.4 with libpmix 4.2.2:
// a client that finalizes and re-initialises loses its own per-process job keys
// (PMIX_LOCAL_RANK: NOT-FOUND), and under Slurm a rank that finalizes while faster ranks have
// already entered the next fence makes that fence fail with PARTIAL-SUCCESS / INVALID-ARG.
// Create/destroy cycles are therefore only reliable if the connection outlives them.
struct Session {
  std::mutex mu;  // guards everything below but the fence state
  bool open = false;
  bool closed = false;  // finalized at exit
  pid_t pid = 0;
  int refs = 0;  // PMIx_Init calls not yet finalized, the process-lifetime one included
  pmix_proc_t me{};
  int rank = -1, size = 0, localRank = -1, localSize = 0;
  uint64_t instances = 0;
  std::atomic<bool> aborted{false};

  // Fences are job-wide, so one runs at a time per process. Data fences alternate between two
  // keys ("slots"): a rank re-puts slot k for data fence c+2 only after data fence c+1
  // completed, which every rank entered only after finishing its Gets of fence c.
  std::mutex fenceMu;
  uint64_t dataFences = 0;
};

Session& session() {
  static Session* s = new Session;  // never destroyed: the atexit handler still needs it
  return *s;
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

struct Value {
  Op op;
  uint64_t instance;
  uint64_t seq;
  int32_t rank;
  std::vector<uint8_t> payload;
};

std::vector<uint8_t> encodeValue(const Value& v) {
  wire::Writer w;
  w.u8(static_cast<uint8_t>(v.op)).u64(v.instance).u64(v.seq).i32(v.rank).bytes(v.payload);
  return wire::encodeRecord(kValueKind, kValueVersion, w.data());
}

/// Decodes rank `from`'s value and checks that it belongs to this very call: ranks that called
/// collectives in different orders get a ProtocolError instead of each other's data.
std::vector<uint8_t> decodeValue(const std::vector<uint8_t>& rec, const Value& expect, int from) {
  std::string what = fmt::format("PMIx record of rank {}", from);
  // The record, then zero padding up to its size class.
  auto h = wire::decodeHeader({rec.data(), std::min(rec.size(), wire::kRecordHeaderSize)},
                              kValueVersion, kMaxValue, what);
  if (h.length > rec.size() - wire::kRecordHeaderSize) {
    throw Error(ErrorCode::ProtocolError,
                fmt::format("pmix bootstrap: truncated {} ({} of {} bytes)", what, rec.size(),
                            wire::kRecordHeaderSize + h.length),
                from);
  }
  auto d = wire::decodeRecord({rec.data(), wire::kRecordHeaderSize + h.length}, kValueKind,
                              kValueVersion, kMaxValue, what);
  wire::Reader r(d.body, what);
  auto op = static_cast<Op>(r.u8("op"));
  uint64_t instance = r.u64("instance");
  uint64_t seq = r.u64("seq");
  int32_t rank = r.i32("rank");
  auto payload = r.bytes(std::max(kInlineMax, kCreatePayloadMax), "payload");
  r.expectEnd();
  if (op != expect.op || instance != expect.instance || seq != expect.seq || rank != from) {
    throw Error(ErrorCode::ProtocolError,
                fmt::format("pmix bootstrap: {} #{} of bootstrap #{} got rank {}'s record of {} "
                            "#{} of bootstrap #{} (claiming rank {}): the ranks called bootstrap "
                            "collectives, or created bootstraps, in different orders",
                            opName(expect.op), expect.seq, expect.instance, from, opName(op), seq,
                            instance, rank),
                from);
  }
  return payload;
}

/// Put (when `mine` is set), one collecting fence, and Gets of the ranks in `from`.
/// `payloadBound` is the largest payload any rank may put in this call (the same on every rank,
/// so that all agree on the key).
std::vector<std::vector<uint8_t>> dataFence(const std::vector<uint8_t>* mine, size_t payloadBound,
                                            const std::vector<int>& from, double timeout,
                                            std::string_view what) {
  Session& s = session();
  std::lock_guard lk(s.fenceMu);
  size_t cls = valueClass(payloadBound);
  std::string key = fmt::format("strata.s{}.{}", s.dataFences % 2, cls);
  ++s.dataFences;
  if (mine) {
    if (mine->size() > cls) {
      throw Error(ErrorCode::Internal,
                  fmt::format("pmix bootstrap: {} record of {} bytes exceeds its {}-byte class",
                              what, mine->size(), cls));
    }
    std::vector<uint8_t> padded(*mine);
    padded.resize(cls, 0);
    put(key.c_str(), padded, what);
  }
  fence(true, timeout, what);
  std::vector<std::vector<uint8_t>> out;
  out.reserve(from.size());
  for (int peer : from) out.push_back(get(peer, key.c_str(), timeout, what));
  return out;
}

bool envPresent(const char* prefix) {
  size_t n = std::strlen(prefix);
  for (char** e = environ; e && *e; ++e) {
    if (std::strncmp(*e, prefix, n) == 0) return true;
  }
  return false;
}

int familyFromConfig(const Config& config) {
  std::string f = config::getString(config, "bootstrap.tcp.family");
  if (f == "ipv4") return AF_INET;
  if (f == "ipv6") return AF_INET6;
  return AF_UNSPEC;
}

}  // namespace

struct PmixBootstrap::Impl {
  uint64_t instance = 0;
  int rank = -1, size = 0, localRank = -1, localSize = 0;
  double timeout = 30;
  bool released = false;
  std::unique_ptr<mesh::PeerMesh> mesh;
  std::mutex callMu;  // one collective at a time, so that seq follows the order of calls
  uint64_t seq = 0;
  std::atomic<bool> aborted{false};
  std::string abortReason;

  void checkNotAborted() const {
    if (aborted) {
      throw Error(ErrorCode::Aborted,
                  fmt::format("pmix bootstrap: this rank called abort(): {}", abortReason), rank);
    }
  }

  std::vector<int> others() const {
    std::vector<int> v;
    for (int r = 0; r < size; ++r) {
      if (r != rank) v.push_back(r);
    }
    return v;
  }
};

PmixBootstrap::PmixBootstrap(const Config& config) : impl_(std::make_unique<Impl>()) {
  auto& I = *impl_;
  // Read the configuration before joining PMIx: a bad value must not cost a PMIx reference.
  mesh::Options opt;
  opt.backend = "pmix";
  opt.timeout = config::getDouble(config, "bootstrap.timeout");
  opt.handshakeTimeout = config::getDouble(config, "bootstrap.handshake_timeout");
  opt.maxMessage = config::getBytes(config, "bootstrap.max_message");
  double connectTimeout = config::getDouble(config, "bootstrap.connect_timeout");
  std::string interface = config::getString(config, "bootstrap.tcp.interface");
  int family = familyFromConfig(config);
  I.timeout = opt.timeout;

  I.instance = acquire();
  try {
    Session& s = session();
    I.rank = s.rank;
    I.size = s.size;
    I.localRank = s.localRank;
    I.localSize = s.localSize;
    log::setRank(I.rank);
    opt.rank = I.rank;
    opt.size = I.size;
    auto spin = mesh::spinPolicy(config, I.localSize);
    opt.spinUs = spin.us;
    opt.spinYield = spin.yield;
    if (I.size == 1) {
      I.mesh = std::make_unique<mesh::PeerMesh>(opt, net::Fd());
      return;
    }

    auto iface = netif::select(interface, family);
    net::SockAddr bindAddr =
        net::SockAddr::fromRaw(reinterpret_cast<const sockaddr*>(&iface.addr), iface.addrLen);
    bindAddr.setPort(0);
    net::Fd listener = net::listenOn(bindAddr);
    std::string address = net::localAddress(listener.get()).toString();
    STRATA_LOG(Debug, kSub, "rank {} of {} (bootstrap #{}) listens on {} ({})", I.rank, I.size,
               I.instance, address, iface.name);

    // Rank 0 makes up the job secret and publishes it with its address, in the same fence.
    std::string secret = I.rank == 0 ? crypto::randomSecretHex() : std::string();
    wire::Writer body;
    body.str(address).str(secret);
    Value mine{Op::Create, I.instance, 0, I.rank, body.take()};
    auto rec = encodeValue(mine);
    auto others = I.others();
    auto values =
        dataFence(&rec, kCreatePayloadMax, others, connectTimeout, "create (address exchange)");

    std::vector<std::string> table(static_cast<size_t>(I.size));
    table[static_cast<size_t>(I.rank)] = address;
    for (size_t i = 0; i < others.size(); ++i) {
      int peer = others[i];
      auto payload = decodeValue(values[i], mine, peer);
      wire::Reader r(payload, fmt::format("pmix create record of rank {}", peer));
      std::string addr = r.str(kMaxAddress, "address");
      std::string peerSecret = r.str(kMaxSecret, "secret");
      r.expectEnd();
      try {
        net::SockAddr::parseNumeric(addr);
      } catch (const Error&) {
        throw Error(
            ErrorCode::ProtocolError,
            fmt::format("pmix bootstrap: rank {} published a bad mesh address '{}'", peer, addr),
            peer);
      }
      table[static_cast<size_t>(peer)] = addr;
      if (peer == 0) secret = peerSecret;
    }
    if (secret.size() < 32) {
      throw Error(ErrorCode::ProtocolError,
                  fmt::format("pmix bootstrap: rank 0 published a job secret of {} characters "
                              "(expected 64)",
                              secret.size()),
                  0);
    }
    opt.secret = secret;
    I.mesh = std::make_unique<mesh::PeerMesh>(opt, std::move(listener));
    I.mesh->setPeerAddresses(table);
  } catch (...) {
    I.mesh.reset();
    release();
    I.released = true;
    throw;
  }
}

PmixBootstrap::~PmixBootstrap() {
  auto& I = *impl_;
  if (I.mesh) I.mesh->close();
  I.mesh.reset();
  if (!I.released) release();
}

int PmixBootstrap::rank() const noexcept {
  return impl_->rank;
}
int PmixBootstrap::size() const noexcept {
  return impl_->size;
}
int PmixBootstrap::localRank() const noexcept {
  return impl_->localRank;
}
int PmixBootstrap::localSize() const noexcept {
  return impl_->localSize;
}

void PmixBootstrap::send(int peer, int tag, const void* data, size_t bytes) {
  impl_->mesh->send(peer, tag, data, bytes, impl_->mesh->callDeadline());
}

void PmixBootstrap::recv(int peer, int tag, void* data, size_t bytes) {
  impl_->mesh->recv(peer, tag, data, bytes, impl_->mesh->callDeadline());
}

void PmixBootstrap::allGather(void* data, size_t bytesPerRank) {
  auto& I = *impl_;
  I.checkNotAborted();
  std::lock_guard lk(I.callMu);
  uint64_t seq = ++I.seq;
  if (I.size == 1) return;
  if (bytesPerRank > kInlineMax) {
    I.mesh->allGather(data, bytesPerRank);
    return;
  }
  auto* bytes = static_cast<uint8_t*>(data);
  const uint8_t* slot = bytes + bytesPerRank * static_cast<size_t>(I.rank);
  Value mine{Op::AllGather, I.instance, seq, I.rank,
             std::vector<uint8_t>(slot, slot + bytesPerRank)};
  auto rec = encodeValue(mine);
  auto others = I.others();
  auto values = dataFence(&rec, bytesPerRank, others, I.timeout, "allGather");
  for (size_t i = 0; i < others.size(); ++i) {
    int peer = others[i];
    auto payload = decodeValue(values[i], mine, peer);
    if (payload.size() != bytesPerRank) {
      throw Error(ErrorCode::ProtocolError,
                  fmt::format("pmix bootstrap: allGather: rank {} contributed {} bytes, this rank "
                              "{} bytes per rank; every rank must pass the same size",
                              peer, payload.size(), bytesPerRank),
                  peer);
    }
    if (bytesPerRank > 0) {
      std::memcpy(bytes + bytesPerRank * static_cast<size_t>(peer), payload.data(), bytesPerRank);
    }
  }
}

void PmixBootstrap::broadcast(void* data, size_t bytes, int root) {
  auto& I = *impl_;
  if (root < 0 || root >= I.size) {
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("pmix bootstrap: broadcast root {} is not a rank of this job (0..{})",
                            root, I.size - 1));
  }
  I.checkNotAborted();
  std::lock_guard lk(I.callMu);
  uint64_t seq = ++I.seq;
  if (I.size == 1) return;
  if (bytes > kInlineMax) {
    I.mesh->broadcast(data, bytes, root);
    return;
  }
  auto* p = static_cast<uint8_t*>(data);
  Value expect{Op::Broadcast, I.instance, seq, root, {}};
  if (I.rank == root) {
    expect.payload.assign(p, p + bytes);
    auto rec = encodeValue(expect);
    dataFence(&rec, bytes, {}, I.timeout, "broadcast");
    return;
  }
  auto values = dataFence(nullptr, bytes, {root}, I.timeout, "broadcast");
  auto payload = decodeValue(values[0], expect, root);
  if (payload.size() != bytes) {
    throw Error(ErrorCode::ProtocolError,
                fmt::format("pmix bootstrap: broadcast from rank {} carried {} bytes, this rank "
                            "expected {}; every rank must pass the same size",
                            root, payload.size(), bytes),
                root);
  }
  if (bytes > 0) std::memcpy(p, payload.data(), bytes);
}

void PmixBootstrap::barrier() {
  auto& I = *impl_;
  I.checkNotAborted();
  std::lock_guard lk(I.callMu);
  ++I.seq;
  if (I.size == 1) return;
  Session& s = session();
  std::lock_guard fk(s.fenceMu);
  fence(false, I.timeout, "barrier");
}

void PmixBootstrap::abort(std::string_view reason) noexcept {
  auto& I = *impl_;
  if (I.aborted.exchange(true)) return;
  try {
    I.abortReason = std::string(reason.substr(0, 1024));
  } catch (...) {
  }
  // The mesh first: PMIx_Abort may end this process before it returns.
  if (I.mesh) I.mesh->abort(reason);
  if (I.size <= 1) return;
  Session& s = session();
  if (s.pid != getpid()) return;
  s.aborted = true;
  try {
    // PMIx_Abort asks the server to end the whole job and waits for its answer. Run it aside
    // so that a server that never answers cannot hang this call.
    auto message = std::make_shared<std::string>(
        fmt::format("strata: rank {} aborted: {}", I.rank, I.abortReason));
    auto done = std::make_shared<std::promise<void>>();
    auto finished = done->get_future();
    std::thread([message, done] {
      PMIx_Abort(1, message->c_str(), nullptr, 0);
      done->set_value();
    }).detach();
    if (finished.wait_for(std::chrono::seconds(5)) != std::future_status::ready) {
      STRATA_LOG(Warn, kSub, "PMIx_Abort did not return within 5 s; leaving it running");
    }
  } catch (...) {
    STRATA_LOG(Warn, kSub,
               "could not call PMIx_Abort; other ranks learn of the abort only "
               "through their mesh connections");
  }
}

std::string PmixBootstrap::listenAddress() const {
  return impl_->mesh ? impl_->mesh->listenAddress() : std::string();
}

bool detectServer() noexcept {
  return envPresent("PMIX_SERVER_URI") || envPresent("PMIX_NAMESPACE=");
}

}  // namespace strata::pmix

namespace {

bool detect() noexcept {
  return strata::pmix::detectServer();
}

std::unique_ptr<strata::Bootstrap> create(const strata::Config& config) {
  try {
    return std::make_unique<strata::pmix::PmixBootstrap>(config);
  } catch (const strata::Error&) {
    throw;
  } catch (const std::exception& e) {
    throw strata::Error(strata::ErrorCode::Internal,
                        fmt::format("pmix bootstrap: unexpected failure: {}", e.what()));
  }
}

}  // namespace

extern "C" __attribute__((visibility("default"))) const strata::backend::ModuleInfo*
strata_module_info() {
  static const strata::backend::ModuleInfo info{
      STRATA_MODULE_ABI_VERSION,
      strata::backend::ModuleKind::Bootstrap,
      "pmix",
      STRATA_VERSION_STRING,
      "PMIx (srun --mpi=pmix, mpirun): identity and collectives from the PMIx server, "
      "point-to-point over authenticated TCP",
      &detect,
      &create,
      nullptr,
      nullptr,
  };
  return &info;
}
