// strata-bootstrap-ucx.so: the UCX bootstrap backend.
//
// Rendezvous through UCX's client/server connection establishment, data over UCX. Rank 0
// listens on STRATA_ROOT with ucp_listener_create (sockaddr); every other rank connects there
// with a client-server endpoint, proves the job secret with the same HMAC challenge-response
// as lib/net/handshake.cpp (net/handshake_codec.hpp, carried in UCX tag messages), and only then
// sends its worker address. Endpoints from clients carry no rank: each is identified by its
// handshake, never by arrival order. Rank 0 then broadcasts the address table over UCX along a
// binomial tree, so the root sends O(N) bytes per child and O(N log N) in all; endpoints to peers
// are created lazily from that table.
//
// Mixed backends: a ucx rank whose UCX connection fails looks for a strata TCP rendezvous on
// the root port (a CHALLENGE record sent unasked); if it finds one it checks in there with its
// ucx record, so a tcp rank 0 names the mismatch and rejects every rank. A ucx rank 0 started
// by strata-run serves the strata handshake on the inherited socket until every rank checked
// in there, and only then opens its UCX listener; a tcp rank is named and rejected the same
// way, whenever it arrives (docs/backends.md).
//
// Messages use UCX tag matching (ucx_data.cpp). This file holds the backend class's set-up
// and tear-down and the module entry point; the rendezvous is in ucx_rendezvous.cpp, the
// handshake over UCX in ucx_handshake.cpp, what they share in ucx_internal.hpp.

#include <unistd.h>

#include <algorithm>
#include <cstdlib>

#include <fmt/format.h>

#include <strata/backend/module.hpp>
#include <strata/error.hpp>
#include <strata/version.hpp>

#include "base/config_keys.hpp"
#include "base/log.hpp"
#include "base/wire.hpp"
#include "ucx_internal.hpp"

namespace strata::ucx {
namespace {

std::once_flag gSecretWarning;

// strata-run hands rank 0 its root socket. The first bootstrap closes it right before the UCX
// listener binds the port; later bootstraps in the process (create/destroy cycles) must never
// touch that descriptor number again and simply bind the port themselves.
std::mutex gRootMu;
bool gRootFdClosed = false;

}  // namespace

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
      std::vector<ucp_ep_h*> eps;
      std::vector<bool> forced;
      for (auto& p : peers_) {
        if (!p) continue;
        eps.push_back(&p->ep);
        forced.push_back(p->lost.load());
      }
      closeEndpoints(lk, eps, forced);
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

namespace {

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
    nullptr,
    nullptr,
};

}  // namespace
}  // namespace strata::ucx
extern "C" __attribute__((visibility("default"))) const strata::backend::ModuleInfo*
strata_module_info() {
  return &strata::ucx::kInfo;
}
