#include "root_socket.hpp"

#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

namespace strata::run {
namespace {

// A TCP socket bound to the first address of host:port that works.
struct BoundSocket {
  Fd fd;
  std::string host;  ///< numeric
  int port = 0;
  bool v6 = false;
};

// Resolves host, then binds (with SO_REUSEADDR) and with backlog > 0 listens on the first address
// that works. Returns "" on success, else why not; `unresolved` tells a name that did not
// resolve (the text is gai_strerror's) from a socket call that failed.
std::string bindFirst(const std::string& host, int port, int backlog, BoundSocket& out,
                      bool& unresolved) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | AI_PASSIVE;
  addrinfo* results = nullptr;
  unresolved = false;
  int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &results);
  if (rc != 0) {
    unresolved = true;
    return ::gai_strerror(rc);
  }
  std::string lastError = "no address";
  for (addrinfo* ai = results; ai; ai = ai->ai_next) {
    Fd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
    if (!fd) {
      lastError = "socket: " + errnoText(errno);
      continue;
    }
    int one = 1;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0) {
      lastError = "bind: " + errnoText(errno);
      continue;
    }
    if (backlog > 0 && ::listen(fd.get(), backlog) != 0) {
      lastError = "listen: " + errnoText(errno);
      continue;
    }
    sockaddr_storage bound{};
    socklen_t len = sizeof(bound);
    char numericHost[NI_MAXHOST];
    char serv[NI_MAXSERV];
    if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&bound), &len) != 0 ||
        ::getnameinfo(reinterpret_cast<sockaddr*>(&bound), len, numericHost, sizeof(numericHost),
                      serv, sizeof(serv), NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
      lastError = "getsockname: " + errnoText(errno);
      continue;
    }
    out.fd = std::move(fd);
    out.host = numericHost;
    out.port = std::atoi(serv);
    out.v6 = bound.ss_family == AF_INET6;
    ::freeaddrinfo(results);
    return "";
  }
  ::freeaddrinfo(results);
  return lastError;
}

}  // namespace

// The root listener is created here and handed to rank 0 as an open fd instead of passing rank 0
// a port number to bind: binding, closing and re-binding a port races with other processes
// (MSCCL++ issue #163), an inherited listening socket cannot.
bool openRootSocket(const Options& options, Fd& listener, std::string& address, int& boundPort,
                    std::string& error) {
  BoundSocket b;
  bool unresolved = false;
  std::string why =
      bindFirst(options.rootHost, options.rootPort, std::max(SOMAXCONN, options.np), b, unresolved);
  if (unresolved) {
    error = "cannot resolve --root-host '" + options.rootHost + "': " + why +
            "; give a numeric address such as 127.0.0.1 or ::1";
    return false;
  }
  if (!why.empty()) {
    error = "cannot open the root listener on " + options.rootHost + " port " +
            std::to_string(options.rootPort) + " (" + why + ")";
    if (options.rootPort != 0) {
      error += "; choose another --root-port, or omit it to get a free one";
    }
    return false;
  }
  // The same notation the library parses: "a.b.c.d:port" or "[v6]:port".
  const std::string port = std::to_string(b.port);
  address = b.v6 ? "[" + b.host + "]:" + port : b.host + ":" + port;
  boundPort = b.port;
  listener = std::move(b.fd);
  return true;
}

// --torch: a free TCP port on `host` for MASTER_PORT. torch's rank 0 binds it itself (env://
// cannot adopt an inherited listener). Binding port 0, reading the port back and closing raced
// with every other process on the machine: one took the port between the close and torch's bind
// (CI saw "errno 98 - Address already in use" in rank 0's TCPStore). So the probe stays bound,
// with SO_REUSEADDR and not listening, for the whole run (`hold`): the kernel then gives the port
// to no other bind and to no outgoing connection, while torch's TCPStore, which also sets
// SO_REUSEADDR, can still bind and listen on it (Linux allows that while the holder does not
// listen). `avoid` (the root port) is still bound while this runs, so the kernel does not hand it
// out; a probe that gets it anyway stays open until the end, so that the next one gets another.
bool pickFreePort(const std::string& host, int avoid, int& port, Fd& hold, std::string& error) {
  std::vector<Fd> held;
  std::string lastError = "no address";
  for (int attempt = 0; attempt < 8; ++attempt) {
    BoundSocket b;
    bool unresolved = false;
    std::string why = bindFirst(host, 0, 0, b, unresolved);
    if (unresolved) {
      error = "--torch: cannot resolve MASTER_ADDR '" + host + "': " + why;
      return false;
    }
    if (!why.empty()) {
      lastError = why;
      break;  // every address failed: retrying will not help
    }
    if (b.port <= 0 || b.port > 65535 || b.port == avoid) {
      lastError = "got port " + std::to_string(b.port);
      held.push_back(std::move(b.fd));  // try again while this one is held
      continue;
    }
    port = b.port;
    hold = std::move(b.fd);
    return true;
  }
  error = "--torch: cannot find a free port for MASTER_PORT on " + host + " (" + lastError +
          "); give one with --env MASTER_PORT=P";
  return false;
}

}  // namespace strata::run
