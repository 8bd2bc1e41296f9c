// The status service: one thread per process that answers for every scope it serves (its TCP
// port, authenticated with the job secret) and for the process (an abstract unix socket, same
// user only). A dump request asks every rank, on a thread of its own.

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <list>
#include <mutex>
#include <optional>
#include <thread>

#include <fmt/format.h>

#include "base/deadline.hpp"
#include "base/log.hpp"
#include "net/handshake.hpp"
#include "net/socket.hpp"
#include "served_scope.hpp"

namespace strata::watch {

namespace {
constexpr const char* kSub = "watch";
constexpr size_t kMaxConnections = 512;
constexpr double kConnectionSeconds = 3.0;
}  // namespace

std::string socketName(int32_t pid) {
  return fmt::format("strata-status.{}", pid);
}

namespace {

struct Conn {
  bool local = false;                  ///< the unix socket (same user), no handshake
  std::shared_ptr<ServedScope> scope;  ///< tcp: the scope whose listener took it
  std::optional<handshake::ListenSide> hs;
  net::Fd fd;  ///< local connections
  handshake::RecordReader reader{kMaxRequest};
  Deadline deadline = Deadline::after(kConnectionSeconds);
  int sock() const { return local ? fd.get() : hs->fd(); }
};

class Service {
 public:
  void add(const std::shared_ptr<ServedScope>& s) {
    std::lock_guard life(lifeMu_);
    {
      std::lock_guard lk(mu_);
      scopes_.push_back(s);
    }
    if (!thread_.joinable()) start();
    wake();
  }

  void remove(const Scope* s) {
    std::lock_guard life(lifeMu_);
    bool last = false;
    {
      std::lock_guard lk(mu_);
      std::erase_if(scopes_, [&](const std::weak_ptr<ServedScope>& w) {
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

  std::vector<std::shared_ptr<ServedScope>> scopes() {
    std::lock_guard lk(mu_);
    std::vector<std::shared_ptr<ServedScope>> out;
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
  void accept(int listenFd, const std::shared_ptr<ServedScope>& scope, std::list<Conn>& conns);
  void serve(Conn& c, const Request& q);

  std::mutex lifeMu_;  ///< start/stop; never taken by the thread
  std::mutex mu_;
  std::vector<std::weak_ptr<ServedScope>> scopes_;
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

void Service::accept(int listenFd, const std::shared_ptr<ServedScope>& scope,
                     std::list<Conn>& conns) {
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
      c.hs.emplace(std::move(fd), remote, scope->secret, handshake::Purpose::Status, scope->rank(),
                   scope->size(), Deadline::after(kConnectionSeconds));
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
  std::shared_ptr<ServedScope> scope = c.scope;
  auto all = scopes();
  if (!scope) {
    for (auto& s : all) {
      if (q.jobId == 0 || s->jobId() == q.jobId) {
        scope = s;
        break;
      }
    }
  } else if (q.jobId != 0 && q.jobId != scope->jobId()) {
    scope = nullptr;
  }
  if (q.type == RequestType::List) {
    for (auto& s : all) {
      if (!c.scope || s == c.scope) rep.reports.push_back(report(*s));
    }
  } else if (!scope) {
    rep.error = fmt::format("this process (pid {}) has no job {:016x}", ::getpid(), q.jobId);
  } else if (q.type == RequestType::Status) {
    rep.reports.push_back(report(*scope));
  } else if (q.type == RequestType::Revoke) {
    rep.error = takeRevoke(*scope, q);
  } else {
    // Dump: ask every rank, which takes up to watch.query_timeout; not on this thread.
    net::Fd fd = c.local ? std::move(c.fd) : c.hs->takeFd();
    std::thread([scope, fd = std::move(fd)]() mutable {
      Reply r;
      try {
        auto answers = collect(*scope, scope->queryTimeout);
        r.reports.reserve(answers.size());
        for (auto& a : answers) r.reports.push_back(a.report);
        r.text = describeJob(*scope, answers) + describeRevokes(*scope);
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
    std::vector<std::pair<int, std::shared_ptr<ServedScope>>> listeners;
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

void serve(const std::shared_ptr<ServedScope>& scope) {
  service().add(scope);
}

void stopServing(const Scope* scope) {
  service().remove(scope);
}

}  // namespace strata::watch
