#include "base/watch_calls.hpp"

#include <time.h>

#include <algorithm>

#include <fmt/format.h>

namespace strata::watch {

using Clock = std::chrono::steady_clock;

namespace {

/// steady_clock's ticks from the kernel's coarse monotonic clock: the same clock at a few
/// milliseconds' resolution, at a quarter of the cost (read at every collective call).
int64_t coarseNow() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return std::chrono::duration_cast<Clock::duration>(std::chrono::seconds(ts.tv_sec) +
                                                     std::chrono::nanoseconds(ts.tv_nsec))
      .count();
}

}  // namespace

namespace {
thread_local CallRecord* tlsCall = nullptr;
thread_local Scope* tlsScope = nullptr;
thread_local std::shared_ptr<CallRecord> tlsSpare;
thread_local std::string tlsDiagnosed;  ///< the last message diagnose() produced
thread_local Verdict tlsVerdict;
}  // namespace

Scope::Scope(int rank, int size, std::string host, int32_t pid)
    : rank_(rank), size_(size), host_(std::move(host)), pid_(pid) {}

Scope::~Scope() = default;

std::string Scope::nextDomain() {
  return fmt::format("communicator {}", communicators_++);
}

void Scope::listenRevoke(const std::string& domain, RevokeListener listener) {
  std::unique_lock lk(revokeMu_);
  auto it = revoked_.find(domain);
  if (it != revoked_.end()) {
    Revoke r = it->second;
    lk.unlock();
    listener(r);
    return;
  }
  revokeListeners_[domain] = std::move(listener);
}

void Scope::unlistenRevoke(const std::string& domain) noexcept {
  std::lock_guard lk(revokeMu_);
  revokeListeners_.erase(domain);
}

bool Scope::deliverRevoke(const std::string& domain, const Revoke& revoke) {
  RevokeListener listener;
  {
    std::lock_guard lk(revokeMu_);
    if (!revoked_.emplace(domain, revoke).second) return false;
    auto it = revokeListeners_.find(domain);
    if (it != revokeListeners_.end()) {
      listener = std::move(it->second);
      revokeListeners_.erase(it);
    }
  }
  if (listener) listener(revoke);
  return true;
}

std::optional<Scope::Revoke> Scope::revokeOf(const std::string& domain) const {
  std::lock_guard lk(revokeMu_);
  auto it = revoked_.find(domain);
  if (it == revoked_.end()) return std::nullopt;
  return it->second;
}

std::map<std::string, Scope::Revoke> Scope::revokes() const {
  std::lock_guard lk(revokeMu_);
  return revoked_;
}

void Scope::broadcastRevoke(const std::string&, const Revoke&) noexcept {}

Verdict Scope::findCulprits(const CallRecord&) noexcept {
  return {};
}

Call::Call(std::shared_ptr<Scope> scope, std::string domain, std::string_view op, uint64_t seq)
    : scope_(std::move(scope)) {
  if (!scope_) return;
  // One record per thread is reused (a collective call must stay cheap); nested calls and
  // records still listed by a report being built get fresh ones.
  if (tlsSpare && tlsSpare.use_count() == 1) {
    rec_ = std::move(tlsSpare);
    rec_->waitingFor.store(-1, std::memory_order_relaxed);
    rec_->failed.store(false, std::memory_order_relaxed);
    rec_->detail.clear();
  } else {
    rec_ = std::make_shared<CallRecord>();
  }
  rec_->start.store(Clock::now().time_since_epoch().count(), std::memory_order_relaxed);
  rec_->domain = std::move(domain);
  rec_->op = op;
  rec_->seq = seq;
  {
    std::lock_guard lk(scope_->mu_);
    scope_->calls_.push_back(rec_);
    if (!scope_->failed_.empty()) scope_->failed_.erase(rec_->domain);
  }
  prev_ = tlsCall;
  prevScope_ = tlsScope;
  tlsCall = rec_.get();
  tlsScope = scope_.get();
}

Call::~Call() {
  if (!scope_) return;
  tlsCall = prev_;
  tlsScope = prevScope_;
  {
    std::lock_guard lk(scope_->mu_);
    std::erase(scope_->calls_, rec_);
    if (rec_->failed.load(std::memory_order_relaxed)) {
      scope_->failed_[rec_->domain] = std::move(rec_);
      return;
    }
  }
  if (!tlsSpare) tlsSpare = std::move(rec_);
}

Slot::Slot(std::shared_ptr<Scope> scope, std::string domain) : scope_(std::move(scope)) {
  if (!scope_) return;
  rec_ = std::make_shared<CallRecord>();
  rec_->domain = std::move(domain);
  rec_->active.store(false, std::memory_order_relaxed);
  std::lock_guard lk(scope_->mu_);
  scope_->calls_.push_back(rec_);
}

Slot::~Slot() {
  if (!scope_) return;
  std::lock_guard lk(scope_->mu_);
  std::erase(scope_->calls_, rec_);
}

// No lock: the record is the slot's alone, and a report being built reads each field atomically
// (a report may mix two consecutive calls' fields; it is a snapshot of a moving target anyway).
Slot::Active::Active(Slot* slot, const char* op, uint64_t seq) noexcept
    : slot_(slot && slot->rec_ ? slot : nullptr) {
  if (!slot_) return;
  CallRecord& r = *slot_->rec_;
  r.waitingFor.store(-1, std::memory_order_relaxed);
  r.failed.store(false, std::memory_order_relaxed);
  r.opStatic.store(op, std::memory_order_relaxed);
  r.seq.store(seq, std::memory_order_relaxed);
  r.start.store(coarseNow(), std::memory_order_relaxed);
  r.active.store(true, std::memory_order_release);
  prev_ = tlsCall;
  prevScope_ = tlsScope;
  tlsCall = &r;
  tlsScope = slot_->scope_.get();
}

Slot::Active::~Active() {
  if (!slot_) return;
  tlsCall = prev_;
  tlsScope = prevScope_;
  CallRecord& r = *slot_->rec_;
  if (!r.failed.load(std::memory_order_relaxed)) r.active.store(false, std::memory_order_release);
}

void waitingFor(int peer, std::string_view detail, Clock::time_point since) noexcept {
  CallRecord* c = tlsCall;
  if (!c) return;
  const int64_t ticks = since.time_since_epoch().count();
  if (c->waitingFor.load(std::memory_order_relaxed) == peer &&
      c->waitSince.load(std::memory_order_relaxed) == ticks) {
    return;
  }
  try {
    std::lock_guard lk(tlsScope->mu_);
    c->detail.assign(detail);
    c->waitSince.store(ticks, std::memory_order_relaxed);
    c->waitingFor.store(peer, std::memory_order_relaxed);
  } catch (...) {
  }
}

void waitingFor(int peer, std::string_view detail) noexcept {
  CallRecord* c = tlsCall;
  if (!c) return;
  if (c->waitingFor.load(std::memory_order_relaxed) == peer) {
    // Same peer: keep the time the wait began, refresh the detail only.
    try {
      std::lock_guard lk(tlsScope->mu_);
      c->detail.assign(detail);
    } catch (...) {
    }
    return;
  }
  waitingFor(peer, detail, Clock::now());
}

void progressed() noexcept {
  if (CallRecord* c = tlsCall) c->waitingFor.store(-1, std::memory_order_relaxed);
}

void markFailed() noexcept {
  if (CallRecord* c = tlsCall) c->failed.store(true, std::memory_order_relaxed);
}

Error diagnose(const Error& e) noexcept {
  try {
    CallRecord* rec = tlsCall;
    Scope* scope = tlsScope;
    if (tlsDiagnosed != e.what()) tlsVerdict = {};
    if (!rec || !scope || scope->size() < 2) return e;
    if (e.code() != ErrorCode::Timeout && e.code() != ErrorCode::ProtocolError &&
        e.code() != ErrorCode::PeerLost) {
      return e;
    }
    if (tlsDiagnosed == e.what()) return e;  // an inner call's diagnosis, passing through
    rec->failed = true;
    Verdict v = scope->findCulprits(*rec);
    if (v.culprit < 0) return e;
    std::string text = fmt::format("{}. This rank ({}): {}", v.ownText, scope->rank(), e.what());
    const int peer = v.culprit == scope->rank() ? e.peer() : v.culprit;
    tlsVerdict = std::move(v);
    Error out(e.code(), text, peer);
    tlsDiagnosed = out.what();
    return out;
  } catch (...) {
    return e;
  }
}

Verdict lastVerdict() noexcept {
  try {
    return tlsVerdict;
  } catch (...) {
    return {};
  }
}

}  // namespace strata::watch
