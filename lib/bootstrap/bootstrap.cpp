// Bootstrap::create and createTcpBootstrap: the backend, then what every bootstrap goes through
// once it is up (assembly.hpp).

#include <strata/bootstrap.hpp>

#include <unistd.h>

#include <utility>

#include <fmt/format.h>

#include <strata/error.hpp>

#include "agreement.hpp"
#include "assembly.hpp"
#include "base/config_keys.hpp"
#include "base/log.hpp"
#include "bootstrap/registry.hpp"
#include "bootstrap/watched.hpp"
#include "net/netif.hpp"
#include "net/socket.hpp"

namespace strata {

namespace bootstrap {

std::unique_ptr<Bootstrap> assemble(const Config& config, const LaunchInfo* launch,
                                    const std::function<std::unique_ptr<Bootstrap>()>& backend) {
  log::configure(config);
  auto b = backend();
  log::setRank(b->rank());
  checkAgreement(*b, config);
  STRATA_LOG(Debug, "bootstrap", "{} bootstrap ready: rank {} of {} (local {} of {})", b->backend(),
             b->rank(), b->size(), b->localRank(), b->localSize());
  return launch ? attachWatch(std::move(b), config, *launch) : attachWatch(std::move(b), config);
}

}  // namespace bootstrap

Bootstrap::~Bootstrap() = default;

std::unique_ptr<Bootstrap> Bootstrap::create(const Config& config) {
  return bootstrap::assemble(config, nullptr, [&] {
    return bootstrap::createBackend(bootstrap::resolveBackendName(config), config);
  });
}

RendezvousListener::RendezvousListener(const Config& config, const std::string& hostHint) {
  const int family = netif::familyOf(config::getString(config, "bootstrap.tcp.family"));
  std::vector<net::SockAddr> hint;
  if (!hostHint.empty()) hint = net::resolve(hostHint, 0, family);
  auto iface = netif::select(config::getString(config, "bootstrap.tcp.interface"), family,
                             hint.empty() ? nullptr : hint.front().get());
  net::SockAddr addr =
      net::SockAddr::fromRaw(reinterpret_cast<const sockaddr*>(&iface.addr), iface.addrLen);
  addr.setPort(static_cast<uint16_t>(config::getInt(config, "bootstrap.tcp.port")));
  net::Fd fd = net::listenOn(addr);
  address_ = net::localAddress(fd.get()).toString();
  fd_ = fd.release();
  STRATA_LOG(Debug, "tcp", "rendezvous listener on {} ({})", address_, iface.name);
}

RendezvousListener::~RendezvousListener() {
  if (fd_ >= 0) ::close(fd_);
}

RendezvousListener::RendezvousListener(RendezvousListener&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), address_(std::move(other.address_)) {}

std::unique_ptr<Bootstrap> createTcpBootstrap(const ExplicitLaunch& launch, const Config& config,
                                              const RendezvousListener* listener) {
  if (launch.size < 1 || launch.rank < 0 || launch.rank >= launch.size || launch.localSize < 1 ||
      launch.localRank < 0 || launch.localRank >= launch.localSize ||
      launch.localSize > launch.size) {
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("createTcpBootstrap: rank {} of {} (local {} of {}) is not a valid "
                            "launch",
                            launch.rank, launch.size, launch.localRank, launch.localSize));
  }
  const int roots = launch.roots.size() > 1 ? static_cast<int>(launch.roots.size()) : 1;
  if (roots > launch.size) {
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("createTcpBootstrap: {} rendezvous roots for {} ranks (at most one "
                            "root per rank)",
                            roots, launch.size));
  }
  for (int k = 0; k < roots && roots > 1; ++k) {
    const std::string& a = launch.roots[static_cast<size_t>(k)];
    if (a.empty()) {
      throw Error(ErrorCode::InvalidArgument,
                  fmt::format("createTcpBootstrap: rendezvous root {} has no address", k));
    }
    for (int j = 0; j < k; ++j) {
      if (launch.roots[static_cast<size_t>(j)] == a) {
        throw Error(ErrorCode::InvalidArgument,
                    fmt::format("createTcpBootstrap: rendezvous roots {} and {} are the same "
                                "address {}: each root needs its own listener",
                                j, k, a));
      }
    }
  }
  if (roots > 1 && !launch.root.empty() && launch.root != launch.roots.front()) {
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("createTcpBootstrap: root {} and roots[0] {} disagree (with several "
                            "roots, roots[0] is rank 0's: leave root empty or the same)",
                            launch.root, launch.roots.front()));
  }
  const std::string root = roots > 1 ? launch.roots.front() : launch.root;
  const int block = rendezvousBlockOf(launch.rank, launch.size, roots);
  const bool serves =
      launch.size > 1 && launch.rank == rendezvousBlockStart(block, launch.size, roots);
  if (launch.size > 1 && root.empty()) {
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("createTcpBootstrap: rank {} of {} has no root address", launch.rank,
                            launch.size));
  }
  if (serves && listener == nullptr) {
    throw Error(ErrorCode::InvalidArgument,
                launch.rank == 0
                    ? std::string("createTcpBootstrap: rank 0 must pass the RendezvousListener "
                                  "whose address it published")
                    : fmt::format("createTcpBootstrap: rank {} serves rendezvous block {} of {} "
                                  "and must pass the RendezvousListener of roots[{}] ({})",
                                  launch.rank, block, roots, block,
                                  launch.roots[static_cast<size_t>(block)]));
  }
  LaunchInfo info;
  info.rank = launch.rank;
  info.size = launch.size;
  info.localRank = launch.localRank;
  info.localSize = launch.localSize;
  info.root = root;
  info.secret = launch.secret;
  info.launcher = kExplicitLauncher;
  info.rootFd = (serves && listener != nullptr) ? listener->fd() : -1;
  if (roots > 1) info.roots = launch.roots;
  // The same assembly as Bootstrap::create: log.level from strata.toml applies and ranks that
  // made different choices fail at start-up instead of in their first collective.
  return bootstrap::assemble(config, &info,
                             [&] { return bootstrap::createBuiltinTcp(config, info); });
}

}  // namespace strata
