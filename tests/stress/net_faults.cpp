// One rank of a network-fault job (tests/stress/net_faults.sh runs 4 of them on two "hosts"):
// three phases, each checked, with the fault injected by the script while a phase runs.
//
//   create     Bootstrap::create (rendezvous over tcp, across the hosts' link)
//   allgather  bootstrap allGathers of 64 KiB per rank (the peer mesh)
//   connect    Communicator::create (shm and fabric connections; with NETFAULT_PHASE=connect every
//              rank creates SYNC/connect.RANK and waits for SYNC/go first)
//   allreduce  allReduces of NETFAULT_COUNT doubles over the fabric
//
// Synchronisation with the script (no sleeps): NETFAULT_SYNC is a directory. NETFAULT_PHASE names
// the phase the fault is aimed at. Before Bootstrap::create every rank creates
// SYNC/create.RANK. In the faulted allgather or allreduce phase the ranks loop on that collective
// and create SYNC/PHASE.RANK after the first call completed, so the next calls are in flight when
// the script sees all four markers and injects the fault; they stop when any rank saw SYNC/stop
// (the flag travels inside the collective's data, so every rank stops after the same call). In
// the other phases each collective runs once. Every result is checked.
//
// Output: one line per phase, and a last line "RESULT rank=R phase=P status=ok|error ..." with,
// on error, the strata::Error code, peer and message, the start of the failing call and the time
// of the error (seconds since the epoch, so that the script can compare them with the fault).
// Exit status: 0 all phases passed; 10 + ErrorCode on a strata::Error; 3 wrong data; 4 the stop
// deadline passed (NETFAULT_WAIT s); 2 bad environment.

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
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

namespace {

using strata::Bootstrap;
using strata::Communicator;

double now() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

std::string env(const char* name, const char* fallback = nullptr) {
  const char* v = std::getenv(name);
  if (v && *v) return v;
  if (fallback) return fallback;
  std::fprintf(stderr, "net-faults: %s is not set\n", name);
  std::exit(2);
}

bool exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

void touch(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (!f) {
    std::fprintf(stderr, "net-faults: cannot create %s: %s\n", path.c_str(), std::strerror(errno));
    std::exit(2);
  }
  std::fclose(f);
}

// Element i of rank r's contribution to call `iter`: small integers, exact in double and uint64.
uint64_t value(int rank, size_t i, int iter) {
  return static_cast<uint64_t>((rank + 1) * 7 + static_cast<int>(i % 13) + iter % 5);
}

struct Job {
  int rank = -1;
  std::string sync;
  std::string faultPhase;
  double waitSeconds = 60;
  const char* phase = "start";
  int iter = 0;
  double callStart = 0;
  double longest = 0;  // the longest call of the phase's loop, s
  double started = now();

  bool stopRequested() const { return exists(sync + "/stop"); }
  void checkDeadline() const {
    if (now() - started > waitSeconds) {
      std::printf("RESULT rank=%d phase=%s status=deadline iter=%d\n", rank, phase, iter);
      std::fflush(stdout);
      std::exit(4);
    }
  }
  [[noreturn]] void wrong(size_t i, double got, double want) const {
    std::printf("RESULT rank=%d phase=%s status=wrong iter=%d element=%zu got=%.17g want=%.17g\n",
                rank, phase, iter, i, got, want);
    std::fflush(stdout);
    std::exit(3);
  }
};

// Bootstrap allGathers of 64 KiB per rank; slot[0] of each rank carries its stop flag.
void allGathers(Bootstrap& boot, Job& job, bool loop) {
  const size_t words = 8192;
  const int n = boot.size();
  std::vector<uint64_t> data(words * n);
  for (job.iter = 0;; ++job.iter) {
    job.checkDeadline();
    uint64_t* mine = data.data() + words * job.rank;
    for (size_t i = 0; i < words; ++i) mine[i] = value(job.rank, i, job.iter);
    mine[0] = loop && job.stopRequested() ? 1000 : 0;
    job.callStart = now();
    boot.allGather(data.data(), words * sizeof(uint64_t));
    job.longest = std::max(job.longest, now() - job.callStart);
    bool stop = false;
    for (int r = 0; r < n; ++r) {
      const uint64_t* slot = data.data() + words * r;
      stop = stop || slot[0] == 1000;
      if (slot[0] != 0 && slot[0] != 1000) job.wrong(words * r, slot[0], 0);
      for (size_t i = 1; i < words; ++i) {
        if (slot[i] != value(r, i, job.iter))
          job.wrong(words * r + i, slot[i], value(r, i, job.iter));
      }
    }
    if (job.iter == 0 && loop) touch(job.sync + "/allgather." + std::to_string(job.rank));
    if (!loop || stop) return;
  }
}

// allReduces of count doubles plus one: the last element sums the ranks' stop flags.
void allReduces(Communicator& comm, Job& job, size_t count, bool loop) {
  const int n = comm.size();
  std::vector<double> send(count + 1), recv(count + 1);
  for (job.iter = 0;; ++job.iter) {
    job.checkDeadline();
    for (size_t i = 0; i < count; ++i) send[i] = static_cast<double>(value(job.rank, i, job.iter));
    send[count] = loop && job.stopRequested() ? 1 : 0;
    std::fill(recv.begin(), recv.end(), -1.0);
    job.callStart = now();
    comm.allReduce(send.data(), recv.data(), count + 1, strata::DataType::Float64,
                   strata::ReduceOp::Sum);
    job.longest = std::max(job.longest, now() - job.callStart);
    for (size_t i = 0; i < count; ++i) {
      double want = 0;
      for (int r = 0; r < n; ++r) want += static_cast<double>(value(r, i, job.iter));
      if (recv[i] != want) job.wrong(i, recv[i], want);
    }
    if (recv[count] < 0 || recv[count] > n) job.wrong(count, recv[count], 0);
    if (job.iter == 0 && loop) touch(job.sync + "/allreduce." + std::to_string(job.rank));
    if (!loop || recv[count] > 0) return;
  }
}

}  // namespace

int main() {
  Job job;
  job.rank = std::atoi(env("STRATA_RANK").c_str());
  job.sync = env("NETFAULT_SYNC");
  job.faultPhase = env("NETFAULT_PHASE", "none");
  job.waitSeconds = std::atof(env("NETFAULT_WAIT", "60").c_str());
  const size_t count = std::strtoull(env("NETFAULT_COUNT", "524288").c_str(), nullptr, 10);
  if (count == 0) {
    std::fprintf(stderr, "net-faults: NETFAULT_COUNT must be a positive number\n");
    return 2;
  }
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  try {
    job.phase = "create";
    touch(job.sync + "/create." + std::to_string(job.rank));
    job.callStart = now();
    std::shared_ptr<Bootstrap> boot = Bootstrap::create();
    std::printf("rank %d: create ok in %.2f s (%d ranks, %d on this host)\n", job.rank,
                now() - job.callStart, boot->size(), boot->localSize());

    job.phase = "allgather";
    double t = now();
    allGathers(*boot, job, job.faultPhase == "allgather");
    std::printf("rank %d: allgather ok, %d calls in %.2f s, the longest %.2f s\n", job.rank,
                job.iter + 1, now() - t, job.longest);
    job.longest = 0;

    job.phase = "connect";
    if (job.faultPhase == "connect") {
      // The script takes the link down before "go": the fabric connections are set up during
      // the fault.
      touch(job.sync + "/connect." + std::to_string(job.rank));
      while (!exists(job.sync + "/go")) {
        job.checkDeadline();
        usleep(10000);
      }
    }
    job.callStart = now();
    auto comm = Communicator::create(boot);
    std::printf("rank %d: communicator ok in %.2f s\n", job.rank, now() - job.callStart);
    job.phase = "allreduce";
    t = now();
    allReduces(*comm, job, count, job.faultPhase == "allreduce");
    std::printf(
        "rank %d: allreduce ok, %d calls of %zu doubles in %.2f s, the longest %.2f s (%s)\n",
        job.rank, job.iter + 1, count + 1, now() - t, job.longest, comm->lastAlgorithm().c_str());
    comm.reset();
    boot.reset();
  } catch (const strata::Error& e) {
    double at = now();
    std::string msg = e.what();
    for (char& c : msg) {
      if (c == '\n') c = ' ';
    }
    std::printf(
        "RESULT rank=%d phase=%s status=error code=%s peer=%d iter=%d call_start=%.3f "
        "at=%.3f msg=%s\n",
        job.rank, job.phase, std::string(strata::toString(e.code())).c_str(), e.peer(), job.iter,
        job.callStart, at, msg.c_str());
    return 10 + static_cast<int>(e.code());
  } catch (const std::exception& e) {
    std::printf("RESULT rank=%d phase=%s status=exception msg=%s\n", job.rank, job.phase, e.what());
    return 5;
  }
  std::printf("RESULT rank=%d phase=done status=ok at=%.3f\n", job.rank, now());
  return 0;
}
