// One job of the scale test (tests/stress/scale.sh runs it at 128 and 256 ranks on 2 cores):
// every rank goes through the phases of a job's start, times each, checks every result, and
// rank 0 reports per phase the time over ranks (min, median, max) and its own resources after
// the phase (resident memory, open file descriptors, threads; from /proc/self).
//
// Phases: rendezvous (Bootstrap::create), a bootstrap allGather of 64 bytes per rank, a
// bootstrap barrier, Communicator::create (connects every pair through the default transports:
// shm on one host), a small allReduce (1024 doubles), a small allGather (16 doubles per rank),
// and the Communicator's destruction.
//
// usage: scale [--json FILE]
// Output (rank 0): one line per phase, "scale: N ranks: PHASE: min/median/max ms (rank 0: rss
// MiB, fds, threads)", and with --json one JSON object per phase in FILE.
// Exit status: 0 all phases passed with correct results; 1 a phase failed or a result was wrong
// (the first error is printed with the rank and phase); 2 bad arguments.

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include <strata/bootstrap.hpp>
#include <strata/communicator.hpp>
#include <strata/error.hpp>

#include "tests/harness/proc_stats.hpp"

namespace {

using Clock = std::chrono::steady_clock;

struct Resources {
  double rssMiB = 0;
  int fds = 0;
  int threads = 0;
};

Resources sample() {
  const strata::test::ProcStats p = strata::test::procStats();
  return {static_cast<double>(p.rssKiB) / 1024.0, p.fds, p.threads};
}

const char* const kPhases[] = {"rendezvous",  "bootstrap-allgather", "bootstrap-barrier",
                               "comm-create", "allreduce",           "allgather",
                               "comm-destroy"};
constexpr int kPhaseCount = sizeof kPhases / sizeof kPhases[0];

struct Failure {
  int phase;
  std::string what;
};

double ms(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

}  // namespace

int main(int argc, char** argv) {
  std::string jsonPath;
  if (argc == 3 && std::strcmp(argv[1], "--json") == 0) {
    jsonPath = argv[2];
  } else if (argc != 1) {
    std::fprintf(stderr, "usage: %s [--json FILE]\n", argv[0]);
    return 2;
  }
  double times[kPhaseCount] = {};
  Resources res[kPhaseCount + 1];
  res[0] = sample();  // before anything (index 0); after phase i at index i + 1
  int phase = 0;
  int rank = -1;
  try {
    auto t = Clock::now();
    std::shared_ptr<strata::Bootstrap> boot = strata::Bootstrap::create();
    auto next = [&] {
      auto now = Clock::now();
      times[phase] = ms(t, now);
      res[phase + 1] = sample();
      ++phase;
      t = Clock::now();
    };
    next();
    rank = boot->rank();
    const int n = boot->size();

    // Bootstrap allGather: 64 bytes per rank, each a pattern of its rank.
    constexpr size_t kBytes = 64;
    auto pattern = [](int r, size_t i) { return static_cast<unsigned char>(r * 131 + i * 7 + 1); };
    std::vector<unsigned char> slots(kBytes * static_cast<size_t>(n));
    for (size_t i = 0; i < kBytes; ++i) slots[rank * kBytes + i] = pattern(rank, i);
    boot->allGather(slots.data(), kBytes);
    for (int r = 0; r < n; ++r) {
      for (size_t i = 0; i < kBytes; ++i) {
        if (slots[r * kBytes + i] != pattern(r, i)) {
          throw Failure{phase, "slot of rank " + std::to_string(r) + " byte " + std::to_string(i) +
                                   " is wrong"};
        }
      }
    }
    next();

    boot->barrier();
    next();

    auto comm = strata::Communicator::create(boot);
    next();

    constexpr size_t kReduce = 1024;
    std::vector<double> send(kReduce), recv(kReduce, -1);
    for (size_t i = 0; i < kReduce; ++i) send[i] = static_cast<double>(rank + 1) + i % 7;
    comm->allReduce(send.data(), recv.data(), kReduce, strata::DataType::Float64,
                    strata::ReduceOp::Sum);
    for (size_t i = 0; i < kReduce; ++i) {
      double want = static_cast<double>(n) * (n + 1) / 2 + static_cast<double>(n) * (i % 7);
      if (recv[i] != want) {
        throw Failure{phase, "element " + std::to_string(i) + " is " + std::to_string(recv[i]) +
                                 ", expected " + std::to_string(want)};
      }
    }
    next();

    constexpr size_t kGather = 16;
    std::vector<double> mine(kGather), all(kGather * static_cast<size_t>(n), -1);
    for (size_t i = 0; i < kGather; ++i) mine[i] = rank * 100.0 + static_cast<double>(i);
    comm->allGather(mine.data(), all.data(), kGather, strata::DataType::Float64);
    for (int r = 0; r < n; ++r) {
      for (size_t i = 0; i < kGather; ++i) {
        if (all[r * kGather + i] != r * 100.0 + static_cast<double>(i)) {
          throw Failure{phase, "block of rank " + std::to_string(r) + " element " +
                                   std::to_string(i) + " is wrong"};
        }
      }
    }
    next();

    comm.reset();
    next();

    // Rank 0 reports: every rank's times (gathered now, after the timed phases).
    std::vector<double> allTimes(static_cast<size_t>(kPhaseCount) * n);
    std::memcpy(allTimes.data() + static_cast<size_t>(rank) * kPhaseCount, times, sizeof times);
    boot->allGather(allTimes.data(), sizeof times);
    if (rank == 0) {
      FILE* json = jsonPath.empty() ? nullptr : std::fopen(jsonPath.c_str(), "w");
      if (!jsonPath.empty() && !json) {
        std::fprintf(stderr, "scale: cannot write %s: %s\n", jsonPath.c_str(),
                     std::strerror(errno));
      }
      std::printf("scale: %d ranks; before: rank 0 rss %.1f MiB, %d fds, %d threads\n", n,
                  res[0].rssMiB, res[0].fds, res[0].threads);
      for (int p = 0; p < kPhaseCount; ++p) {
        std::vector<double> v(static_cast<size_t>(n));
        for (int r = 0; r < n; ++r) v[r] = allTimes[static_cast<size_t>(r) * kPhaseCount + p];
        std::sort(v.begin(), v.end());
        double med = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
        const Resources& r = res[p + 1];
        std::printf(
            "scale: %d ranks: %-19s %9.1f / %9.1f / %9.1f ms (min/median/max); rank 0: "
            "rss %6.1f MiB, %4d fds, %2d threads\n",
            n, kPhases[p], v.front(), med, v.back(), r.rssMiB, r.fds, r.threads);
        if (json) {
          std::fprintf(json,
                       "{\"ranks\":%d,\"phase\":\"%s\",\"min_ms\":%.3f,\"median_ms\":%.3f,"
                       "\"max_ms\":%.3f,\"rank0_rss_mib\":%.1f,\"rank0_fds\":%d,"
                       "\"rank0_threads\":%d}\n",
                       n, kPhases[p], v.front(), med, v.back(), r.rssMiB, r.fds, r.threads);
        }
      }
      if (json) std::fclose(json);
    }
    boot.reset();
  } catch (const Failure& f) {
    std::fprintf(stderr, "scale: rank %d: %s: wrong result: %s\n", rank, kPhases[f.phase],
                 f.what.c_str());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "scale: rank %d: %s failed: %s\n", rank,
                 phase < kPhaseCount ? kPhases[phase] : "report", e.what());
    return 1;
  }
  return 0;
}
