// Revokes between the ranks of a scope (Communicator::revoke): a rank tells every other rank's
// status service that a domain ("communicator 0") is revoked, on a thread of its own so that the
// revoking call never waits; ranks that do not answer (stopped, or slow to accept) are asked again
// until they answer, have exited, or the scope closes. The service delivers what it is told to
// the scope (Scope::deliverRevoke), whose listener (the Communicator) stops its work.

#include <chrono>
#include <thread>

#include <fmt/format.h>

#include "base/log.hpp"
#include "served_scope.hpp"

namespace strata::watch {

namespace {
constexpr const char* kSub = "watch";
/// How long a revoke keeps asking a rank that does not answer (a stopped process).
constexpr double kRevokeRetrySeconds = 600;
constexpr auto kRevokeRetryPause = std::chrono::milliseconds(200);
}  // namespace

std::string takeRevoke(ServedScope& scope, const Request& q) {
  if (q.origin < 0 || q.origin >= scope.size() || q.origin == scope.rank()) {
    return fmt::format("a revoke from rank {} (this scope has ranks 0..{}, this is rank {})",
                       q.origin, scope.size() - 1, scope.rank());
  }
  Scope::Revoke r;
  r.origin = q.origin;
  r.reason = q.reason;
  for (int32_t s : q.suspects) {
    if (s < 0 || s >= scope.size()) {
      return fmt::format("a revoke that names rank {} lost (ranks 0..{})", s, scope.size() - 1);
    }
    r.suspects.push_back(s);
  }
  r.code = static_cast<ErrorCode>(q.code);
  r.interrupt = q.interrupt;
  if (q.domain.empty()) return "a revoke without a domain";
  if (scope.deliverRevoke(q.domain, r)) {
    STRATA_LOG(Debug, kSub, "rank {} revoked {}: {}", q.origin, q.domain, q.reason);
  }
  return {};
}

std::string describeRevokes(const Scope& scope) {
  std::string out;
  for (const auto& [domain, r] : scope.revokes()) {
    out += fmt::format("{}: revoked by rank {}{}: {}\n", domain, r.origin,
                       r.origin == scope.rank() ? " (this rank)" : "", r.reason.substr(0, 300));
  }
  return out;
}

ServedScope::~ServedScope() {
  closed.store(true, std::memory_order_release);
  for (auto& t : revokeThreads) {
    if (!t.joinable()) continue;
    if (t.get_id() == std::this_thread::get_id()) {
      t.detach();
    } else {
      t.join();
    }
  }
}

void ServedScope::broadcastRevoke(const std::string& domain, const Revoke& revoke) noexcept {
  if (closed.load(std::memory_order_acquire)) return;  // nobody to tell any more
  try {
    Request q;
    q.type = RequestType::Revoke;
    q.jobId = jobId();
    q.domain = domain;
    q.origin = rank();
    q.reason = revoke.reason;
    q.suspects.assign(revoke.suspects.begin(), revoke.suspects.end());
    q.code = static_cast<uint8_t>(revoke.code);
    q.interrupt = revoke.interrupt;
    std::vector<int> pending;
    for (int p = 0; p < size(); ++p) {
      if (p != rank()) pending.push_back(p);
    }
    std::thread t([self = shared_from_this(), request = encodeRequest(q), domain,
                   pending = std::move(pending)]() mutable {
      const auto until =
          std::chrono::steady_clock::now() + std::chrono::duration<double>(kRevokeRetrySeconds);
      while (!pending.empty() && !self->closed.load(std::memory_order_acquire)) {
        auto answers = askEach(
            *self, pending, request, self->queryTimeout,
            [](int, Reply& rep, Answer&) { return rep.error; }, &self->closed);
        std::vector<int> again;
        for (int p : pending) {
          const Answer& a = answers[static_cast<size_t>(p)];
          if (a.kind == Answer::Kind::NoAnswer || a.kind == Answer::Kind::Unreachable) {
            again.push_back(p);
          } else if (a.kind != Answer::Kind::Answered) {
            STRATA_LOG(Debug, kSub, "revoke of {} not told to rank {}: {}", domain, p, a.error);
          }
        }
        pending = std::move(again);
        if (pending.empty() || std::chrono::steady_clock::now() > until) break;
        for (auto slept = std::chrono::milliseconds(0);
             slept < kRevokeRetryPause && !self->closed.load(std::memory_order_acquire);
             slept += std::chrono::milliseconds(20)) {
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
      }
      if (!pending.empty() && !self->closed.load(std::memory_order_acquire)) {
        STRATA_LOG(Warn, kSub, "revoke of {}: {} rank(s) never answered (first: rank {})", domain,
                   pending.size(), pending.front());
      }
    });
    std::lock_guard lk(revokeThreadsMu);
    revokeThreads.push_back(std::move(t));
  } catch (const std::exception& e) {
    STRATA_LOG(Warn, "watch", "revoke of {} not told to the other ranks: {}", domain, e.what());
  }
}

}  // namespace strata::watch
