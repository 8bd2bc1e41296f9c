#include <sched.h>
#include <time.h>

#include <algorithm>
#include <chrono>

#include <fmt/format.h>

#include <strata/error.hpp>

#include "base/backoff.hpp"
#include "base/deadline.hpp"
#include "base/watch_calls.hpp"
#include "context_impl.hpp"
#include "records.hpp"

namespace strata {
namespace {

// How long a wait polls (driving progress itself) before it blocks in the transport, where the
// transport can block: short waits keep the latency of polling, long ones stop taking CPU time
// in sleep steps from the threads that move the data.
constexpr auto kPollPhase = std::chrono::milliseconds(2);
// The longest single blocking wait: liveness checks and the deadline run between them.
constexpr double kBlockSlice = 0.02;

}  // namespace

struct HostSemaphore::Impl {
  std::shared_ptr<Connection> conn;
  std::shared_ptr<transport::SlotPool> pool;
  uint32_t localSlot = 0;
  uint64_t remoteOffset = 0;
  uint64_t outbound = 0;  ///< last value written to the peer's counter
  uint64_t expected = 0;  ///< value of our counter after the last signal we consumed
  double timeout = 30;
  ~Impl() {
    if (pool) pool->release(localSlot);
  }
  backend::LocalRef counter;  ///< this transport's registration of the arena, found once
  uint64_t offset() const { return uint64_t{localSlot} * transport::SlotPool::kStride; }
  uint64_t load() {
    return transport::Access::impl(*conn).transport->loadSignal(counter, offset());
  }
};

HostSemaphore::HostSemaphore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HostSemaphore::~HostSemaphore() = default;

int HostSemaphore::peer() const noexcept {
  return impl_->conn->peer();
}

void HostSemaphore::signal() {
  auto& I = *impl_;
  I.conn->updateAndSync(transport::Access::impl(*I.conn).peerArena, I.remoteOffset, I.outbound + 1);
  ++I.outbound;
}

bool HostSemaphore::poll() {
  auto& I = *impl_;
  if (I.load() > I.expected) {
    ++I.expected;
    return true;
  }
  I.conn->progress();
  return false;
}

void HostSemaphore::wait(double timeoutSeconds) {
  auto& I = *impl_;
  double t = timeoutSeconds < 0 ? I.timeout : timeoutSeconds;
  auto deadline = Deadline::fromTimeout(t);
  const auto start = std::chrono::steady_clock::now();
  auto lastCheck = start;
  auto& tr = *transport::Access::impl(*I.conn).transport;
  const bool canBlock = tr.blockingWaitSupported();
  // A signal from a running peer lands within microseconds: spin 20 us before yielding.
  Backoff backoff(20, 1);
  if (I.load() > I.expected) {  // already here: no need to tell the status service
    ++I.expected;
    return;
  }
  watch::Call call(transport::Access::impl(*I.conn).scope, "connection", "semaphore wait", 0);
  watch::waitingFor(peer(), fmt::format("signal {} from it not yet received", I.expected + 1));
  for (;;) {
    if (I.load() > I.expected) {
      ++I.expected;
      return;
    }
    auto now = std::chrono::steady_clock::now();
    // Also at once when the deadline has passed: a blocking wait given no time left would
    // otherwise return at once and loop until the next periodic check.
    if (now - lastCheck > std::chrono::milliseconds(10) || deadline.expired()) {
      lastCheck = now;
      I.conn->checkPeer();
      if (deadline.expired()) {
        throw watch::diagnose(
            Error(ErrorCode::Timeout,
                  fmt::format("semaphore wait for rank {} over {} timed out after {} s (signals "
                              "received {}, waiting for {}); the peer may be stuck or slower: "
                              "raise transport.timeout",
                              peer(), I.conn->transport(), t, I.expected, I.expected + 1),
                  peer()));
      }
    }
    if (canBlock && now - start > kPollPhase) {
      // A long wait (a batch of large writes): sleep until the transport's progress thread sees
      // the signal, waking every few milliseconds for the liveness check and the deadline.
      tr.waitSignal(I.counter, I.offset(), I.expected,
                    std::min(kBlockSlice, std::max(deadline.remaining(), 0.0)));
      continue;
    }
    I.conn->progress();
    backoff.pause();
  }
}

std::vector<std::shared_ptr<HostSemaphore>> Context::createSemaphores(
    std::span<const std::shared_ptr<Connection>> connections) {
  auto& I = *impl_;
  // Group by peer, keeping order: one record per peer carries all its slots.
  std::vector<int> peers;
  std::map<int, std::vector<size_t>> byPeer;
  std::vector<std::unique_ptr<HostSemaphore::Impl>> sems;
  for (size_t i = 0; i < connections.size(); ++i) {
    const auto& c = connections[i];
    if (!c) throw Error(ErrorCode::InvalidArgument, "Context::createSemaphores: null connection");
    if (!byPeer.count(c->peer())) peers.push_back(c->peer());
    byPeer[c->peer()].push_back(i);
    auto s = std::make_unique<HostSemaphore::Impl>();
    s->conn = c;
    s->timeout = I.timeout;
    s->pool = I.pool(std::string(c->transport()), *this);
    s->localSlot = s->pool->acquire(I.rank);
    const auto& arena = s->pool->arena;
    s->counter = {arena.data(), arena.size(), arena.kind(),
                  transport::Access::impl(arena)->localFor(c->transport())};
    s->expected = s->load();
    sems.push_back(std::move(s));
  }
  for (int p : peers) {
    transport::SemaphoreRecord r;
    r.from = I.rank;
    r.to = p;
    for (size_t i : byPeer[p]) {
      r.slots.push_back(
          {std::string(connections[i]->transport()), sems[i]->localSlot, sems[i]->expected});
    }
    transport::sendBlob(*I.bootstrap, p, transport::kTagSemaphore, transport::encodeSemaphore(r));
  }
  for (int p : peers) {
    auto r = transport::decodeSemaphore(
        transport::recvBlob(*I.bootstrap, p, transport::kTagSemaphore, "semaphore record"), p);
    const auto& mine = byPeer[p];
    if (r.to != I.rank || r.slots.size() != mine.size()) {
      throw Error(ErrorCode::ProtocolError,
                  fmt::format("rank {} made {} semaphores with rank {}, this rank made {}: both "
                              "sides must pass their connections to each other in the same order",
                              p, r.slots.size(), I.rank, mine.size()),
                  p);
    }
    for (size_t k = 0; k < mine.size(); ++k) {
      auto& s = *sems[mine[k]];
      const auto& slot = r.slots[k];
      if (slot.transport != s.conn->transport() || slot.slot >= transport::SlotPool::kSlots) {
        throw Error(ErrorCode::ProtocolError,
                    fmt::format("rank {}'s semaphore {} is on {} slot {}, this rank's on {}", p, k,
                                slot.transport, slot.slot, s.conn->transport()),
                    p);
      }
      s.remoteOffset = uint64_t{slot.slot} * transport::SlotPool::kStride;
      s.outbound = slot.base;
    }
  }
  std::vector<std::shared_ptr<HostSemaphore>> out;
  for (auto& s : sems) out.push_back(std::make_shared<HostSemaphore>(std::move(s)));
  return out;
}

}  // namespace strata
