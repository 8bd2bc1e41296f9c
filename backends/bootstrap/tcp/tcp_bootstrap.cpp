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
constexpr uint16_t kRendezvousVersion = 2;  // 2: hellos carry a root's block (multi-root)
constexpr size_t kMaxAddress = 64;          // "[ipv6]:port" fits
constexpr size_t kMaxRecord = 4096;
constexpr const char* kSub = "tcp";

std::once_flag gSecretWarning;

/// The most a root's hello (its block's addresses) takes, for a job of n ranks.
size_t maxHello(int n) {
  return kMaxRecord + static_cast<size_t>(n) * (kMaxAddress + 8);
}

struct Hello {
  int rank = -1;
  int size = 0;
  std::string address;
  std::string host;
  /// A multi-root rendezvous: the root's block (rank, address), the root itself excluded;
  /// empty in every other hello.
  std::vector<std::pair<int, std::string>> block;
};

std::vector<uint8_t> encodeHello(const Hello& h) {
  wire::Writer w;
  w.i32(h.rank).i32(h.size).str(h.address).str(h.host);
  w.u32(static_cast<uint32_t>(h.block.size()));
  for (const auto& [rank, address] : h.block) w.i32(rank).str(address);
  return wire::encodeRecord(kHello, kRendezvousVersion, w.data());
}

Hello decodeHello(const std::vector<uint8_t>& rec, int n) {
  auto d = wire::decodeRecord(rec, kHello, kRendezvousVersion, maxHello(n), "tcp hello record");
  wire::Reader r(d.body, "tcp hello record");
  Hello h;
  h.rank = r.i32();
  h.size = r.i32();
  h.address = r.str(kMaxAddress);
  h.host = r.str(256);
  const uint32_t entries = r.u32();
  if (entries >= static_cast<uint32_t>(n)) {
    throw Error(ErrorCode::ProtocolError,
                fmt::format("tcp hello record: {} block entries in a job of {} ranks", entries, n));
  }
  for (uint32_t i = 0; i < entries; ++i) {
    const int rank = r.i32();
    h.block.emplace_back(rank, r.str(kMaxAddress));
  }
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

  /// The rendezvous served by rank `self` at `rootAddress` (multi-root: the ranks of its block,
  /// and at rank 0 the other roots too).
  rendezvous::Options serverOptions(const mesh::Options& opt, int self,
                                    const std::string& rootAddress) const {
    rendezvous::Options r = rendezvousOptions(opt);
    r.self = self;
    r.root = rootAddress;
    r.maxRecord = maxHello(opt.size);
    return r;
  }

  /// Checks a hello against the rank that authenticated and stores its address (and, from a
  /// root's hello, its block's: exactly the ranks first+1..end-1 of that root's block).
  static void storeHello(int rank, const std::vector<uint8_t>& record, int n, int roots,
                         std::vector<std::string>& table) {
    Hello h = decodeHello(record, n);
    if (h.rank != rank || h.size != n) {
      throw Error(ErrorCode::InvalidConfig,
                  fmt::format("rendezvous: a peer authenticated as rank {} sent a hello for "
                              "rank {} of {} (this job has {} ranks)",
                              rank, h.rank, h.size, n),
                  rank);
    }
    net::SockAddr::parseNumeric(h.address);  // rejects garbage before anyone uses it
    table[static_cast<size_t>(rank)] = h.address;
    const int k = rendezvousBlockOf(rank, n, roots);
    const bool isRoot = roots > 1 && rank == rendezvousBlockStart(k, n, roots);
    const int end = rendezvousBlockStart(k + 1, n, roots);
    if (!isRoot || rank == 0) {
      if (!h.block.empty()) {
        throw Error(ErrorCode::ProtocolError,
                    fmt::format("rendezvous: rank {} sent a root's hello but is not a root", rank),
                    rank);
      }
      return;
    }
    if (h.block.size() != static_cast<size_t>(end - rank - 1)) {
      throw Error(ErrorCode::ProtocolError,
                  fmt::format("rendezvous: root rank {} sent {} addresses for a block of {} "
                              "other ranks",
                              rank, h.block.size(), end - rank - 1),
                  rank);
    }
    for (size_t i = 0; i < h.block.size(); ++i) {
      const auto& [q, address] = h.block[i];
      if (q != rank + 1 + static_cast<int>(i)) {
        throw Error(ErrorCode::ProtocolError,
                    fmt::format("rendezvous: root rank {} sent rank {} in its block's place {}",
                                rank, q, i),
                    rank);
      }
      net::SockAddr::parseNumeric(address);
      table[static_cast<size_t>(q)] = address;
    }
  }

  /// Rank 0: collect every rank's listen address, then tell each its ring successor's. With
  /// several roots: the ranks of block 0 and the other roots, whose hellos carry their blocks;
  /// a root's reply is the successor of its block's last rank.
  void serveRendezvous(int listenFd, std::vector<std::string>& table, const mesh::Options& opt) {
    const int n = opt.size;
    const int roots = std::max<int>(1, static_cast<int>(launch.roots.size()));
    rendezvous::Options ro = serverOptions(opt, 0, root);
    ro.expected.emplace();
    for (int q = 1; q < n; ++q) {
      const int k = rendezvousBlockOf(q, n, roots);
      if (k == 0 || q == rendezvousBlockStart(k, n, roots)) ro.expected->push_back(q);
    }
    rendezvous::serve(
        listenFd, ro,
        [&](int rank, const std::vector<uint8_t>& record) {
          storeHello(rank, record, n, roots, table);
        },
        [&](int rank) {
          const int k = rendezvousBlockOf(rank, n, roots);
          const int after = k == 0 ? rank + 1 : rendezvousBlockStart(k + 1, n, roots);
          return encodeReply(table[static_cast<size_t>(after % n)]);
        });
  }

  /// Root `first` (not 0) of a multi-root rendezvous: collect its block, check in at rank 0 with
  /// the block's addresses, then answer the block. Returns this rank's successor's address.
  std::string serveBlock(int listenFd, std::vector<std::string>& table, const mesh::Options& opt,
                         const std::string& myAddress) {
    const int n = opt.size, roots = static_cast<int>(launch.roots.size());
    const int first = opt.rank, k = rendezvousBlockOf(first, n, roots);
    const int end = rendezvousBlockStart(k + 1, n, roots);
    rendezvous::Options ro = serverOptions(opt, first, launch.roots[static_cast<size_t>(k)]);
    ro.expected.emplace();
    for (int q = first + 1; q < end; ++q) ro.expected->push_back(q);
    std::vector<net::Fd> ready =
        rendezvous::collect(listenFd, ro, [&](int rank, const std::vector<uint8_t>& record) {
          storeHello(rank, record, n, roots, table);
        });
    std::string after;
    try {
      Hello h{first, n, myAddress, process::hostName(), {}};
      for (int q = first + 1; q < end; ++q) h.block.emplace_back(q, table[static_cast<size_t>(q)]);
      after = checkIn(opt, 0, root, encodeHello(h));
    } catch (const Error& e) {
      rendezvous::rejectAll(ready, ro,
                            fmt::format("root rank {} (block {} of {}) could not check in at rank "
                                        "0: {}",
                                        first, k, roots, e.what()),
                            e.code() == ErrorCode::Timeout);
      throw;
    }
    rendezvous::answer(ready, ro, [&](int rank) {
      return encodeReply(rank + 1 < end ? table[static_cast<size_t>(rank + 1)] : after);
    });
    return first + 1 < end ? table[static_cast<size_t>(first + 1)] : after;
  }

  /// Check in at rank `server`'s rendezvous (`address`) with `hello`; returns the successor's
  /// address it answers.
  std::string checkIn(const mesh::Options& opt, int server, const std::string& address,
                      const std::vector<uint8_t>& hello) const {
    std::string host;
    uint16_t port = 0;
    net::splitHostPort(address, host, port, "rendezvous address");
    auto addrs = net::resolve(host, port, family);
    auto rec = rendezvous::checkIn(addrs, serverOptions(opt, server, address), opt.rank, hello);
    auto d =
        wire::decodeRecord(rec, kReply, kRendezvousVersion, kMaxRecord, "tcp rendezvous reply");
    wire::Reader r(d.body, "tcp rendezvous reply");
    std::string next = r.str(kMaxAddress);
    r.expectEnd();
    return next;
  }

  int family = AF_UNSPEC;
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
  const int family = I.family = netif::familyOf(config::getString(config, "bootstrap.tcp.family"));
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
  const int roots = std::max<int>(1, static_cast<int>(I.launch.roots.size()));
  const int block = rendezvousBlockOf(opt.rank, opt.size, roots);
  const int blockFirst = rendezvousBlockStart(block, opt.size, roots);
  if (opt.rank != 0 && opt.rank == blockFirst) {
    // The root of a block of a multi-root rendezvous (the caller's listener).
    if (I.launch.rootFd < 0) {
      throw Error(ErrorCode::InvalidArgument,
                  fmt::format("tcp bootstrap: rank {} serves rendezvous block {} of {} but was "
                              "given no listener for {}",
                              opt.rank, block, roots, I.launch.roots[static_cast<size_t>(block)]));
    }
    net::setNonBlocking(I.launch.rootFd);
    next = I.serveBlock(I.launch.rootFd, table, opt, myAddress);
  } else if (opt.rank == 0) {
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
    Hello h{opt.rank, opt.size, myAddress, process::hostName(), {}};
    next =
        I.checkIn(opt, blockFirst, roots > 1 ? I.launch.roots[static_cast<size_t>(block)] : I.root,
                  encodeHello(h));
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
  if (roots > 1) {
    STRATA_LOG(Debug, kSub,
               "rendezvous of {} ranks over {} roots took {:.3f} ms (block {}: ranks "
               "{}-{}, root {})",
               n, roots, I.rendezvousSeconds * 1e3, block, blockFirst,
               rendezvousBlockStart(block + 1, n, roots) - 1,
               I.launch.roots[static_cast<size_t>(block)]);
  } else {
    STRATA_LOG(Debug, kSub, "rendezvous of {} ranks took {:.3f} ms", n, I.rendezvousSeconds * 1e3);
  }
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

mesh::InterruptKey TcpBootstrap::interruptKey() const noexcept {
  return impl_->mesh ? impl_->mesh->interruptKey() : mesh::InterruptKey{};
}

bool TcpBootstrap::interruptCalls(const Error& why) noexcept {
  if (impl_->mesh) impl_->mesh->interrupt(why);
  return true;
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
      nullptr,
  };
  return &info;
}

}  // namespace strata::tcp
