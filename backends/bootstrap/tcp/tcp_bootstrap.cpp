#include "tcp_bootstrap.hpp"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <list>
#include <mutex>
#include <thread>
#include <utility>

#include <fmt/format.h>

#include <strata/backend/module.hpp>
#include <strata/error.hpp>
#include <strata/version.hpp>

#include "base/config_keys.hpp"
#include "base/deadline.hpp"
#include "base/log.hpp"
#include "base/process.hpp"
#include "base/wire.hpp"
#include "launch/contract.hpp"
#include "mesh/p2p_collectives.hpp"
#include "mesh/peer_mesh.hpp"
#include "mesh/rendezvous.hpp"
#include "net/handshake.hpp"
#include "net/netif.hpp"
#include "net/socket.hpp"

namespace strata::tcp {
namespace {

constexpr uint16_t kHello = 10;
constexpr uint16_t kReply = 11;
constexpr uint16_t kRendezvousVersion = 1;
constexpr size_t kMaxAddress = 64;  // "[ipv6]:port" fits
constexpr size_t kMaxRecord = 4096;
constexpr const char* kSub = "tcp";

std::once_flag gSecretWarning;

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

std::vector<uint8_t> encodeReply(const std::string& next) {
  wire::Writer w;
  w.str(next);
  return wire::encodeRecord(kReply, kRendezvousVersion, w.data());
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

  rendezvous::Options rendezvousOptions(const mesh::Options& opt) const {
    rendezvous::Options r;
    r.backend = "tcp";
    r.root = root;
    r.secret = opt.secret;
    r.size = opt.size;
    r.helloKind = kHello;
    r.connectTimeout = connectTimeout;
    r.handshakeTimeout = opt.handshakeTimeout;
    r.maxRecord = kMaxRecord;
    return r;
  }

  /// Rank 0: collect every rank's listen address, then tell each its ring successor's.
  void serveRendezvous(int listenFd, std::vector<std::string>& table, const mesh::Options& opt) {
    const int n = opt.size;
    rendezvous::serve(
        listenFd, rendezvousOptions(opt),
        [&](int rank, const std::vector<uint8_t>& record) {
          Hello h = decodeHello(record);
          if (h.rank != rank || h.size != n) {
            throw Error(ErrorCode::InvalidConfig,
                        fmt::format("rendezvous: a peer authenticated as rank {} sent a hello for "
                                    "rank {} of {} (this job has {} ranks)",
                                    rank, h.rank, h.size, n),
                        rank);
          }
          net::SockAddr::parseNumeric(h.address);  // rejects garbage before anyone uses it
          table[static_cast<size_t>(rank)] = h.address;
        },
        [&](int rank) { return encodeReply(table[static_cast<size_t>((rank + 1) % n)]); });
  }

  /// Other ranks: check in at the root and learn the ring successor's address.
  std::string checkIn(const std::vector<net::SockAddr>& rootAddrs, const mesh::Options& opt,
                      const std::string& myAddress) {
    Hello h{opt.rank, opt.size, myAddress, process::hostName()};
    auto rec = rendezvous::checkIn(rootAddrs, rendezvousOptions(opt), opt.rank, encodeHello(h));
    auto d =
        wire::decodeRecord(rec, kReply, kRendezvousVersion, kMaxRecord, "tcp rendezvous reply");
    wire::Reader r(d.body, "tcp rendezvous reply");
    std::string next = r.str(kMaxAddress);
    r.expectEnd();
    return next;
  }
};

TcpBootstrap::TcpBootstrap(const Config& config) : TcpBootstrap(config, detectLaunch(config)) {}

TcpBootstrap::TcpBootstrap(const Config& config, const LaunchInfo& launch)
    : impl_(std::make_unique<Impl>()) {
  auto& I = *impl_;
  auto start = std::chrono::steady_clock::now();
  I.launch = launch;
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
  int family = netif::familyOf(config::getString(config, "bootstrap.tcp.family"));
  auto rootAddrs = net::resolve(rootHost, rootPort, family);

  auto iface = netif::select(config::getString(config, "bootstrap.tcp.interface"), family,
                             rootAddrs.front().get());
  net::SockAddr bindAddr =
      net::SockAddr::fromRaw(reinterpret_cast<const sockaddr*>(&iface.addr), iface.addrLen);
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
    if (I.launch.rootFd >= 0 && I.launch.launcher == kExplicitLauncher) {
      rootFd = I.launch.rootFd;  // the caller's RendezvousListener, which keeps it
      net::setNonBlocking(rootFd);
    } else if (I.launch.rootFd >= 0) {
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
    I.serveRendezvous(rootFd, table, opt);
    next = table[1];
  } else {
    next = I.checkIn(rootAddrs, opt, myAddress);
  }
  const int n = opt.size, r = opt.rank;
  I.mesh->setPeerAddress((r + 1) % n, next);

  // Ring all-gather of the address table (mesh/p2p_collectives.hpp): N-1 steps of one
  // fixed-size slot each (length u8, address, then a byte: bit 0 = that rank's host has more
  // ranks than CPUs, bits 1-2 = its bootstrap.collectives choice).
  Deadline dl = I.mesh->callDeadline();
  constexpr size_t kSlot = kMaxAddress + 2;
  std::vector<uint8_t> slots(static_cast<size_t>(n) * kSlot, 0);
  std::vector<uint8_t> crowded(static_cast<size_t>(n));
  const std::string collectives = config::getString(config, "bootstrap.collectives");
  const uint8_t mode = collectives == "log" ? 1 : collectives == "star" ? 2 : 0;
  {
    uint8_t* mine = slots.data() + static_cast<size_t>(r) * kSlot;
    mine[0] = static_cast<uint8_t>(myAddress.size());
    std::memcpy(mine + 1, myAddress.data(), myAddress.size());
    mine[kMaxAddress + 1] = static_cast<uint8_t>((spin.yield ? 1 : 0) | (mode << 1));
  }
  mesh::PeerMesh& engine = *I.mesh;
  p2p::Messenger messenger{
      r, n,
      [&](int peer, uint32_t, const void* data, size_t bytes) {
        engine.send(peer, mesh::kTagSetup, data, bytes, dl, "rendezvous", true);
      },
      [&](int peer, uint32_t, void* data, size_t bytes) {
        engine.recv(peer, mesh::kTagSetup, data, bytes, dl, "rendezvous", true);
      }};
  p2p::allGather(messenger, p2p::AllGatherAlgorithm::Ring, slots.data(), kSlot);
  const int prev = (r - 1 + n) % n;  // every slot came through it
  for (int q = 0; q < n; ++q) {
    const uint8_t* slot = slots.data() + static_cast<size_t>(q) * kSlot;
    crowded[static_cast<size_t>(q)] = slot[kMaxAddress + 1] & 7;
    if (q == r) continue;
    size_t len = slot[0];
    if (len == 0 || len > kMaxAddress) {
      throw Error(
          ErrorCode::ProtocolError,
          fmt::format("tcp bootstrap: rank {} passed an address slot of length {}", prev, len),
          prev);
    }
    std::string addr(reinterpret_cast<const char*>(slot + 1), len);
    try {
      net::SockAddr::parseNumeric(addr);
    } catch (const Error&) {
      throw Error(ErrorCode::ProtocolError,
                  fmt::format("tcp bootstrap: bad peer address '{}' in the address table", addr));
    }
    table[static_cast<size_t>(q)] = addr;
  }
  I.mesh->setPeerAddresses(table);
  // Every rank holds the same flags, so all pick the same algorithms or all fail here (the
  // agreement check after creation would need a collective that already agrees).
  const char* modeNames[] = {"auto", "log", "star", "?"};
  bool anyCrowded = false;
  for (int p = 0; p < n; ++p) {
    uint8_t f = crowded[static_cast<size_t>(p)];
    anyCrowded = anyCrowded || (f & 1);
    if ((f >> 1) != (crowded[0] >> 1)) {
      throw Error(ErrorCode::InvalidConfig,
                  fmt::format("ranks disagree on bootstrap.collectives: rank 0 has '{}', rank {} "
                              "has '{}'. Every rank must use the same value: check the STRATA_* "
                              "environment and strata.toml on every node",
                              modeNames[(crowded[0] >> 1) & 3], p, modeNames[(f >> 1) & 3]),
                  p);
    }
  }
  const uint8_t agreed = crowded[0] >> 1;
  I.mesh->setStarCollectives(agreed == 2 || (agreed == 0 && anyCrowded));
  I.rendezvousSeconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  STRATA_LOG(Debug, kSub, "rendezvous of {} ranks took {:.3f} ms", n, I.rendezvousSeconds * 1e3);
}

TcpBootstrap::~TcpBootstrap() = default;

int TcpBootstrap::rank() const noexcept {
  return impl_->launch.rank;
}
int TcpBootstrap::size() const noexcept {
  return impl_->launch.size;
}
int TcpBootstrap::localRank() const noexcept {
  return impl_->launch.localRank;
}
int TcpBootstrap::localSize() const noexcept {
  return impl_->launch.localSize;
}

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

void TcpBootstrap::barrier() {
  impl_->mesh->barrier();
}

void TcpBootstrap::abort(std::string_view reason) noexcept {
  impl_->mesh->abort(reason);
}

std::string TcpBootstrap::listenAddress() const {
  return impl_->mesh->listenAddress();
}
std::string TcpBootstrap::rootAddress() const {
  return impl_->root;
}
double TcpBootstrap::rendezvousSeconds() const {
  return impl_->rendezvousSeconds;
}

}  // namespace strata::tcp

namespace strata::tcp {

std::unique_ptr<Bootstrap> createExplicit(const Config& config, const LaunchInfo& launch) {
  return std::make_unique<TcpBootstrap>(config, launch);
}

const backend::ModuleInfo* builtinModuleInfo() {
  static const backend::ModuleInfo info{
      STRATA_MODULE_ABI_VERSION,
      backend::ModuleKind::Bootstrap,
      "tcp",
      STRATA_VERSION_STRING,
      "TCP sockets: persistent authenticated connections, rank 0 rendezvous",
      nullptr,
      [](const Config& config) -> std::unique_ptr<Bootstrap> {
        return std::make_unique<TcpBootstrap>(config);
      },
      nullptr,
      nullptr,
  };
  return &info;
}

}  // namespace strata::tcp
