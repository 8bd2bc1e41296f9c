// The ucx backend's rendezvous (docs/backends.md, "The ucx backend"): rank 0 serves it on a
// UCX listener at STRATA_ROOT (after serving strata-run's inherited socket, for mixed
// backends), the other ranks check in there over UCX (or over TCP when they find a strata TCP
// rendezvous on the port), and rank 0 then broadcasts the table of worker addresses.

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <span>

#include <fmt/format.h>

#include <strata/error.hpp>

#include "base/log.hpp"
#include "base/process.hpp"
#include "base/wire.hpp"
#include "mesh/rendezvous.hpp"
#include "net/handshake.hpp"
#include "ucx_internal.hpp"

namespace strata::ucx {
namespace {

constexpr size_t kMaxRejectMessage = 4096;

std::vector<uint8_t> encodeReject(const std::string& message, bool timedOut) {
  return rendezvous::encodeReject("ucx", message, timedOut);
}

uint16_t recordKind(std::span<const uint8_t> rec, size_t maxLength, std::string_view what) {
  if (rec.size() < wire::kRecordHeaderSize) {
    throw Error(ErrorCode::ProtocolError, fmt::format("{}: truncated record", what));
  }
  return wire::decodeHeader(rec.first(wire::kRecordHeaderSize), 0xffff, maxLength, what).kind;
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

}  // namespace

void UcxBootstrap::onConnRequest(ucp_conn_request_h request, void* arg) {
  // Called from ucp_worker_progress, so with mu_ held.
  static_cast<UcxBootstrap*>(arg)->connRequests_.push_back(request);
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
  std::vector<ucp_ep_h*> eps;
  std::vector<bool> forced;
  for (auto& c : rvConns_) {
    eps.push_back(&c->ep);
    forced.push_back(force || c->failed.load());
  }
  closeEndpoints(lk, eps, forced);
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
      rvAccept(lk, req);
    }
    connRequests_.clear();

    for (auto& cp : rvConns_) {
      RvConn& c = *cp;
      if (!failure.empty()) break;
      if (c.state == RvConn::State::WaitAuth) {
        std::string why = rvServeAuth(lk, c);
        if (!why.empty()) drop(c, why);
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
  Hello h{launch_.rank, launch_.size, process::hostName(), myAddress};
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
      Deadline step = Deadline::earlier(deadline, Deadline::fromTimeout(handshakeTimeout_));
      if (c.ep && rvAuthenticate(lk, c, step, what)) {
        rvSend(lk, c, kStepHello, hello);
        if (!rvWait(lk, c, makeTag(Kind::Handshake, static_cast<int>(c.id), kStepReply), kFullMask,
                    deadline, rec)) {
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
      STRATA_LOG(Debug, kSub, "rendezvous attempt {} failed ({}), retrying", attempt,
                 c.failed.load() ? c.why : std::string("no answer"));
      rvClose(lk, true);
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

}  // namespace strata::ucx
