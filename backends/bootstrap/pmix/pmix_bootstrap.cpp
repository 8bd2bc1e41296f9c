// The PmixBootstrap class (pmix_bootstrap.hpp) and the module's entry point: creation and
// teardown on the process's PMIx connection, identity, point-to-point over the peer mesh, and
// abort. Its collectives are in pmix_collectives.cpp.

#include "pmix_bootstrap.hpp"

#include <pmix.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include <fmt/format.h>

#include <strata/backend/module.hpp>
#include <strata/error.hpp>
#include <strata/version.hpp>

#include "base/config_keys.hpp"
#include "base/log.hpp"
#include "mesh/peer_mesh.hpp"
#include "net/netif.hpp"
#include "net/socket.hpp"
#include "pmix_internal.hpp"

extern char** environ;

namespace strata::pmix {
namespace {

bool envPresent(const char* prefix) {
  size_t n = std::strlen(prefix);
  for (char** e = environ; e && *e; ++e) {
    if (std::strncmp(*e, prefix, n) == 0) return true;
  }
  return false;
}

int familyFromConfig(const Config& config) {
  std::string f = config::getString(config, "bootstrap.tcp.family");
  if (f == "ipv4") return AF_INET;
  if (f == "ipv6") return AF_INET6;
  return AF_UNSPEC;
}

}  // namespace

PmixBootstrap::PmixBootstrap(const Config& config) : impl_(std::make_unique<Impl>()) {
  auto& I = *impl_;
  // Read the configuration before joining PMIx: a bad value must not cost a PMIx reference.
  mesh::Options opt;
  opt.backend = "pmix";
  opt.timeout = config::getDouble(config, "bootstrap.timeout");
  opt.handshakeTimeout = config::getDouble(config, "bootstrap.handshake_timeout");
  opt.maxMessage = config::getBytes(config, "bootstrap.max_message");
  double connectTimeout = config::getDouble(config, "bootstrap.connect_timeout");
  std::string interface = config::getString(config, "bootstrap.tcp.interface");
  int family = familyFromConfig(config);
  I.timeout = opt.timeout;

  I.instance = acquire();
  try {
    Session& s = session();
    I.rank = s.rank;
    I.size = s.size;
    I.localRank = s.localRank;
    I.localSize = s.localSize;
    log::setRank(I.rank);
    opt.rank = I.rank;
    opt.size = I.size;
    auto spin = mesh::spinPolicy(config, I.localSize);
    opt.spinUs = spin.us;
    opt.spinYield = spin.yield;
    if (I.size == 1) {
      I.mesh = std::make_unique<mesh::PeerMesh>(opt, net::Fd());
      return;
    }

    auto iface = netif::select(interface, family);
    net::SockAddr bindAddr =
        net::SockAddr::fromRaw(reinterpret_cast<const sockaddr*>(&iface.addr), iface.addrLen);
    bindAddr.setPort(0);
    net::Fd listener = net::listenOn(bindAddr);
    std::string address = net::localAddress(listener.get()).toString();
    STRATA_LOG(Debug, kSub, "rank {} of {} (bootstrap #{}) listens on {} ({})", I.rank, I.size,
               I.instance, address, iface.name);

    auto others = I.others();
    auto directory = exchangeAddresses(I.instance, I.rank, I.size, others, address, connectTimeout);
    opt.secret = directory.secret;
    I.mesh = std::make_unique<mesh::PeerMesh>(opt, std::move(listener));
    I.mesh->setPeerAddresses(directory.addresses);
  } catch (...) {
    I.mesh.reset();
    release();
    I.released = true;
    throw;
  }
}

PmixBootstrap::~PmixBootstrap() {
  auto& I = *impl_;
  if (I.mesh) I.mesh->close();
  I.mesh.reset();
  if (!I.released) release();
}

int PmixBootstrap::rank() const noexcept {
  return impl_->rank;
}
int PmixBootstrap::size() const noexcept {
  return impl_->size;
}
int PmixBootstrap::localRank() const noexcept {
  return impl_->localRank;
}
int PmixBootstrap::localSize() const noexcept {
  return impl_->localSize;
}

void PmixBootstrap::send(int peer, int tag, const void* data, size_t bytes) {
  impl_->mesh->send(peer, tag, data, bytes, impl_->mesh->callDeadline());
}

void PmixBootstrap::recv(int peer, int tag, void* data, size_t bytes) {
  impl_->mesh->recv(peer, tag, data, bytes, impl_->mesh->callDeadline());
}

mesh::InterruptKey PmixBootstrap::interruptKey() const noexcept {
  return impl_->mesh ? impl_->mesh->interruptKey() : mesh::InterruptKey{};
}

bool PmixBootstrap::interruptCalls(const Error& why) noexcept {
  if (impl_->mesh) impl_->mesh->interrupt(why);
  return true;
}

void PmixBootstrap::abort(std::string_view reason) noexcept {
  auto& I = *impl_;
  if (I.aborted.exchange(true)) return;
  try {
    I.abortReason = std::string(reason.substr(0, 1024));
  } catch (...) {
  }
  // The mesh first: PMIx_Abort may end this process before it returns.
  if (I.mesh) I.mesh->abort(reason);
  if (I.size <= 1) return;
  Session& s = session();
  if (s.pid != getpid()) return;
  s.aborted = true;
  try {
    // PMIx_Abort asks the server to end the whole job and waits for its answer. Run it aside
    // so that a server that never answers cannot hang this call.
    auto message = std::make_shared<std::string>(
        fmt::format("strata: rank {} aborted: {}", I.rank, I.abortReason));
    auto done = std::make_shared<std::promise<void>>();
    auto finished = done->get_future();
    std::thread([message, done] {
      PMIx_Abort(1, message->c_str(), nullptr, 0);
      done->set_value();
    }).detach();
    if (finished.wait_for(std::chrono::seconds(5)) != std::future_status::ready) {
      STRATA_LOG(Warn, kSub, "PMIx_Abort did not return within 5 s; leaving it running");
    }
  } catch (...) {
    STRATA_LOG(Warn, kSub,
               "could not call PMIx_Abort; other ranks learn of the abort only "
               "through their mesh connections");
  }
}

std::string PmixBootstrap::listenAddress() const {
  return impl_->mesh ? impl_->mesh->listenAddress() : std::string();
}

bool detectServer() noexcept {
  return envPresent("PMIX_SERVER_URI") || envPresent("PMIX_NAMESPACE=");
}

}  // namespace strata::pmix

namespace {

bool detect() noexcept {
  return strata::pmix::detectServer();
}

std::unique_ptr<strata::Bootstrap> create(const strata::Config& config) {
  try {
    return std::make_unique<strata::pmix::PmixBootstrap>(config);
  } catch (const strata::Error&) {
    throw;
  } catch (const std::exception& e) {
    throw strata::Error(strata::ErrorCode::Internal,
                        fmt::format("pmix bootstrap: unexpected failure: {}", e.what()));
  }
}

}  // namespace

extern "C" __attribute__((visibility("default"))) const strata::backend::ModuleInfo*
strata_module_info() {
  static const strata::backend::ModuleInfo info{
      STRATA_MODULE_ABI_VERSION,
      strata::backend::ModuleKind::Bootstrap,
      "pmix",
      STRATA_VERSION_STRING,
      "PMIx (srun --mpi=pmix, mpirun): identity and collectives from the PMIx server, "
      "point-to-point over authenticated TCP",
      &detect,
      &create,
      nullptr,
      nullptr,
      nullptr,
  };
  return &info;
}
