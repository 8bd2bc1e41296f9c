// Asking: every peer of a scope at once, without blocking on any (collect), and, for tools, one
// process's unix socket or one status port.

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <optional>

#include <fmt/format.h>

#include <strata/error.hpp>

#include "base/deadline.hpp"
#include "base/process.hpp"
#include "net/handshake.hpp"
#include "net/socket.hpp"
#include "served_scope.hpp"
#include "watch/watch.hpp"

namespace strata::watch {

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
  return pid > 0 && host == process::hostName() && process::gone(pid);
}

}  // namespace

std::vector<Answer> askEach(ServedScope& scope, const std::vector<int>& peers,
                            const std::vector<uint8_t>& request, double seconds,
                            const TakeReply& take, const std::atomic<bool>* cancel) {
  const Deadline deadline = Deadline::after(seconds);
  const Deadline connectDeadline = Deadline::after(std::min(0.5, seconds / 2));
  std::vector<Answer> out(static_cast<size_t>(scope.size()));
  out[static_cast<size_t>(scope.rank())].kind = Answer::Kind::Self;
  struct Query {
    int peer = -1;
    std::optional<handshake::ConnectSide> cs;
    net::Fd fd;
    handshake::RecordReader reader{kMaxPeerReply};
    bool done = false;
  };
  std::vector<Query> qs;
  for (int p : peers) {
    if (p == scope.rank() || p < 0 || p >= scope.size()) continue;
    Answer& a = out[static_cast<size_t>(p)];
    a.report.rank = p;
    a.report.host = scope.peers[static_cast<size_t>(p)].host;
    a.report.pid = scope.peers[static_cast<size_t>(p)].pid;
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
                   scope.rank(), scope.size(), p, connectDeadline, deadline,
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
    if (kind == Answer::Kind::NoAnswer && sameHostProcessGone(a.report.host, a.report.pid)) {
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
    if (deadline.expired() || (cancel && cancel->load(std::memory_order_acquire))) {
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
          std::string why = take(q.peer, rep, out[static_cast<size_t>(q.peer)]);
          if (why.empty()) {
            finish(q, Answer::Kind::Answered, {});
          } else {
            finish(q, Answer::Kind::Failed, std::move(why));
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

std::vector<Answer> collect(ServedScope& scope, double seconds) {
  std::vector<int> peers;
  for (int p = 0; p < scope.size(); ++p) peers.push_back(p);
  auto out = askEach(
      scope, peers, encodeRequest(makeRequest(RequestType::Status, scope.jobId())), seconds,
      [&](int peer, Reply& rep, Answer& a) -> std::string {
        if (!rep.error.empty() || rep.reports.empty()) {
          return rep.error.empty() ? "an empty reply" : rep.error;
        }
        if (rep.reports.front().rank != peer || rep.reports.front().jobId != scope.jobId()) {
          return fmt::format("it answered as rank {} of job {:016x}", rep.reports.front().rank,
                             rep.reports.front().jobId);
        }
        a.report = std::move(rep.reports.front());
        return {};
      });
  out[static_cast<size_t>(scope.rank())].report = report(scope);
  return out;
}

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

}  // namespace strata::watch
