#pragma once
#ifndef STRATA_INTERNAL_HEADERS
#error "base/deadline.hpp is internal to strata: applications include <strata/...> only"
#endif

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>

namespace strata {

/// One deadline per blocking call, computed once and passed down. Retries never extend it.
class Deadline {
 public:
  using Clock = std::chrono::steady_clock;

  /// `seconds` from now; infinite or huge values give never(), values <= 0 are already expired.
  static Deadline after(double seconds) {
    if (std::isnan(seconds) || seconds > 1e9) return never();
    Deadline d;
    d.at_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                               std::chrono::duration<double>(seconds > 0 ? seconds : 0.0));
    return d;
  }
  /// For configured timeouts, where 0 (or less) means "no deadline".
  static Deadline fromTimeout(double seconds) { return seconds > 0 ? after(seconds) : never(); }
  static Deadline never() {
    Deadline d;
    d.never_ = true;
    d.at_ = Clock::time_point::max();
    return d;
  }
  bool isNever() const { return never_; }
  bool expired() const { return !never_ && Clock::now() >= at_; }
  Clock::time_point at() const { return at_; }
  /// Seconds left (0 when expired, a large number when never).
  double remaining() const {
    if (never_) return 1e18;
    auto left = std::chrono::duration<double>(at_ - Clock::now()).count();
    return left > 0 ? left : 0.0;
  }
  /// Milliseconds for poll(): -1 for never, rounded up, capped at capMs (if >= 0).
  int pollMs(int capMs = -1) const {
    if (never_) return capMs;
    double ms = std::ceil(remaining() * 1000.0);
    if (ms > INT_MAX / 2) ms = INT_MAX / 2;
    int v = static_cast<int>(ms);
    return capMs >= 0 ? std::min(v, capMs) : v;
  }
  /// The earlier of two deadlines.
  static Deadline earlier(const Deadline& a, const Deadline& b) { return a.at_ <= b.at_ ? a : b; }

 private:
  Clock::time_point at_{};
  bool never_ = false;
};

}  // namespace strata
