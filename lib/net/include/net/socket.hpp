#pragma once
#ifndef STRATA_INTERNAL_HEADERS
#error "net/socket.hpp is internal to strata: applications include <strata/...> only"
#endif

// Non-blocking, poll-based TCP sockets with deadlines, IPv4 and IPv6.

#include <netinet/in.h>
#include <sys/socket.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <strata/export.hpp>

#include "base/deadline.hpp"

namespace strata::net {

/// A socket address (IPv4 or IPv6).
struct STRATA_API SockAddr {
  sockaddr_storage storage{};
  socklen_t len = 0;

  int family() const { return storage.ss_family; }
  const sockaddr* get() const { return reinterpret_cast<const sockaddr*>(&storage); }
  sockaddr* get() { return reinterpret_cast<sockaddr*>(&storage); }
  uint16_t port() const;
  void setPort(uint16_t port);
  bool isLoopback() const;
  /// "127.0.0.1:5000" or "[::1]:5000".
  std::string toString() const;
  /// Numeric address only.
  std::string host() const;

  static SockAddr fromRaw(const sockaddr* sa, socklen_t len);
  /// Parses a numeric "a.b.c.d:port" or "[v6]:port" (throws InvalidArgument).
  static SockAddr parseNumeric(std::string_view hostPort);
};

/// Splits "host:port" / "[v6]:port"; throws InvalidConfig naming `what` when malformed.
STRATA_API void splitHostPort(std::string_view text, std::string& host, uint16_t& port,
                              std::string_view what);
/// Resolves host (name or numeric) to addresses, IPv4 first; family AF_UNSPEC/AF_INET/AF_INET6.
/// Throws InvalidConfig naming host when it does not resolve.
STRATA_API std::vector<SockAddr> resolve(const std::string& host, uint16_t port, int family = 0);

/// An owned file descriptor, closed on destruction.
class STRATA_API Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd();
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    int f = fd_;
    fd_ = -1;
    return f;
  }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

STRATA_API void setNonBlocking(int fd);
STRATA_API void setNoDelay(int fd);
STRATA_API void setCloexec(int fd);

/// A non-blocking listening socket bound to addr (port 0 = any); SO_REUSEADDR set.
STRATA_API Fd listenOn(const SockAddr& addr, int backlog = 1024);
/// The bound address of a socket.
STRATA_API SockAddr localAddress(int fd);
STRATA_API SockAddr peerAddress(int fd);

/// Connects to one of addrs, retrying refused or unreachable connections with capped
/// back-off until the deadline. Throws Timeout naming `what` and the last error.
/// Returns a non-blocking connected socket with TCP_NODELAY.
STRATA_API Fd connectWithRetry(const std::vector<SockAddr>& addrs, const Deadline& deadline,
                               std::string_view what);
/// Non-blocking accept; returns an invalid Fd when nothing is pending (EAGAIN, ECONNABORTED,
/// EINTR). The accepted socket is non-blocking with TCP_NODELAY and close-on-exec.
STRATA_API Fd acceptOne(int listenFd, SockAddr* remote = nullptr);

/// Reads/writes exactly n bytes on a non-blocking socket, polling until the deadline.
/// Throws Timeout / PeerLost (EOF, reset) / SystemError, naming `what`.
STRATA_API void readFull(int fd, void* buf, size_t n, const Deadline& deadline,
                         std::string_view what);
STRATA_API void writeFull(int fd, const void* buf, size_t n, const Deadline& deadline,
                          std::string_view what);

/// strerror_r as a string.
STRATA_API std::string errnoText(int err);

/// True when the other end of a connected socket that is expected to send nothing has closed
/// or reset it (EOF or an error pending); false while it is open or has bytes waiting. Does not
/// block and consumes nothing.
STRATA_API bool peerHasClosed(int fd);

}  // namespace strata::net
