// test-cuda-collectives: the CUDA collectives module (strata-collectives-cuda.so) through the
// public Communicator API on one GPU, every rank a thread of this process with its own stream,
// ranks joined by an in-process bootstrap (cuda_collectives/thread_bootstrap.hpp).
//
// For N = 2, 4, 8 ranks (--short: 2 and 4, fewer types and sizes), one Communicator per phase:
//   auto     every op (allReduce, reduceScatter, allGather, broadcast from every root, allToAll,
//            send/recv around a ring) with the size-based choice: sizes on both sides of each
//            threshold, odd counts, in place and out of place, buffers off 16-byte alignment,
//            allReduce past the staging area; allReduce and reduceScatter with every type and op;
//   burst    4 x 12 calls of every op and algorithm enqueued back to back and synchronized once,
//            so that ranks run calls ahead of each other and algorithms switch call to call;
//   graph    3 allReduces (one per algorithm) captured into a CUDA graph on every rank, replayed
//            5 times with new inputs;
//   forced   each of oneshot-ll8, twoshot-ll16, direct-staged forced for every op it has
//            (direct-staged with a 256 KiB staging area, so that the larger calls take several
//            chunks).
// Every result is compared bit for bit with a reference folded in rank order on the host
// (tests/harness/reference_fold.hpp); every call must have been run by the cuda/ algorithm the
// thresholds or the forcing name, with a grid within collectives.cuda.max_blocks (4: 8 ranks'
// kernels of 512-thread blocks stay co-resident on one GPU).
//
// Exit status: 0 when every check passed, 1 when one failed (or the watchdog fired), 77 without
// a CUDA device (one line "SKIP: no CUDA device: ..."). Options:
//   --short          the smaller sweep (compute-sanitizer runs use it);
//   --ranks=2,4      the rank counts to run (even, 2..8);
//   --timeout=S      the watchdog: after S seconds (default 240), or on SIGTERM/SIGINT/SIGHUP,
//                    print what every rank was doing and exit 1;
//   --host           a self-check of this harness without a GPU: the auto and burst phases
//                    (no 16-bit floats: the host collectives round them per step) on host
//                    memory through the host collectives.
//
// This file has the main, the options and the watchdog; cuda_collectives/ the rest: the cases
// (cases.cpp), one world of N ranks and each rank's phases (world.cpp), the in-process bootstrap
// (thread_bootstrap.hpp) and the rank's memory (harness.hpp).

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "tests/gpu/cuda_collectives/cases.hpp"
#include "tests/gpu/cuda_collectives/harness.hpp"
#include "tests/gpu/cuda_collectives/world.hpp"

namespace cuda_coll_test {

Options gOpt;
Progress gProgress;

}  // namespace cuda_coll_test

namespace {

using namespace cuda_coll_test;

/// Waits for the deadline or SIGTERM/SIGINT/SIGHUP (blocked in every other thread), then
/// prints what each rank was doing and exits 1, so that a hang never blocks gpu-check.
void watchdog(double seconds, sigset_t signals) {
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(seconds));
  int sig = 0;
  for (;;) {
    const auto left = deadline - Clock::now();
    if (left <= Clock::duration::zero()) break;
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
    timespec ts{static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
    sig = sigtimedwait(&signals, nullptr, &ts);
    if (sig > 0) break;
    sig = 0;
  }
  const std::string why = sig > 0 ? fmt::format("terminated by signal {} ({})", sig, strsignal(sig))
                                  : fmt::format("no result after {} s (--timeout)", seconds);
  std::printf("FAIL: test-cuda-collectives: watchdog: %s; what each rank was doing:\n%s\n",
              why.c_str(), gProgress.dump().c_str());
  std::fflush(stdout);
  _exit(1);
}

bool parseArgs(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    if (a == "--short") {
      gOpt.shortRun = true;
    } else if (a == "--host") {
      gOpt.host = true;
    } else if (a.rfind("--timeout=", 0) == 0) {
      gOpt.watchdogSeconds = std::atof(argv[i] + 10);
      if (gOpt.watchdogSeconds <= 0) return false;
    } else if (a.rfind("--ranks=", 0) == 0) {
      std::string list(a.substr(8));
      for (size_t pos = 0; pos < list.size();) {
        size_t end = list.find(',', pos);
        if (end == std::string::npos) end = list.size();
        const int n = std::atoi(list.substr(pos, end - pos).c_str());
        if (n < 2 || n > 8 || n % 2 != 0) return false;  // send/recv pairs even with odd ranks
        gOpt.ranks.push_back(n);
        pos = end + 1;
      }
    } else {
      return false;
    }
  }
  if (gOpt.ranks.empty()) {
    gOpt.ranks = gOpt.shortRun ? std::vector<int>{2, 4} : std::vector<int>{2, 4, 8};
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  // Before any other thread exists (CUDA's included): the watchdog alone takes these signals.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  if (!parseArgs(argc, argv)) {
    std::fprintf(stderr,
                 "usage: %s [--short] [--ranks=2,4,8] [--timeout=SECONDS] [--host]\n"
                 "  (rank counts: even, 2..8)\n",
                 argv[0]);
    return 2;
  }
  // Tests never pick up a user's strata.toml (an explicit STRATA_CONFIG is honoured).
  setenv("STRATA_CONFIG", "/dev/null/none", 0);
  // Every rank's stream needs its own hardware queue: with CUDA's default of 8, streams share
  // queues, and a kernel waiting for a peer can block the peer's kernel queued behind it.
  // Read when the context is created, so set before any CUDA call.
  const char* connections = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");
  const std::string userConnections = connections != nullptr ? connections : "";
  if (!gOpt.host) setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 1);

  std::string device = "host memory (--host: the harness's self-check, host collectives)";
  if (!gOpt.host) {
    int count = 0;
    const cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
      std::printf("SKIP: no CUDA device: cudaGetDeviceCount: %s (%s)\n", cudaGetErrorString(e),
                  cudaGetErrorName(e));
      return 77;
    }
    if (count == 0) {
      std::printf("SKIP: no CUDA device: cudaGetDeviceCount found none\n");
      return 77;
    }
    cudaDeviceProp prop{};
    const cudaError_t pe = cudaGetDeviceProperties(&prop, 0);
    if (pe != cudaSuccess) {
      std::printf("FAIL: cudaGetDeviceProperties(0): %s (%s)\n", cudaGetErrorString(pe),
                  cudaGetErrorName(pe));
      return 1;
    }
    // One 512-thread block per SM (the kernels' register budget): every rank's blocks must fit
    // at once, or a kernel spins for a peer whose kernel cannot start.
    const int most = *std::max_element(gOpt.ranks.begin(), gOpt.ranks.end());
    gMaxBlocks = std::clamp(prop.multiProcessorCount / most, 1, kMaxBlocks);
    device =
        fmt::format("device 0 of {}: {} (sm_{}{}, {} SMs), collectives.cuda.max_blocks {}", count,
                    prop.name, prop.major, prop.minor, prop.multiProcessorCount, gMaxBlocks);
    if (!userConnections.empty() && userConnections != "32") {
      device += fmt::format("; CUDA_DEVICE_MAX_CONNECTIONS {} replaced by 32", userConnections);
    }
  }
  std::thread(watchdog, gOpt.watchdogSeconds, signals).detach();

  std::string ranks;
  for (int n : gOpt.ranks) ranks += (ranks.empty() ? "" : ",") + std::to_string(n);
  std::printf("test-cuda-collectives: %s; N = %s; %s sweep; watchdog %.0f s\n", device.c_str(),
              ranks.c_str(), gOpt.shortRun ? "short" : "full", gOpt.watchdogSeconds);
  std::fflush(stdout);

  const auto start = Clock::now();
  bool ok = true;
  for (int n : gOpt.ranks) {
    const WorldResult r = runWorld(n);
    ok = ok && r.ok;
    if (r.hard) {
      // A rank that failed hard may have left kernels spinning until the wait limit, and
      // the CUDA context may be broken: the remaining sizes would say nothing new.
      if (gOpt.ranks.back() != n) std::printf("(the remaining rank counts are not run)\n");
      break;
    }
  }
  const double s = std::chrono::duration<double>(Clock::now() - start).count();
  std::printf("%s: test-cuda-collectives in %.1f s\n", ok ? "PASS" : "FAIL", s);
  std::fflush(stdout);
  return ok ? 0 : 1;
}
