#include "base/watch_calls.hpp"

#include <time.h>

#include <algorithm>

#include <fmt/format.h>

namespace strata::watch {

using Clock = std::chrono::steady_clock;

namespace {

double secondsSince(int64_t ticks) {
  return std::chrono::duration<double>(Clock::now() - Clock::time_point(Clock::duration(ticks)))
      .count();
}

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

struct Scope::Rec {
  std::string domain;
  std::string op;  ///< Call's; a Slot's call names its op in opStatic instead
  std::atomic<const char*> opStatic{nullptr};
  std::atomic<uint64_t> seq{0};
  std::atomic<int64_t> start{Clock::now().time_since_epoch().count()};
  std::atomic<bool> active{true};  ///< a Slot's record between calls: false
  std::atomic<int32_t> waitingFor{-1};
  std::atomic<int64_t> waitSince{0};  ///< steady clock ticks
  std::string detail;                 ///< under the scope's mutex
  std::atomic<bool> failed{false};

  std::string opName() const {
    const char* s = opStatic.load(std::memory_order_relaxed);
    return s ? std::string(s) : op;
  }
};

namespace {
thread_local Scope::Rec* tlsCall = nullptr;
thread_local Scope* tlsScope = nullptr;
thread_local std::shared_ptr<Scope::Rec> tlsSpare;
thread_local std::string tlsDiagnosed;  ///< the last message diagnose() produced
thread_local Verdict tlsVerdict;
}  // namespace

Scope::Scope(int rank, int size, std::string host, int32_t pid)
    : rank_(rank), size_(size), host_(std::move(host)), pid_(pid) {}

Scope::~Scope() = default;

RankReport Scope::report() {
  RankReport s;
  s.rank = rank_;
  s.size = size_;
  s.pid = pid_;
  s.host = host_;
  s.jobId = jobId();
  std::lock_guard lk(mu_);
  std::vector<Rec*> all;
  for (auto& [domain, c] : failed_) all.push_back(c.get());
  for (auto& c : calls_) all.push_back(c.get());
  for (Rec* c : all) {
    if (s.calls.size() >= kMaxCallsReported) break;
    if (!c->active.load(std::memory_order_acquire)) continue;
    CallReport cs;
    cs.domain = c->domain;
    cs.op = c->opName();
    cs.seq = c->seq.load(std::memory_order_relaxed);
    cs.seconds = secondsSince(c->start.load(std::memory_order_relaxed));
    cs.waitingFor = c->waitingFor.load(std::memory_order_relaxed);
    if (cs.waitingFor >= 0) {
      cs.waitingSeconds = secondsSince(c->waitSince.load(std::memory_order_relaxed));
      cs.detail = c->detail;
    }
    cs.failed = c->failed.load(std::memory_order_relaxed);
    s.calls.push_back(std::move(cs));
  }
  return s;
}

std::string Scope::nextDomain() {
  return fmt::format("communicator {}", communicators_++);
}

Verdict Scope::findCulprits(const CallReport&) noexcept {
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
    rec_->start.store(Clock::now().time_since_epoch().count(), std::memory_order_relaxed);
  } else {
    rec_ = std::make_shared<Scope::Rec>();
  }
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
  rec_ = std::make_shared<Scope::Rec>();
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
  Scope::Rec& r = *slot_->rec_;
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
  Scope::Rec& r = *slot_->rec_;
  if (!r.failed.load(std::memory_order_relaxed)) r.active.store(false, std::memory_order_release);
}

void waitingFor(int peer, std::string_view detail, Clock::time_point since) noexcept {
  Scope::Rec* c = tlsCall;
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
  Scope::Rec* c = tlsCall;
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
  if (Scope::Rec* c = tlsCall) c->waitingFor.store(-1, std::memory_order_relaxed);
}

Error diagnose(const Error& e) noexcept {
  try {
    Scope::Rec* rec = tlsCall;
    Scope* scope = tlsScope;
    if (tlsDiagnosed != e.what()) tlsVerdict = {};
    if (!rec || !scope || scope->size() < 2) return e;
    if (e.code() != ErrorCode::Timeout && e.code() != ErrorCode::ProtocolError &&
        e.code() != ErrorCode::PeerLost) {
      return e;
    }
    if (tlsDiagnosed == e.what()) return e;  // an inner call's diagnosis, passing through
    rec->failed = true;
    CallReport failing;
    failing.domain = rec->domain;
    failing.op = rec->opName();
    failing.seq = rec->seq.load(std::memory_order_relaxed);
    Verdict v = scope->findCulprits(failing);
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
