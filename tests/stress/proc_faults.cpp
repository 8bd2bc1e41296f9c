// One rank of the process-fault jobs (tests/stress/proc_faults.sh): the script stops, kills,
// impersonates and attacks ranks at known points, and this program tells it where each rank is
// through files in DIR, so that nothing depends on a sleep.
//
// usage: proc-faults DIR STEPS [COUNT]
//   Before anything else the rank writes DIR/pid.R (its pid). When DIR/hold.R exists it waits
//   until DIR/release.R exists before it creates its Communicator (to catch a rank in the
//   rendezvous); DIR/root.R, when it exists then, replaces its STRATA_ROOT. After the create it
//   writes DIR/up.R. Then, for each step s < STEPS: it writes DIR/at.R.s, waits for DIR/go.s (or
//   DIR/go.all, or DIR/go.s.R for this rank alone), runs one allReduce of COUNT floats (default
//   65536) and checks every element. At the end it destroys the Communicator, prints
//   "rank R: done" and exits 0.
// env PF_EXIT=RANK:STEP:HOW   that rank leaves at that step instead of running it: HOW is
//                             "clean" (destroys its Communicator, exits 0) or "_exit" (_exit(0)
//                             with the Communicator alive).
// Any strata error: prints "proc-faults: rank R: WHERE: FAILED code=CODE peer=P after S s: MSG"
// and exits 3. A wrong result exits 1; a wait for a file that never comes (120 s) exits 4.

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <strata/communicator.hpp>
#include <strata/error.hpp>

#include "tests/harness/marker_files.hpp"

namespace {

using Clock = std::chrono::steady_clock;

std::string dir;
int rank = -1;

bool exists(const std::string& name) {
  return strata::test::markerExists(dir, name);
}

void touch(const std::string& name, const std::string& text = "") {
  strata::test::writeMarker(dir, name, text, "proc-faults");
}

void waitFor(const std::string& a, const std::string& b = "", const std::string& c = "") {
  auto until = Clock::now() + std::chrono::seconds(120);
  while (!exists(a) && (b.empty() || !exists(b)) && (c.empty() || !exists(c))) {
    if (Clock::now() > until) {
      std::fprintf(stderr, "proc-faults: rank %d: %s never appeared\n", rank, a.c_str());
      std::exit(4);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3 || argc > 4) {
    std::fprintf(stderr, "usage: %s DIR STEPS [COUNT]\n", argv[0]);
    return 2;
  }
  dir = argv[1];
  const int steps = std::atoi(argv[2]);
  const size_t count = argc > 3 ? std::strtoull(argv[3], nullptr, 10) : 65536;
  const char* r = std::getenv("STRATA_RANK");
  if (!r) r = std::getenv("SLURM_PROCID");
  const int envRank = r ? std::atoi(r) : 0;
  rank = envRank;
  touch("pid." + std::to_string(envRank), std::to_string(::getpid()) + "\n");
  int exitRank = -1, exitStep = -1;
  std::string exitHow;
  if (const char* e = std::getenv("PF_EXIT")) {
    char how[16] = {};
    if (std::sscanf(e, "%d:%d:%15s", &exitRank, &exitStep, how) != 3) {
      std::fprintf(stderr, "proc-faults: PF_EXIT='%s' is not RANK:STEP:HOW\n", e);
      return 2;
    }
    exitHow = how;
  }
  if (exists("hold." + std::to_string(envRank))) waitFor("release." + std::to_string(envRank));
  // A test hook of this program only: DIR/root.R sends rank R's check-in elsewhere (through a
  // recording proxy).
  if (FILE* f = std::fopen((dir + "/root." + std::to_string(envRank)).c_str(), "r")) {
    char root[128] = {};
    if (std::fscanf(f, "%127s", root) == 1) ::setenv("STRATA_ROOT", root, 1);
    std::fclose(f);
  }

  std::string where = "create";
  auto t0 = Clock::now();
  try {
    auto comm = strata::Communicator::create();
    rank = comm->rank();
    const int n = comm->size();
    touch("up." + std::to_string(rank));
    std::vector<float> send(count), recv(count);
    for (int s = 0; s < steps; ++s) {
      where = "step " + std::to_string(s) + " allReduce";
      touch("at." + std::to_string(rank) + "." + std::to_string(s));
      waitFor("go." + std::to_string(s), "go.all",
              "go." + std::to_string(s) + "." + std::to_string(rank));
      if (rank == exitRank && s == exitStep) {
        std::printf("rank %d: leaving before step %d (%s)\n", rank, s, exitHow.c_str());
        std::fflush(stdout);
        if (exitHow == "_exit") ::_exit(0);
        comm.reset();
        return 0;
      }
      for (size_t i = 0; i < count; ++i) send[i] = static_cast<float>((rank + 1) * (s + 1) + i % 7);
      t0 = Clock::now();
      comm->allReduce(send.data(), recv.data(), count, strata::DataType::Float32,
                      strata::ReduceOp::Sum);
      for (size_t i = 0; i < count; ++i) {
        float want = static_cast<float>(n * (n + 1) / 2 * (s + 1) + n * static_cast<int>(i % 7));
        if (recv[i] != want) {
          std::fprintf(stderr, "proc-faults: rank %d: step %d: element %zu is %g, expected %g\n",
                       rank, s, i, recv[i], want);
          return 1;
        }
      }
      std::printf("rank %d: step %d ok\n", rank, s);
      std::fflush(stdout);
    }
    where = "destroy";
    t0 = Clock::now();
    comm.reset();
  } catch (const strata::Error& e) {
    std::printf("proc-faults: rank %d: %s: FAILED code=%s peer=%d after %.1f s: %s\n", rank,
                where.c_str(), std::string(strata::toString(e.code())).c_str(), e.peer(), since(t0),
                e.what());
    std::fflush(stdout);
    return 3;
  } catch (const std::exception& e) {
    std::printf("proc-faults: rank %d: %s: FAILED (not a strata error) after %.1f s: %s\n", rank,
                where.c_str(), since(t0), e.what());
    return 5;
  }
  std::printf("rank %d: done\n", rank);
  return 0;
}
