// The NCCL C API (nccl.h 2.28) over strata: communicators from an ncclUniqueId through strata's
// tcp bootstrap, every collective and send/recv on strata::Communicator, NCCL's error codes with
// strata's messages. Groups are in nccl_group.cpp. docs/nccl-api.md is the reference.

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>

#include <fmt/format.h>

#include <strata/backend/host_memory.hpp>
#include <strata/bootstrap.hpp>
#include <strata/config.hpp>
#include <strata/transport.hpp>

#include "nccl_internal.hpp"

#define NCCL_EXPORT extern "C" __attribute__((visibility("default")))
// NCCL exports every function twice: nccl* and the profiling twin pnccl* (same code here).
#define NCCL_TWIN(ret, name, params) NCCL_EXPORT ret p##name params __attribute__((alias(#name)));

using strata::Communicator;
using strata::Config;
using strata::DataType;
using strata::Error;
using strata::ErrorCode;
using strata::ReduceOp;

namespace strata::nccl {

namespace {

thread_local std::string threadLastError;

/// What an ncclUniqueId carries (128 bytes): rank 0's rendezvous address and the job secret.
struct IdRecord {
  char magic[8];     ///< "strataID"
  uint32_t version;  ///< 1
  uint32_t flags;    ///< kFromCommId: from NCCL_COMM_ID (rank 0 binds it at init)
  uint64_t job;      ///< random, for logs
  char secret[40];   ///< hex, NUL-terminated; empty: unauthenticated (NCCL_COMM_ID)
  char root[64];     ///< "host:port", NUL-terminated
};
static_assert(sizeof(IdRecord) <= NCCL_UNIQUE_ID_BYTES);
constexpr char kIdMagic[8] = {'s', 't', 'r', 'a', 't', 'a', 'I', 'D'};
constexpr uint32_t kFromCommId = 1;

/// Rendezvous listeners ncclGetUniqueId opened in this process, by address: the rank 0 that
/// inits with that id takes it.
std::mutex listenersMu;
std::map<std::string, std::unique_ptr<strata::RendezvousListener>> listeners;

std::string randomHex(size_t chars) {
  std::random_device rd;
  std::string s;
  static const char* digits = "0123456789abcdef";
  while (s.size() < chars) {
    uint32_t v = rd();
    for (int i = 0; i < 8 && s.size() < chars; ++i, v >>= 4) s += digits[v & 15];
  }
  return s;
}

/// strata's configuration with the NCCL_* variables strata has a knob for (docs/nccl-api.md):
/// NCCL_SOCKET_IFNAME -> bootstrap.tcp.interface and NCCL_DEBUG -> log.level, each unless the
/// strata key is set.
Config ncclConfig() {
  Config c = Config::load();
  if (const char* ifname = std::getenv("NCCL_SOCKET_IFNAME");
      ifname && *ifname && !std::getenv("STRATA_BOOTSTRAP_TCP_INTERFACE")) {
    std::string name = ifname;
    if (name[0] == '=') name.erase(0, 1);
    // "^prefix" (exclusion) and lists have no strata equivalent: left to strata's choice.
    if (!name.empty() && name[0] != '^' && name.find(',') == std::string::npos) {
      c.set("bootstrap.tcp.interface", name);
    }
  }
  if (const char* debug = std::getenv("NCCL_DEBUG"); debug && !std::getenv("STRATA_LOG_LEVEL")) {
    std::string d = debug;
    for (char& ch : d) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
    if (d == "WARN" || d == "VERSION") c.set("log.level", "warn");
    if (d == "INFO") c.set("log.level", "info");
    if (d == "TRACE") c.set("log.level", "trace");
  }
  return c;
}

/// This process's place among the ranks of its host, from the launcher's variables when they
/// describe the same job (they only set the bootstrap's spin policy); else alone.
void localPlace(int rank, int size, int* localRank, int* localSize) {
  *localRank = 0;
  *localSize = 1;
  struct Names {
    const char *rank, *size, *localRank, *localSize;
  };
  for (const Names& n :
       {Names{"STRATA_RANK", "STRATA_SIZE", "STRATA_LOCAL_RANK", "STRATA_LOCAL_SIZE"},
        Names{"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
              "OMPI_COMM_WORLD_LOCAL_SIZE"},
        Names{"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"}}) {
    const char *r = std::getenv(n.rank), *s = std::getenv(n.size), *lr = std::getenv(n.localRank),
               *ls = std::getenv(n.localSize);
    if (!r || !s || !lr || !ls) continue;
    if (std::atoi(r) != rank || std::atoi(s) != size) continue;
    const int a = std::atoi(lr), b = std::atoi(ls);
    if (b >= 1 && a >= 0 && a < b && b <= size) {
      *localRank = a;
      *localSize = b;
      return;
    }
  }
}

/// The CUDA device current in this thread, where the program has the CUDA runtime loaded.
int currentDevice() {
  using GetDevice = int (*)(int*);
  auto get = reinterpret_cast<GetDevice>(dlsym(RTLD_DEFAULT, "cudaGetDevice"));
  int d = 0;
  if (get == nullptr || get(&d) != 0) return 0;
  return d;
}

IdRecord decodeId(const ncclUniqueId& id) {
  IdRecord rec;
  std::memcpy(&rec, id.internal, sizeof rec);
  if (std::memcmp(rec.magic, kIdMagic, sizeof kIdMagic) != 0 || rec.version != 1 ||
      std::memchr(rec.root, 0, sizeof rec.root) == nullptr ||
      std::memchr(rec.secret, 0, sizeof rec.secret) == nullptr || rec.root[0] == 0) {
    throw Error(ErrorCode::InvalidArgument,
                "the ncclUniqueId was not made by this library's ncclGetUniqueId (a real NCCL's "
                "id, an uninitialised one, or one corrupted on the way)");
  }
  return rec;
}

// ---- Fallback: STRATA_NCCL_FALLBACK=/path/libnccl.so.2
// -------------------------------------------

/// The real NCCL, loaded once per process with dlopen (its own symbols, never ours).
struct Fallback {
  void* lib = nullptr;
  std::string path;
  decltype(&ncclGetUniqueId) getUniqueId = nullptr;
  decltype(&ncclCommInitRank) commInitRank = nullptr;
  decltype(&ncclCommDestroy) commDestroy = nullptr;
  decltype(&ncclGetErrorString) getErrorString = nullptr;
  decltype(&ncclAllReduce) allReduce = nullptr;
  decltype(&ncclAllGather) allGather = nullptr;
  decltype(&ncclReduceScatter) reduceScatter = nullptr;
  decltype(&ncclBroadcast) broadcast = nullptr;
};

/// The fallback library, or null without STRATA_NCCL_FALLBACK. Throws InvalidArgument when the
/// variable names something that is not a loadable NCCL (or is this library).
const Fallback* fallback() {
  static std::once_flag once;
  static std::unique_ptr<Fallback> fb;
  static std::string error;
  std::call_once(once, [] {
    const char* path = std::getenv("STRATA_NCCL_FALLBACK");
    if (path == nullptr || *path == 0) return;
    auto f = std::make_unique<Fallback>();
    f->path = path;
    f->lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (f->lib == nullptr) {
      const char* e = dlerror();
      error = fmt::format("STRATA_NCCL_FALLBACK={} cannot be loaded: {}", path, e ? e : "?");
      return;
    }
    auto load = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(f->lib, name));
      if (fn == nullptr && error.empty()) {
        error = fmt::format("STRATA_NCCL_FALLBACK={} has no {}: not an NCCL library", path, name);
      }
    };
    load(f->getUniqueId, "ncclGetUniqueId");
    load(f->commInitRank, "ncclCommInitRank");
    load(f->commDestroy, "ncclCommDestroy");
    load(f->getErrorString, "ncclGetErrorString");
    load(f->allReduce, "ncclAllReduce");
    load(f->allGather, "ncclAllGather");
    load(f->reduceScatter, "ncclReduceScatter");
    load(f->broadcast, "ncclBroadcast");
    if (error.empty() && f->getUniqueId == &ncclGetUniqueId) {
      error = fmt::format(
          "STRATA_NCCL_FALLBACK={} is this library (strata's NCCL API): it must "
          "name a real NCCL",
          path);
    }
    if (error.empty()) fb = std::move(f);
  });
  if (!error.empty()) throw Error(ErrorCode::InvalidArgument, error);
  return fb.get();
}

/// Makes comm's fallback communicator: rank 0's id of the real NCCL over strata's bootstrap.
void initFallback(ncclComm* c) {
  const Fallback* fb = fallback();
  if (fb == nullptr) return;
  ncclUniqueId id{};
  strata::Bootstrap& boot = c->comm->bootstrap();
  int ok = 1;
  if (c->rank == 0) ok = fb->getUniqueId(&id) == ncclSuccess ? 1 : 0;
  boot.broadcast(&ok, sizeof ok, 0);
  if (ok == 0) {
    throw Error(
        ErrorCode::BackendError,
        fmt::format("the fallback NCCL ({}) failed in ncclGetUniqueId on rank 0", fb->path));
  }
  boot.broadcast(&id, sizeof id, 0);
  const ncclResult_t r = fb->commInitRank(&c->fallbackComm, c->size, id, c->rank);
  if (r != ncclSuccess) {
    c->fallbackComm = nullptr;
    throw Error(ErrorCode::BackendError,
                fmt::format("the fallback NCCL ({}) failed in ncclCommInitRank: {}", fb->path,
                            fb->getErrorString(r)));
  }
}

}  // namespace

/// Runs a call of the fallback NCCL (logged once per kind of call and communicator); throws
/// BackendError when it fails.
template <typename F>
void runFallback(ncclComm* comm, const char* what, const std::string& why, F&& call) {
  const Fallback* fb = fallback();
  {
    std::lock_guard lk(comm->mu);
    auto& seen = comm->fallbackLogged;
    if (std::find(seen.begin(), seen.end(), what) == seen.end()) {
      seen.push_back(what);
      std::fprintf(stderr, "[strata nccl] rank %d: %s sent to the fallback NCCL (%s): %s\n",
                   comm->rank, what, fb->path.c_str(), why.c_str());
    }
  }
  const ncclResult_t r = call(*fb, comm->fallbackComm);
  if (r != ncclSuccess) {
    throw Error(ErrorCode::BackendError, fmt::format("{} in the fallback NCCL ({}) returned {}",
                                                     what, fb->path, fb->getErrorString(r)));
  }
}

/// strata's call, or, when strata cannot serve it (NotSupported) and a fallback NCCL is
/// loaded, the fallback's.
template <typename S, typename F>
void orFallback(ncclComm* comm, const char* what, S&& strataCall, F&& fallbackCall) {
  try {
    strataCall();
  } catch (const Error& e) {
    if (e.code() != ErrorCode::NotSupported || comm->fallbackComm == nullptr) throw;
    runFallback(comm, what, e.what(), fallbackCall);
  }
}

namespace {

/// Builds the strata communicator for rank of nranks from its ids (blocking, collective).
/// Several ids (ncclCommInitRankScalable): id k is the rendezvous root of NCCL's block k of
/// ranks, served by the block's first rank, which must initialise in the process that made
/// the id; the first id's secret authenticates every connection.
void initFromId(ncclComm* c, int nranks, const std::vector<IdRecord>& ids, int rank) {
  Config config = ncclConfig();
  strata::ExplicitLaunch launch;
  launch.rank = rank;
  launch.size = nranks;
  localPlace(rank, nranks, &launch.localRank, &launch.localSize);
  const IdRecord& id = ids.front();
  launch.root = id.root;
  launch.secret = id.secret;
  if (launch.secret.empty()) {
    // NCCL_COMM_ID carries no secret; a launcher's job secret (strata-run) is every rank's.
    if (const char* s = std::getenv("STRATA_SECRET")) launch.secret = s;
  }
  // The same id given several times (NCCL_COMM_ID on every rank) is one root.
  const bool oneRoot = std::all_of(
      ids.begin(), ids.end(), [&](const IdRecord& i) { return std::strcmp(i.root, id.root) == 0; });
  const int roots = oneRoot ? 1 : static_cast<int>(ids.size());
  if (roots > 1) {
    if (roots > nranks) {
      throw Error(ErrorCode::InvalidArgument,
                  fmt::format("ncclCommInitRankScalable: {} ids for {} ranks (at most one per "
                              "rank)",
                              roots, nranks));
    }
    for (const IdRecord& i : ids) launch.roots.emplace_back(i.root);
    launch.root.clear();  // roots[0] is rank 0's
  }
  const int block = strata::rendezvousBlockOf(rank, nranks, roots);
  const IdRecord& mine = ids[static_cast<size_t>(roots > 1 ? block : 0)];
  std::unique_ptr<strata::RendezvousListener> listener;
  if (rank == strata::rendezvousBlockStart(block, nranks, roots) && nranks > 1) {
    {
      std::lock_guard lk(listenersMu);
      auto it = listeners.find(mine.root);
      if (it != listeners.end()) {
        listener = std::move(it->second);
        listeners.erase(it);
      }
    }
    if (!listener && (mine.flags & kFromCommId) != 0) {
      // NCCL_COMM_ID=host:port: rank 0 listens on that port.
      const std::string root = mine.root;
      const size_t colon = root.rfind(':');
      Config c = config;
      c.set("bootstrap.tcp.port", root.substr(colon + 1));
      std::string host = root.substr(0, colon);
      if (host.size() > 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
      listener = std::make_unique<strata::RendezvousListener>(c, host);
      (roots > 1 ? launch.roots[static_cast<size_t>(block)] : launch.root) = listener->address();
    }
    if (!listener) {
      throw Error(
          ErrorCode::InvalidArgument,
          roots > 1
              ? fmt::format("rank {} serves block {} of {} of ncclCommInitRankScalable's ranks "
                            "and must initialise in the process that called ncclGetUniqueId for "
                            "id {} (its rendezvous listener on {} lives there), once",
                            rank, block, roots, block, mine.root)
              : fmt::format("rank 0 must initialise in the process that called ncclGetUniqueId "
                            "for this id (its rendezvous listener on {} lives there), once; or "
                            "set NCCL_COMM_ID=host:port on every rank",
                            launch.root));
    }
  }
  std::shared_ptr<strata::Bootstrap> boot =
      strata::createTcpBootstrap(launch, config, listener.get());
  c->comm = Communicator::create(std::move(boot), config);
  c->rank = rank;
  c->size = nranks;
  initFallback(c);
}

DataType typeOf(ncclDataType_t t, bool* ok) {
  *ok = true;
  switch (t) {
    case ncclInt8:
      return DataType::Int8;
    case ncclUint8:
      return DataType::Uint8;
    case ncclInt32:
      return DataType::Int32;
    case ncclUint32:
      return DataType::Uint32;
    case ncclInt64:
      return DataType::Int64;
    case ncclUint64:
      return DataType::Uint64;
    case ncclFloat16:
      return DataType::Float16;
    case ncclFloat32:
      return DataType::Float32;
    case ncclFloat64:
      return DataType::Float64;
    case ncclBfloat16:
      return DataType::BFloat16;
    default:
      *ok = false;
      return DataType::Uint8;
  }
}

}  // namespace

bool valid(const ncclComm* comm) noexcept {
  return comm != nullptr && comm->magic == ncclComm::kMagic;
}

void setLastError(ncclComm* comm, const std::string& msg) noexcept {
  try {
    threadLastError = msg;
    if (valid(comm)) {
      std::lock_guard lk(comm->mu);
      comm->lastError = comm->name.empty() ? msg : "[" + comm->name + "] " + msg;
    }
  } catch (...) {
  }
}

ncclResult_t fail(ncclComm* comm, ncclResult_t code, const std::string& msg) noexcept {
  setLastError(comm, msg);
  return code;
}

ncclResult_t resultOf(const Error& e) noexcept {
  switch (e.code()) {
    case ErrorCode::InvalidArgument:
    case ErrorCode::InvalidConfig:
      return ncclInvalidArgument;
    case ErrorCode::NotSupported:
      return ncclInvalidUsage;
    case ErrorCode::Timeout:
    case ErrorCode::PeerLost:
    case ErrorCode::ProtocolError:
    case ErrorCode::Aborted:
      return ncclRemoteError;
    case ErrorCode::AuthFailed:
    case ErrorCode::SystemError:
      return ncclSystemError;
    case ErrorCode::BackendError:
      return std::string_view(e.what()).find("CUDA") != std::string_view::npos ||
                     std::string_view(e.what()).find("cuda") != std::string_view::npos
                 ? ncclUnhandledCudaError
                 : ncclSystemError;
    case ErrorCode::Internal:
      return ncclInternalError;
  }
  return ncclInternalError;
}

ncclResult_t caught(ncclComm* comm) noexcept {
  try {
    throw;
  } catch (const Error& e) {
    const ncclResult_t r = resultOf(e);
    setLastError(comm, e.what());
    // Arguments refused before anything moved leave the communicator usable.
    if (r != ncclInvalidArgument && r != ncclInvalidUsage && valid(comm)) {
      int expected = ncclSuccess;
      comm->broken.compare_exchange_strong(expected, r);
    }
    return r;
  } catch (const std::exception& e) {
    setLastError(comm, std::string("internal error: ") + e.what());
    return ncclInternalError;
  } catch (...) {
    setLastError(comm, "internal error: an unknown exception");
    return ncclInternalError;
  }
}

/// The stream strata's call takes: the caller's for device memory, none for host memory, after
/// waiting for the stream's earlier work where the CUDA driver is loaded (strata::hostOrdered,
/// which every Communicator call applies too; the shim calls it first because it touches host
/// buffers itself: pre-multiplication, copies to self). docs/nccl-api.md, "Memory and streams".
cudaStream_t hostOrdered(const void* buf, cudaStream_t stream) {
  return static_cast<cudaStream_t>(strata::hostOrdered(buf, Stream{stream}).handle);
}

}  // namespace strata::nccl

using namespace strata::nccl;

namespace {

/// A handle of a communicator not destroyed.
ncclResult_t live(ncclComm* comm, const char* what) {
  if (comm == nullptr)
    return fail(nullptr, ncclInvalidArgument, std::string(what) + ": comm is NULL");
  if (!valid(comm)) {
    return fail(nullptr, ncclInvalidArgument,
                std::string(what) + ": comm is not a live communicator (destroyed, or not one)");
  }
  return ncclSuccess;
}

/// A communicator handle that can take calls now: live, initialised, not broken.
ncclResult_t usable(ncclComm* comm, const char* what) {
  if (ncclResult_t r = live(comm, what); r != ncclSuccess) return r;
  const int init = comm->initState.load(std::memory_order_acquire);
  if (init == ncclInProgress && groupDepth() == 0) {
    return fail(comm, ncclInvalidUsage,
                std::string(what) +
                    ": the communicator is still initialising (poll ncclCommGetAsyncError until "
                    "it returns ncclSuccess)");
  }
  if (init != ncclSuccess && init != ncclInProgress) {
    return fail(comm, static_cast<ncclResult_t>(init),
                std::string(what) + ": the communicator's initialisation failed");
  }
  const int broken = comm->broken.load(std::memory_order_acquire);
  if (broken != ncclSuccess) {
    std::string last;
    {
      std::lock_guard lk(comm->mu);
      last = comm->lastError;
    }
    setLastError(comm,
                 std::string(what) + ": the communicator is broken by an earlier error: " + last);
    return static_cast<ncclResult_t>(broken);
  }
  return ncclSuccess;
}

/// A datatype strata lacks (fp8) that the fallback NCCL takes: the call goes there.
bool fallbackType(ncclComm* comm, ncclDataType_t t) {
  bool ok = false;
  typeOf(t, &ok);
  return !ok && static_cast<int>(t) >= 0 && static_cast<int>(t) < ncclNumTypes && valid(comm) &&
         comm->fallbackComm != nullptr;
}

ncclResult_t checkType(ncclComm* comm, ncclDataType_t t, DataType* out, const char* what) {
  bool ok = false;
  *out = typeOf(t, &ok);
  if (!ok) {
    return fail(comm, ncclInvalidArgument,
                fmt::format("{}: datatype {} is not one strata reduces or moves (fp8 types are "
                            "not supported; STRATA_NCCL_FALLBACK can send them to a real NCCL)",
                            what, static_cast<int>(t)));
  }
  return ncclSuccess;
}

/// A reduction: a built-in op, or a pre-multiply-sum op of comm.
struct Reduction {
  ReduceOp op = ReduceOp::Sum;
  bool preMul = false;
  ncclComm::PreMulSum pre;
};

ncclResult_t checkOp(ncclComm* comm, ncclRedOp_t op, DataType type, Reduction* out,
                     const char* what) {
  const int v = static_cast<int>(op);
  switch (v) {
    case ncclSum:
      out->op = ReduceOp::Sum;
      return ncclSuccess;
    case ncclProd:
      out->op = ReduceOp::Prod;
      return ncclSuccess;
    case ncclMax:
      out->op = ReduceOp::Max;
      return ncclSuccess;
    case ncclMin:
      out->op = ReduceOp::Min;
      return ncclSuccess;
    case ncclAvg:
      out->op = ReduceOp::Avg;
      return ncclSuccess;
    default:
      break;
  }
  if (v >= ncclNumOps) {
    std::lock_guard lk(comm->mu);
    const size_t i = static_cast<size_t>(v - ncclNumOps);
    if (i < comm->preMulSums.size() && comm->preMulSums[i].live) {
      if (comm->preMulSums[i].type != type) {
        return fail(nullptr, ncclInvalidArgument,
                    fmt::format("{}: pre-mul-sum op {} was made for another datatype", what, v));
      }
      out->preMul = true;
      out->pre = comm->preMulSums[i];
      out->op = ReduceOp::Sum;
      return ncclSuccess;
    }
  }
  return fail(comm, ncclInvalidArgument,
              fmt::format("{}: reduction op {} is neither built in nor a live op of this "
                          "communicator",
                          what, v));
}

ncclResult_t checkRank(ncclComm* comm, int r, const char* role, const char* what) {
  if (r < 0 || r >= comm->size) {
    return fail(comm, ncclInvalidArgument,
                fmt::format("{}: {} {} is not a rank of this communicator (0 to {})", what, role, r,
                            comm->size - 1));
  }
  return ncclSuccess;
}

ncclResult_t checkBuffer(ncclComm* comm, const void* p, size_t count, const char* name,
                         const char* what) {
  if (p == nullptr && count > 0) {
    return fail(comm, ncclInvalidArgument, fmt::format("{}: {} is NULL", what, name));
  }
  return ncclSuccess;
}

/// The argument checks of one call in order, stopping at the first that fails (which recorded
/// the last error): usable() at construction, then a chain, then one test of failed().
class Checks {
 public:
  Checks(ncclComm* comm, const char* what) : comm_(comm), what_(what), r_(usable(comm, what)) {}
  Checks& type(ncclDataType_t t, DataType* out) {
    if (!failed()) r_ = checkType(comm_, t, out, what_);
    return *this;
  }
  /// `type` by reference: the value type() above stored.
  Checks& op(ncclRedOp_t op, const DataType& type, Reduction* out) {
    if (!failed()) r_ = checkOp(comm_, op, type, out, what_);
    return *this;
  }
  Checks& rank(int r, const char* role) {
    if (!failed()) r_ = checkRank(comm_, r, role, what_);
    return *this;
  }
  /// `needed` false: a buffer this rank does not use (the root's only, for instance).
  Checks& buffer(const void* p, size_t count, const char* name, bool needed = true) {
    if (!failed() && needed) r_ = checkBuffer(comm_, p, count, name, what_);
    return *this;
  }
  bool failed() const { return r_ != ncclSuccess; }
  ncclResult_t result() const { return r_; }

 private:
  ncclComm* comm_;
  const char* what_;
  ncclResult_t r_;
};

// ---- pre-multiply-sum on host buffers --------------------------------------------------------

/// The scalar of a pre-mul-sum op: given at creation, or read from where it points when the call
/// runs (ncclScalarDevice). A scalar in device memory is not read here: NotSupported
/// (ncclInvalidUsage; the op is strata's, so the fallback NCCL cannot take the call).
double scalarOf(const ncclComm::PreMulSum& p) {
  if (p.device == nullptr) return p.scalar;
  if (strata::isDeviceMemory(p.device)) {
    throw Error(ErrorCode::NotSupported,
                "a pre-mul-sum scalar in device memory (ncclScalarDevice) is not supported yet: "
                "strata's pre-multiplication runs on host memory");
  }
  return strata::elementAsDouble(p.device, p.type);
}

/// The send buffer a pre-mul-sum call reduces: send * scalar in comm's scratch (host memory
/// only), or send itself for every other op.
const void* premultiplied(ncclComm* comm, const Reduction& red, const void* send, size_t n,
                          DataType type) {
  if (!red.preMul || n == 0) return send;
  if (strata::isDeviceMemory(send)) {
    throw Error(ErrorCode::NotSupported,
                "a pre-mul-sum reduction on device memory is not supported yet (strata "
                "pre-multiplies on the host)");
  }
  const size_t bytes = n * strata::sizeOf(type);
  if (comm->scratch.size() < bytes) comm->scratch.resize(bytes);
  strata::scaleElements(comm->scratch.data(), send, n, type, scalarOf(red.pre));
  return comm->scratch.data();
}

/// Runs a call now, or queues it in the current group.
template <typename F>
ncclResult_t submit(ncclComm* comm, F&& f) {
  if (groupDepth() > 0) {
    GroupOp op;
    op.comm = comm;
    op.run = std::forward<F>(f);
    groupAdd(std::move(op));
    return ncclSuccess;
  }
  return guarded(comm, f);
}

strata::Stream streamOf(cudaStream_t s) {
  return strata::Stream{static_cast<void*>(s)};
}

/// One side of a send/recv, for a batch.
GroupOp p2pOp(ncclComm* comm, GroupOp::Kind kind, const void* send, void* recv, size_t count,
              DataType type, int peer, cudaStream_t stream) {
  GroupOp g;
  g.comm = comm;
  g.kind = kind;
  g.sendBuf = send;
  g.recvBuf = recv;
  g.count = count;
  g.type = type;
  g.peer = peer;
  g.stream = stream;
  return g;
}

/// Queues the ops in the current group, or runs them now as one batch.
ncclResult_t batchOrQueue(ncclComm* comm, std::vector<GroupOp> ops) {
  if (groupDepth() > 0) {
    for (auto& g : ops) groupAdd(std::move(g));
    return ncclSuccess;
  }
  return guarded(comm, [&] { runP2pBatch(comm, ops); });
}

const char* kErrorStrings[] = {
    "no error",
    "unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
    "unhandled system error (run with NCCL_DEBUG=INFO for details)",
    "internal error - please report this issue to the NCCL developers",
    "invalid argument (run with NCCL_DEBUG=WARN for details)",
    "invalid usage (run with NCCL_DEBUG=WARN for details)",
    "remote process exited or there was a network error",
    "NCCL operation in progress",
};

void destroy(ncclComm* c);

ncclResult_t initChecked(ncclComm_t* out, int nranks, const ncclUniqueId* ids, int nIds, int rank,
                         const ncclConfig_t* config) {
  if (out == nullptr) return fail(nullptr, ncclInvalidArgument, "ncclCommInitRank: comm is NULL");
  *out = nullptr;
  if (nranks < 1 || rank < 0 || rank >= nranks) {
    return fail(nullptr, ncclInvalidArgument,
                fmt::format("ncclCommInitRank: rank {} of {} is not a valid place", rank, nranks));
  }
  bool blocking = true;
  std::string name;
  if (config != nullptr) {
    if (config->magic != 0xcafebeef ||
        config->size < offsetof(ncclConfig_t, commName) + sizeof(config->commName)) {
      return fail(nullptr, ncclInvalidArgument,
                  "ncclConfig_t was not set from NCCL_CONFIG_INITIALIZER (bad magic or size)");
    }
    if (config->blocking != NCCL_CONFIG_UNDEF_INT) blocking = config->blocking != 0;
    if (config->commName != nullptr) name = config->commName;
  }
  std::vector<IdRecord> rec;
  try {
    for (int i = 0; i < nIds; ++i) rec.push_back(decodeId(ids[i]));
  } catch (const Error& e) {
    return fail(nullptr, ncclInvalidArgument,
                nIds == 1 ? fmt::format("ncclCommInitRank: {}", e.what())
                          : fmt::format("ncclCommInitRankScalable: id {} of {}: {}", rec.size(),
                                        nIds, e.what()));
  }
  auto* c = new ncclComm();
  c->name = name;
  c->rank = rank;
  c->size = nranks;
  c->device = currentDevice();
  *out = c;
  auto run = [c, nranks, rec, rank] {
    const ncclResult_t r = guarded(c, [&] { initFromId(c, nranks, rec, rank); });
    c->initState.store(r, std::memory_order_release);
  };
  if (groupDepth() > 0) {
    groupAddInit(run);
    return ncclSuccess;
  }
  if (!blocking) {
    c->initThread = std::thread(run);
    return ncclInProgress;
  }
  run();
  const auto r = static_cast<ncclResult_t>(c->initState.load());
  if (r != ncclSuccess) {  // a failed blocking init leaves no communicator behind
    destroy(c);
    *out = nullptr;
  }
  return r;
}

void destroy(ncclComm* c) {
  if (c->initThread.joinable()) c->initThread.join();
  c->magic = 0;
  if (c->fallbackComm != nullptr) {
    try {
      fallback()->commDestroy(c->fallbackComm);
    } catch (...) {
    }
  }
  try {
    c->comm.reset();
  } catch (...) {
  }
  delete c;
}

}  // namespace

// ---- versions, ids, errors -------------------------------------------------------------------

NCCL_EXPORT ncclResult_t ncclGetVersion(int* version) {
  if (version == nullptr) return fail(nullptr, ncclInvalidArgument, "ncclGetVersion: NULL");
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}
NCCL_TWIN(ncclResult_t, ncclGetVersion, (int* version))

NCCL_EXPORT ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId) {
  if (uniqueId == nullptr) return fail(nullptr, ncclInvalidArgument, "ncclGetUniqueId: NULL");
  IdRecord rec{};
  std::memcpy(rec.magic, kIdMagic, sizeof kIdMagic);
  rec.version = 1;
  return guarded(nullptr, [&] {
    std::random_device rd;
    rec.job = (static_cast<uint64_t>(rd()) << 32) | rd();
    std::string root;
    if (const char* env = std::getenv("NCCL_COMM_ID"); env && *env) {
      root = env;
      const size_t colon = root.rfind(':');
      if (colon == std::string::npos || colon == 0 || colon + 1 == root.size() ||
          root.size() >= sizeof rec.root) {
        throw Error(ErrorCode::InvalidArgument,
                    fmt::format("NCCL_COMM_ID={} is not host:port", root));
      }
      rec.flags = kFromCommId;  // no secret: every rank computes the same id
    } else {
      auto listener = std::make_unique<strata::RendezvousListener>(ncclConfig());
      root = listener->address();
      if (root.size() >= sizeof rec.root) {
        throw Error(ErrorCode::Internal, "rendezvous address too long for an ncclUniqueId");
      }
      const std::string secret = randomHex(32);
      std::memcpy(rec.secret, secret.c_str(), secret.size() + 1);
      std::lock_guard lk(listenersMu);
      listeners[root] = std::move(listener);
    }
    std::memcpy(rec.root, root.c_str(), root.size() + 1);
    std::memset(uniqueId->internal, 0, sizeof uniqueId->internal);
    std::memcpy(uniqueId->internal, &rec, sizeof rec);
  });
}
NCCL_TWIN(ncclResult_t, ncclGetUniqueId, (ncclUniqueId * uniqueId))

NCCL_EXPORT const char* ncclGetErrorString(ncclResult_t result) {
  const int r = static_cast<int>(result);
  if (r < 0 || r >= ncclNumResults) return "unknown result code";
  return kErrorStrings[r];
}
NCCL_TWIN(const char*, ncclGetErrorString, (ncclResult_t result))

NCCL_EXPORT const char* ncclGetLastError(ncclComm_t comm) {
  static thread_local std::string copy;
  if (valid(comm)) {
    std::lock_guard lk(comm->mu);
    copy = comm->lastError;
  } else {
    copy = threadLastError;
  }
  return copy.c_str();
}
NCCL_TWIN(const char*, ncclGetLastError, (ncclComm_t comm))

// ---- communicators ---------------------------------------------------------------------------

NCCL_EXPORT ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId,
                                          int rank) {
  return initChecked(comm, nranks, &commId, 1, rank, nullptr);
}
NCCL_TWIN(ncclResult_t, ncclCommInitRank,
          (ncclComm_t * comm, int nranks, ncclUniqueId commId, int rank))

NCCL_EXPORT ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId,
                                                int rank, ncclConfig_t* config) {
  return initChecked(comm, nranks, &commId, 1, rank, config);
}
NCCL_TWIN(ncclResult_t, ncclCommInitRankConfig,
          (ncclComm_t * comm, int nranks, ncclUniqueId commId, int rank, ncclConfig_t* config))

NCCL_EXPORT ncclResult_t ncclCommInitRankScalable(ncclComm_t* newcomm, int nranks, int myrank,
                                                  int nId, ncclUniqueId* commIds,
                                                  ncclConfig_t* config) {
  if (nId < 1 || commIds == nullptr) {
    return fail(nullptr, ncclInvalidArgument,
                "ncclCommInitRankScalable: needs at least one id (nId >= 1, commIds not NULL)");
  }
  // Each id is the rendezvous root of one block of ranks (initFromId).
  return initChecked(newcomm, nranks, commIds, nId, myrank, config);
}
NCCL_TWIN(ncclResult_t, ncclCommInitRankScalable,
          (ncclComm_t * newcomm, int nranks, int myrank, int nId, ncclUniqueId* commIds,
           ncclConfig_t* config))

NCCL_EXPORT ncclResult_t ncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist) {
  if (comms == nullptr || ndev < 1) {
    return fail(nullptr, ncclInvalidArgument, "ncclCommInitAll: comms NULL or ndev < 1");
  }
  ncclUniqueId id;
  if (const char* env = std::getenv("NCCL_COMM_ID"); env && *env) {
    // The id would not carry a listener of this process; InitAll makes its own.
    unsetenv("NCCL_COMM_ID");
    const ncclResult_t r = ncclGetUniqueId(&id);
    setenv("NCCL_COMM_ID", env, 1);
    if (r != ncclSuccess) return r;
  } else if (ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess) {
    return r;
  }
  std::vector<ncclResult_t> results(static_cast<size_t>(ndev), ncclSuccess);
  std::vector<std::thread> threads;
  for (int i = 0; i < ndev; ++i) {
    threads.emplace_back([&, i] {
      results[i] = initChecked(&comms[i], ndev, &id, 1, i, nullptr);
      if (results[i] == ncclSuccess && devlist != nullptr) comms[i]->device = devlist[i];
    });
  }
  for (auto& t : threads) t.join();
  for (ncclResult_t r : results) {
    if (r != ncclSuccess) return r;
  }
  return ncclSuccess;
}
NCCL_TWIN(ncclResult_t, ncclCommInitAll, (ncclComm_t * comms, int ndev, const int* devlist))

NCCL_EXPORT ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  if (!valid(comm)) return fail(nullptr, ncclInvalidArgument, "ncclCommFinalize: not a comm");
  if (comm->initThread.joinable()) comm->initThread.join();
  // Host calls complete before they return, and device calls are ordered on their streams:
  // nothing is left to flush here.
  return ncclSuccess;
}
NCCL_TWIN(ncclResult_t, ncclCommFinalize, (ncclComm_t comm))

NCCL_EXPORT ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;
  if (!valid(comm)) return fail(nullptr, ncclInvalidArgument, "ncclCommDestroy: not a comm");
  destroy(comm);
  return ncclSuccess;
}
NCCL_TWIN(ncclResult_t, ncclCommDestroy, (ncclComm_t comm))

NCCL_EXPORT ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;
  if (!valid(comm)) return fail(nullptr, ncclInvalidArgument, "ncclCommAbort: not a comm");
  if (comm->comm && !comm->shrunk && !comm->comm->revoked()) {
    try {
      // The other ranks' bootstrap calls fail with Aborted naming this rank; their collectives
      // fail with PeerLost or Timeout when this rank's endpoints close. Not after a revoke or a
      // shrink: the survivors' shrunk communicators talk over this bootstrap.
      comm->comm->bootstrap().abort("ncclCommAbort");
    } catch (...) {
    }
  }
  destroy(comm);
  return ncclSuccess;
}
NCCL_TWIN(ncclResult_t, ncclCommAbort, (ncclComm_t comm))

/// A communicator that revoke or shrink may act on: live and initialised, broken or not (a
/// broken one is what they are for).
ncclResult_t initialised(ncclComm* comm, const char* what) {
  if (ncclResult_t r = live(comm, what); r != ncclSuccess) return r;
  if (comm->initThread.joinable() && comm->initState.load() != ncclInProgress) {
    comm->initThread.join();
  }
  const int init = comm->initState.load(std::memory_order_acquire);
  if (init != ncclSuccess || !comm->comm) {
    return fail(comm, init == ncclInProgress ? ncclInvalidUsage : static_cast<ncclResult_t>(init),
                std::string(what) + ": the communicator is not initialised");
  }
  return ncclSuccess;
}

NCCL_EXPORT ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags) {
  if (ncclResult_t r = initialised(comm, "ncclCommRevoke"); r != ncclSuccess) return r;
  if (revokeFlags != NCCL_REVOKE_DEFAULT) {
    return fail(
        comm, ncclInvalidArgument,
        fmt::format("ncclCommRevoke: revokeFlags {} (only NCCL_REVOKE_DEFAULT, 0)", revokeFlags));
  }
  // Unlike NCCL's, strata's revoke reaches every rank: their calls fail with ncclRemoteError
  // naming this rank (docs/fault-tolerance.md).
  comm->comm->revoke(fmt::format("ncclCommRevoke on rank {}", comm->rank));
  return ncclSuccess;
}
NCCL_TWIN(ncclResult_t, ncclCommRevoke, (ncclComm_t comm, int revokeFlags))

NCCL_EXPORT ncclResult_t ncclCommShrink(ncclComm_t comm, int* excludeRanksList,
                                        int excludeRanksCount, ncclComm_t* newcomm,
                                        ncclConfig_t* config, int shrinkFlags) {
  if (newcomm != nullptr) *newcomm = nullptr;
  if (ncclResult_t r = initialised(comm, "ncclCommShrink"); r != ncclSuccess) return r;
  if (newcomm == nullptr) return fail(comm, ncclInvalidArgument, "ncclCommShrink: newcomm NULL");
  if (excludeRanksCount < 0 || (excludeRanksCount > 0 && excludeRanksList == nullptr)) {
    return fail(comm, ncclInvalidArgument,
                fmt::format("ncclCommShrink: {} excluded ranks in a {} list", excludeRanksCount,
                            excludeRanksList ? "given" : "NULL"));
  }
  if (shrinkFlags != NCCL_SHRINK_DEFAULT && shrinkFlags != NCCL_SHRINK_ABORT) {
    return fail(comm, ncclInvalidArgument,
                fmt::format("ncclCommShrink: shrinkFlags {} (NCCL_SHRINK_DEFAULT or "
                            "NCCL_SHRINK_ABORT)",
                            shrinkFlags));
  }
  std::string name = comm->name;
  if (config != nullptr) {
    if (config->magic != 0xcafebeef) {
      return fail(comm, ncclInvalidArgument, "ncclCommShrink: ncclConfig_t not initialised");
    }
    if (config->commName != nullptr) name = config->commName;
  }
  std::vector<int> exclude(excludeRanksList, excludeRanksList + excludeRanksCount);
  if (shrinkFlags == NCCL_SHRINK_ABORT) {
    // Ends what still runs on the parent (on every rank) before the survivors agree; with
    // NCCL_SHRINK_DEFAULT strata's shrink revokes the parent as well, after checking the list.
    comm->comm->revoke(fmt::format("ncclCommShrink(NCCL_SHRINK_ABORT) on rank {}", comm->rank));
  }
  std::unique_ptr<Communicator> shrunk;
  ncclResult_t r = guarded(comm, [&] { shrunk = comm->comm->shrink(exclude); });
  if (r != ncclSuccess) return r;
  comm->shrunk = true;
  auto* c = new ncclComm();
  c->name = name;
  c->rank = shrunk->rank();
  c->size = shrunk->size();
  c->device = comm->device;
  c->comm = std::move(shrunk);
  const ncclResult_t res = guarded(c, [&] { initFallback(c); });
  c->initState.store(res, std::memory_order_release);
  if (res != ncclSuccess) {
    destroy(c);
    return res;
  }
  *newcomm = c;
  return ncclSuccess;
}
NCCL_TWIN(ncclResult_t, ncclCommShrink,
          (ncclComm_t comm, int* excludeRanksList, int excludeRanksCount, ncclComm_t* newcomm,
           ncclConfig_t* config, int shrinkFlags))

NCCL_EXPORT ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  if (!valid(comm) || asyncError == nullptr) {
    return fail(nullptr, ncclInvalidArgument, "ncclCommGetAsyncError: bad comm or NULL result");
  }
  const int init = comm->initState.load(std::memory_order_acquire);
  if (init == ncclInProgress) {
    *asyncError = ncclInProgress;
    return ncclSuccess;
  }
  if (comm->initThread.joinable()) comm->initThread.join();
  if (init != ncclSuccess) {
    *asyncError = static_cast<ncclResult_t>(init);
    return ncclSuccess;
  }
  if (int b = comm->broken.load(); b != ncclSuccess) {
    *asyncError = static_cast<ncclResult_t>(b);
    return ncclSuccess;
  }
  *asyncError = ncclSuccess;
  if (comm->comm) {
    auto revoked = comm->comm->revoked();
    if (revoked && revoked->code() == strata::ErrorCode::Aborted && revoked->peer() == comm->rank) {
      // This rank's ncclCommRevoke: as with NCCL, quiescent (host calls complete before they
      // return; kernels stop at their next abort-word poll): ncclSuccess, and destroy or shrink
      // may follow.
      return ncclSuccess;
    }
    if (auto e = comm->comm->asyncError()) {
      setLastError(comm, e->what());
      *asyncError = resultOf(*e);
      int expected = ncclSuccess;
      comm->broken.compare_exchange_strong(expected, *asyncError);
    }
  }
  return ncclSuccess;
}
NCCL_TWIN(ncclResult_t, ncclCommGetAsyncError, (ncclComm_t comm, ncclResult_t* asyncError))

NCCL_EXPORT ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  if (!valid(comm) || count == nullptr) {
    return fail(nullptr, ncclInvalidArgument, "ncclCommCount: bad comm or NULL count");
  }
  *count = comm->size;
  return ncclSuccess;
}
NCCL_TWIN(ncclResult_t, ncclCommCount, (const ncclComm_t comm, int* count))

NCCL_EXPORT ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  if (!valid(comm) || device == nullptr) {
    return fail(nullptr, ncclInvalidArgument, "ncclCommCuDevice: bad comm or NULL device");
  }
  *device = comm->device;
  return ncclSuccess;
}
NCCL_TWIN(ncclResult_t, ncclCommCuDevice, (const ncclComm_t comm, int* device))

NCCL_EXPORT ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  if (!valid(comm) || rank == nullptr) {
    return fail(nullptr, ncclInvalidArgument, "ncclCommUserRank: bad comm or NULL rank");
  }
  *rank = comm->rank;
  return ncclSuccess;
}
NCCL_TWIN(ncclResult_t, ncclCommUserRank, (const ncclComm_t comm, int* rank))

// ---- split -------------------------------------------------------------------------------------

NCCL_EXPORT ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                                       ncclConfig_t* config) {
  if (ncclResult_t r = usable(comm, "ncclCommSplit"); r != ncclSuccess) return r;
  if (newcomm == nullptr) return fail(comm, ncclInvalidArgument, "ncclCommSplit: newcomm NULL");
  if (color < 0 && color != NCCL_SPLIT_NOCOLOR) {
    return fail(
        comm, ncclInvalidArgument,
        fmt::format("ncclCommSplit: color {} (a color is >= 0, or NCCL_SPLIT_NOCOLOR)", color));
  }
  *newcomm = nullptr;
  std::string name;
  bool blocking = true;
  if (config != nullptr) {
    if (config->magic != 0xcafebeef) {
      return fail(comm, ncclInvalidArgument, "ncclCommSplit: ncclConfig_t not initialised");
    }
    if (config->blocking != NCCL_CONFIG_UNDEF_INT) blocking = config->blocking != 0;
    if (config->commName != nullptr) name = config->commName;
  }
  // Every rank of the parent: its color and key, then each group's first rank (by key, then
  // parent rank) opens a rendezvous listener and tells its address and a secret.
  struct Entry {
    int32_t color, key;
  };
  struct Root {
    char address[64];
    char secret[40];
  };
  const int n = comm->size, me = comm->rank;
  std::vector<Entry> entries(static_cast<size_t>(n));
  std::vector<Root> roots(static_cast<size_t>(n));
  std::vector<int> members;
  int newRank = -1;
  std::unique_ptr<strata::RendezvousListener> listener;
  ncclResult_t r = guarded(comm, [&] {
    strata::Bootstrap& boot = comm->comm->bootstrap();
    entries[me] = {color, key};
    boot.allGather(entries.data(), sizeof(Entry));
    for (int p = 0; p < n; ++p) {
      if (color != NCCL_SPLIT_NOCOLOR && entries[p].color == color) members.push_back(p);
    }
    std::stable_sort(members.begin(), members.end(), [&](int a, int b) {
      return entries[a].key != entries[b].key ? entries[a].key < entries[b].key : a < b;
    });
    std::memset(&roots[me], 0, sizeof(Root));
    if (!members.empty() && members.front() == me && members.size() > 1) {
      listener = std::make_unique<strata::RendezvousListener>(ncclConfig());
      const std::string secret = randomHex(32);
      std::snprintf(roots[me].address, sizeof roots[me].address, "%s", listener->address().c_str());
      std::snprintf(roots[me].secret, sizeof roots[me].secret, "%s", secret.c_str());
    }
    boot.allGather(roots.data(), sizeof(Root));
  });
  if (r != ncclSuccess) return r;
  if (color == NCCL_SPLIT_NOCOLOR) return ncclSuccess;
  newRank = static_cast<int>(std::find(members.begin(), members.end(), me) - members.begin());
  auto* c = new ncclComm();
  c->name = name;
  c->rank = newRank;
  c->size = static_cast<int>(members.size());
  c->device = comm->device;
  *newcomm = c;
  const Root root = roots[members.front()];
  // Local place from the parent's context (which ranks share a host).
  int localRank = 0, localSize = 0;
  try {
    for (int m : members) {
      if (comm->comm->context().hostId(m) == comm->comm->context().hostId(me)) {
        if (m < me) ++localRank;
        ++localSize;
      }
    }
  } catch (...) {
    localRank = 0;
    localSize = 1;
  }
  auto run = [c, root, members, newRank, localRank, localSize,
              listener = std::shared_ptr<strata::RendezvousListener>(std::move(listener))] {
    const ncclResult_t res = guarded(c, [&] {
      Config config = ncclConfig();
      strata::ExplicitLaunch launch;
      launch.rank = newRank;
      launch.size = static_cast<int>(members.size());
      launch.localRank = std::min(localRank, std::max(localSize, 1) - 1);
      launch.localSize = std::max(localSize, 1);
      launch.root = root.address;
      launch.secret = root.secret;
      std::shared_ptr<strata::Bootstrap> boot =
          strata::createTcpBootstrap(launch, config, listener.get());
      c->comm = Communicator::create(std::move(boot), config);
      initFallback(c);  // the fallback NCCL's communicator of this group, as at init
    });
    c->initState.store(res, std::memory_order_release);
  };
  if (groupDepth() > 0) {
    groupAddInit(run);
    return ncclSuccess;
  }
  if (!blocking) {
    c->initThread = std::thread(run);
    return ncclInProgress;
  }
  run();
  return static_cast<ncclResult_t>(c->initState.load());
}
NCCL_TWIN(ncclResult_t, ncclCommSplit,
          (ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config))

// ---- memory ------------------------------------------------------------------------------------

NCCL_EXPORT ncclResult_t ncclMemAlloc(void** ptr, size_t size) {
  if (ptr == nullptr || size == 0) {
    return fail(nullptr, ncclInvalidArgument, "ncclMemAlloc: NULL ptr or size 0");
  }
  using Malloc = int (*)(void**, size_t);
  if (auto m = reinterpret_cast<Malloc>(dlsym(RTLD_DEFAULT, "cudaMalloc"))) {
    if (m(ptr, size) != 0) {
      return fail(nullptr, ncclUnhandledCudaError,
                  fmt::format("ncclMemAlloc: cudaMalloc of {} bytes failed", size));
    }
    return ncclSuccess;
  }
  return guarded(nullptr, [&] { *ptr = strata::backend::allocSharedHost(size); });
}
NCCL_TWIN(ncclResult_t, ncclMemAlloc, (void** ptr, size_t size))

NCCL_EXPORT ncclResult_t ncclMemFree(void* ptr) {
  if (ptr == nullptr) return ncclSuccess;
  if (strata::backend::findSharedHost(ptr, 1)) {
    return guarded(nullptr, [&] { strata::backend::freeSharedHost(ptr); });
  }
  using Free = int (*)(void*);
  if (auto f = reinterpret_cast<Free>(dlsym(RTLD_DEFAULT, "cudaFree"))) {
    return f(ptr) == 0 ? ncclSuccess
                       : fail(nullptr, ncclUnhandledCudaError, "ncclMemFree: cudaFree failed");
  }
  return fail(nullptr, ncclInvalidArgument,
              "ncclMemFree: the pointer is not from ncclMemAlloc (or was freed already)");
}
NCCL_TWIN(ncclResult_t, ncclMemFree, (void* ptr))

NCCL_EXPORT ncclResult_t ncclCommRegister(const ncclComm_t comm, void* buff, size_t size,
                                          void** handle) {
  if (!valid(comm) || handle == nullptr || (buff == nullptr && size > 0)) {
    return fail(valid(comm) ? comm : nullptr, ncclInvalidArgument,
                "ncclCommRegister: bad comm, NULL handle, or NULL buffer");
  }
  // strata registers what its transports need when a call runs (allocHost buffers take the
  // zero-copy path on their own); the handle only records the registration.
  auto rec = std::make_unique<char[]>(sizeof(void*) + sizeof(size_t));
  std::memcpy(rec.get(), &buff, sizeof(void*));
  std::memcpy(rec.get() + sizeof(void*), &size, sizeof(size_t));
  std::lock_guard lk(comm->mu);
  *handle = rec.get();
  comm->registrations.push_back(std::move(rec));
  return ncclSuccess;
}
NCCL_TWIN(ncclResult_t, ncclCommRegister,
          (const ncclComm_t comm, void* buff, size_t size, void** handle))

NCCL_EXPORT ncclResult_t ncclCommDeregister(const ncclComm_t comm, void* handle) {
  if (!valid(comm)) return fail(nullptr, ncclInvalidArgument, "ncclCommDeregister: bad comm");
  std::lock_guard lk(comm->mu);
  auto& regs = comm->registrations;
  auto it = std::find_if(regs.begin(), regs.end(), [&](auto& p) { return p.get() == handle; });
  if (it == regs.end()) {
    comm->lastError = "ncclCommDeregister: not a handle of this communicator's ncclCommRegister";
    threadLastError = comm->lastError;
    return ncclInvalidArgument;
  }
  regs.erase(it);
  return ncclSuccess;
}
NCCL_TWIN(ncclResult_t, ncclCommDeregister, (const ncclComm_t comm, void* handle))

NCCL_EXPORT ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size,
                                                ncclWindow_t* win, int winFlags) {
  (void)buff, (void)size, (void)winFlags;
  if (!valid(comm) || win == nullptr) {
    return fail(nullptr, ncclInvalidArgument, "ncclCommWindowRegister: bad comm or NULL win");
  }
  *win = nullptr;  // no symmetric kernels: a NULL window, as NCCL 2.29 when unsupported
  return ncclSuccess;
}
NCCL_TWIN(ncclResult_t, ncclCommWindowRegister,
          (ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win, int winFlags))

NCCL_EXPORT ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win) {
  if (!valid(comm)) return fail(nullptr, ncclInvalidArgument, "ncclCommWindowDeregister: comm");
  if (win != nullptr) {
    return fail(comm, ncclInvalidArgument,
                "ncclCommWindowDeregister: not a window of ncclCommWindowRegister (which returns "
                "NULL here)");
  }
  return ncclSuccess;
}
NCCL_TWIN(ncclResult_t, ncclCommWindowDeregister, (ncclComm_t comm, ncclWindow_t win))

// ---- reduction operators ---------------------------------------------------------------------

NCCL_EXPORT ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar,
                                                  ncclDataType_t datatype,
                                                  ncclScalarResidence_t residence,
                                                  ncclComm_t comm) {
  if (!valid(comm) || op == nullptr || scalar == nullptr) {
    return fail(valid(comm) ? comm : nullptr, ncclInvalidArgument,
                "ncclRedOpCreatePreMulSum: bad comm, NULL op or NULL scalar");
  }
  DataType type;
  if (ncclResult_t r = checkType(comm, datatype, &type, "ncclRedOpCreatePreMulSum");
      r != ncclSuccess) {
    return r;
  }
  if (residence != ncclScalarHostImmediate && residence != ncclScalarDevice) {
    return fail(comm, ncclInvalidArgument, "ncclRedOpCreatePreMulSum: unknown residence");
  }
  ncclComm::PreMulSum p;
  p.live = true;
  p.type = type;
  if (residence == ncclScalarHostImmediate) {
    p.scalar = strata::elementAsDouble(scalar, type);  // read now, as NCCL does
  } else {
    p.device = scalar;
  }
  std::lock_guard lk(comm->mu);
  auto& ops = comm->preMulSums;
  size_t i = 0;
  while (i < ops.size() && ops[i].live) ++i;
  if (i == ops.size()) ops.emplace_back();
  ops[i] = p;
  *op = static_cast<ncclRedOp_t>(ncclNumOps + static_cast<int>(i));
  return ncclSuccess;
}
NCCL_TWIN(ncclResult_t, ncclRedOpCreatePreMulSum,
          (ncclRedOp_t * op, void* scalar, ncclDataType_t datatype, ncclScalarResidence_t residence,
           ncclComm_t comm))

NCCL_EXPORT ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm) {
  if (!valid(comm)) return fail(nullptr, ncclInvalidArgument, "ncclRedOpDestroy: bad comm");
  const int v = static_cast<int>(op);
  std::lock_guard lk(comm->mu);
  const size_t i = static_cast<size_t>(v - ncclNumOps);
  if (v < ncclNumOps || i >= comm->preMulSums.size() || !comm->preMulSums[i].live) {
    comm->lastError =
        fmt::format("ncclRedOpDestroy: op {} is built in or not a live op of this comm", v);
    threadLastError = comm->lastError;
    return ncclInvalidArgument;
  }
  comm->preMulSums[i].live = false;
  return ncclSuccess;
}
NCCL_TWIN(ncclResult_t, ncclRedOpDestroy, (ncclRedOp_t op, ncclComm_t comm))

// ---- collectives -------------------------------------------------------------------------------

NCCL_EXPORT ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                                       ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                       cudaStream_t stream) {
  const char* what = "ncclAllReduce";
  DataType type;
  Reduction red;
  Checks check(comm, what);
  if (check.failed()) return check.result();
  auto viaFallback = [=](const auto& fb, ncclComm_t fc) {
    return fb.allReduce(sendbuff, recvbuff, count, datatype, op, fc, stream);
  };
  if (fallbackType(comm, datatype)) {
    return submit(comm, [=] { runFallback(comm, what, "a datatype strata lacks", viaFallback); });
  }
  check.type(datatype, &type)
      .op(op, type, &red)
      .buffer(sendbuff, count, "sendbuff")
      .buffer(recvbuff, count, "recvbuff");
  if (check.failed()) return check.result();
  return submit(comm, [=] {
    // The core orders host buffers on the stream; a pre-multiplication reads sendbuff first.
    const cudaStream_t st = red.preMul ? hostOrdered(sendbuff, stream) : stream;
    const void* s = premultiplied(comm, red, sendbuff, count, type);
    if (red.preMul) return comm->comm->allReduce(s, recvbuff, count, type, red.op, streamOf(st));
    orFallback(
        comm, what, [&] { comm->comm->allReduce(s, recvbuff, count, type, red.op, streamOf(st)); },
        viaFallback);
  });
}
NCCL_TWIN(ncclResult_t, ncclAllReduce,
          (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream))

NCCL_EXPORT ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count,
                                    ncclDataType_t datatype, ncclRedOp_t op, int root,
                                    ncclComm_t comm, cudaStream_t stream) {
  const char* what = "ncclReduce";
  DataType type;
  Reduction red;
  Checks check(comm, what);
  check.type(datatype, &type)
      .op(op, type, &red)
      .rank(root, "root")
      .buffer(sendbuff, count, "sendbuff")
      .buffer(recvbuff, count, "recvbuff", comm->rank == root);
  if (check.failed()) return check.result();
  return submit(comm, [=] {
    // An allReduce whose result only the root keeps (the others into a scratch buffer).
    const cudaStream_t st = red.preMul ? hostOrdered(sendbuff, stream) : stream;
    const void* s = premultiplied(comm, red, sendbuff, count, type);
    void* dst = recvbuff;
    std::vector<char> own;
    if (comm->rank != root) {
      own.resize(count * strata::sizeOf(type));
      dst = own.data();
    }
    comm->comm->allReduce(s, dst, count, type, red.op, streamOf(st));
  });
}
NCCL_TWIN(ncclResult_t, ncclReduce,
          (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
           ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream))

NCCL_EXPORT ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                                       ncclDataType_t datatype, int root, ncclComm_t comm,
                                       cudaStream_t stream) {
  const char* what = "ncclBroadcast";
  DataType type;
  Checks check(comm, what);
  if (check.failed()) return check.result();
  auto viaFallback = [=](const auto& fb, ncclComm_t fc) {
    return fb.broadcast(sendbuff, recvbuff, count, datatype, root, fc, stream);
  };
  if (fallbackType(comm, datatype)) {
    return submit(comm, [=] { runFallback(comm, what, "a datatype strata lacks", viaFallback); });
  }
  check.type(datatype, &type)
      .rank(root, "root")
      .buffer(sendbuff, count, "sendbuff", comm->rank == root)
      .buffer(recvbuff, count, "recvbuff");
  if (check.failed()) return check.result();
  return submit(comm, [=] {
    orFallback(
        comm, what,
        [&] { comm->comm->broadcast(sendbuff, recvbuff, count, type, root, streamOf(stream)); },
        viaFallback);
  });
}
NCCL_TWIN(ncclResult_t, ncclBroadcast,
          (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
           ncclComm_t comm, cudaStream_t stream))

NCCL_EXPORT ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root,
                                   ncclComm_t comm, cudaStream_t stream) {
  return ncclBroadcast(buff, buff, count, datatype, root, comm, stream);
}
NCCL_TWIN(ncclResult_t, ncclBcast,
          (void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
           cudaStream_t stream))

NCCL_EXPORT ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                           cudaStream_t stream) {
  const char* what = "ncclReduceScatter";
  DataType type;
  Reduction red;
  Checks check(comm, what);
  if (check.failed()) return check.result();
  auto viaFallback = [=](const auto& fb, ncclComm_t fc) {
    return fb.reduceScatter(sendbuff, recvbuff, recvcount, datatype, op, fc, stream);
  };
  if (fallbackType(comm, datatype)) {
    return submit(comm, [=] { runFallback(comm, what, "a datatype strata lacks", viaFallback); });
  }
  check.type(datatype, &type)
      .op(op, type, &red)
      .buffer(sendbuff, recvcount, "sendbuff")
      .buffer(recvbuff, recvcount, "recvbuff");
  if (check.failed()) return check.result();
  return submit(comm, [=] {
    const size_t n = recvcount * static_cast<size_t>(comm->size);
    const cudaStream_t st = red.preMul ? hostOrdered(sendbuff, stream) : stream;
    const void* s = premultiplied(comm, red, sendbuff, n, type);
    // In place stays in place only when the send buffer is the user's.
    if (red.preMul) {
      return comm->comm->reduceScatter(s, recvbuff, recvcount, type, red.op, streamOf(st));
    }
    orFallback(
        comm, what,
        [&] { comm->comm->reduceScatter(s, recvbuff, recvcount, type, red.op, streamOf(st)); },
        viaFallback);
  });
}
NCCL_TWIN(ncclResult_t, ncclReduceScatter,
          (const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream))

NCCL_EXPORT ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                                       ncclDataType_t datatype, ncclComm_t comm,
                                       cudaStream_t stream) {
  const char* what = "ncclAllGather";
  DataType type;
  Checks check(comm, what);
  if (check.failed()) return check.result();
  auto viaFallback = [=](const auto& fb, ncclComm_t fc) {
    return fb.allGather(sendbuff, recvbuff, sendcount, datatype, fc, stream);
  };
  if (fallbackType(comm, datatype)) {
    return submit(comm, [=] { runFallback(comm, what, "a datatype strata lacks", viaFallback); });
  }
  check.type(datatype, &type)
      .buffer(sendbuff, sendcount, "sendbuff")
      .buffer(recvbuff, sendcount, "recvbuff");
  if (check.failed()) return check.result();
  return submit(comm, [=] {
    orFallback(
        comm, what,
        [&] { comm->comm->allGather(sendbuff, recvbuff, sendcount, type, streamOf(stream)); },
        viaFallback);
  });
}
NCCL_TWIN(ncclResult_t, ncclAllGather,
          (const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
           ncclComm_t comm, cudaStream_t stream))

NCCL_EXPORT ncclResult_t ncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count,
                                      ncclDataType_t datatype, ncclComm_t comm,
                                      cudaStream_t stream) {
  const char* what = "ncclAlltoAll";
  DataType type;
  Checks check(comm, what);
  check.type(datatype, &type)
      .buffer(sendbuff, count, "sendbuff")
      .buffer(recvbuff, count, "recvbuff");
  if (check.failed()) return check.result();
  return submit(comm,
                [=] { comm->comm->allToAll(sendbuff, recvbuff, count, type, streamOf(stream)); });
}
NCCL_TWIN(ncclResult_t, ncclAlltoAll,
          (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
           ncclComm_t comm, cudaStream_t stream))

NCCL_EXPORT ncclResult_t ncclGather(const void* sendbuff, void* recvbuff, size_t count,
                                    ncclDataType_t datatype, int root, ncclComm_t comm,
                                    cudaStream_t stream) {
  const char* what = "ncclGather";
  DataType type;
  Checks check(comm, what);
  check.type(datatype, &type)
      .rank(root, "root")
      .buffer(sendbuff, count, "sendbuff")
      .buffer(recvbuff, count, "recvbuff", comm->rank == root);
  if (check.failed()) return check.result();
  // Sends to the root and the root's receives (its own block too, a local copy): one batch
  // (nccl_group.cpp), so any group of them completes.
  const size_t bytes = count * strata::sizeOf(type);
  std::vector<GroupOp> ops{
      p2pOp(comm, GroupOp::Send, sendbuff, nullptr, count, type, root, stream)};
  if (comm->rank == root) {
    for (int p = 0; p < comm->size; ++p) {
      ops.push_back(p2pOp(comm, GroupOp::Recv, nullptr, static_cast<char*>(recvbuff) + p * bytes,
                          count, type, p, stream));
    }
  }
  return batchOrQueue(comm, std::move(ops));
}
NCCL_TWIN(ncclResult_t, ncclGather,
          (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
           ncclComm_t comm, cudaStream_t stream))

NCCL_EXPORT ncclResult_t ncclScatter(const void* sendbuff, void* recvbuff, size_t count,
                                     ncclDataType_t datatype, int root, ncclComm_t comm,
                                     cudaStream_t stream) {
  const char* what = "ncclScatter";
  DataType type;
  Checks check(comm, what);
  check.type(datatype, &type)
      .rank(root, "root")
      .buffer(recvbuff, count, "recvbuff")
      .buffer(sendbuff, count, "sendbuff", comm->rank == root);
  if (check.failed()) return check.result();
  const size_t bytes = count * strata::sizeOf(type);
  std::vector<GroupOp> ops;
  if (comm->rank == root) {
    for (int p = 0; p < comm->size; ++p) {
      ops.push_back(p2pOp(comm, GroupOp::Send, static_cast<const char*>(sendbuff) + p * bytes,
                          nullptr, count, type, p, stream));
    }
  }
  ops.push_back(p2pOp(comm, GroupOp::Recv, nullptr, recvbuff, count, type, root, stream));
  return batchOrQueue(comm, std::move(ops));
}
NCCL_TWIN(ncclResult_t, ncclScatter,
          (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
           ncclComm_t comm, cudaStream_t stream))

namespace {

ncclResult_t p2p(GroupOp::Kind kind, const void* sendbuff, void* recvbuff, size_t count,
                 ncclDataType_t datatype, int peer, ncclComm_t comm, cudaStream_t stream) {
  const char* what = kind == GroupOp::Send ? "ncclSend" : "ncclRecv";
  DataType type;
  Checks check(comm, what);
  const bool send = kind == GroupOp::Send;
  check.type(datatype, &type)
      .rank(peer, "peer")
      .buffer(send ? sendbuff : recvbuff, count, send ? "sendbuff" : "recvbuff");
  if (check.failed()) return check.result();
  return batchOrQueue(comm, {p2pOp(comm, kind, sendbuff, recvbuff, count, type, peer, stream)});
}

}  // namespace

NCCL_EXPORT ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype,
                                  int peer, ncclComm_t comm, cudaStream_t stream) {
  return p2p(GroupOp::Send, sendbuff, nullptr, count, datatype, peer, comm, stream);
}
NCCL_TWIN(ncclResult_t, ncclSend,
          (const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
           cudaStream_t stream))

NCCL_EXPORT ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                                  ncclComm_t comm, cudaStream_t stream) {
  return p2p(GroupOp::Recv, nullptr, recvbuff, count, datatype, peer, comm, stream);
}
NCCL_TWIN(ncclResult_t, ncclRecv,
          (void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
           cudaStream_t stream))
