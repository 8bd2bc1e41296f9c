#include "tcp_bootstrap.hpp"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <list>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include <strata/error.hpp>

#include "config_keys.hpp"
#include "deadline.hpp"
#include "handshake.hpp"
#include "launcher.hpp"
#include "log.hpp"
#include "mesh.hpp"
#include "netif.hpp"
#include "socket.hpp"
#include "wire.hpp"

namespace strata::tcp {
namespace {

constexpr uint16_t kHello = 10;
constexpr uint16_t kReply = 11;
constexpr uint16_t kRendezvousVersion = 1;
constexpr size_t kMaxAddress = 64;  // "[ipv6]:port" fits
constexpr size_t kMaxRecord = 4096;
constexpr const char* kSub = "tcp";

std::once_flag gSecretWarning;

int familyFromConfig(const Config& config) {
  std::string f = config::getString(config, "bootstrap.tcp.family");
  if (f == "ipv4") return AF_INET;
  if (f == "ipv6") return AF_INET6;
  return AF_UNSPEC;
}

struct Hello {
  int rank = -1;
  int size = 0;
  std::string address;
  std::string host;
};

std::vector<uint8_t> encodeHello(const Hello& h) {
  wire::Writer w;
  w.i32(h.rank).i32(h.size).str(h.address).str(h.host);
  return wire::encodeRecord(kHello, kRendezvousVersion, w.data());
}

Hello decodeHello(const std::vector<uint8_t>& rec) {
  auto d = wire::decodeRecord(rec, kHello, kRendezvousVersion, kMaxRecord, "tcp hello record");
  wire::Reader r(d.body, "tcp hello record");
  Hello h;
  h.rank = r.i32();
  h.size = r.i32();
  h.address = r.str(kMaxAddress);
  h.host = r.str(256);
  r.expectEnd();
  return h;
}

std::vector<uint8_t> encodeReply(bool ok, const std::string& error, const std::string& next) {
  wire::Writer w;
  w.u8(ok ? 1 : 0).str(error.substr(0, 2048)).str(next);
  return wire::encodeRecord(kReply, kRendezvousVersion, w.data());
}

std::string hostName() {
  char buf[256] = {0};
  gethostname(buf, sizeof buf - 1);
  return buf;
}

std::string rankList(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size() && i < 16; ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  if (ranks.size() > 16) s += fmt::format(" and {} more", ranks.size() - 16);
  return s;
}

// strata-run hands rank 0 its root socket; it stays open for the life of the process so that
// later bootstraps (create/destroy cycles) reuse it instead of racing to bind the port again.
struct InheritedRoot {
  std::mutex mu;
  int fd = -1;
};
InheritedRoot& inheritedRoot() {
  static InheritedRoot r;
  return r;
}

}  // namespace

struct TcpBootstrap::Impl {
  LaunchInfo launch;
  std::string root;
  double rendezvousSeconds = 0;
  double connectTimeout = 60;
  std::unique_ptr<mesh::PeerMesh> mesh;

  Deadline callDeadline() const { return mesh->callDeadline(); }

  /// Rank 0: accept every other rank's hello, then tell each its ring successor.
  void serveRendezvous(int listenFd, const std::vector<std::string>& unusedAddrs,
                       std::vector<std::string>& table, const mesh::Options& opt) {
    (void)unusedAddrs;
    const int n = opt.size;
    Deadline deadline = Deadline::fromTimeout(connectTimeout);
    struct Client {
      handshake::ListenSide hs;
      handshake::RecordReader reader{kMaxRecord};
      int rank = -1;
    };
    std::list<Client> clients;
    std::vector<net::Fd> ready(static_cast<size_t>(n));
    std::vector<std::string> hosts(static_cast<size_t>(n));
    int count = 1;
    std::string failure;
    while (count < n && failure.empty()) {
      if (deadline.expired()) {
        std::vector<int> missing;
        for (int r = 1; r < n; ++r) {
          if (!ready[static_cast<size_t>(r)].valid()) missing.push_back(r);
        }
        failure = fmt::format(
            "rendezvous at {} timed out after {} s: {} of {} ranks checked in; missing ranks: "
            "{}. Check that every rank was started, uses the same STRATA_ROOT/SLURM step, and "
            "can reach {} (bootstrap.connect_timeout to wait longer)",
            root, connectTimeout, count, n, rankList(missing), root);
        break;
      }
      std::vector<pollfd> fds;
      fds.push_back({listenFd, POLLIN, 0});
      Deadline next = deadline;
      for (auto& c : clients) {
        fds.push_back({c.hs.state() == handshake::ListenSide::State::Accepted ? c.hs.fd() : c.hs.fd(),
                       POLLIN, 0});
        next = Deadline::earlier(next, c.hs.deadline());
      }
      int rc = ::poll(fds.data(), fds.size(), next.pollMs(1000) + 1);
      if (rc < 0 && errno != EINTR) {
        throw Error(ErrorCode::SystemError, fmt::format("poll(): {}", net::errnoText(errno)));
      }
      size_t i = 1;
      for (auto it = clients.begin(); it != clients.end(); ++i) {
        Client& c = *it;
        bool readable = i < fds.size() && fds[i].revents != 0;
        bool drop = false;
        if (c.hs.state() == handshake::ListenSide::State::InProgress) {
          if (readable || c.hs.deadline().expired()) {
            auto st = c.hs.step();
            if (st == handshake::ListenSide::State::Rejected) {
              STRATA_LOG(Warn, kSub, "rendezvous: rejected a connection from {}: {}",
                         c.hs.remote().toString(), c.hs.reason());
              drop = true;
            } else if (st == handshake::ListenSide::State::Accepted) {
              readable = true;  // the hello may already be buffered
            }
          }
        }
        if (!drop && c.hs.state() == handshake::ListenSide::State::Accepted && readable) {
          try {
            if (c.reader.step(c.hs.fd(), "tcp hello record")) {
              auto kind = wire::decodeHeader({c.reader.record().data(), wire::kRecordHeaderSize},
                                             0xffff, kMaxRecord, "tcp hello record")
                              .kind;
              if (kind != kHello) {
                // An authenticated rank of this job that runs another backend (ucx sends kind
                // 30): fail the whole job at once instead of waiting for it until the deadline.
                failure = fmt::format(
                    "ranks disagree on bootstrap backend: rank 0 has 'tcp', rank {} has '{}'. "
                    "Every rank must use the same bootstrap.backend (check STRATA_* and "
                    "strata.toml on every node)",
                    c.hs.peerRank(), kind == 30 ? "ucx" : fmt::format("unknown (kind {})", kind));
                try {
                  handshake::writeRecord(c.hs.fd(), encodeReply(false, failure, ""),
                                         Deadline::after(1.0), "rendezvous reply");
                } catch (const Error&) {
                }
                it = clients.erase(it);
                continue;
              }
              Hello h = decodeHello(c.reader.record());
              if (h.rank != c.hs.peerRank() || h.size != n || h.rank <= 0 || h.rank >= n) {
                failure = fmt::format(
                    "rendezvous: a peer authenticated as rank {} sent a hello for rank {} of {} "
                    "(this job has {} ranks)",
                    c.hs.peerRank(), h.rank, h.size, n);
              } else if (ready[static_cast<size_t>(h.rank)].valid()) {
                failure = fmt::format(
                    "rendezvous: rank {} checked in twice (from {} and from {} at {}); two "
                    "processes were given the same rank",
                    h.rank, hosts[static_cast<size_t>(h.rank)], h.host, c.hs.remote().toString());
              } else {
                ready[static_cast<size_t>(h.rank)] = c.hs.takeFd();
                table[static_cast<size_t>(h.rank)] = h.address;
                hosts[static_cast<size_t>(h.rank)] = h.host;
                ++count;
              }
              drop = true;
            }
          } catch (const Error& e) {
            STRATA_LOG(Warn, kSub, "rendezvous: dropped rank {} connection from {}: {}",
                       c.hs.peerRank(), c.hs.remote().toString(), e.what());
            drop = true;
          }
        }
        it = drop ? clients.erase(it) : std::next(it);
      }
      if (rc > 0 && (fds[0].revents & POLLIN)) {
        for (;;) {
          net::SockAddr remote;
          net::Fd fd = net::acceptOne(listenFd, &remote);
          if (!fd.valid()) break;
          clients.push_back(Client{handshake::ListenSide(std::move(fd), remote, launch.secret,
                                                         handshake::Purpose::Rendezvous, 0, n,
                                                         Deadline::fromTimeout(opt.handshakeTimeout)),
                                   handshake::RecordReader(kMaxRecord), -1});
          auto st = clients.back().hs.step();
          if (st == handshake::ListenSide::State::Rejected) {
            STRATA_LOG(Warn, kSub, "rendezvous: rejected a connection from {}: {}",
                       remote.toString(), clients.back().hs.reason());
            clients.pop_back();
          }
        }
      }
    }
    Deadline replyDeadline = Deadline::after(std::max(1.0, opt.handshakeTimeout));
    for (int r = 1; r < n; ++r) {
      auto& fd = ready[static_cast<size_t>(r)];
      if (!fd.valid()) continue;
      try {
        handshake::writeRecord(fd.get(),
                               encodeReply(failure.empty(), failure,
                                           table[static_cast<size_t>((r + 1) % n)]),
                               replyDeadline, fmt::format("rendezvous reply to rank {}", r));
      } catch (const Error& e) {
        if (failure.empty()) {
          failure = fmt::format("rendezvous: rank {} vanished before its reply: {}", r, e.what());
        }
      }
    }
    if (!failure.empty()) {
      throw Error(failure.find("timed out") != std::string::npos ? ErrorCode::Timeout
                                                                  : ErrorCode::InvalidConfig,
                  failure);
    }
  }

  /// Other ranks: check in at the root and learn the ring successor's address.
  std::string checkIn(const std::vector<net::SockAddr>& rootAddrs, const mesh::Options& opt,
                      const std::string& myAddress) {
    Deadline deadline = Deadline::fromTimeout(connectTimeout);
    std::string what = fmt::format("tcp bootstrap rendezvous with rank 0 at {}", root);
    for (;;) {
      net::Fd fd = net::connectWithRetry(rootAddrs, deadline, what);
      try {
        handshake::connectSide(fd.get(), opt.secret, handshake::Purpose::Rendezvous, opt.rank,
                               opt.size, 0, deadline, what);
        Hello h{opt.rank, opt.size, myAddress, hostName()};
        handshake::writeRecord(fd.get(), encodeHello(h), deadline, what);
        auto rec = handshake::readRecord(fd.get(), kMaxRecord, deadline, what);
        auto d = wire::decodeRecord(rec, kReply, kRendezvousVersion, kMaxRecord,
                                    "tcp rendezvous reply");
        wire::Reader r(d.body, "tcp rendezvous reply");
        bool ok = r.u8() != 0;
        std::string error = r.str(2048);
        std::string next = r.str(kMaxAddress);
        r.expectEnd();
        if (!ok) {
          throw Error(error.find("timed out") != std::string::npos ? ErrorCode::Timeout
                                                                   : ErrorCode::InvalidConfig,
                      fmt::format("rank 0 failed the rendezvous: {}", error), 0);
        }
        return next;
      } catch (const Error& e) {
        // Rank 0 from an earlier bootstrap in this process may still be closing, or the port
        // belongs to something else for a moment: retry until the deadline.
        bool transient = e.code() == ErrorCode::PeerLost && !deadline.expired();
        if (!transient) {
          if (e.code() == ErrorCode::Timeout) {
            throw Error(ErrorCode::Timeout,
                        fmt::format("{}: {} (is rank 0 running? bootstrap.connect_timeout={} s)",
                                    what, e.what(), connectTimeout),
                        0);
          }
          throw;
        }
        STRATA_LOG(Debug, kSub, "rendezvous attempt failed, retrying: {}", e.what());
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
  }
};

TcpBootstrap::TcpBootstrap(const Config& config) : impl_(std::make_unique<Impl>()) {
  auto& I = *impl_;
  auto start = std::chrono::steady_clock::now();
  I.launch = detectLaunch(config);
  log::setRank(I.launch.rank);
  mesh::Options opt;
  opt.backend = "tcp";
  opt.rank = I.launch.rank;
  opt.size = I.launch.size;
  opt.secret = I.launch.secret;
  opt.timeout = config::getDouble(config, "bootstrap.timeout");
  opt.handshakeTimeout = config::getDouble(config, "bootstrap.handshake_timeout");
  opt.maxMessage = config::getBytes(config, "bootstrap.max_message");
  auto spin = mesh::spinPolicy(config, I.launch.localSize);
  opt.spinUs = spin.us;
  opt.spinYield = spin.yield;
  I.connectTimeout = config::getDouble(config, "bootstrap.connect_timeout");
  I.root = I.launch.root;

  if (opt.size == 1) {
    I.mesh = std::make_unique<mesh::PeerMesh>(opt, net::Fd());
    return;
  }
  if (opt.secret.empty()) {
    std::call_once(gSecretWarning, [] {
      STRATA_LOG(Warn, kSub,
                 "no job secret (STRATA_SECRET or bootstrap.secret_file): bootstrap connections "
                 "are not authenticated; launch with strata-run or set bootstrap.secret_file");
    });
  }
  if (I.root.empty()) {
    throw Error(ErrorCode::InvalidConfig,
                fmt::format("tcp bootstrap: rank {} of {} has no rendezvous address. Launch with "
                            "strata-run, set STRATA_ROOT or bootstrap.tcp.root=host:port, or "
                            "under srun use --resv-ports=<ntasks> or bootstrap.tcp.port",
                            opt.rank, opt.size));
  }
  std::string rootHost;
  uint16_t rootPort = 0;
  net::splitHostPort(I.root, rootHost, rootPort, "rendezvous address (STRATA_ROOT)");
  int family = familyFromConfig(config);
  auto rootAddrs = net::resolve(rootHost, rootPort, family);

  auto iface = netif::select(config::getString(config, "bootstrap.tcp.interface"), family,
                             rootAddrs.front().get());
  net::SockAddr bindAddr = net::SockAddr::fromRaw(reinterpret_cast<const sockaddr*>(&iface.addr),
                                                  iface.addrLen);
  bindAddr.setPort(0);
  net::Fd listener = net::listenOn(bindAddr);
  std::string myAddress = net::localAddress(listener.get()).toString();
  STRATA_LOG(Debug, kSub, "rank {} of {} listens on {} ({}), root {}", opt.rank, opt.size,
             myAddress, iface.name, I.root);
  I.mesh = std::make_unique<mesh::PeerMesh>(opt, std::move(listener));

  std::vector<std::string> table(static_cast<size_t>(opt.size));
  table[static_cast<size_t>(opt.rank)] = myAddress;
  std::string next;
  if (opt.rank == 0) {
    net::Fd ownRoot;
    int rootFd = -1;
    std::unique_lock inheritedLock(inheritedRoot().mu, std::defer_lock);
    if (I.launch.rootFd >= 0) {
      inheritedLock.lock();
      rootFd = inheritedRoot().fd = I.launch.rootFd;
      net::setNonBlocking(rootFd);
    } else {
      std::string lastError;
      for (const auto& a : rootAddrs) {
        try {
          ownRoot = net::listenOn(a);
          break;
        } catch (const Error& e) {
          lastError = e.what();
        }
      }
      if (!ownRoot.valid()) {
        throw Error(ErrorCode::SystemError,
                    fmt::format("tcp bootstrap: rank 0 cannot serve the rendezvous at {}: {}",
                                I.root, lastError));
      }
      rootFd = ownRoot.get();
    }
    I.serveRendezvous(rootFd, {}, table, opt);
    next = table[1];
  } else {
    next = I.checkIn(rootAddrs, opt, myAddress);
  }
  const int n = opt.size, r = opt.rank;
  I.mesh->setPeerAddress((r + 1) % n, next);

  // Ring all-gather of the address table: N-1 steps of one fixed-size slot each.
  Deadline dl = I.mesh->callDeadline();
  std::vector<uint8_t> slot(kMaxAddress + 1);
  for (int step = 0; step < n - 1; ++step) {
    const std::string& mine = table[static_cast<size_t>((r - step + n) % n)];
    std::fill(slot.begin(), slot.end(), 0);
    slot[0] = static_cast<uint8_t>(mine.size());
    std::memcpy(slot.data() + 1, mine.data(), mine.size());
    I.mesh->send((r + 1) % n, mesh::kTagSetup, slot.data(), slot.size(), dl, "rendezvous", true);
    I.mesh->recv((r - 1 + n) % n, mesh::kTagSetup, slot.data(), slot.size(), dl, "rendezvous",
                 true);
    size_t len = slot[0];
    if (len == 0 || len > kMaxAddress) {
      throw Error(ErrorCode::ProtocolError,
                  fmt::format("tcp bootstrap: rank {} passed an address slot of length {}",
                              (r - 1 + n) % n, len),
                  (r - 1 + n) % n);
    }
    std::string addr(reinterpret_cast<const char*>(slot.data() + 1), len);
    try {
      net::SockAddr::parseNumeric(addr);
    } catch (const Error&) {
      throw Error(ErrorCode::ProtocolError,
                  fmt::format("tcp bootstrap: bad peer address '{}' in the address table", addr));
    }
    table[static_cast<size_t>((r - step - 1 + n) % n)] = addr;
  }
  I.mesh->setPeerAddresses(table);
  I.rendezvousSeconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  STRATA_LOG(Debug, kSub, "rendezvous of {} ranks took {:.3f} ms", n, I.rendezvousSeconds * 1e3);
}

TcpBootstrap::~TcpBootstrap() = default;

int TcpBootstrap::rank() const noexcept { return impl_->launch.rank; }
int TcpBootstrap::size() const noexcept { return impl_->launch.size; }
int TcpBootstrap::localRank() const noexcept { return impl_->launch.localRank; }
int TcpBootstrap::localSize() const noexcept { return impl_->launch.localSize; }

void TcpBootstrap::send(int peer, int tag, const void* data, size_t bytes) {
  impl_->mesh->send(peer, tag, data, bytes, impl_->callDeadline());
}

void TcpBootstrap::recv(int peer, int tag, void* data, size_t bytes) {
  impl_->mesh->recv(peer, tag, data, bytes, impl_->callDeadline());
}

void TcpBootstrap::allGather(void* data, size_t bytesPerRank) {
  impl_->mesh->allGather(data, bytesPerRank);
}

void TcpBootstrap::broadcast(void* data, size_t bytes, int root) {
  impl_->mesh->broadcast(data, bytes, root);
}

void TcpBootstrap::barrier() { impl_->mesh->barrier(); }

void TcpBootstrap::abort(std::string_view reason) noexcept { impl_->mesh->abort(reason); }

std::string TcpBootstrap::listenAddress() const { return impl_->mesh->listenAddress(); }
std::string TcpBootstrap::rootAddress() const { return impl_->root; }
double TcpBootstrap::rendezvousSeconds() const { return impl_->rendezvousSeconds; }

}  // namespace strata::tcp
