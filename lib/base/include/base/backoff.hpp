#pragma once
#ifndef STRATA_INTERNAL_HEADERS
#error "base/backoff.hpp is internal to strata: applications include <strata/...> only"
#endif

#include <sched.h>
#include <time.h>

#include <chrono>

namespace strata {

/// The pause of a polling wait: spin briefly, then yield, then sleep in 50 us steps. Ranks often
/// share cores, and a spinning waiter would starve the rank it waits for. The phases count from
/// the first pause() after construction or reset() (call reset() on progress).
///
/// A spin step is pausesPerStep pause instructions (25 ns each on AMD EPYC, about 40 on recent
/// Intel): 16 make a step of 400-640 ns. Polling the host collectives after every pause made a
/// 2-rank allGather of 8 B take 0.45 us instead of 0.63 (AMD EPYC, 2 CPUs, alternating runs)
/// but allReduce of 256 KiB and 1 MiB per rank 5-13% slower, even when fine polling lasted
/// only the first 400 ns of each wait; the engine keeps 16.
class Backoff {
 public:
  /// spinUs: how long to spin before yielding (0 when ranks outnumber cores: a spinning rank
  /// would only delay the one it waits for); pausesPerStep: pause instructions per spin step.
  explicit Backoff(int spinUs = 10, int pausesPerStep = 16)
      : spin_(std::chrono::microseconds(spinUs)), pauses_(pausesPerStep) {}
  void reset() { idle_ = false; }
  void pause() {
    auto now = std::chrono::steady_clock::now();
    if (!idle_) {
      idle_ = true;
      since_ = now;
    }
    auto waited = now - since_;
    if (waited < spin_) {
#if defined(__x86_64__)
      for (int i = 0; i < pauses_; ++i) __builtin_ia32_pause();
#endif
    } else if (waited < std::chrono::milliseconds(2)) {
      sched_yield();
    } else {
      timespec ts{0, 50'000};
      nanosleep(&ts, nullptr);
    }
  }

 private:
  std::chrono::microseconds spin_;
  int pauses_;
  bool idle_ = false;
  std::chrono::steady_clock::time_point since_;
};

}  // namespace strata
