#include "base/watch.hpp"
#include "base/watch_testing.hpp"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <ctime>
#include <fstream>
#include <list>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include "base/config_keys.hpp"
#include "base/deadline.hpp"
#include "base/handshake.hpp"
#include "base/hmac.hpp"
#include "base/launcher.hpp"
#include "base/log.hpp"
#include "base/netif.hpp"
#include "base/socket.hpp"
#include "base/wire.hpp"

namespace strata::watch {

using Clock = std::chrono::steady_clock;

namespace {
constexpr const char* kSub = "watch";
constexpr size_t kMaxConnections = 512;
constexpr double kConnectionSeconds = 3.0;

double secondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

/// steady_clock's ticks from the kernel's coarse monotonic clock: the same clock at a few
/// milliseconds' resolution, at a quarter of the cost (read at every collective call).
int64_t coarseNow() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return std::chrono::duration_cast<Clock::duration>(std::chrono::seconds(ts.tv_sec) +
                                                     std::chrono::nanoseconds(ts.tv_nsec))
      .count();
}

std::string socketName(int32_t pid) {
  return fmt::format("strata-status.{}", pid);
}
}  // namespace

// ---------------------------------------------------------------------------------------------
// Scope and calls

struct Call::Rec {
  std::string domain;
  std::string op;  ///< Call's; a Slot's call names its op in opStatic instead
  std::atomic<const char*> opStatic{nullptr};
  std::atomic<uint64_t> seq{0};
  std::atomic<int64_t> start{Clock::now().time_since_epoch().count()};
  std::atomic<bool> active{true};  ///< a Slot's record between calls: false
  std::atomic<int32_t> waitingFor{-1};
  std::atomic<int64_t> waitSince{0};  ///< steady clock ticks
  std::string detail;                 ///< under the scope's mutex
  std::atomic<bool> failed{false};
};

class Scope {
 public:
  uint64_t jobId = 0;
  int rank = 0;
  int size = 1;
  std::string secret;
  double queryTimeout = 1.0;
  std::vector<PeerInfo> peers;
  std::string host;
  int32_t pid = 0;
  net::Fd listener;
  std::atomic<uint64_t> bootstrapSeq{0};
  std::atomic<int> communicators{0};

  std::mutex mu;
  std::vector<std::shared_ptr<Call::Rec>> calls;  ///< active, in start order
  /// Per domain, the last call that failed, until the next call of that domain starts: a rank
  /// that failed and went on (into a barrier, or its own code) still answers that it was in
  /// that call, so that a slower peer's analysis does not take it for a rank elsewhere.
  std::map<std::string, std::shared_ptr<Call::Rec>> failed;

  RankState snapshot() {
    RankState s;
    s.rank = rank;
    s.size = size;
    s.pid = pid;
    s.host = host;
    s.jobId = jobId;
    std::lock_guard lk(mu);
    std::vector<Call::Rec*> all;
    for (auto& [domain, c] : failed) all.push_back(c.get());
    for (auto& c : calls) all.push_back(c.get());
    for (Call::Rec* c : all) {
      if (s.calls.size() >= kMaxCallsReported) break;
      if (!c->active.load(std::memory_order_acquire)) continue;
      CallState cs;
      cs.domain = c->domain;
      const char* op = c->opStatic.load(std::memory_order_relaxed);
      cs.op = op ? std::string(op) : c->op;
      cs.seq = c->seq.load(std::memory_order_relaxed);
      cs.seconds = secondsSince(
          Clock::time_point(Clock::duration(c->start.load(std::memory_order_relaxed))));
      cs.waitingFor = c->waitingFor.load(std::memory_order_relaxed);
      if (cs.waitingFor >= 0) {
        cs.waitingSeconds = secondsSince(
            Clock::time_point(Clock::duration(c->waitSince.load(std::memory_order_relaxed))));
        cs.detail = c->detail;
      }
      cs.failed = c->failed.load(std::memory_order_relaxed);
      s.calls.push_back(std::move(cs));
    }
    return s;
  }
};

namespace {
thread_local Call::Rec* tlsCall = nullptr;
thread_local Scope* tlsScope = nullptr;
thread_local std::shared_ptr<Call::Rec> tlsSpare;
thread_local std::string tlsDiagnosed;  ///< the last message diagnose() produced
thread_local int tlsVerdictRoot = -1;
thread_local std::string tlsVerdictText;
}  // namespace

Call::Call(std::shared_ptr<Scope> scope, std::string domain, std::string_view op, uint64_t seq)
    : scope_(std::move(scope)) {
  if (!scope_) return;
  // One record per thread is reused (a collective call must stay cheap); nested calls and
  // records still listed by a reply being built get fresh ones.
  if (tlsSpare && tlsSpare.use_count() == 1) {
    rec_ = std::move(tlsSpare);
    rec_->waitingFor.store(-1, std::memory_order_relaxed);
    rec_->failed.store(false, std::memory_order_relaxed);
    rec_->detail.clear();
    rec_->start.store(Clock::now().time_since_epoch().count(), std::memory_order_relaxed);
  } else {
    rec_ = std::make_shared<Rec>();
  }
  rec_->domain = std::move(domain);
  rec_->op = op;
  rec_->seq = seq;
  {
    std::lock_guard lk(scope_->mu);
    scope_->calls.push_back(rec_);
    if (!scope_->failed.empty()) scope_->failed.erase(rec_->domain);
  }
  prev_ = tlsCall;
  prevScope_ = tlsScope;
  tlsCall = rec_.get();
  tlsScope = scope_.get();
}

Call::~Call() {
  if (!scope_) return;
  tlsCall = prev_;
  tlsScope = prevScope_;
  {
    std::lock_guard lk(scope_->mu);
    std::erase(scope_->calls, rec_);
    if (rec_->failed.load(std::memory_order_relaxed)) {
      scope_->failed[rec_->domain] = std::move(rec_);
      return;
    }
  }
  if (!tlsSpare) tlsSpare = std::move(rec_);
}

Slot::Slot(std::shared_ptr<Scope> scope, std::string domain) : scope_(std::move(scope)) {
  if (!scope_) return;
  rec_ = std::make_shared<Call::Rec>();
  rec_->domain = std::move(domain);
  rec_->active.store(false, std::memory_order_relaxed);
  std::lock_guard lk(scope_->mu);
  scope_->calls.push_back(rec_);
}

Slot::~Slot() {
  if (!scope_) return;
  std::lock_guard lk(scope_->mu);
  std::erase(scope_->calls, rec_);
}

// No lock: the record is the slot's alone, and a reply being built reads each field atomically
// (a reply may mix two consecutive calls' fields; it is a snapshot of a moving target anyway).
Slot::Active::Active(Slot* slot, const char* op, uint64_t seq) noexcept
    : slot_(slot && slot->rec_ ? slot : nullptr) {
  if (!slot_) return;
  Call::Rec& r = *slot_->rec_;
  r.waitingFor.store(-1, std::memory_order_relaxed);
  r.failed.store(false, std::memory_order_relaxed);
  r.opStatic.store(op, std::memory_order_relaxed);
  r.seq.store(seq, std::memory_order_relaxed);
  r.start.store(coarseNow(), std::memory_order_relaxed);
  r.active.store(true, std::memory_order_release);
  prev_ = tlsCall;
  prevScope_ = tlsScope;
  tlsCall = &r;
  tlsScope = slot_->scope_.get();
}

Slot::Active::~Active() {
  if (!slot_) return;
  tlsCall = prev_;
  tlsScope = prevScope_;
  Call::Rec& r = *slot_->rec_;
  if (!r.failed.load(std::memory_order_relaxed)) r.active.store(false, std::memory_order_release);
}

uint64_t nextBootstrapSeq(Scope& scope) {
  return ++scope.bootstrapSeq;
}

std::string nextDomain(Scope& scope) {
  return fmt::format("communicator {}", scope.communicators++);
}

void waitingFor(int peer, std::string_view detail, Clock::time_point since) noexcept {
  Call::Rec* c = tlsCall;
  if (!c) return;
  const int64_t ticks = since.time_since_epoch().count();
  if (c->waitingFor.load(std::memory_order_relaxed) == peer &&
      c->waitSince.load(std::memory_order_relaxed) == ticks) {
    return;
  }
  try {
    std::lock_guard lk(tlsScope->mu);
    c->detail.assign(detail);
    c->waitSince.store(ticks, std::memory_order_relaxed);
    c->waitingFor.store(peer, std::memory_order_relaxed);
  } catch (...) {
  }
}

void waitingFor(int peer, std::string_view detail) noexcept {
  Call::Rec* c = tlsCall;
  if (!c) return;
  if (c->waitingFor.load(std::memory_order_relaxed) == peer) {
    // Same peer: keep the time the wait began, refresh the detail only.
    try {
      std::lock_guard lk(tlsScope->mu);
      c->detail.assign(detail);
    } catch (...) {
    }
    return;
  }
  waitingFor(peer, detail, Clock::now());
}

void progressed() noexcept {
  if (Call::Rec* c = tlsCall) c->waitingFor.store(-1, std::memory_order_relaxed);
}

// The records: watch_codec.cpp.

// ---------------------------------------------------------------------------------------------
// The service thread

namespace {

struct Conn {
  bool local = false;            ///< the unix socket (same user), no handshake
  std::shared_ptr<Scope> scope;  ///< tcp: the scope whose listener took it
  std::optional<handshake::ListenSide> hs;
  net::Fd fd;  ///< local connections
  handshake::RecordReader reader{kMaxRequest};
  Deadline deadline = Deadline::after(kConnectionSeconds);
  int sock() const { return local ? fd.get() : hs->fd(); }
};

class Service {
 public:
  void add(const std::shared_ptr<Scope>& s) {
    std::lock_guard life(lifeMu_);
    {
      std::lock_guard lk(mu_);
      scopes_.push_back(s);
    }
    if (!thread_.joinable()) start();
    wake();
  }

  void remove(Scope* s) {
    std::lock_guard life(lifeMu_);
    bool last = false;
    {
      std::lock_guard lk(mu_);
      std::erase_if(scopes_, [&](const std::weak_ptr<Scope>& w) {
        auto p = w.lock();
        return !p || p.get() == s;
      });
      last = scopes_.empty();
      if (last) stop_ = true;
    }
    if (last && thread_.joinable()) {
      wake();
      thread_.join();
      ::close(wakeFd_);
      wakeFd_ = -1;
    }
  }

  /// In the child of a fork(): the service thread does not exist there, and a lock the parent's
  /// threads held at the fork stays held. Start afresh (a bootstrap the child creates starts
  /// a service of its own; one it inherited is not served).
  void afterForkInChild() {
    new (&lifeMu_) std::mutex;
    new (&mu_) std::mutex;
    new (&thread_) std::thread;  // the parent's handle: nothing to join here
    scopes_.clear();
    if (wakeFd_ >= 0) ::close(wakeFd_);
    wakeFd_ = -1;
    stop_ = false;
  }

  std::vector<std::shared_ptr<Scope>> scopes() {
    std::lock_guard lk(mu_);
    std::vector<std::shared_ptr<Scope>> out;
    for (auto& w : scopes_) {
      if (auto p = w.lock()) out.push_back(std::move(p));
    }
    return out;
  }

 private:
  void start() {
    stop_ = false;
    wakeFd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    net::Fd local(::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (local.valid()) {
      sockaddr_un a{};
      a.sun_family = AF_UNIX;
      std::string name = socketName(static_cast<int32_t>(::getpid()));
      std::memcpy(a.sun_path + 1, name.data(), name.size());  // abstract: no file to clean up
      socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
      if (::bind(local.get(), reinterpret_cast<sockaddr*>(&a), len) != 0 ||
          ::listen(local.get(), 64) != 0) {
        STRATA_LOG(Debug, kSub, "no local status socket @{}: {}", name, net::errnoText(errno));
        local.reset();
      }
    }
    thread_ = std::thread([this, fd = std::move(local)]() mutable { run(std::move(fd)); });
  }

  void wake() {
    if (wakeFd_ < 0) return;
    uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(wakeFd_, &one, sizeof one);
  }

  void run(net::Fd local);
  void accept(int listenFd, const std::shared_ptr<Scope>& scope, std::list<Conn>& conns);
  void serve(Conn& c, const Request& q);

  std::mutex lifeMu_;  ///< start/stop; never taken by the thread
  std::mutex mu_;
  std::vector<std::weak_ptr<Scope>> scopes_;
  std::thread thread_;
  int wakeFd_ = -1;
  std::atomic<bool> stop_{false};
};

void logRejected(const handshake::ListenSide& hs) {
  const auto level = hs.probe() ? log::Level::Debug : log::Level::Warn;
  if (log::enabled(level)) {
    log::write(level, kSub,
               fmt::format("status service: rejected a connection from {}: {}",
                           hs.remote().toString(), hs.reason()));
  }
}

Service& service() {
  // Never destroyed: no join during static destruction.
  static Service* s = [] {
    auto* created = new Service;
    ::pthread_atfork(nullptr, nullptr, [] { service().afterForkInChild(); });
    return created;
  }();
  return *s;
}

void Service::accept(int listenFd, const std::shared_ptr<Scope>& scope, std::list<Conn>& conns) {
  for (;;) {
    net::SockAddr remote;
    net::Fd fd;
    if (scope) {
      fd = net::acceptOne(listenFd, &remote);
    } else {
      fd = net::Fd(::accept4(listenFd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    }
    if (!fd.valid()) return;
    if (conns.size() >= kMaxConnections) conns.pop_front();  // the oldest: likely a stalled one
    Conn c;
    if (!scope) {
      ucred cred{};
      socklen_t len = sizeof cred;
      if (::getsockopt(fd.get(), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 ||
          (cred.uid != ::getuid() && cred.uid != 0)) {
        STRATA_LOG(Warn, kSub, "closed a local status connection from uid {} (not this user)",
                   cred.uid);
        continue;
      }
      c.local = true;
      c.fd = std::move(fd);
    } else {
      c.scope = scope;
      c.hs.emplace(std::move(fd), remote, scope->secret, handshake::Purpose::Status, scope->rank,
                   scope->size, Deadline::after(kConnectionSeconds));
      if (c.hs->step() == handshake::ListenSide::State::Rejected) {
        logRejected(*c.hs);
        continue;
      }
    }
    conns.push_back(std::move(c));
  }
}

void Service::serve(Conn& c, const Request& q) {
  Reply rep;
  std::shared_ptr<Scope> scope = c.scope;
  auto all = scopes();
  if (!scope) {
    for (auto& s : all) {
      if (q.jobId == 0 || s->jobId == q.jobId) {
        scope = s;
        break;
      }
    }
  } else if (q.jobId != 0 && q.jobId != scope->jobId) {
    scope = nullptr;
  }
  if (q.type == RequestType::List) {
    for (auto& s : all) {
      if (!c.scope || s == c.scope) rep.states.push_back(s->snapshot());
    }
  } else if (!scope) {
    rep.error = fmt::format("this process (pid {}) has no job {:016x}", ::getpid(), q.jobId);
  } else if (q.type == RequestType::Status) {
    rep.states.push_back(scope->snapshot());
  } else {
    // Dump: ask every rank, which takes up to watch.query_timeout; not on this thread.
    net::Fd fd = c.local ? std::move(c.fd) : c.hs->takeFd();
    std::thread([scope, fd = std::move(fd)]() mutable {
      Reply r;
      try {
        auto answers = collect(*scope, scope->queryTimeout);
        r.states.reserve(answers.size());
        for (auto& a : answers) r.states.push_back(a.state);
        r.text = describeJob(*scope, answers);
      } catch (const std::exception& e) {
        r.error = e.what();
      }
      try {
        handshake::writeRecord(fd.get(), encodeReply(r), Deadline::after(kConnectionSeconds),
                               "status reply");
      } catch (const std::exception&) {
      }
    }).detach();
    return;
  }
  try {
    handshake::writeRecord(c.sock(), encodeReply(rep), Deadline::after(0.5), "status reply");
  } catch (const std::exception& e) {
    STRATA_LOG(Debug, kSub, "status reply not sent: {}", e.what());
  }
}

void Service::run(net::Fd local) {
  std::list<Conn> conns;
  while (!stop_) {
    auto all = scopes();
    std::vector<pollfd> fds;
    std::vector<std::pair<int, std::shared_ptr<Scope>>> listeners;
    fds.push_back({wakeFd_, POLLIN, 0});
    if (local.valid()) {
      fds.push_back({local.get(), POLLIN, 0});
      listeners.emplace_back(local.get(), nullptr);
    }
    for (auto& s : all) {
      if (s->listener.valid()) {
        fds.push_back({s->listener.get(), POLLIN, 0});
        listeners.emplace_back(s->listener.get(), s);
      }
    }
    const size_t firstConn = fds.size();
    Deadline next = Deadline::after(1.0);
    for (auto& c : conns) {
      fds.push_back({c.sock(), POLLIN, 0});
      next = Deadline::earlier(next, c.deadline);
    }
    int rc = ::poll(fds.data(), fds.size(), next.pollMs(1000) + 1);
    if (rc < 0 && errno != EINTR) {
      STRATA_LOG(Warn, kSub, "status service: poll(): {}", net::errnoText(errno));
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      continue;
    }
    if (fds[0].revents) {
      uint64_t v = 0;
      [[maybe_unused]] ssize_t n = ::read(wakeFd_, &v, sizeof v);
    }
    size_t i = firstConn;
    for (auto it = conns.begin(); it != conns.end(); ++i) {
      Conn& c = *it;
      bool readable = i < fds.size() && fds[i].revents != 0;
      bool drop = c.deadline.expired();
      try {
        if (!drop && !c.local && c.hs->state() == handshake::ListenSide::State::InProgress &&
            readable) {
          if (c.hs->step() == handshake::ListenSide::State::Rejected) {
            logRejected(*c.hs);
            drop = true;
          }
        }
        bool ready = c.local || c.hs->state() == handshake::ListenSide::State::Accepted;
        if (!drop && ready && readable && c.reader.step(c.sock(), "status request")) {
          serve(c, decodeRequest(c.reader.record()));
          drop = true;
        }
      } catch (const std::exception& e) {
        STRATA_LOG(Debug, kSub, "status service: dropped a connection: {}", e.what());
        drop = true;
      }
      it = drop ? conns.erase(it) : std::next(it);
    }
    for (size_t k = 0; k < listeners.size(); ++k) {
      if (fds[k + 1].revents & POLLIN) accept(listeners[k].first, listeners[k].second, conns);
    }
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Asking

namespace {

Answer::Kind classify(const std::string& error, ErrorCode code) {
  if (error.find("connection refused") != std::string::npos) return Answer::Kind::Exited;
  if (error.find("connect timed out") != std::string::npos ||
      error.find("timed out during the connect") != std::string::npos) {
    return Answer::Kind::Unreachable;
  }
  if (code == ErrorCode::Timeout) return Answer::Kind::NoAnswer;
  if (error.find("closed the connection") != std::string::npos) return Answer::Kind::Exited;
  return Answer::Kind::Failed;
}

bool sameHostProcessGone(const std::string& host, int32_t pid) {
  return pid > 0 && host == hostName() && processGone(pid);
}

}  // namespace

std::vector<Answer> collect(Scope& scope, double seconds) {
  const Deadline deadline = Deadline::after(seconds);
  const Deadline connectDeadline = Deadline::after(std::min(0.5, seconds / 2));
  std::vector<Answer> out(static_cast<size_t>(scope.size));
  out[static_cast<size_t>(scope.rank)].kind = Answer::Kind::Self;
  out[static_cast<size_t>(scope.rank)].state = scope.snapshot();
  struct Query {
    int peer = -1;
    std::optional<handshake::ConnectSide> cs;
    net::Fd fd;
    handshake::RecordReader reader{kMaxPeerReply};
    bool done = false;
  };
  std::vector<Query> qs;
  const auto request = encodeRequest({RequestType::Status, scope.jobId});
  for (int p = 0; p < scope.size; ++p) {
    if (p == scope.rank) continue;
    Answer& a = out[static_cast<size_t>(p)];
    a.state.rank = p;
    a.state.host = scope.peers[static_cast<size_t>(p)].host;
    a.state.pid = scope.peers[static_cast<size_t>(p)].pid;
    const std::string& address = scope.peers[static_cast<size_t>(p)].address;
    if (address.empty()) {
      a.kind = Answer::Kind::Failed;
      a.error = "it runs no status service (watch.enabled = false there?)";
      continue;
    }
    try {
      Query q;
      q.peer = p;
      q.cs.emplace(net::SockAddr::parseNumeric(address), scope.secret, handshake::Purpose::Status,
                   scope.rank, scope.size, p, connectDeadline, deadline,
                   fmt::format("status of rank {} at {}", p, address));
      qs.push_back(std::move(q));
    } catch (const std::exception& e) {
      a.kind = Answer::Kind::Failed;
      a.error = e.what();
    }
  }
  auto finish = [&](Query& q, Answer::Kind kind, std::string error) {
    q.done = true;
    q.fd.reset();
    q.cs.reset();
    Answer& a = out[static_cast<size_t>(q.peer)];
    a.kind = kind;
    a.error = std::move(error);
    if (kind == Answer::Kind::NoAnswer && sameHostProcessGone(a.state.host, a.state.pid)) {
      a.kind = Answer::Kind::Exited;
    }
  };
  for (;;) {
    std::vector<pollfd> fds;
    std::vector<Query*> who;
    Deadline next = deadline;
    for (auto& q : qs) {
      if (q.done) continue;
      if (q.cs) {
        auto st = q.cs->step();
        if (st == handshake::ConnectSide::State::Failed) {
          finish(q, classify(q.cs->error(), q.cs->errorCode()), q.cs->error());
          continue;
        }
        if (st == handshake::ConnectSide::State::Done) {
          q.fd = q.cs->takeFd();
          q.cs.reset();
          try {
            handshake::writeRecord(q.fd.get(), request, deadline, "status request");
          } catch (const Error& e) {
            finish(q, Answer::Kind::Exited, e.what());
            continue;
          }
        } else {
          next = Deadline::earlier(next, q.cs->wakeAt());
          if (q.cs->fd() >= 0) {
            fds.push_back({q.cs->fd(), q.cs->events(), 0});
            who.push_back(&q);
          }
          continue;
        }
      }
      fds.push_back({q.fd.get(), POLLIN, 0});
      who.push_back(&q);
    }
    bool pending = std::any_of(qs.begin(), qs.end(), [](const Query& q) { return !q.done; });
    if (!pending) break;
    if (deadline.expired()) {
      for (auto& q : qs) {
        if (q.done) continue;
        // Connected (the connect has its own, earlier deadline), but no answer.
        finish(q, Answer::Kind::NoAnswer, "no answer within watch.query_timeout");
      }
      break;
    }
    int rc = ::poll(fds.data(), fds.size(), next.pollMs(100) + 1);
    if (rc < 0 && errno != EINTR) break;
    for (size_t k = 0; k < fds.size(); ++k) {
      Query& q = *who[k];
      if (q.cs || q.done || fds[k].revents == 0) continue;
      try {
        if (q.reader.step(q.fd.get(), "status reply")) {
          Reply rep = decodeReply(q.reader.record());
          Answer& a = out[static_cast<size_t>(q.peer)];
          if (!rep.error.empty() || rep.states.empty()) {
            finish(q, Answer::Kind::Failed, rep.error.empty() ? "an empty reply" : rep.error);
          } else if (rep.states.front().rank != q.peer || rep.states.front().jobId != scope.jobId) {
            finish(q, Answer::Kind::Failed,
                   fmt::format("it answered as rank {} of job {:016x}", rep.states.front().rank,
                               rep.states.front().jobId));
          } else {
            a.state = std::move(rep.states.front());
            finish(q, Answer::Kind::Answered, {});
          }
        }
      } catch (const Error& e) {
        finish(q, e.code() == ErrorCode::PeerLost ? Answer::Kind::Exited : Answer::Kind::Failed,
               e.what());
      }
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Analysis

namespace {

std::string rankList(std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  std::string s;
  size_t shown = 0;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (shown >= 12) {
      s += fmt::format(" and {} more", ranks.size() - i);
      break;
    }
    if (!s.empty()) s += ", ";
    if (j - i >= 2) {
      s += fmt::format("{}-{}", ranks[i], ranks[j]);
    } else {
      s += std::to_string(ranks[i]);
      if (j > i) s += ", " + std::to_string(ranks[j]);
    }
    ++shown;
    i = j + 1;
  }
  return s;
}

std::string ranksWord(const std::vector<int>& ranks) {
  size_t n = ranks.size();
  return fmt::format("{} {}", n == 1 ? "rank" : "ranks", rankList(ranks));
}

std::string callLabel(const CallState& c, bool withDomain) {
  std::string s = c.seq > 0 ? fmt::format("{} #{}", c.op, c.seq) : c.op;
  if (withDomain && c.domain != "bootstrap" && c.domain.rfind("communicator", 0) != 0) return s;
  if (withDomain && c.domain == "bootstrap") return "bootstrap " + s;
  return s;
}

/// The innermost call of a state in a domain (the last started).
const CallState* inDomain(const RankState& s, const std::string& domain) {
  for (auto it = s.calls.rbegin(); it != s.calls.rend(); ++it) {
    if (it->domain == domain) return &*it;
  }
  return nullptr;
}

enum class RootKind { Mismatch, NoAnswer, Elsewhere, Unreachable, Exited };

struct Root {
  int rank = -1;
  RootKind kind = RootKind::NoAnswer;
  std::string why;
  bool tentative = false;  ///< another sequence number only: see analyse()
};

struct Analysis {
  std::vector<Root> roots;
  std::map<int, std::vector<int>> waiters;  ///< root -> ranks whose waits lead to it
};

/// ref: the call the job is in (the failing call of this rank, or the most common one).
Analysis analyse(const std::vector<Answer>& answers, const CallState& ref, int selfRank) {
  const int n = static_cast<int>(answers.size());
  Analysis v;
  std::vector<const CallState*> cur(static_cast<size_t>(n), nullptr);
  std::map<std::pair<std::string, uint64_t>, std::vector<int>> byCall;
  for (int p = 0; p < n; ++p) {
    const Answer& a = answers[static_cast<size_t>(p)];
    if (a.kind != Answer::Kind::Answered && a.kind != Answer::Kind::Self) continue;
    cur[static_cast<size_t>(p)] = inDomain(a.state, ref.domain);
    if (cur[static_cast<size_t>(p)] && ref.seq > 0 && cur[static_cast<size_t>(p)]->seq > 0) {
      byCall[{cur[static_cast<size_t>(p)]->op, cur[static_cast<size_t>(p)]->seq}].push_back(p);
    }
  }
  // The call most ranks are in (ties: the reference's).
  std::pair<std::string, uint64_t> major{ref.op, ref.seq};
  size_t best = byCall.count(major) ? byCall[major].size() : 0;
  for (auto& [k, ranks] : byCall) {
    if (ranks.size() > best) {
      best = ranks.size();
      major = k;
    }
  }
  // For a point-to-point wait (no sequence number) only the ranks on this rank's chain of
  // waits matter: the others may be anywhere.
  std::vector<bool> onChain(static_cast<size_t>(n), ref.seq > 0);
  if (ref.seq == 0 && selfRank >= 0 && selfRank < n) {
    int q = selfRank;
    for (int hop = 0; hop < n; ++hop) {
      onChain[static_cast<size_t>(q)] = true;
      const CallState* c = cur[static_cast<size_t>(q)];
      if (!c || c->waitingFor < 0 || c->waitingFor >= n) break;
      q = c->waitingFor;
      if (onChain[static_cast<size_t>(q)]) break;
      onChain[static_cast<size_t>(q)] = true;
      if (!cur[static_cast<size_t>(q)]) break;
    }
  }
  // At each sequence number the ranks are in, the operation most of them are in there (ties:
  // this rank's, else the first by name).
  std::map<uint64_t, std::string> opAt;
  for (auto& [k, ranks] : byCall) {
    auto& best = opAt[k.second];
    const bool mine = selfRank >= 0 && selfRank < n && cur[static_cast<size_t>(selfRank)] &&
                      cur[static_cast<size_t>(selfRank)]->seq == k.second &&
                      cur[static_cast<size_t>(selfRank)]->op == k.first;
    if (best.empty()) {
      best = k.first;
      continue;
    }
    const size_t have = byCall[{best, k.second}].size();
    if (ranks.size() > have || (ranks.size() == have && mine)) best = k.first;
  }
  const std::string majorLabel =
      major.second > 0 ? fmt::format("{} #{}", major.first, major.second) : major.first;
  for (int p = 0; p < n; ++p) {
    const Answer& a = answers[static_cast<size_t>(p)];
    const CallState* c = cur[static_cast<size_t>(p)];
    Root r;
    r.rank = p;
    switch (a.kind) {
      case Answer::Kind::NoAnswer:
        r.kind = RootKind::NoAnswer;
        r.why =
            "made no progress: it is not answering (stopped by a signal or a debugger, "
            "swapping, or starved of CPU)";
        break;
      case Answer::Kind::Exited:
        r.kind = RootKind::Exited;
        r.why = "has exited (its status port refuses connections)";
        break;
      case Answer::Kind::Unreachable:
        r.kind = RootKind::Unreachable;
        r.why = fmt::format(
            "cannot be reached from rank {} ({}): the network between the two hosts may be down",
            selfRank, a.error);
        break;
      case Answer::Kind::Failed:
        continue;
      case Answer::Kind::Answered:
      case Answer::Kind::Self:
        if (!c) {
          if (!onChain[static_cast<size_t>(p)]) continue;
          r.kind = RootKind::Elsewhere;
          if (!a.state.calls.empty()) {
            const CallState& other = a.state.calls.back();
            r.why = fmt::format("is in {} while {} in {}", callLabel(other, true),
                                byCall.count(major) && byCall[major].size() > 1
                                    ? ranksWord(byCall[major]) + " are"
                                    : "this rank is",
                                majorLabel);
          } else {
            r.why =
                "is in no strata call: it is running the application's own code (or "
                "finished its calls early)";
          }
          break;
        }
        if (ref.seq > 0 && c->seq > 0) {
          // Another operation at the same sequence number is a mismatch. Another sequence
          // number is not by itself: a rank that got all it needed from a call goes on to the
          // next one while the others still wait (a broadcast's root may run ahead further).
          const std::string& right = opAt[c->seq];
          if (!right.empty() && c->op != right) {
            r.kind = RootKind::Mismatch;
            const std::vector<int>& others = byCall[{right, c->seq}];
            r.why =
                fmt::format("is in {} #{} while {} {} in {} #{}", c->op, c->seq, ranksWord(others),
                            others.size() == 1 ? "is" : "are", right, c->seq);
            break;
          }
          if (c->op != major.first || c->seq != major.second) {
            // Tentative: kept below only when its waits come back to it (it skipped a call).
            r.kind = RootKind::Mismatch;
            r.tentative = true;
            std::vector<int> majors = byCall[major];
            r.why = fmt::format("is in {} #{} while {} {} in {}", c->op, c->seq, ranksWord(majors),
                                majors.size() == 1 ? "is" : "are", majorLabel);
            break;
          }
        }
        continue;
    }
    v.roots.push_back(std::move(r));
  }
  // A rank in another sequence number of the same operation that waits, directly or through
  // others, for a rank at fault for another reason (not answering, exited, elsewhere) only lags
  // behind because of it: a stopped rank that sent its part of allReduce #50 to some ranks
  // and not to others leaves those in #50 while the rest are in #51. It waited; it is not the
  // cause. (A rank that skipped a call waits for ranks that wait for it: it stays named.)
  std::vector<bool> otherRoot(static_cast<size_t>(n), false);
  for (auto& r : v.roots) {
    if (r.kind != RootKind::Mismatch) otherRoot[static_cast<size_t>(r.rank)] = true;
  }
  // Likewise a rank one call ahead or behind whose waits simply end (skew: it got all it
  // needed from one call and went on). Only one whose waits come back to it is kept.
  std::erase_if(v.roots, [&](const Root& r) {
    if (!r.tentative) return false;
    std::vector<bool> seen(static_cast<size_t>(n), false);
    int q = r.rank;
    for (int hop = 0; hop <= n; ++hop) {
      const CallState* w = cur[static_cast<size_t>(q)];
      if (!w || w->waitingFor < 0 || w->waitingFor >= n) return true;
      seen[static_cast<size_t>(q)] = true;
      q = w->waitingFor;
      if (otherRoot[static_cast<size_t>(q)]) return true;
      if (seen[static_cast<size_t>(q)]) return false;
    }
    return true;
  });
  // Who waited for whom: follow each rank's waits to a root.
  std::vector<bool> isRoot(static_cast<size_t>(n), false);
  for (auto& r : v.roots) isRoot[static_cast<size_t>(r.rank)] = true;
  for (int p = 0; p < n; ++p) {
    if (isRoot[static_cast<size_t>(p)]) continue;
    int q = p;
    for (int hop = 0; hop < n; ++hop) {
      const CallState* c = cur[static_cast<size_t>(q)];
      if (!c || c->waitingFor < 0 || c->waitingFor >= n) break;
      q = c->waitingFor;
      if (isRoot[static_cast<size_t>(q)]) {
        v.waiters[q].push_back(p);
        break;
      }
    }
  }
  // By kind; within a kind, ranks that others wait for first.
  std::stable_sort(v.roots.begin(), v.roots.end(), [&](const Root& a, const Root& b) {
    if (a.kind != b.kind) return a.kind < b.kind;
    return v.waiters.count(a.rank) > v.waiters.count(b.rank);
  });
  return v;
}

std::string whoIs(const Answer& a, int rank, int selfRank) {
  std::string self = rank == selfRank ? " (this rank)" : "";
  if (a.state.host.empty()) return fmt::format("rank {}{}", rank, self);
  return fmt::format("rank {}{} on host {} (pid {})", rank, self, a.state.host, a.state.pid);
}

std::string verdictText(const Analysis& v, const std::vector<Answer>& answers, int selfRank) {
  std::string s;
  size_t shown = 0;
  for (const Root& r : v.roots) {
    if (shown == 4) {
      s += fmt::format("; and {} more rank(s) at fault", v.roots.size() - shown);
      break;
    }
    if (!s.empty()) s += "; also ";
    s += whoIs(answers[static_cast<size_t>(r.rank)], r.rank, selfRank) + " " + r.why;
    auto w = v.waiters.find(r.rank);
    if (w != v.waiters.end() && !w->second.empty()) {
      s += fmt::format("; {} waited for it", ranksWord(w->second));
    }
    ++shown;
  }
  return s;
}

std::string stateLine(const Answer& a, int rank) {
  std::string head = fmt::format("rank {:>4}  {}  pid {}", rank,
                                 a.state.host.empty() ? "?" : a.state.host, a.state.pid);
  switch (a.kind) {
    case Answer::Kind::NoAnswer:
      return head +
             "  NOT ANSWERING (stopped by a signal or a debugger, swapping, or starved of CPU)";
    case Answer::Kind::Exited:
      return head + "  EXITED (its status port refuses connections)";
    case Answer::Kind::Unreachable:
      return head + "  UNREACHABLE: " + a.error;
    case Answer::Kind::Failed:
      return head + "  no answer: " + a.error;
    default:
      break;
  }
  if (a.state.calls.empty()) return head + "  not in any call";
  std::string s = head;
  for (const CallState& c : a.state.calls) {
    s += fmt::format("  {} {} for {:.1f} s", c.domain, callLabel(c, false), c.seconds);
    if (c.waitingFor >= 0) {
      s += fmt::format(", waiting for rank {} for {:.1f} s", c.waitingFor, c.waitingSeconds);
      if (!c.detail.empty()) s += " (" + c.detail + ")";
    }
    if (c.failed) s += " [failed]";
  }
  return s;
}

std::string describeAnswers(uint64_t jobId, int size, int rank, const std::vector<Answer>& answers,
                            const std::vector<PeerInfo>& peers = {}) {
  std::string out = fmt::format("job {:016x}: {} ranks, asked from rank {}\n", jobId, size, rank);
  for (size_t p = 0; p < answers.size(); ++p) {
    out += stateLine(answers[p], static_cast<int>(p));
    if (p < peers.size() && !peers[p].address.empty()) {
      out += "  [status " + peers[p].address + "]";
    }
    out += "\n";
  }
  // The reference: the most common innermost (domain, op, seq) among ranks in a call.
  std::map<std::tuple<std::string, std::string, uint64_t>, int> count;
  for (auto& a : answers) {
    if ((a.kind == Answer::Kind::Answered || a.kind == Answer::Kind::Self) &&
        !a.state.calls.empty()) {
      const CallState& c = a.state.calls.back();
      ++count[{c.domain, c.op, c.seq}];
    }
  }
  if (count.empty()) {
    bool allAnswered = std::all_of(answers.begin(), answers.end(), [](const Answer& a) {
      return a.kind == Answer::Kind::Answered || a.kind == Answer::Kind::Self;
    });
    out += allAnswered ? "verdict: every rank answered; none is in a strata call\n"
                       : "verdict: no rank is in a strata call; some did not answer (above)\n";
    return out;
  }
  auto best = std::max_element(count.begin(), count.end(),
                               [](auto& a, auto& b) { return a.second < b.second; });
  CallState ref;
  std::tie(ref.domain, ref.op, ref.seq) = best->first;
  Analysis v = analyse(answers, ref, rank);
  if (v.roots.empty()) {
    out += fmt::format(
        "verdict: every rank answered; the ranks in a call are in {} {} "
        "(nobody is stopped or in another call)\n",
        ref.domain, ref.seq > 0 ? fmt::format("{} #{}", ref.op, ref.seq) : ref.op);
  } else {
    out += "verdict: " + verdictText(v, answers, -1) + "\n";
  }
  return out;
}

}  // namespace

std::string describeJob(Scope& scope, const std::vector<Answer>& answers) {
  return describeAnswers(scope.jobId, scope.size, scope.rank, answers, scope.peers);
}

Error diagnose(const Error& e) noexcept {
  try {
    Call::Rec* rec = tlsCall;
    Scope* scope = tlsScope;
    if (tlsDiagnosed != e.what()) {
      tlsVerdictRoot = -1;
      tlsVerdictText.clear();
    }
    if (!rec || !scope || scope->size < 2) return e;
    if (e.code() != ErrorCode::Timeout && e.code() != ErrorCode::ProtocolError &&
        e.code() != ErrorCode::PeerLost) {
      return e;
    }
    if (tlsDiagnosed == e.what()) return e;  // an inner call's diagnosis, passing through
    rec->failed = true;
    auto answers = collect(*scope, scope->queryTimeout);
    CallState ref;
    ref.domain = rec->domain;
    const char* op = rec->opStatic.load(std::memory_order_relaxed);
    ref.op = op ? std::string(op) : rec->op;
    ref.seq = rec->seq.load(std::memory_order_relaxed);
    Analysis v = analyse(answers, ref, scope->rank);
    if (v.roots.empty()) return e;
    tlsVerdictRoot = v.roots.front().rank;
    tlsVerdictText = verdictText(v, answers, -1);
    std::string text = fmt::format("{}. This rank ({}): {}", verdictText(v, answers, scope->rank),
                                   scope->rank, e.what());
    int peer = v.roots.front().rank == scope->rank ? e.peer() : v.roots.front().rank;
    Error out(e.code(), text, peer);
    tlsDiagnosed = out.what();
    return out;
  } catch (...) {
    return e;
  }
}

Verdict lastVerdict() noexcept {
  try {
    return {tlsVerdictRoot, tlsVerdictText};
  } catch (...) {
    return {};
  }
}

// ---------------------------------------------------------------------------------------------
// Tools

Reply askLocal(int32_t pid, const Request& request, double seconds) {
  Deadline dl = Deadline::after(seconds);
  net::Fd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) throw Error(ErrorCode::SystemError, "socket(AF_UNIX): " + net::errnoText(errno));
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::string name = socketName(pid);
  std::memcpy(a.sun_path + 1, name.data(), name.size());
  socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&a), len) != 0) {
    throw Error(ErrorCode::PeerLost,
                fmt::format("process {} runs no strata status service (@{}: {})", pid, name,
                            net::errnoText(errno)));
  }
  net::setNonBlocking(fd.get());
  handshake::writeRecord(fd.get(), encodeRequest(request), dl, "status request");
  return decodeReply(
      handshake::readRecord(fd.get(), kMaxReply, dl, fmt::format("status of process {}", pid)));
}

Reply askRemote(const std::string& address, const std::string& secret, const Request& request,
                double seconds) {
  Deadline dl = Deadline::after(seconds);
  std::string host;
  uint16_t port = 0;
  net::splitHostPort(address, host, port, "status address");
  auto addrs = net::resolve(host, port);
  net::Fd fd = net::connectWithRetry({addrs.front()}, Deadline::after(std::min(2.0, seconds)),
                                     "status service at " + address);
  handshake::connectSide(fd.get(), secret, handshake::Purpose::Status, 0, 0, -1, dl,
                         "status service at " + address);
  handshake::writeRecord(fd.get(), encodeRequest(request), dl, "status request");
  return decodeReply(handshake::readRecord(fd.get(), kMaxReply, dl, "status of " + address));
}

std::vector<int32_t> localServices() {
  std::vector<int32_t> pids;
  std::ifstream in("/proc/net/unix");
  std::string line;
  const std::string marker = "@strata-status.";
  while (std::getline(in, line)) {
    auto at = line.find(marker);
    if (at == std::string::npos) continue;
    try {
      int32_t pid = std::stoi(line.substr(at + marker.size()));
      if (std::find(pids.begin(), pids.end(), pid) == pids.end()) pids.push_back(pid);
    } catch (const std::exception&) {
    }
  }
  std::sort(pids.begin(), pids.end());
  return pids;
}

// ---------------------------------------------------------------------------------------------
// The watched bootstrap

namespace {

class Watched final : public Bootstrap {
 public:
  Watched(std::unique_ptr<Bootstrap> inner, std::shared_ptr<Scope> scope)
      : inner_(std::move(inner)), scope_(std::move(scope)) {}
  ~Watched() override {
    service().remove(scope_.get());
    inner_.reset();
  }
  std::string_view backend() const noexcept override { return inner_->backend(); }
  int rank() const noexcept override { return inner_->rank(); }
  int size() const noexcept override { return inner_->size(); }
  int localRank() const noexcept override { return inner_->localRank(); }
  int localSize() const noexcept override { return inner_->localSize(); }
  void send(int peer, int tag, const void* data, size_t bytes) override {
    Call c(scope_, "bootstrap", "send", 0);
    run([&] { inner_->send(peer, tag, data, bytes); });
  }
  void recv(int peer, int tag, void* data, size_t bytes) override {
    Call c(scope_, "bootstrap", "recv", 0);
    run([&] { inner_->recv(peer, tag, data, bytes); });
  }
  void allGather(void* data, size_t bytesPerRank) override {
    Call c(scope_, "bootstrap", "allGather", nextBootstrapSeq(*scope_));
    run([&] { inner_->allGather(data, bytesPerRank); });
  }
  void broadcast(void* data, size_t bytes, int root) override {
    Call c(scope_, "bootstrap", "broadcast", nextBootstrapSeq(*scope_));
    run([&] { inner_->broadcast(data, bytes, root); });
  }
  void barrier() override {
    Call c(scope_, "bootstrap", "barrier", nextBootstrapSeq(*scope_));
    run([&] { inner_->barrier(); });
  }
  void abort(std::string_view reason) noexcept override { inner_->abort(reason); }

  Bootstrap& inner() { return *inner_; }
  const std::shared_ptr<Scope>& scope() const { return scope_; }

 private:
  template <class F>
  void run(F&& f) {
    try {
      f();
    } catch (const Error& e) {
      // A peer that closed its bootstrap because a call of its own failed is not the cause
      // either: it waited for someone too.
      if (e.code() == ErrorCode::Timeout || e.code() == ErrorCode::ProtocolError ||
          (e.code() == ErrorCode::PeerLost &&
           std::string_view(e.what()).find("after a call of its own failed") !=
               std::string_view::npos)) {
        throw diagnose(e);
      }
      throw;
    }
  }
  std::unique_ptr<Bootstrap> inner_;
  std::shared_ptr<Scope> scope_;
};

}  // namespace

std::unique_ptr<Bootstrap> attach(std::unique_ptr<Bootstrap> inner, const Config& config) {
  if (!inner || inner->size() < 2 || !config::getBool(config, "watch.enabled")) {
    return attach(std::move(inner), config, LaunchInfo{});
  }
  return attach(std::move(inner), config, detectLaunch(config));
}

std::unique_ptr<Bootstrap> attach(std::unique_ptr<Bootstrap> inner, const Config& config,
                                  const LaunchInfo& launch) {
  if (!inner || inner->size() < 2 || !config::getBool(config, "watch.enabled")) return inner;
  auto scope = std::make_shared<Scope>();
  scope->rank = inner->rank();
  scope->size = inner->size();
  scope->host = hostName();
  scope->pid = static_cast<int32_t>(::getpid());
  scope->queryTimeout = config::getDouble(config, "watch.query_timeout");
  PeerInfo me{"", scope->host, scope->pid};
  try {
    const std::string& root = launch.root;
    std::vector<net::SockAddr> hint;
    if (!root.empty()) {
      std::string host;
      uint16_t port = 0;
      net::splitHostPort(root, host, port, "rendezvous address");
      hint = net::resolve(host, port);
    }
    auto iface = netif::select(config::getString(config, "bootstrap.tcp.interface"), 0,
                               hint.empty() ? nullptr : hint.front().get());
    net::SockAddr a =
        net::SockAddr::fromRaw(reinterpret_cast<const sockaddr*>(&iface.addr), iface.addrLen);
    a.setPort(0);
    scope->listener = net::listenOn(a, 256);
    std::string address = net::localAddress(scope->listener.get()).toString();
    if (address.size() > kMaxExchangeAddress) {
      scope->listener.reset();
      throw Error(ErrorCode::Internal,
                  fmt::format("its address {} is too long to publish", address));
    }
    me.address = address;
  } catch (const std::exception& e) {
    STRATA_LOG(Warn, kSub,
               "rank {}: no status service ({}); a stalled job's errors will not say which rank "
               "is stuck",
               scope->rank, e.what());
  }
  uint64_t mine = 0;
  crypto::randomBytes(std::span<uint8_t>(reinterpret_cast<uint8_t*>(&mine), sizeof mine));
  // The status port takes the job secret; without one, rank 0 makes one for the status service
  // and sends it over the bootstrap (authenticated itself, or PMIx's), so that only the job's
  // ranks can ask (local tools use the same-user unix socket instead). The job secret itself is
  // never sent: every rank has it, and it may be longer than the exchange record holds.
  std::string madeSecret;
  if (launch.secret.empty() && scope->rank == 0) {
    std::array<uint8_t, 24> raw{};
    crypto::randomBytes(raw);
    madeSecret = crypto::toHex(raw);
  }
  std::vector<uint8_t> all(kExchangeSlot * static_cast<size_t>(scope->size));
  auto slot = encodeExchange({mine, madeSecret, me});
  std::memcpy(all.data() + kExchangeSlot * static_cast<size_t>(scope->rank), slot.data(),
              kExchangeSlot);
  inner->allGather(all.data(), kExchangeSlot);
  scope->peers.resize(static_cast<size_t>(scope->size));
  for (int r = 0; r < scope->size; ++r) {
    Exchange x = decodeExchange(std::span<const uint8_t>(all).subspan(
                                    kExchangeSlot * static_cast<size_t>(r), kExchangeSlot),
                                r);
    scope->peers[static_cast<size_t>(r)] = std::move(x.peer);
    if (r == 0) {
      scope->jobId = x.jobId;
      scope->secret = launch.secret.empty() ? x.secret : launch.secret;
    }
  }
  service().add(scope);
  return std::make_unique<Watched>(std::move(inner), std::move(scope));
}

Bootstrap& unwrap(Bootstrap& b) {
  if (auto* w = dynamic_cast<Watched*>(&b)) return w->inner();
  return b;
}

std::shared_ptr<Scope> scopeOf(const Bootstrap* b) {
  if (auto* w = dynamic_cast<const Watched*>(b)) return w->scope();
  return nullptr;
}

// ---------------------------------------------------------------------------------------------
// Test seam (base/watch_testing.hpp)

namespace testing {

std::string rankList(std::vector<int> ranks) {
  return watch::rankList(std::move(ranks));
}

Finding analyse(const std::vector<Answer>& answers, const CallState& ref, int selfRank) {
  Analysis v = watch::analyse(answers, ref, selfRank);
  Finding f;
  for (const Root& r : v.roots) f.roots.push_back(r.rank);
  f.waiters = v.waiters;
  f.text = verdictText(v, answers, selfRank);
  return f;
}

std::string describe(uint64_t jobId, int rank, const std::vector<Answer>& answers) {
  return describeAnswers(jobId, static_cast<int>(answers.size()), rank, answers);
}

}  // namespace testing

}  // namespace strata::watch
