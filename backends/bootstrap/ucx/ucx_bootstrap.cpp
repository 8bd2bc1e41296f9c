// strata-bootstrap-ucx.so: the UCX bootstrap backend.
//
// Rendezvous through UCX's client/server connection establishment, data over UCX. Rank 0
// listens on STRATA_ROOT with ucp_listener_create (sockaddr); every other rank connects there
// with a client-server endpoint, proves the job secret with the same HMAC challenge-response
// as lib/base/handshake.cpp (carried in UCX tag messages), and only then sends its worker
// address. Endpoints from clients carry no rank: each is identified by its handshake, never
// by arrival order. Rank 0 then broadcasts the address table over UCX along a binomial tree,
// so the root sends O(N) bytes per child and O(N log N) in all; endpoints to peers are created
// lazily from that table.
//
// Mixed backends: a ucx rank whose UCX connection fails looks for a strata TCP rendezvous on
// the root port (a CHALLENGE record sent unasked); if it finds one it checks in there with its
// ucx record, so a tcp rank 0 names the mismatch and rejects every rank. A ucx rank 0 started
// by strata-run serves the strata handshake on the inherited socket until every rank checked
// in there, and only then opens its UCX listener; a tcp rank is named and rejected the same
// way, whenever it arrives (docs/backends.md).
//
// Messages use UCX tag matching. The 64-bit tag holds a kind (user, collective, abort, setup,
// handshake) in the top 8 bits, the sender's rank (for handshakes: the connection id) in the
// next 24 and the user tag or collective sequence in the low 32, and receives match it with a
// full mask, so a message is only ever taken for the (peer, tag) it was sent on. UCX matches
// messages of one endpoint in send order.

#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <ucp/api/ucp.h>

#include <strata/backend/module.hpp>
#include <strata/bootstrap.hpp>
#include <strata/error.hpp>
#include <strata/version.hpp>

#include "base/collectives_over_p2p.hpp"
#include "base/config_keys.hpp"
#include "base/deadline.hpp"
#include "base/handshake.hpp"
#include "base/hmac.hpp"
#include "base/launcher.hpp"
#include "base/log.hpp"
#include "base/mesh.hpp"
#include "base/rendezvous.hpp"
#include "base/socket.hpp"
#include "base/wire.hpp"

namespace strata::ucx {
namespace {

constexpr const char* kSub = "ucx";

// Rendezvous records (docs/wire-format.md). Kinds differ from the tcp backend's 10/11 so
// that a rank started with another backend is recognised instead of misread.
constexpr uint16_t kHello = 30;
constexpr uint16_t kReply = 31;
constexpr uint16_t kTable = 32;
constexpr uint16_t kAbortRecord = 33;
constexpr uint16_t kVersion = 1;
constexpr size_t kMaxWorkerAddress = 16384;
constexpr size_t kMaxRecord = kMaxWorkerAddress + 1024;
constexpr size_t kMaxAbortReason = 1024;

// Tag layout: kind (8 bits) | sender rank (24 bits) | user tag or collective tag (32 bits).
enum class Kind : uint64_t { User = 0, Collective = 1, Abort = 2, Setup = 3, Handshake = 4 };
constexpr uint64_t kFullMask = ~uint64_t{0};
constexpr uint64_t kKindMask = uint64_t{0xFF} << 56;

uint64_t makeTag(Kind kind, int rank, uint32_t low) {
  return (static_cast<uint64_t>(kind) << 56) |
         ((static_cast<uint64_t>(static_cast<uint32_t>(rank)) & 0xFFFFFF) << 32) | low;
}
int tagRank(uint64_t tag) {
  return static_cast<int>((tag >> 32) & 0xFFFFFF);
}

// A waiting thread blocks on the worker's event fd for at most this long, so that deadlines
// and peers lost without an event are noticed.
constexpr int kMaxSleepMs = 50;
// A peer whose endpoint failed is reported lost only after this long, so that an abort
// message it sent just before closing (possibly on another connection) is seen first.
constexpr auto kLostGrace = std::chrono::milliseconds(150);
// Sends are buffered (see send()); past this many bytes in flight a send waits.
constexpr size_t kMaxInFlightBytes = size_t{1} << 30;

std::once_flag gSecretWarning;

// strata-run hands rank 0 its root socket. The first bootstrap closes it right before the UCX
// listener binds the port; later bootstraps in the process (create/destroy cycles) must never
// touch that descriptor number again and simply bind the port themselves.
std::mutex gRootMu;
bool gRootFdClosed = false;

// The rendezvous handshake over UCX (docs/wire-format.md, "Handshake"): the records of
// base/handshake_codec.hpp, each sent with tag {Handshake, connection id, step}.
constexpr size_t kMaxRejectMessage = 4096;
enum Step : uint32_t {
  kStepChallenge = 1,
  kStepAuth = 2,
  kStepResult = 3,
  kStepHello = 4,
  kStepReply = 5
};
constexpr uint64_t kStepMask = kKindMask | 0xFFFFFFFFull;  // any connection id

std::vector<uint8_t> encodeReject(const std::string& message, bool timedOut) {
  return rendezvous::encodeReject("ucx", message, timedOut);
}

uint16_t recordKind(std::span<const uint8_t> rec, size_t maxLength, std::string_view what) {
  if (rec.size() < wire::kRecordHeaderSize) {
    throw Error(ErrorCode::ProtocolError, fmt::format("{}: truncated record", what));
  }
  return wire::decodeHeader(rec.first(wire::kRecordHeaderSize), 0xffff, maxLength, what).kind;
}

std::string statusText(ucs_status_t status) {
  return ucs_status_string(status);
}

bool isPeerFailure(ucs_status_t status) {
  switch (status) {
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_REJECTED:
    case UCS_ERR_NOT_CONNECTED:
    case UCS_ERR_IO_ERROR:
    case UCS_ERR_TIMED_OUT:
      return true;
    default:
      return false;
  }
}

std::string tagText(Kind kind, int tag) {
  return kind == Kind::User ? fmt::format("tag {}", tag) : std::string("internal tag");
}

struct Hello {
  int rank = -1;
  int size = 0;
  std::string host;
  std::vector<uint8_t> address;
};

std::vector<uint8_t> encodeHello(const Hello& h) {
  wire::Writer w;
  w.i32(h.rank).i32(h.size).str(h.host).bytes(h.address);
  return wire::encodeRecord(kHello, kVersion, w.data());
}

Hello decodeHello(std::span<const uint8_t> body) {
  wire::Reader r(body, "ucx hello record");
  Hello h;
  h.rank = r.i32("rank");
  h.size = r.i32("size");
  h.host = r.str(256, "host");
  h.address = r.bytes(kMaxWorkerAddress, "worker address");
  r.expectEnd();
  if (h.address.empty()) {
    throw Error(ErrorCode::ProtocolError, "ucx hello record: empty worker address");
  }
  return h;
}

// The reply to a check-in that succeeded (failures travel as the shared REJECT record).
std::vector<uint8_t> encodeReply() {
  return wire::encodeRecord(kReply, kVersion, {});
}

// Per-operation completion state, filled by UCX callbacks from inside ucp_worker_progress.
struct OpState {
  bool done = false;
  ucs_status_t status = UCS_OK;
  size_t length = 0;
  uint64_t senderTag = 0;
};

void sendDone(void* /*request*/, ucs_status_t status, void* user) {
  auto* op = static_cast<OpState*>(user);
  op->done = true;
  op->status = status;
}

void recvDone(void* /*request*/, ucs_status_t status, const ucp_tag_recv_info_t* info, void* user) {
  auto* op = static_cast<OpState*>(user);
  op->done = true;
  op->status = status;
  if (info) {
    op->length = info->length;
    op->senderTag = info->sender_tag;
  }
}

void closeDone(void* /*request*/, ucs_status_t status, void* user) {
  auto* op = static_cast<OpState*>(user);
  op->done = true;
  op->status = status;
}

class UcxBootstrap;

struct Peer {
  UcxBootstrap* owner = nullptr;
  int rank = -1;
  ucp_ep_h ep = nullptr;
  // Set from UCX's error callback.
  std::atomic<bool> lost{false};
  std::chrono::steady_clock::time_point lostAt;
  std::string lostWhy;
};

// One rendezvous connection (a sockaddr endpoint), on rank 0 or on a client. It lives until
// the worker is destroyed, because UCX may call onRvError until then.
struct RvConn {
  ucp_ep_h ep = nullptr;
  uint32_t id = 0;  // rank 0's connection id, in the tag's rank field
  std::atomic<bool> failed{false};
  std::string why;
  std::string remote = "(unknown address)";
  enum class State { WaitAuth, WaitHello, CheckedIn, Dropped } state = State::WaitAuth;
  handshake::Challenge challenge;  // rank 0: the one it sent
  int rank = -1;
  Deadline deadline = Deadline::never();
};

struct PendingSend {
  OpState op;
  void* request = nullptr;
  int peer = -1;
  std::unique_ptr<uint8_t[]> data;
  size_t bytes = 0;
};

class UcxBootstrap final : public Bootstrap {
 public:
  explicit UcxBootstrap(const Config& config);
  ~UcxBootstrap() override;

  std::string_view backend() const noexcept override { return "ucx"; }
  int rank() const noexcept override { return launch_.rank; }
  int size() const noexcept override { return launch_.size; }
  int localRank() const noexcept override { return launch_.localRank; }
  int localSize() const noexcept override { return launch_.localSize; }
  void send(int peer, int tag, const void* data, size_t bytes) override;
  void recv(int peer, int tag, void* data, size_t bytes) override;
  void allGather(void* data, size_t bytesPerRank) override;
  void broadcast(void* data, size_t bytes, int root) override;
  void barrier() override;
  void abort(std::string_view reason) noexcept override;

  static void onPeerError(void* arg, ucp_ep_h ep, ucs_status_t status);

 private:
  using Lock = std::unique_lock<std::mutex>;

  // Set-up and tear-down.
  void initUcx();
  void teardown() noexcept;
  std::vector<net::Fd> serveInheritedSocket(int fd);
  void serveRendezvous(const std::vector<net::SockAddr>& rootAddrs, const Deadline& deadline,
                       std::vector<net::Fd>* held);
  void checkIn(const std::vector<net::SockAddr>& rootAddrs, const std::vector<uint8_t>& myAddress);
  bool checkInOverTcp(const std::vector<net::SockAddr>& rootAddrs,
                      const std::vector<uint8_t>& hello, double& probeWait);
  static void onConnRequest(ucp_conn_request_h request, void* arg);
  static void onRvError(void* arg, ucp_ep_h ep, ucs_status_t status);
  void rvSend(Lock& lk, RvConn& c, uint32_t step, std::vector<uint8_t> record);
  bool rvTryRecv(Lock& lk, uint64_t tag, uint64_t mask, std::vector<uint8_t>& out,
                 uint64_t* senderTag = nullptr);
  bool rvWait(Lock& lk, RvConn& c, uint64_t tag, uint64_t mask, const Deadline& deadline,
              std::vector<uint8_t>& out, uint64_t* senderTag = nullptr);
  void rvClose(Lock& lk, bool force);
  void exchangeTable();

  // Engine; every function below runs with mu_ held.
  Deadline callDeadline() const { return Deadline::fromTimeout(timeout_); }
  void checkPeer(int peer, std::string_view op) const;
  void progress(Lock& lk);
  void blockOnce(Lock& lk, const Deadline& deadline, int capMs);
  void progressLoop();
  template <class Done, class OnTimeout>
  void waitUntil(Lock& lk, const Deadline& deadline, int peer, Done done, OnTimeout onTimeout,
                 std::string_view op, Kind kind, int tag);
  ucp_ep_h endpoint(int peer);
  void startSend(Lock& lk, int peer, uint64_t tag, const void* data, size_t bytes,
                 const Deadline& deadline, std::string_view op, Kind kind, int userTag);
  /// Receives exactly `bytes` (or any size when exact is false; the size goes to *got).
  void recvTagged(Lock& lk, int peer, uint64_t tag, void* data, size_t bytes,
                  const Deadline& deadline, std::string_view op, Kind kind, int userTag,
                  std::vector<uint8_t>* any = nullptr);
  void sendInternal(Lock& lk, int peer, Kind kind, uint32_t low, const void* data, size_t bytes,
                    const Deadline& deadline, std::string_view op);
  void recvInternal(Lock& lk, int peer, Kind kind, uint32_t low, void* data, size_t bytes,
                    const Deadline& deadline, std::string_view op);
  void reapSends();
  void checkAbortMessage();
  [[noreturn]] void throwAborted() const;
  bool lostLongEnough(int peer) const;
  [[noreturn]] void throwLost(int peer, std::string_view op, Kind kind, int tag) const;
  uint32_t nextCollective();
  /// One collective call's messages (see allGather).
  p2p::Link collectiveLink(Lock& lk, const Deadline& deadline, std::string_view op,
                           bool tagRounds);
  void waitRequest(Lock& lk, void* request, std::unique_ptr<OpState>& state,
                   const Deadline& deadline, int peer, std::string_view op, Kind kind, int tag);

  LaunchInfo launch_;
  double timeout_ = 30;
  double connectTimeout_ = 60;
  double handshakeTimeout_ = 5;
  uint64_t maxMessage_ = uint64_t{1} << 30;
  std::string root_;

  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  int efd_ = -1;
  mesh::SpinPolicy spin_;
  std::vector<std::vector<uint8_t>> table_;
  std::vector<std::unique_ptr<Peer>> peers_;
  // The rendezvous: rank 0's listener, its connection requests not yet taken, and the
  // sockaddr endpoints of either side.
  ucp_listener_h listener_ = nullptr;
  std::vector<ucp_conn_request_h> connRequests_;
  std::vector<std::unique_ptr<RvConn>> rvConns_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool driving_ = false;
  bool stopping_ = false;
  std::thread progressThread_;
  std::list<std::unique_ptr<PendingSend>> sends_;
  // Receives that timed out and could not be cancelled (see waitRequest).
  std::vector<std::pair<void*, std::unique_ptr<OpState>>> orphans_;
  size_t inFlightBytes_ = 0;
  uint32_t collectiveSeq_ = 0;

  // The pre-posted receive that catches abort messages from any rank.
  void* abortRequest_ = nullptr;
  OpState abortOp_;
  std::vector<uint8_t> abortBuf_;
  bool aborted_ = false;
  int abortOrigin_ = -1;
  std::string abortReason_;
};

void UcxBootstrap::onPeerError(void* arg, ucp_ep_h /*ep*/, ucs_status_t status) {
  auto* p = static_cast<Peer*>(arg);
  if (p->lost.load()) return;
  p->lostWhy = fmt::format("its UCX endpoint failed: {}", statusText(status));
  p->lostAt = std::chrono::steady_clock::now();
  p->lost.store(true);
  STRATA_LOG(Debug, kSub, "rank {} lost: {}", p->rank, p->lostWhy);
}

UcxBootstrap::UcxBootstrap(const Config& config) {
  launch_ = detectLaunch(config);
  log::setRank(launch_.rank);
  timeout_ = config::getDouble(config, "bootstrap.timeout");
  connectTimeout_ = config::getDouble(config, "bootstrap.connect_timeout");
  handshakeTimeout_ = config::getDouble(config, "bootstrap.handshake_timeout");
  maxMessage_ = config::getBytes(config, "bootstrap.max_message");
  spin_ = mesh::spinPolicy(config, launch_.localSize);
  root_ = launch_.root;
  const int n = launch_.size;

  try {
    initUcx();
    peers_.resize(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) {
      peers_[static_cast<size_t>(r)] = std::make_unique<Peer>();
      peers_[static_cast<size_t>(r)]->owner = this;
      peers_[static_cast<size_t>(r)]->rank = r;
    }
    table_.resize(static_cast<size_t>(n));
    progressThread_ = std::thread([this] { progressLoop(); });

    std::vector<uint8_t> myAddress;
    {
      ucp_worker_attr_t attr{};
      attr.field_mask = UCP_WORKER_ATTR_FIELD_ADDRESS;
      ucs_status_t st = ucp_worker_query(worker_, &attr);
      if (st != UCS_OK) {
        throw Error(ErrorCode::BackendError,
                    fmt::format("ucx bootstrap: ucp_worker_query() failed: {}", statusText(st)));
      }
      auto* a = reinterpret_cast<const uint8_t*>(attr.address);
      myAddress.assign(a, a + attr.address_length);
      ucp_worker_release_address(worker_, attr.address);
      if (myAddress.size() > kMaxWorkerAddress) {
        throw Error(ErrorCode::BackendError,
                    fmt::format("ucx bootstrap: the UCX worker address has {} bytes, more than "
                                "the {} this backend exchanges; restrict UCX_TLS or "
                                "UCX_NET_DEVICES",
                                myAddress.size(), kMaxWorkerAddress));
      }
    }
    table_[static_cast<size_t>(launch_.rank)] = myAddress;
    if (n == 1) return;

    if (launch_.secret.empty()) {
      std::call_once(gSecretWarning, [] {
        STRATA_LOG(Warn, kSub,
                   "no job secret (STRATA_SECRET or bootstrap.secret_file): the rendezvous is "
                   "not authenticated; launch with strata-run or set bootstrap.secret_file");
      });
    }
    if (root_.empty()) {
      throw Error(ErrorCode::InvalidConfig,
                  fmt::format("ucx bootstrap: rank {} of {} has no rendezvous address. Launch "
                              "with strata-run, set STRATA_ROOT or bootstrap.tcp.root=host:port, "
                              "or under srun use --resv-ports=<ntasks> or bootstrap.tcp.port",
                              launch_.rank, n));
    }
    std::string rootHost;
    uint16_t rootPort = 0;
    net::splitHostPort(root_, rootHost, rootPort, "rendezvous address (STRATA_ROOT)");
    auto rootAddrs = net::resolve(rootHost, rootPort);

    if (launch_.rank == 0) {
      Deadline deadline = Deadline::fromTimeout(connectTimeout_);
      std::vector<net::Fd> held;
      {
        std::lock_guard rootLock(gRootMu);
        if (launch_.rootFd >= 0 && !gRootFdClosed) {
          // The UCX listener needs the port: serve the strata handshake on strata-run's
          // socket until every rank checked in there (a tcp rank must hear why it is
          // refused), then close it right before binding.
          gRootFdClosed = true;
          try {
            held = serveInheritedSocket(launch_.rootFd);
          } catch (...) {
            ::close(launch_.rootFd);
            throw;
          }
          ::close(launch_.rootFd);
        }
      }
      serveRendezvous(rootAddrs, deadline, &held);
    } else {
      checkIn(rootAddrs, myAddress);
    }
    exchangeTable();
  } catch (...) {
    teardown();
    throw;
  }
}

UcxBootstrap::~UcxBootstrap() {
  teardown();
}

void UcxBootstrap::initUcx() {
  ucp_config_t* cfg = nullptr;
  // NULL prefix and file: UCX reads UCX_* from the environment and ucx.conf itself; strata
  // never overrides what the user set there.
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &cfg);
  if (st != UCS_OK) {
    throw Error(ErrorCode::BackendError,
                fmt::format("ucx bootstrap: reading the UCX configuration failed: {}. Check "
                            "the UCX_* environment variables and ucx.conf",
                            statusText(st)));
  }
  // Rank 0 binds STRATA_ROOT again in every bootstrap of a process (create/destroy cycles),
  // and the rendezvous connections it closed leave TIME_WAIT entries on that port, which make
  // a bind without SO_REUSEADDR fail for a minute. UCX reads its connection manager's settings
  // only from the environment (ucp_config_modify does not reach them in UCX 1.13), so set
  // UCX_TCP_CM_REUSEADDR once, never overriding a value the user chose.
  if (launch_.rank == 0) {
    static std::once_flag reuseOnce;
    std::call_once(reuseOnce, [] { ::setenv("UCX_TCP_CM_REUSEADDR", "y", 0); });
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_ESTIMATED_NUM_EPS |
                      UCP_PARAM_FIELD_ESTIMATED_NUM_PPN | UCP_PARAM_FIELD_NAME;
  params.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
  params.estimated_num_eps = static_cast<size_t>(launch_.size);
  params.estimated_num_ppn = static_cast<size_t>(launch_.localSize);
  params.name = "strata-bootstrap";
  st = ucp_init(&params, cfg, &context_);
  ucp_config_release(cfg);
  if (st != UCS_OK) {
    context_ = nullptr;
    throw Error(ErrorCode::BackendError,
                fmt::format("ucx bootstrap: ucp_init() failed: {}. Check UCX_TLS and "
                            "UCX_NET_DEVICES (tests use UCX_TLS=tcp,self UCX_NET_DEVICES=lo)",
                            statusText(st)));
  }
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  // Every worker call happens under mu_, so UCX need not lock on its own.
  wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  st = ucp_worker_create(context_, &wp, &worker_);
  if (st != UCS_OK) {
    worker_ = nullptr;
    throw Error(ErrorCode::BackendError,
                fmt::format("ucx bootstrap: ucp_worker_create() failed: {}. Check UCX_TLS and "
                            "UCX_NET_DEVICES",
                            statusText(st)));
  }
  if (ucp_worker_get_efd(worker_, &efd_) != UCS_OK) efd_ = -1;  // fall back to short sleeps

  // Abort messages may come from any rank at any time: keep a receive posted for them.
  abortBuf_.resize(wire::kRecordHeaderSize + kMaxAbortReason + 64);
  ucp_request_param_t rp{};
  rp.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  rp.cb.recv = recvDone;
  rp.user_data = &abortOp_;
  void* req = ucp_tag_recv_nbx(worker_, abortBuf_.data(), abortBuf_.size(),
                               makeTag(Kind::Abort, 0, 0), kKindMask, &rp);
  if (UCS_PTR_IS_ERR(req)) {
    throw Error(ErrorCode::BackendError,
                fmt::format("ucx bootstrap: posting the abort receive failed: {}",
                            statusText(UCS_PTR_STATUS(req))));
  }
  abortRequest_ = req;
}

void UcxBootstrap::teardown() noexcept {
  try {
    if (progressThread_.joinable()) {
      {
        Lock lk(mu_);
        stopping_ = true;
        if (worker_) ucp_worker_signal(worker_);
        cv_.notify_all();
      }
      progressThread_.join();
    }
    Lock lk(mu_);
    if (worker_) {
      // Deliver what was sent (the last barrier messages, an abort) before disconnecting.
      Deadline flush = Deadline::after(std::min(timeout_ > 0 ? timeout_ : 10.0, 10.0));
      auto flushStart = std::chrono::steady_clock::now();
      STRATA_LOG(Debug, kSub, "teardown: {} sends in flight", sends_.size());
      while (!sends_.empty() && !flush.expired()) {
        progress(lk);
        if (!sends_.empty()) {
          lk.unlock();
          std::this_thread::sleep_for(std::chrono::microseconds(200));
          lk.lock();
        }
      }
      STRATA_LOG(
          Debug, kSub, "teardown: flushed in {:.3f} ms, {} left",
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - flushStart)
              .count(),
          sends_.size());
      for (auto& s : sends_) {
        if (!s->op.done) {
          if (s->peer >= 0) {
            STRATA_LOG(Warn, kSub,
                       "destroying the bootstrap while a {}-byte send to rank {} is unfinished "
                       "(rank {} never received it)",
                       s->bytes, s->peer, s->peer);
          }
          ucp_request_cancel(worker_, s->request);
        }
      }
      if (abortRequest_) ucp_request_cancel(worker_, abortRequest_);
      Deadline cancel = Deadline::after(2.0);
      while ((!sends_.empty() || (abortRequest_ && !abortOp_.done)) && !cancel.expired()) {
        ucp_worker_progress(worker_);
        reapSends();
      }
      if (abortRequest_ && abortOp_.done) {
        ucp_request_free(abortRequest_);
        abortRequest_ = nullptr;
      }

      rvClose(lk, true);
      // Close every endpoint, flushing it unless its peer is gone.
      std::vector<std::pair<void*, std::unique_ptr<OpState>>> closing;
      for (auto& p : peers_) {
        if (!p || !p->ep) continue;
        auto op = std::make_unique<OpState>();
        ucp_request_param_t cp{};
        cp.op_attr_mask =
            UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
        cp.cb.send = closeDone;
        cp.user_data = op.get();
        cp.flags = p->lost.load() ? UCP_EP_CLOSE_FLAG_FORCE : 0;
        void* req = ucp_ep_close_nbx(p->ep, &cp);
        p->ep = nullptr;
        if (req != nullptr && !UCS_PTR_IS_ERR(req)) closing.emplace_back(req, std::move(op));
      }
      Deadline closeBy = Deadline::after(2.0);
      auto allClosed = [&] {
        return std::all_of(closing.begin(), closing.end(),
                           [](const auto& c) { return c.second->done; });
      };
      while (!allClosed() && !closeBy.expired()) {
        if (ucp_worker_progress(worker_) == 0) {
          lk.unlock();
          std::this_thread::sleep_for(std::chrono::microseconds(100));
          lk.lock();
        }
      }
      for (auto& c : closing) {
        if (!c.second->done) STRATA_LOG(Debug, kSub, "an endpoint did not close within 2 s");
        ucp_request_free(c.first);  // UCX releases unfinished ones when they complete
      }
      for (auto& s : sends_) ucp_request_free(s->request);
      for (auto& o : orphans_) ucp_request_free(o.first);
      if (abortRequest_) ucp_request_free(abortRequest_);
      abortRequest_ = nullptr;
      ucp_worker_destroy(worker_);
      worker_ = nullptr;
      sends_.clear();
      rvConns_.clear();  // no more onRvError calls
    }
    if (context_) {
      ucp_cleanup(context_);
      context_ = nullptr;
    }
  } catch (...) {
  }
}

void UcxBootstrap::onConnRequest(ucp_conn_request_h request, void* arg) {
  // Called from ucp_worker_progress, so with mu_ held.
  static_cast<UcxBootstrap*>(arg)->connRequests_.push_back(request);
}

void UcxBootstrap::onRvError(void* arg, ucp_ep_h /*ep*/, ucs_status_t status) {
  auto* c = static_cast<RvConn*>(arg);
  if (c->failed.load()) return;
  c->why = statusText(status);
  c->failed.store(true);
}

void UcxBootstrap::rvSend(Lock& /*lk*/, RvConn& c, uint32_t step, std::vector<uint8_t> record) {
  auto s = std::make_unique<PendingSend>();
  s->bytes = record.size();
  s->data.reset(new uint8_t[record.size()]);
  std::memcpy(s->data.get(), record.data(), record.size());
  ucp_request_param_t rp{};
  rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  rp.cb.send = sendDone;
  rp.user_data = &s->op;
  void* req = ucp_tag_send_nbx(c.ep, s->data.get(), s->bytes,
                               makeTag(Kind::Handshake, static_cast<int>(c.id), step), &rp);
  if (req == nullptr) return;
  if (UCS_PTR_IS_ERR(req)) {
    if (!c.failed.load()) {
      c.why = statusText(UCS_PTR_STATUS(req));
      c.failed.store(true);
    }
    return;
  }
  s->request = req;  // peer -1: reapSends attributes no failure to a rank
  inFlightBytes_ += s->bytes;
  sends_.push_back(std::move(s));
}

// Takes one waiting message matching tag/mask, if any. Larger than kMaxRecord: received and
// returned empty (the caller treats it as garbage).
bool UcxBootstrap::rvTryRecv(Lock& lk, uint64_t tag, uint64_t mask, std::vector<uint8_t>& out,
                             uint64_t* senderTag) {
  ucp_tag_recv_info_t info{};
  ucp_tag_message_h msg = ucp_tag_probe_nb(worker_, tag, mask, 1, &info);
  if (!msg) return false;
  // A stranger's oversized message is truncated (and then treated as garbage).
  const size_t capacity = std::min(info.length, kMaxRecord);
  std::vector<uint8_t> buf(std::max<size_t>(capacity, 1));
  auto state = std::make_unique<OpState>();
  ucp_request_param_t rp{};
  rp.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  rp.cb.recv = recvDone;
  rp.user_data = state.get();
  void* req = ucp_tag_msg_recv_nbx(worker_, buf.data(), capacity, msg, &rp);
  if (UCS_PTR_IS_ERR(req)) {
    out.clear();
  } else {
    waitRequest(lk, req, state, Deadline::after(std::max(handshakeTimeout_, 1.0)), -1, "rendezvous",
                Kind::Handshake, 0);
    buf.resize(info.length);
    out = info.length <= kMaxRecord && state->status == UCS_OK ? std::move(buf)
                                                               : std::vector<uint8_t>{};
  }
  if (senderTag) *senderTag = info.sender_tag;
  return true;
}

bool UcxBootstrap::rvWait(Lock& lk, RvConn& c, uint64_t tag, uint64_t mask,
                          const Deadline& deadline, std::vector<uint8_t>& out,
                          uint64_t* senderTag) {
  for (;;) {
    progress(lk);
    if (rvTryRecv(lk, tag, mask, out, senderTag)) return true;
    if (c.failed.load() || deadline.expired()) return false;
    blockOnce(lk, deadline, 20);
  }
}

void UcxBootstrap::rvClose(Lock& lk, bool force) {
  if (listener_) {
    for (auto* r : connRequests_) ucp_listener_reject(listener_, r);
    ucp_listener_destroy(listener_);
    listener_ = nullptr;
  }
  connRequests_.clear();
  // Deliver the last replies before disconnecting.
  Deadline flush = Deadline::after(2.0);
  while (!force && !sends_.empty() && !flush.expired()) {
    progress(lk);
    if (!sends_.empty()) blockOnce(lk, flush, 5);
  }
  std::vector<std::pair<void*, std::unique_ptr<OpState>>> closing;
  for (auto& c : rvConns_) {
    if (!c->ep) continue;
    auto op = std::make_unique<OpState>();
    ucp_request_param_t cp{};
    cp.op_attr_mask =
        UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
    cp.cb.send = closeDone;
    cp.user_data = op.get();
    cp.flags = force || c->failed.load() ? UCP_EP_CLOSE_FLAG_FORCE : 0;
    void* req = ucp_ep_close_nbx(c->ep, &cp);
    c->ep = nullptr;
    if (req != nullptr && !UCS_PTR_IS_ERR(req)) closing.emplace_back(req, std::move(op));
  }
  Deadline closeBy = Deadline::after(2.0);
  while (!closeBy.expired() && std::any_of(closing.begin(), closing.end(),
                                           [](const auto& c) { return !c.second->done; })) {
    if (ucp_worker_progress(worker_) == 0) {
      lk.unlock();
      std::this_thread::sleep_for(std::chrono::microseconds(100));
      lk.lock();
    }
  }
  for (auto& c : closing) ucp_request_free(c.first);
}

// Under strata-run, rank 0 inherits the launcher's socket on the root port, and the other
// ranks may reach it before any UCX listener exists. Ranks started with bootstrap.backend=tcp
// wait there for a strata handshake; a UCX listener never sends one, so if rank 0 closed this
// socket early they would wait until bootstrap.connect_timeout and rank 0 would never learn
// why they are missing. So rank 0 runs the shared strata rendezvous server on this socket
// (rendezvous::collect) until every rank has checked in on it:
//  - a ucx rank's UCX connection to this socket fails the handshake and is closed (logged at
//    debug); the rank then checks in over TCP with its ucx hello (checkInOverTcp), and that
//    connection is held;
//  - any other check-in record fails the job at once: that rank and every rank held so far
//    get the REJECT naming both backends;
//  - once every rank is held, the caller closes this socket, opens the UCX listener and only
//    then releases the held connections, whose ranks retry over UCX and find it.
// Returns the held connections.
std::vector<net::Fd> UcxBootstrap::serveInheritedSocket(int fd) {
  net::setNonBlocking(fd);
  rendezvous::Options opt;
  opt.backend = "ucx";
  opt.root = root_;
  opt.secret = launch_.secret;
  opt.size = launch_.size;
  opt.helloKind = kHello;
  opt.connectTimeout = connectTimeout_;
  opt.handshakeTimeout = handshakeTimeout_;
  opt.maxRecord = kMaxRecord;
  opt.quietRejects = true;
  return rendezvous::collect(fd, opt, [](int, const std::vector<uint8_t>&) {});
}

// Rank 0: a UCX listener on the root address. Each connection is authenticated (challenge,
// auth, result), then sends its hello; after every rank checked in, each gets the reply (or
// the same REJECT), and the listener and these endpoints are closed.
void UcxBootstrap::serveRendezvous(const std::vector<net::SockAddr>& rootAddrs,
                                   const Deadline& deadline, std::vector<net::Fd>* held) {
  const int n = launch_.size;
  Lock lk(mu_);
  {
    // The port may still be held for a moment (an earlier bootstrap's listener, the socket
    // just closed): retry the bind briefly.
    Deadline bindBy = Deadline::earlier(deadline, Deadline::after(5.0));
    ucs_status_t st = UCS_ERR_BUSY;
    for (;;) {
      for (const auto& a : rootAddrs) {
        ucp_listener_params_t lp{};
        lp.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
        lp.sockaddr.addr = a.get();
        lp.sockaddr.addrlen = a.len;
        lp.conn_handler.cb = &UcxBootstrap::onConnRequest;
        lp.conn_handler.arg = this;
        st = ucp_listener_create(worker_, &lp, &listener_);
        if (st == UCS_OK) break;
        listener_ = nullptr;
      }
      if (st == UCS_OK || st != UCS_ERR_BUSY || bindBy.expired()) break;
      lk.unlock();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      lk.lock();
    }
    if (st != UCS_OK) {
      std::string why = fmt::format(
          "ucx bootstrap: rank 0 cannot listen for the rendezvous at {}: "
          "ucp_listener_create() failed: {}. Check that the port is free "
          "and that UCX_TLS/UCX_NET_DEVICES offer a sockaddr transport "
          "(tests use UCX_TLS=tcp,self UCX_NET_DEVICES=lo)",
          root_, statusText(st));
      Deadline replyBy = Deadline::after(std::max(1.0, handshakeTimeout_));
      for (auto& f : *held) {
        if (!f.valid()) continue;
        try {
          handshake::writeRecord(f.get(), encodeReject(why, false), replyBy, "rendezvous reject");
        } catch (const Error&) {
        }
      }
      throw Error(ErrorCode::SystemError, why);
    }
  }
  // Ranks that checked in on strata-run's socket retry over UCX when it closes their
  // connection; the listener is up now.
  held->clear();
  std::vector<RvConn*> byRank(static_cast<size_t>(n), nullptr);
  int count = 1, failurePeer = -1;
  std::string failure;
  bool timedOut = false;
  std::vector<uint8_t> rec;
  auto drop = [&](RvConn& c, const std::string& why) {
    STRATA_LOG(Warn, kSub, "rendezvous: rejected a connection from {}: {}", c.remote, why);
    c.state = RvConn::State::Dropped;
  };
  auto fail = [&](RvConn& c, int rank, std::string message) {
    c.state = RvConn::State::CheckedIn;  // it gets the REJECT too
    if (failure.empty()) {
      failure = std::move(message);
      failurePeer = rank;
    }
  };
  while (count < n && failure.empty()) {
    progress(lk);
    for (auto* req : connRequests_) {
      auto c = std::make_unique<RvConn>();
      ucp_conn_request_attr_t qa{};
      qa.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR;
      if (ucp_conn_request_query(req, &qa) == UCS_OK) {
        c->remote = net::SockAddr::fromRaw(reinterpret_cast<const sockaddr*>(&qa.client_address),
                                           sizeof(qa.client_address))
                        .toString();
      }
      do {
        uint8_t b[3];
        crypto::randomBytes(b);
        c->id = (uint32_t{b[0]} << 16 | uint32_t{b[1]} << 8 | b[2]);
      } while (c->id == 0 || std::any_of(rvConns_.begin(), rvConns_.end(),
                                         [&](const auto& o) { return o->id == c->id; }));
      ucp_ep_params_t ep{};
      ep.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER;
      ep.conn_request = req;
      ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
      ep.err_handler.cb = &UcxBootstrap::onRvError;
      ep.err_handler.arg = c.get();
      ucs_status_t st = ucp_ep_create(worker_, &ep, &c->ep);
      if (st != UCS_OK) {
        c->ep = nullptr;
        STRATA_LOG(Warn, kSub, "rendezvous: accepting a connection from {} failed: {}", c->remote,
                   statusText(st));
        continue;
      }
      c->challenge = handshake::makeChallenge(handshake::Purpose::Rendezvous, 0);
      c->deadline = Deadline::fromTimeout(handshakeTimeout_);
      rvSend(lk, *c, kStepChallenge, handshake::encode(c->challenge));
      rvConns_.push_back(std::move(c));
    }
    connRequests_.clear();

    for (auto& cp : rvConns_) {
      RvConn& c = *cp;
      if (!failure.empty()) break;
      if (c.state == RvConn::State::WaitAuth) {
        if (rvTryRecv(lk, makeTag(Kind::Handshake, static_cast<int>(c.id), kStepAuth), kFullMask,
                      rec)) {
          std::string why;
          handshake::Auth auth;
          try {
            auth = handshake::decodeAuth(rec, "handshake");
            why = handshake::checkAuth(auth, launch_.secret, c.challenge, n);
          } catch (const Error& e) {
            why = fmt::format("garbage instead of a handshake ({})", e.what());
          }
          handshake::Result result;
          if (why.empty()) {
            result = handshake::acceptResult(launch_.secret, c.challenge, auth);
            c.rank = auth.rank;
            c.state = RvConn::State::WaitHello;
            c.deadline = Deadline::fromTimeout(handshakeTimeout_);
          } else {
            result.reason = why;
            drop(c, why);
          }
          rvSend(lk, c, kStepResult, handshake::encode(result));
        } else if (c.failed.load()) {
          drop(c, fmt::format("its endpoint failed during the handshake: {}", c.why));
        } else if (c.deadline.expired()) {
          drop(c, "sent no complete handshake in time");
        }
      } else if (c.state == RvConn::State::WaitHello) {
        if (rvTryRecv(lk, makeTag(Kind::Handshake, static_cast<int>(c.id), kStepHello), kFullMask,
                      rec)) {
          const int r = c.rank;
          try {
            uint16_t kind = recordKind(rec, kMaxRecord, "ucx check-in record");
            if (kind != kHello) {
              fail(c, r,
                   fmt::format("ranks disagree on bootstrap backend: rank 0 has 'ucx', rank {} "
                               "has '{}'. Every rank must use the same bootstrap.backend (check "
                               "STRATA_* and strata.toml on every node)",
                               r, rendezvous::backendOfKind(kind)));
              continue;
            }
            if (r == 0 || byRank[static_cast<size_t>(r)]) {
              fail(c, r,
                   fmt::format("rendezvous: rank {} checked in twice (from {} and from {}); two "
                               "processes were given the same rank",
                               r,
                               r == 0 ? std::string("rank 0 itself")
                                      : byRank[static_cast<size_t>(r)]->remote,
                               c.remote));
              continue;
            }
            auto d = wire::decodeRecord(rec, kHello, kVersion, kMaxRecord, "ucx hello record");
            Hello hello = decodeHello(d.body);
            if (hello.rank != r || hello.size != n) {
              fail(c, r,
                   fmt::format("rendezvous: a peer authenticated as rank {} sent a hello for "
                               "rank {} of {} (this job has {} ranks)",
                               r, hello.rank, hello.size, n));
              continue;
            }
            table_[static_cast<size_t>(r)] = std::move(hello.address);
            byRank[static_cast<size_t>(r)] = &c;
            c.state = RvConn::State::CheckedIn;
            ++count;
          } catch (const Error& e) {
            drop(c, fmt::format("rank {} sent a bad check-in record: {}", r, e.what()));
          }
        } else if (c.failed.load()) {
          drop(c,
               fmt::format("rank {} closed its connection before checking in: {}", c.rank, c.why));
        } else if (c.deadline.expired()) {
          drop(c, fmt::format("rank {} sent no check-in record in time", c.rank));
        }
      }
    }
    if (count >= n || !failure.empty()) break;
    if (deadline.expired()) {
      std::vector<int> missing;
      for (int r = 1; r < n; ++r) {
        if (!byRank[static_cast<size_t>(r)]) missing.push_back(r);
      }
      timedOut = true;
      failure = rendezvous::timeoutMessage(root_, connectTimeout_, count, n, missing);
      break;
    }
    Deadline next = deadline;
    for (auto& c : rvConns_) {
      if (c->state == RvConn::State::WaitAuth || c->state == RvConn::State::WaitHello) {
        next = Deadline::earlier(next, c->deadline);
      }
    }
    blockOnce(lk, next, 20);
  }
  for (auto& c : rvConns_) {
    if (c->state != RvConn::State::CheckedIn) continue;
    rvSend(lk, *c, kStepReply, failure.empty() ? encodeReply() : encodeReject(failure, timedOut));
  }
  rvClose(lk, false);
  if (!failure.empty()) {
    throw Error(timedOut ? ErrorCode::Timeout : ErrorCode::InvalidConfig, failure, failurePeer);
  }
}

// A ucx rank whose UCX connection failed: is a strata TCP rendezvous (a rank 0 started with
// bootstrap.backend=tcp) on the root port? Such a listener sends its CHALLENGE unasked, while
// UCX's waits for the client. If so, check in there with the ucx record, so that rank 0 names
// the mismatch and rejects every rank alike. A ucx rank 0 serving strata-run's socket
// (serveInheritedSocket) holds the connection instead, and closes it once its UCX listener is
// up. Returns false to retry over UCX.
bool UcxBootstrap::checkInOverTcp(const std::vector<net::SockAddr>& rootAddrs,
                                  const std::vector<uint8_t>& hello, double& probeWait) {
  for (const auto& a : rootAddrs) {
    net::Fd fd;
    try {
      fd = net::connectWithRetry({a}, Deadline::after(0.2), "rendezvous probe");
    } catch (const Error&) {
      continue;
    }
    // A strata listener sends its CHALLENGE as soon as it accepts. What stays silent is
    // usually the UCX listener, up since the UCX attempt failed: wait briefly, and longer
    // each time, in case it is a tcp rank 0 too busy to accept at once.
    pollfd p{fd.get(), POLLIN, 0};
    int ready = ::poll(&p, 1, static_cast<int>(probeWait * 1000));
    if (ready <= 0) {
      probeWait = std::min(probeWait * 2, 0.5);
      continue;
    }
    uint8_t head[wire::kRecordHeaderSize];
    ssize_t got = ::recv(fd.get(), head, sizeof head, MSG_PEEK | MSG_WAITALL);
    if (got != static_cast<ssize_t>(sizeof head)) continue;
    try {
      if (wire::decodeHeader(head, 0xffff, handshake::kMaxChallengeBody, "probe").kind !=
          handshake::kChallengeKind) {
        continue;
      }
    } catch (const Error&) {
      continue;
    }
    Deadline dl = Deadline::after(std::max(handshakeTimeout_, 1.0));
    std::string what = fmt::format("ucx bootstrap rendezvous with rank 0 at {} (over TCP)", root_);
    std::vector<uint8_t> rec;
    try {
      handshake::connectSide(fd.get(), launch_.secret, handshake::Purpose::Rendezvous, launch_.rank,
                             launch_.size, 0, dl, what);
      handshake::writeRecord(fd.get(), hello, dl, what);
      rec = handshake::readRecord(fd.get(), kMaxRejectMessage + 512,
                                  Deadline::fromTimeout(connectTimeout_), what);
    } catch (const Error& e) {
      if (e.code() == ErrorCode::AuthFailed) throw;
      STRATA_LOG(Debug, kSub, "rendezvous over TCP failed, retrying over UCX: {}", e.what());
      return false;
    }
    if (recordKind(rec, kMaxRejectMessage + 512, what) == rendezvous::kRejectKind) {
      rendezvous::throwReject(rec);
    }
    return false;
  }
  return false;
}

void UcxBootstrap::checkIn(const std::vector<net::SockAddr>& rootAddrs,
                           const std::vector<uint8_t>& myAddress) {
  Hello h{launch_.rank, launch_.size, hostName(), myAddress};
  const auto hello = encodeHello(h);
  Deadline deadline = Deadline::fromTimeout(connectTimeout_);
  std::string what = fmt::format("ucx bootstrap rendezvous with rank 0 at {}", root_);
  double backoff = 0.005, probeWait = 0.05;
  size_t attempt = 0;
  std::vector<uint8_t> rec;
  for (;;) {
    if (deadline.expired()) {
      throw Error(ErrorCode::Timeout,
                  fmt::format("{}: no rendezvous within {} s (is rank 0 running? "
                              "bootstrap.connect_timeout={} s)",
                              what, connectTimeout_, connectTimeout_),
                  0);
    }
    bool connected = false;
    {
      Lock lk(mu_);
      auto cp = std::make_unique<RvConn>();
      RvConn& c = *cp;
      const auto& a = rootAddrs[attempt++ % rootAddrs.size()];
      ucp_ep_params_t ep{};
      ep.field_mask = UCP_EP_PARAM_FIELD_SOCK_ADDR | UCP_EP_PARAM_FIELD_FLAGS |
                      UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
      ep.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
      ep.sockaddr.addr = a.get();
      ep.sockaddr.addrlen = a.len;
      ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
      ep.err_handler.cb = &UcxBootstrap::onRvError;
      ep.err_handler.arg = &c;
      ucs_status_t st = ucp_ep_create(worker_, &ep, &c.ep);
      if (st != UCS_OK) c.ep = nullptr;
      rvConns_.push_back(std::move(cp));
      uint64_t senderTag = 0;
      Deadline step = Deadline::earlier(deadline, Deadline::fromTimeout(handshakeTimeout_));
      if (c.ep && rvWait(lk, c, makeTag(Kind::Handshake, 0, kStepChallenge), kStepMask, step, rec,
                         &senderTag)) {
        connected = true;
        c.id = static_cast<uint32_t>(tagRank(senderTag));
        auto challenge = handshake::decodeChallenge(rec, what);
        handshake::checkChallenge(challenge, handshake::Purpose::Rendezvous, 0, what);
        auto auth = handshake::makeAuth(launch_.secret, challenge, launch_.rank, launch_.size);
        rvSend(lk, c, kStepAuth, handshake::encode(auth));
        if (!rvWait(lk, c, makeTag(Kind::Handshake, static_cast<int>(c.id), kStepResult), kFullMask,
                    step, rec)) {
          connected = false;  // rank 0 went away or stalled: start over
        } else {
          handshake::checkResult(handshake::decodeResult(rec, what), launch_.secret, challenge,
                                 auth, what);
          rvSend(lk, c, kStepHello, hello);
          if (!rvWait(lk, c, makeTag(Kind::Handshake, static_cast<int>(c.id), kStepReply),
                      kFullMask, deadline, rec)) {
            if (deadline.expired()) {
              throw Error(ErrorCode::Timeout,
                          fmt::format("{}: rank 0 sent no reply within {} s "
                                      "(bootstrap.connect_timeout)",
                                      what, connectTimeout_),
                          0);
            }
            throw Error(ErrorCode::PeerLost,
                        fmt::format("{}: rank 0 closed the connection before replying ({}); it "
                                    "failed or was stopped",
                                    what, c.why),
                        0);
          }
          uint16_t kind = recordKind(rec, kMaxRejectMessage + 512, what);
          if (kind == rendezvous::kRejectKind) {
            rvClose(lk, true);
            rendezvous::throwReject(rec);
          }
          auto d2 = wire::decodeRecord(rec, kReply, kVersion, kMaxRecord, "ucx rendezvous reply");
          wire::Reader r2(d2.body, "ucx rendezvous reply");
          r2.expectEnd();
          rvClose(lk, false);
          return;
        }
      }
      if (!connected) {
        STRATA_LOG(Debug, kSub, "rendezvous attempt {} failed ({}), retrying", attempt,
                   c.failed.load() ? c.why : std::string("no answer"));
        rvClose(lk, true);
      }
    }
    // Not a UCX listener (yet): a tcp rank 0, or nothing listening.
    if (checkInOverTcp(rootAddrs, hello, probeWait)) return;
    std::this_thread::sleep_for(std::chrono::duration<double>(backoff));
    backoff = std::min(backoff * 2, 0.2);
  }
}

// Binomial-tree broadcast of the address table from rank 0: a rank receives it from its
// parent (no endpoint needed to receive), then sends it on to its children.
void UcxBootstrap::exchangeTable() {
  const int n = launch_.size, me = launch_.rank;
  Deadline deadline = Deadline::fromTimeout(connectTimeout_);
  Lock lk(mu_);
  std::vector<uint8_t> blob;
  int mask = 1;
  if (me != 0) {
    while (mask < n && !(me & mask)) mask <<= 1;
    int parent = me - mask;
    recvTagged(lk, parent, makeTag(Kind::Setup, parent, 0), nullptr, 0, deadline,
               "rendezvous (address table)", Kind::Setup, 0, &blob);
    auto d = wire::decodeRecord(blob, kTable, kVersion, maxMessage_, "ucx address table");
    wire::Reader r(d.body, "ucx address table");
    uint32_t count = r.u32("count");
    if (count != static_cast<uint32_t>(n)) {
      throw Error(ErrorCode::ProtocolError,
                  fmt::format("ucx address table from rank {} has {} entries, the job has {} "
                              "ranks",
                              parent, count, n),
                  parent);
    }
    for (int q = 0; q < n; ++q) {
      auto a = r.bytes(kMaxWorkerAddress, "worker address");
      if (a.empty()) {
        throw Error(
            ErrorCode::ProtocolError,
            fmt::format("ucx address table from rank {}: rank {} has no address", parent, q),
            parent);
      }
      if (q != me) table_[static_cast<size_t>(q)] = std::move(a);
    }
    r.expectEnd();
  } else {
    wire::Writer w;
    w.u32(static_cast<uint32_t>(n));
    for (const auto& a : table_) w.bytes(a);
    blob = wire::encodeRecord(kTable, kVersion, w.data());
    mask = 1;
    while (mask < n) mask <<= 1;
  }
  for (mask >>= 1; mask > 0; mask >>= 1) {
    int child = me + mask;
    if (child < n) {
      startSend(lk, child, makeTag(Kind::Setup, me, 0), blob.data(), blob.size(), deadline,
                "rendezvous (address table)", Kind::Setup, 0);
    }
  }
}

void UcxBootstrap::checkPeer(int peer, std::string_view op) const {
  if (peer < 0 || peer >= launch_.size) {
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("{}: peer {} is out of range 0..{}", op, peer, launch_.size - 1), peer);
  }
  if (peer == launch_.rank) {
    throw Error(
        ErrorCode::InvalidArgument,
        fmt::format("{}: peer {} is this rank; send/recv to self is not supported", op, peer),
        peer);
  }
}

ucp_ep_h UcxBootstrap::endpoint(int peer) {
  Peer& p = *peers_[static_cast<size_t>(peer)];
  if (p.ep) return p.ep;
  const auto& address = table_[static_cast<size_t>(peer)];
  if (address.empty()) {
    throw Error(ErrorCode::Internal,
                fmt::format("ucx bootstrap: no worker address for rank {}", peer), peer);
  }
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                  UCP_EP_PARAM_FIELD_ERR_HANDLER;
  ep.address = reinterpret_cast<const ucp_address_t*>(address.data());
  // PEER mode: requests to a dead peer fail, and onPeerError tells waiting calls.
  ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  ep.err_handler.cb = &UcxBootstrap::onPeerError;
  ep.err_handler.arg = &p;
  ucs_status_t st = ucp_ep_create(worker_, &ep, &p.ep);
  if (st != UCS_OK) {
    p.ep = nullptr;
    throw Error(ErrorCode::BackendError,
                fmt::format("ucx bootstrap: creating an endpoint to rank {} failed: {}. Check "
                            "that UCX_TLS and UCX_NET_DEVICES give both ranks a common transport",
                            peer, statusText(st)),
                peer);
  }
  return p.ep;
}

void UcxBootstrap::reapSends() {
  for (auto it = sends_.begin(); it != sends_.end();) {
    PendingSend& s = **it;
    if (!s.op.done) {
      ++it;
      continue;
    }
    if (s.op.status != UCS_OK && s.op.status != UCS_ERR_CANCELED && s.peer >= 0) {
      Peer& p = *peers_[static_cast<size_t>(s.peer)];
      if (!p.lost.load()) {
        p.lostWhy = fmt::format("a send to it failed: {}", statusText(s.op.status));
        p.lostAt = std::chrono::steady_clock::now();
        p.lost.store(true);
      }
    }
    ucp_request_free(s.request);
    inFlightBytes_ -= s.bytes;
    it = sends_.erase(it);
  }
}

void UcxBootstrap::checkAbortMessage() {
  if (!abortRequest_ || !abortOp_.done) return;
  ucp_request_free(abortRequest_);
  abortRequest_ = nullptr;
  if (abortOp_.status == UCS_ERR_CANCELED) return;
  int origin = tagRank(abortOp_.senderTag);
  std::string reason = "(no reason received)";
  if (abortOp_.status == UCS_OK) {
    try {
      auto d = wire::decodeRecord({abortBuf_.data(), abortOp_.length}, kAbortRecord, kVersion,
                                  abortBuf_.size(), "ucx abort record");
      wire::Reader r(d.body, "ucx abort record");
      origin = r.i32("origin");
      reason = r.str(kMaxAbortReason, "reason");
    } catch (const Error& e) {
      reason = fmt::format("(unreadable abort record: {})", e.what());
    }
  }
  if (!aborted_) {
    aborted_ = true;
    abortOrigin_ = origin;
    abortReason_ = reason;
    STRATA_LOG(Error, kSub, "rank {} aborted the job: {}", origin, reason);
  }
  cv_.notify_all();
}

void UcxBootstrap::progress(Lock& /*lk*/) {
  unsigned events = 0;
  for (int i = 0; i < 64; ++i) {
    unsigned e = ucp_worker_progress(worker_);
    events += e;
    if (e == 0) break;
  }
  reapSends();
  checkAbortMessage();
  if (events > 0 && driving_) {
    ucp_worker_signal(worker_);  // the thread asleep on the efd may be waiting for this
  }
  if (events > 0) cv_.notify_all();
}

void UcxBootstrap::throwAborted() const {
  if (abortOrigin_ == launch_.rank) {
    throw Error(ErrorCode::Aborted,
                fmt::format("ucx bootstrap: this rank called abort(): {}", abortReason_),
                abortOrigin_);
  }
  throw Error(ErrorCode::Aborted,
              fmt::format("ucx bootstrap: rank {} aborted the job: {}", abortOrigin_, abortReason_),
              abortOrigin_);
}

bool UcxBootstrap::lostLongEnough(int peer) const {
  if (peer < 0) return false;
  const Peer& p = *peers_[static_cast<size_t>(peer)];
  return p.lost.load() && std::chrono::steady_clock::now() - p.lostAt >= kLostGrace;
}

void UcxBootstrap::throwLost(int peer, std::string_view op, Kind kind, int tag) const {
  const Peer& p = *peers_[static_cast<size_t>(peer)];
  throw Error(
      ErrorCode::PeerLost,
      fmt::format("{} {} rank {} ({}) failed: rank {} is gone ({}); it died or "
                  "destroyed its bootstrap. Make every rank take part in the same "
                  "exchanges",
                  op, op == "send" ? "to" : "with", peer, tagText(kind, tag), peer, p.lostWhy),
      peer);
}

template <class Done, class OnTimeout>
void UcxBootstrap::waitUntil(Lock& lk, const Deadline& deadline, int peer, Done done,
                             OnTimeout onTimeout, std::string_view op, Kind kind, int tag) {
  const auto spinUntil = std::chrono::steady_clock::now() + std::chrono::microseconds(spin_.us);
  for (;;) {
    progress(lk);
    if (aborted_) throwAborted();
    if (done()) return;
    if (lostLongEnough(peer)) throwLost(peer, op, kind, tag);
    if (deadline.expired()) {
      onTimeout();  // throws, except where the caller only wanted to wait a while
      return;
    }
    if (std::chrono::steady_clock::now() < spinUntil) {
      // Poll the worker again before sleeping (bootstrap.spin_us); let other threads in.
      lk.unlock();
      if (spin_.yield) sched_yield();
      lk.lock();
      continue;
    }
    int capMs = kMaxSleepMs;
    if (peer >= 0 && peers_[static_cast<size_t>(peer)]->lost.load()) capMs = 10;
    blockOnce(lk, deadline, capMs);
  }
}

void UcxBootstrap::blockOnce(Lock& lk, const Deadline& deadline, int capMs) {
  if (driving_ || efd_ < 0) {
    if (efd_ < 0 && !driving_) {
      lk.unlock();
      std::this_thread::sleep_for(std::chrono::microseconds(100));
      lk.lock();
    } else {
      // Another thread sleeps on the worker's fd and wakes us after each progress.
      cv_.wait_for(lk, std::chrono::milliseconds(deadline.pollMs(capMs) + 1));
    }
    return;
  }
  ucs_status_t st = ucp_worker_arm(worker_);
  if (st == UCS_ERR_BUSY) return;  // events arrived meanwhile: progress again
  driving_ = true;
  lk.unlock();
  pollfd pfd{efd_, POLLIN, 0};
  ::poll(&pfd, 1, st == UCS_OK ? deadline.pollMs(capMs) + 1 : 1);
  lk.lock();
  driving_ = false;
  cv_.notify_all();
}

// Sends complete, wireup requests are answered and aborts and lost peers are noticed even
// while the user makes no call (a rank that sends and then computes must still deliver).
void UcxBootstrap::progressLoop() {
  Lock lk(mu_);
  while (!stopping_) {
    progress(lk);
    if (stopping_) break;
    blockOnce(lk, Deadline::never(), 100);
  }
}

void UcxBootstrap::waitRequest(Lock& lk, void* request, std::unique_ptr<OpState>& state,
                               const Deadline& deadline, int peer, std::string_view opName,
                               Kind kind, int tag) {
  OpState& op = *state;
  try {
    waitUntil(
        lk, deadline, peer, [&] { return op.done; },
        [&] {
          throw Error(ErrorCode::Timeout,
                      fmt::format("{} {} rank {} ({}) timed out after {} s in the middle of the "
                                  "transfer",
                                  opName, opName == "send" ? "to" : "from", peer,
                                  tagText(kind, tag), timeout_),
                      peer);
        },
        opName, kind, tag);
  } catch (...) {
    // Take the request back before the caller's buffer goes away.
    ucp_request_cancel(worker_, request);
    Deadline grace = Deadline::after(5.0);
    while (!op.done && !grace.expired()) {
      if (ucp_worker_progress(worker_) == 0) {
        lk.unlock();
        std::this_thread::sleep_for(std::chrono::microseconds(200));
        lk.lock();
      }
    }
    if (op.done) {
      ucp_request_free(request);
    } else {
      // UCX still owns it: keep its state alive until the worker is destroyed.
      STRATA_LOG(Warn, kSub,
                 "a {} with rank {} could not be cancelled; its buffer may still be "
                 "written by UCX",
                 opName, peer);
      orphans_.emplace_back(request, std::move(state));
    }
    throw;
  }
  ucp_request_free(request);
}

void UcxBootstrap::startSend(Lock& lk, int peer, uint64_t tag, const void* data, size_t bytes,
                             const Deadline& deadline, std::string_view op, Kind kind,
                             int userTag) {
  if (aborted_) throwAborted();
  if (peers_[static_cast<size_t>(peer)]->lost.load()) {
    // Give a just-sent abort the chance to arrive first.
    waitUntil(
        lk, Deadline::after(1.0), peer, [] { return false; }, [] {}, op, kind, userTag);
    throwLost(peer, op, kind, userTag);
  }
  if (inFlightBytes_ + bytes > kMaxInFlightBytes && !sends_.empty()) {
    waitUntil(
        lk, deadline, peer,
        [&] { return sends_.empty() || inFlightBytes_ + bytes <= kMaxInFlightBytes; },
        [&] {
          throw Error(
              ErrorCode::Timeout,
              fmt::format("{} to rank {} ({}, {} bytes) timed out after {} s: {} bytes "
                          "sent earlier are still not received by their peers",
                          op, peer, tagText(kind, userTag), bytes, timeout_, inFlightBytes_),
              peer);
        },
        op, kind, userTag);
  }
  ucp_ep_h ep = endpoint(peer);
  // The message is copied so that send() returns without waiting for the receiver: a large
  // message goes by rendezvous, which completes only once the peer receives it, and two
  // ranks sending to each other must not deadlock.
  auto s = std::make_unique<PendingSend>();
  s->peer = peer;
  s->bytes = bytes;
  s->data.reset(new uint8_t[bytes ? bytes : 1]);
  if (bytes) std::memcpy(s->data.get(), data, bytes);
  ucp_request_param_t rp{};
  rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  rp.cb.send = sendDone;
  rp.user_data = &s->op;
  void* req = ucp_tag_send_nbx(ep, s->data.get(), bytes, tag, &rp);
  if (req == nullptr) return;  // completed in place
  if (UCS_PTR_IS_ERR(req)) {
    ucs_status_t st = UCS_PTR_STATUS(req);
    if (isPeerFailure(st)) {
      Peer& p = *peers_[static_cast<size_t>(peer)];
      if (!p.lost.load()) {
        p.lostWhy = fmt::format("a send to it failed: {}", statusText(st));
        p.lostAt = std::chrono::steady_clock::now() - kLostGrace;
        p.lost.store(true);
      }
      throwLost(peer, op, kind, userTag);
    }
    throw Error(ErrorCode::BackendError,
                fmt::format("{} to rank {} ({}, {} bytes): ucp_tag_send_nbx() failed: {}", op, peer,
                            tagText(kind, userTag), bytes, statusText(st)),
                peer);
  }
  s->request = req;
  inFlightBytes_ += bytes;
  sends_.push_back(std::move(s));
}

void UcxBootstrap::recvTagged(Lock& lk, int peer, uint64_t tag, void* data, size_t bytes,
                              const Deadline& deadline, std::string_view op, Kind kind, int userTag,
                              std::vector<uint8_t>* any) {
  if (aborted_) throwAborted();
  // An endpoint of our own makes the peer's death visible to us (onPeerError).
  if (!table_[static_cast<size_t>(peer)].empty()) endpoint(peer);
  ucp_tag_message_h msg = nullptr;
  ucp_tag_recv_info_t info{};
  waitUntil(
      lk, deadline, peer,
      [&] {
        msg = ucp_tag_probe_nb(worker_, tag, kFullMask, 1, &info);
        return msg != nullptr;
      },
      [&] {
        throw Error(ErrorCode::Timeout,
                    fmt::format("{} from rank {} ({}, {} bytes) timed out after {} s: rank {} "
                                "did not send it (is it stuck, or did the ranks call different "
                                "operations?)",
                                op, peer, tagText(kind, userTag), bytes, timeout_, peer),
                    peer);
      },
      op, kind, userTag);

  const size_t length = info.length;
  std::unique_ptr<uint8_t[]> scratch;
  void* target = data;
  size_t capacity = bytes;
  bool mismatch = false;
  if (any) {
    if (length > maxMessage_) {
      mismatch = true;
    } else {
      any->resize(length);
      target = any->data();
      capacity = length;
    }
  } else if (length != bytes) {
    mismatch = true;
  }
  if (mismatch) {
    // Consume the message so that the stream stays in step, then report.
    capacity = length <= maxMessage_ ? length : 0;
    scratch.reset(new uint8_t[capacity ? capacity : 1]);
    target = scratch.get();
  }
  auto state = std::make_unique<OpState>();
  ucp_request_param_t rp{};
  rp.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  rp.cb.recv = recvDone;
  rp.user_data = state.get();
  uint8_t dummy = 0;
  void* req = ucp_tag_msg_recv_nbx(worker_, target ? target : &dummy, capacity, msg, &rp);
  if (UCS_PTR_IS_ERR(req)) {
    throw Error(ErrorCode::BackendError,
                fmt::format("{} from rank {} ({}): ucp_tag_msg_recv_nbx() failed: {}", op, peer,
                            tagText(kind, userTag), statusText(UCS_PTR_STATUS(req))),
                peer);
  }
  waitRequest(lk, req, state, deadline, peer, op, kind, userTag);
  if (mismatch) {
    throw Error(ErrorCode::ProtocolError,
                any ? fmt::format("{} from rank {} ({}): rank {} sent {} bytes, more than "
                                  "bootstrap.max_message ({} bytes); the message was discarded",
                                  op, peer, tagText(kind, userTag), peer, length, maxMessage_)
                    : fmt::format("{} from rank {} ({}): expected {} bytes but rank {} sent {} "
                                  "bytes; the message was discarded",
                                  op, peer, tagText(kind, userTag), bytes, peer, length),
                peer);
  }
  if (state->status != UCS_OK) {
    if (isPeerFailure(state->status)) {
      Peer& p = *peers_[static_cast<size_t>(peer)];
      if (!p.lost.load()) {
        p.lostWhy = fmt::format("a receive from it failed: {}", statusText(state->status));
        p.lostAt = std::chrono::steady_clock::now() - kLostGrace;
        p.lost.store(true);
      }
      throwLost(peer, op, kind, userTag);
    }
    throw Error(ErrorCode::BackendError,
                fmt::format("{} from rank {} ({}, {} bytes) failed in UCX: {}", op, peer,
                            tagText(kind, userTag), length, statusText(state->status)),
                peer);
  }
}

void UcxBootstrap::sendInternal(Lock& lk, int peer, Kind kind, uint32_t low, const void* data,
                                size_t bytes, const Deadline& deadline, std::string_view op) {
  startSend(lk, peer, makeTag(kind, launch_.rank, low), data, bytes, deadline, op, kind, 0);
}

void UcxBootstrap::recvInternal(Lock& lk, int peer, Kind kind, uint32_t low, void* data,
                                size_t bytes, const Deadline& deadline, std::string_view op) {
  recvTagged(lk, peer, makeTag(kind, peer, low), data, bytes, deadline, op, kind, 0);
}

uint32_t UcxBootstrap::nextCollective() {
  // Every rank calls the collectives in the same order, so sequence numbers agree; the low
  // 8 bits number the steps within one collective.
  return (++collectiveSeq_ & 0xFFFFFF) << 8;
}

void UcxBootstrap::send(int peer, int tag, const void* data, size_t bytes) {
  checkPeer(peer, "send");
  if (tag < 0) {
    throw Error(ErrorCode::InvalidArgument, fmt::format("send: tag {} is negative", tag), peer);
  }
  if (bytes > maxMessage_) {
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("send to rank {}: {} bytes exceed bootstrap.max_message ({} bytes)",
                            peer, bytes, maxMessage_),
                peer);
  }
  if (bytes && !data) {
    throw Error(ErrorCode::InvalidArgument, "send: null buffer", peer);
  }
  Deadline dl = callDeadline();
  Lock lk(mu_);
  startSend(lk, peer, makeTag(Kind::User, launch_.rank, static_cast<uint32_t>(tag)), data, bytes,
            dl, "send", Kind::User, tag);
  progress(lk);
}

void UcxBootstrap::recv(int peer, int tag, void* data, size_t bytes) {
  checkPeer(peer, "recv");
  if (tag < 0) {
    throw Error(ErrorCode::InvalidArgument, fmt::format("recv: tag {} is negative", tag), peer);
  }
  if (bytes && !data) {
    throw Error(ErrorCode::InvalidArgument, "recv: null buffer", peer);
  }
  Deadline dl = callDeadline();
  Lock lk(mu_);
  recvTagged(lk, peer, makeTag(Kind::User, peer, static_cast<uint32_t>(tag)), data, bytes, dl,
             "recv", Kind::User, tag);
}

// The algorithms are lib/base/collectives_over_p2p.cpp's. Every rank calls the collectives
// in the same order, so one sequence number per call (nextCollective) tags all its messages;
// the barrier also puts its round in the low 8 bits.
p2p::Link UcxBootstrap::collectiveLink(Lock& lk, const Deadline& deadline, std::string_view op,
                                       bool tagRounds) {
  const uint32_t seq = nextCollective();
  auto low = [seq, tagRounds](uint32_t round) { return tagRounds ? seq | round : seq; };
  return {launch_.rank, launch_.size,
          [this, &lk, deadline, op, low](int peer, uint32_t round, const void* data,
                                         size_t bytes) {
            sendInternal(lk, peer, Kind::Collective, low(round), data, bytes, deadline, op);
          },
          [this, &lk, deadline, op, low](int peer, uint32_t round, void* data, size_t bytes) {
            recvInternal(lk, peer, Kind::Collective, low(round), data, bytes, deadline, op);
          }};
}

// Ring: sends are buffered, so the ring never waits on itself.
void UcxBootstrap::allGather(void* data, size_t bytesPerRank) {
  if (!p2p::allGatherNeeded(launch_.size, data, bytesPerRank)) return;
  Deadline dl = callDeadline();
  Lock lk(mu_);
  if (aborted_) throwAborted();
  p2p::allGather(collectiveLink(lk, dl, "allGather", false), p2p::AllGatherAlgorithm::Ring, data,
                 bytesPerRank);
}

void UcxBootstrap::broadcast(void* data, size_t bytes, int root) {
  if (!p2p::broadcastNeeded(launch_.size, data, bytes, root)) return;
  Deadline dl = callDeadline();
  Lock lk(mu_);
  if (aborted_) throwAborted();
  p2p::broadcast(collectiveLink(lk, dl, "broadcast", false), false, data, bytes, root);
}

void UcxBootstrap::barrier() {
  if (!p2p::barrierNeeded(launch_.size)) return;
  Deadline dl = callDeadline();
  Lock lk(mu_);
  if (aborted_) throwAborted();
  p2p::barrier(collectiveLink(lk, dl, "barrier", true), false);
}

void UcxBootstrap::abort(std::string_view reason) noexcept {
  try {
    Lock lk(mu_);
    if (aborted_ || !worker_) return;
    aborted_ = true;
    abortOrigin_ = launch_.rank;
    abortReason_ = std::string(reason.substr(0, kMaxAbortReason));
    STRATA_LOG(Error, kSub, "aborting the job: {}", abortReason_);
    cv_.notify_all();
    wire::Writer w;
    w.i32(launch_.rank).str(abortReason_);
    auto rec = wire::encodeRecord(kAbortRecord, kVersion, w.data());
    // Every rank, not only connected ones: a rank may be waiting on us without ever having
    // talked to us.
    for (int r = 0; r < launch_.size; ++r) {
      if (r == launch_.rank || peers_[static_cast<size_t>(r)]->lost.load()) continue;
      if (table_[static_cast<size_t>(r)].empty()) continue;
      try {
        ucp_ep_h ep = endpoint(r);
        auto s = std::make_unique<PendingSend>();
        s->peer = r;
        s->bytes = rec.size();
        s->data.reset(new uint8_t[rec.size()]);
        std::memcpy(s->data.get(), rec.data(), rec.size());
        ucp_request_param_t rp{};
        rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
        rp.cb.send = sendDone;
        rp.user_data = &s->op;
        void* req = ucp_tag_send_nbx(ep, s->data.get(), rec.size(),
                                     makeTag(Kind::Abort, launch_.rank, 0), &rp);
        if (req != nullptr && !UCS_PTR_IS_ERR(req)) {
          s->request = req;
          inFlightBytes_ += s->bytes;
          sends_.push_back(std::move(s));
        }
      } catch (const Error& e) {
        STRATA_LOG(Debug, kSub, "abort: cannot tell rank {}: {}", r, e.what());
      }
    }
    // Deliver them before the caller goes on (and likely destroys us or exits).
    Deadline dl = Deadline::after(2.0);
    while (!sends_.empty() && !dl.expired()) {
      if (ucp_worker_progress(worker_) == 0) {
        lk.unlock();
        std::this_thread::sleep_for(std::chrono::microseconds(100));
        lk.lock();
      }
      reapSends();
    }
  } catch (...) {
  }
}

bool detect() noexcept {
  return false;
}  // never chosen by bootstrap.backend=auto

std::unique_ptr<Bootstrap> create(const Config& config) {
  return std::make_unique<UcxBootstrap>(config);
}

const backend::ModuleInfo kInfo = {
    STRATA_MODULE_ABI_VERSION,
    backend::ModuleKind::Bootstrap,
    "ucx",
    STRATA_VERSION_STRING,
    "UCX: tag-matched messages over UCX workers, TCP rendezvous at rank 0",
    &detect,
    &create,
    nullptr,
};

}  // namespace
}  // namespace strata::ucx

extern "C" __attribute__((visibility("default"))) const strata::backend::ModuleInfo*
strata_module_info() {
  return &strata::ucx::kInfo;
}
