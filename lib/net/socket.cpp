#include "net/socket.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include <fmt/format.h>

#include <strata/error.hpp>

#include "base/log.hpp"

namespace strata::net {

bool peerHasClosed(int fd) {
  pollfd p{fd, POLLIN, 0};
  int rc = ::poll(&p, 1, 0);
  if (rc <= 0) return false;
  if (p.revents & (POLLERR | POLLNVAL)) return true;
  char b = 0;
  ssize_t got = ::recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
  if (got == 0) return true;
  if (got < 0) return errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
  return false;
}

std::string errnoText(int err) {
  char buf[256];
  // GNU strerror_r returns a pointer that may or may not be buf.
  const char* s = strerror_r(err, buf, sizeof(buf));
  return s;
}

uint16_t SockAddr::port() const {
  if (family() == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(&storage)->sin_port);
  if (family() == AF_INET6)
    return ntohs(reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_port);
  return 0;
}

void SockAddr::setPort(uint16_t p) {
  if (family() == AF_INET) reinterpret_cast<sockaddr_in*>(&storage)->sin_port = htons(p);
  if (family() == AF_INET6) reinterpret_cast<sockaddr_in6*>(&storage)->sin6_port = htons(p);
}

bool SockAddr::isLoopback() const {
  if (family() == AF_INET) {
    return (ntohl(reinterpret_cast<const sockaddr_in*>(&storage)->sin_addr.s_addr) >> 24) == 127;
  }
  if (family() == AF_INET6) {
    return IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_addr);
  }
  return false;
}

std::string SockAddr::host() const {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (family() == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&storage)->sin_addr, buf, sizeof buf);
  } else if (family() == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_addr, buf,
              sizeof buf);
  } else {
    return "<no address>";
  }
  return buf;
}

std::string SockAddr::toString() const {
  if (family() == AF_INET6) return fmt::format("[{}]:{}", host(), port());
  return fmt::format("{}:{}", host(), port());
}

SockAddr SockAddr::fromRaw(const sockaddr* sa, socklen_t len) {
  SockAddr a;
  if (len > sizeof(a.storage)) len = sizeof(a.storage);
  std::memcpy(&a.storage, sa, len);
  a.len = len;
  return a;
}

void splitHostPort(std::string_view text, std::string& host, uint16_t& port,
                   std::string_view what) {
  auto bad = [&](std::string_view why) {
    return Error(ErrorCode::InvalidConfig,
                 fmt::format("{} '{}' is not host:port ({}); expected e.g. 10.0.0.1:29500, "
                             "node01:29500 or [fe80::1]:29500",
                             what, text, why));
  };
  std::string_view h, p;
  if (!text.empty() && text.front() == '[') {
    auto close = text.find(']');
    if (close == std::string_view::npos) throw bad("missing ']'");
    h = text.substr(1, close - 1);
    if (close + 1 >= text.size() || text[close + 1] != ':') throw bad("missing ':port'");
    p = text.substr(close + 2);
  } else {
    auto colon = text.rfind(':');
    if (colon == std::string_view::npos) throw bad("missing ':port'");
    h = text.substr(0, colon);
    p = text.substr(colon + 1);
    if (h.find(':') != std::string_view::npos) throw bad("IPv6 addresses need [brackets]");
  }
  if (h.empty()) throw bad("empty host");
  if (p.empty() || p.size() > 5) throw bad("bad port");
  unsigned value = 0;
  for (char c : p) {
    if (c < '0' || c > '9') throw bad("bad port");
    value = value * 10 + static_cast<unsigned>(c - '0');
  }
  if (value == 0 || value > 65535) throw bad("port out of range 1..65535");
  host = std::string(h);
  port = static_cast<uint16_t>(value);
}

SockAddr SockAddr::parseNumeric(std::string_view hostPort) {
  std::string host;
  uint16_t port = 0;
  splitHostPort(hostPort, host, port, "address");
  SockAddr a;
  auto* v4 = reinterpret_cast<sockaddr_in*>(&a.storage);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&a.storage);
  if (inet_pton(AF_INET, host.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(port);
    a.len = sizeof(sockaddr_in);
  } else if (inet_pton(AF_INET6, host.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(port);
    a.len = sizeof(sockaddr_in6);
  } else {
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("'{}' is not a numeric IPv4 or IPv6 address", host));
  }
  return a;
}

std::vector<SockAddr> resolve(const std::string& host, uint16_t port, int family) {
  addrinfo hints{};
  hints.ai_family = family;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0) {
    throw Error(ErrorCode::InvalidConfig,
                fmt::format("cannot resolve host '{}': {}", host, gai_strerror(rc)));
  }
  std::vector<SockAddr> v4, v6;
  for (auto* ai = res; ai; ai = ai->ai_next) {
    if (ai->ai_family != AF_INET && ai->ai_family != AF_INET6) continue;
    SockAddr a = SockAddr::fromRaw(ai->ai_addr, ai->ai_addrlen);
    a.setPort(port);
    auto& list = ai->ai_family == AF_INET ? v4 : v6;
    bool dup = false;
    for (auto& x : list)
      dup = dup || (x.len == a.len && std::memcmp(&x.storage, &a.storage, a.len) == 0);
    if (!dup) list.push_back(a);
  }
  freeaddrinfo(res);
  v4.insert(v4.end(), v6.begin(), v6.end());
  if (v4.empty()) {
    throw Error(ErrorCode::InvalidConfig, fmt::format("host '{}' has no IPv4/IPv6 address", host));
  }
  return v4;
}

Fd::~Fd() {
  reset();
}

Fd& Fd::operator=(Fd&& o) noexcept {
  if (this != &o) reset(o.release());
  return *this;
}

void Fd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

static Error sysError(std::string_view what, int err) {
  return Error(ErrorCode::SystemError, fmt::format("{}: {}", what, errnoText(err)));
}

void setNonBlocking(int fd) {
  int flags = fcntl(fd, F_GETFL, 0);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    throw sysError("fcntl(O_NONBLOCK)", errno);
  }
}

void setCloexec(int fd) {
  int flags = fcntl(fd, F_GETFD, 0);
  if (flags < 0 || fcntl(fd, F_SETFD, flags | FD_CLOEXEC) < 0) {
    throw sysError("fcntl(FD_CLOEXEC)", errno);
  }
}

void setNoDelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

Fd listenOn(const SockAddr& addr, int backlog) {
  Fd fd(::socket(addr.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) throw sysError("socket()", errno);
  int one = 1;
  setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (addr.family() == AF_INET6) setsockopt(fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
  if (::bind(fd.get(), addr.get(), addr.len) != 0) {
    int err = errno;
    throw Error(ErrorCode::SystemError,
                fmt::format("cannot listen on {}: bind: {}{}", addr.toString(), errnoText(err),
                            err == EADDRINUSE ? " (another process holds this port; choose "
                                                "another port or stop that process)"
                                              : ""));
  }
  if (::listen(fd.get(), backlog) != 0) throw sysError("listen()", errno);
  return fd;
}

SockAddr localAddress(int fd) {
  SockAddr a;
  a.len = sizeof(a.storage);
  if (getsockname(fd, a.get(), &a.len) != 0) throw sysError("getsockname()", errno);
  return a;
}

SockAddr peerAddress(int fd) {
  SockAddr a;
  a.len = sizeof(a.storage);
  if (getpeername(fd, a.get(), &a.len) != 0) a.len = 0;
  return a;
}

Fd connectWithRetry(const std::vector<SockAddr>& addrs, const Deadline& deadline,
                    std::string_view what) {
  if (addrs.empty()) throw Error(ErrorCode::InvalidArgument, fmt::format("{}: no address", what));
  int lastErr = 0;
  std::string lastAddr;
  double backoff = 0.001;
  for (size_t attempt = 0;; ++attempt) {
    const SockAddr& a = addrs[attempt % addrs.size()];
    Fd fd(::socket(a.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!fd.valid()) throw sysError("socket()", errno);
    int rc = ::connect(fd.get(), a.get(), a.len);
    if (rc != 0 && (errno == EINPROGRESS || errno == EINTR)) {
      pollfd p{fd.get(), POLLOUT, 0};
      int pr;
      do {
        pr = ::poll(&p, 1, deadline.pollMs(1000));
      } while (pr < 0 && errno == EINTR);
      if (pr > 0) {
        int err = 0;
        socklen_t len = sizeof err;
        getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
        rc = err == 0 ? 0 : -1;
        errno = err;
      } else {
        rc = -1;
        errno = ETIMEDOUT;
      }
    }
    if (rc == 0) {
      setNoDelay(fd.get());
      return fd;
    }
    lastErr = errno;
    lastAddr = a.toString();
    // EPIPE: the connection was made and reset at once, as by a relay or proxy whose own
    // connection to the listener was refused (the listener not up yet): retry like a refusal.
    if (lastErr != ECONNREFUSED && lastErr != ETIMEDOUT && lastErr != ENETUNREACH &&
        lastErr != EHOSTUNREACH && lastErr != ECONNRESET && lastErr != ECONNABORTED &&
        lastErr != EAGAIN && lastErr != EADDRNOTAVAIL && lastErr != EPIPE) {
      throw Error(ErrorCode::SystemError,
                  fmt::format("{}: connect to {} failed: {}", what, lastAddr, errnoText(lastErr)));
    }
    if (deadline.expired()) break;
    // Try the other addresses at once; back off only after a full round.
    if ((attempt + 1) % addrs.size() == 0) {
      double sleep = std::min(backoff, deadline.remaining());
      std::this_thread::sleep_for(std::chrono::duration<double>(sleep));
      backoff = std::min(backoff * 2, 0.2);
    }
    if (deadline.expired()) break;
  }
  throw Error(ErrorCode::Timeout,
              fmt::format("{}: could not connect to {} before the deadline (last error: {})", what,
                          lastAddr, errnoText(lastErr)));
}

Fd acceptOne(int listenFd, SockAddr* remote) {
  SockAddr a;
  a.len = sizeof(a.storage);
  int fd = ::accept4(listenFd, a.get(), &a.len, SOCK_NONBLOCK | SOCK_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    if (err == EAGAIN || err == EWOULDBLOCK || err == EINTR || err == ECONNABORTED ||
        err == EPROTO || err == ENETDOWN || err == ENOPROTOOPT || err == EHOSTDOWN ||
        err == ENONET || err == EHOSTUNREACH || err == EOPNOTSUPP || err == ENETUNREACH) {
      return Fd();
    }
    throw sysError("accept()", err);
  }
  setNoDelay(fd);
  if (remote) *remote = a;
  return Fd(fd);
}

static void waitFor(int fd, short events, const Deadline& deadline, std::string_view what,
                    std::string_view op) {
  pollfd p{fd, events, 0};
  for (;;) {
    int rc = ::poll(&p, 1, deadline.pollMs());
    if (rc > 0) return;
    if (rc < 0 && errno == EINTR) continue;
    if (rc < 0) throw sysError("poll()", errno);
    throw Error(ErrorCode::Timeout, fmt::format("{}: timed out while {}", what, op));
  }
}

void readFull(int fd, void* buf, size_t n, const Deadline& deadline, std::string_view what) {
  auto* p = static_cast<uint8_t*>(buf);
  size_t done = 0;
  while (done < n) {
    ssize_t r = ::recv(fd, p + done, n - done, 0);
    if (r > 0) {
      done += static_cast<size_t>(r);
      continue;
    }
    if (r == 0) {
      throw Error(ErrorCode::PeerLost,
                  fmt::format("{}: connection closed by the other side", what));
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      waitFor(fd, POLLIN, deadline, what, "reading");
      continue;
    }
    if (errno == ECONNRESET || errno == EPIPE) {
      throw Error(ErrorCode::PeerLost, fmt::format("{}: connection reset", what));
    }
    throw sysError(fmt::format("{}: recv()", what), errno);
  }
}

void writeFull(int fd, const void* buf, size_t n, const Deadline& deadline, std::string_view what) {
  auto* p = static_cast<const uint8_t*>(buf);
  size_t done = 0;
  while (done < n) {
    ssize_t r = ::send(fd, p + done, n - done, MSG_NOSIGNAL);
    if (r >= 0) {
      done += static_cast<size_t>(r);
      continue;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      waitFor(fd, POLLOUT, deadline, what, "writing");
      continue;
    }
    if (errno == ECONNRESET || errno == EPIPE) {
      throw Error(ErrorCode::PeerLost, fmt::format("{}: connection reset", what));
    }
    throw sysError(fmt::format("{}: send()", what), errno);
  }
}

}  // namespace strata::net
