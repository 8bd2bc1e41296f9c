// Opening a scope: its status port, and the exchange of every rank's status address, host and
// pid over the bootstrap being watched.

#include <unistd.h>

#include <array>
#include <chrono>
#include <cstring>

#include <fmt/format.h>

#include <strata/error.hpp>

#include "base/crypto.hpp"
#include "base/log.hpp"
#include "base/process.hpp"
#include "net/netif.hpp"
#include "net/socket.hpp"
#include "served_scope.hpp"
#include "watch/watch.hpp"

namespace strata::watch {

namespace {

constexpr const char* kSub = "watch";

/// The status port on the interface the bootstrap uses; its published address.
std::string listen(ServedScope& scope, const OpenOptions& o) {
  std::vector<net::SockAddr> hint;
  if (!o.rootHint.empty()) {
    std::string host;
    uint16_t port = 0;
    net::splitHostPort(o.rootHint, host, port, "rendezvous address");
    hint = net::resolve(host, port);
  }
  auto iface = netif::select(o.interface, 0, hint.empty() ? nullptr : hint.front().get());
  net::SockAddr a =
      net::SockAddr::fromRaw(reinterpret_cast<const sockaddr*>(&iface.addr), iface.addrLen);
  a.setPort(0);
  scope.listener = net::listenOn(a, 256);
  std::string address = net::localAddress(scope.listener.get()).toString();
  if (address.size() > kMaxExchangeAddress) {
    scope.listener.reset();
    throw Error(ErrorCode::Internal, fmt::format("its address {} is too long to publish", address));
  }
  return address;
}

double secondsSince(int64_t ticks) {
  using Clock = std::chrono::steady_clock;
  return std::chrono::duration<double>(Clock::now() - Clock::time_point(Clock::duration(ticks)))
      .count();
}

}  // namespace

CallReport report(const CallRecord& c) {
  CallReport r;
  r.domain = c.domain;
  r.op = c.opName();
  r.seq = c.seq.load(std::memory_order_relaxed);
  r.seconds = secondsSince(c.start.load(std::memory_order_relaxed));
  r.waitingFor = c.waitingFor.load(std::memory_order_relaxed);
  if (r.waitingFor >= 0) {
    r.waitingSeconds = secondsSince(c.waitSince.load(std::memory_order_relaxed));
    r.detail = c.detail;
  }
  r.failed = c.failed.load(std::memory_order_relaxed);
  return r;
}

RankReport report(Scope& scope) {
  RankReport s;
  s.rank = scope.rank();
  s.size = scope.size();
  s.pid = scope.pid();
  s.host = scope.host();
  s.jobId = scope.jobId();
  scope.forEachCall([&](const CallRecord& c) {
    if (s.calls.size() < kMaxCallsReported && c.active.load(std::memory_order_acquire)) {
      s.calls.push_back(report(c));
    }
  });
  return s;
}

std::shared_ptr<Scope> open(const OpenOptions& o, const AllGather& allGather) {
  auto scope = std::make_shared<ServedScope>(o.rank, o.size, process::hostName(),
                                             static_cast<int32_t>(::getpid()));
  scope->queryTimeout = o.queryTimeout;
  PeerInfo me{"", scope->host(), scope->pid()};
  try {
    me.address = listen(*scope, o);
  } catch (const std::exception& e) {
    STRATA_LOG(Warn, kSub,
               "rank {}: no status service ({}); a stalled job's errors will not say which rank "
               "is stuck",
               o.rank, e.what());
  }
  uint64_t mine = 0;
  crypto::randomBytes(std::span<uint8_t>(reinterpret_cast<uint8_t*>(&mine), sizeof mine));
  // The status port takes the job secret; without one, rank 0 makes one for the status service
  // and sends it over the bootstrap (authenticated itself, or PMIx's), so that only the job's
  // ranks can ask (local tools use the same-user unix socket instead). The job secret itself is
  // never sent: every rank has it, and it may be longer than the exchange record holds.
  std::string madeSecret;
  if (o.secret.empty() && o.rank == 0) {
    std::array<uint8_t, 24> raw{};
    crypto::randomBytes(raw);
    madeSecret = crypto::toHex(raw);
  }
  const size_t n = static_cast<size_t>(o.size);
  std::vector<uint8_t> all(kExchangeSlot * n);
  auto slot = encodeExchange({mine, madeSecret, me});
  std::memcpy(all.data() + kExchangeSlot * static_cast<size_t>(o.rank), slot.data(), kExchangeSlot);
  allGather(all.data(), kExchangeSlot);
  scope->peers.resize(n);
  for (size_t r = 0; r < n; ++r) {
    Exchange x =
        decodeExchange(std::span<const uint8_t>(all).subspan(kExchangeSlot * r, kExchangeSlot),
                       static_cast<int>(r));
    scope->peers[r] = std::move(x.peer);
    if (r == 0) {
      scope->setJob(x.jobId);
      scope->secret = o.secret.empty() ? x.secret : o.secret;
    }
  }
  serve(scope);
  return scope;
}

void close(const Scope& scope) noexcept {
  if (auto* served = dynamic_cast<const ServedScope*>(&scope)) {
    served->closed.store(true, std::memory_order_release);
    // The revoke senders stop at once (closed) and are joined, so that none outlives the scope
    // (nor the process's exit with a handshake half done).
    std::vector<std::thread> threads;
    {
      std::lock_guard lk(served->revokeThreadsMu);
      threads.swap(served->revokeThreads);
    }
    for (auto& t : threads) {
      if (t.joinable() && t.get_id() != std::this_thread::get_id()) t.join();
      if (t.joinable()) t.detach();
    }
  }
  try {
    stopServing(&scope);
  } catch (...) {
  }
}

}  // namespace strata::watch
