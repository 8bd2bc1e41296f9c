// The soak job (tools/bench/soak.sh runs it; not a CI test): for SECONDS, every rank creates a
// Communicator (bootstrap included), runs a random mix of collectives of random sizes and types
// (allReduce, allGather, reduceScatter, broadcast, allToAll, send/recv on a ring), checks every
// result, destroys it, and starts again. Between cycles, at start-up and then every SAMPLE
// seconds, each rank writes a line of what it holds to DIR/rank-R.tsv:
//   seconds cycles rss_kib fds threads maps memfd_maps dev_shm_entries
// (maps: lines of /proc/self/maps; memfd_maps: those of memfd or /dev/shm files; dev_shm_entries:
// the host's /dev/shm, which other processes share).
//
// usage: soak SECONDS DIR [SAMPLE [SEED]]     (SAMPLE default 60, SEED default 1)
// Exit status: 0 every call succeeded with the right result; 1 otherwise (the first error is
// printed with the rank, cycle and call); 2 bad arguments.

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <strata/communicator.hpp>
#include <strata/error.hpp>

#include "tests/harness/proc_stats.hpp"

namespace {

using strata::Communicator;
using strata::DataType;
using strata::ReduceOp;
using Clock = std::chrono::steady_clock;

using strata::test::countEntries;

struct Sample {
  long rssKiB = 0;
  int fds = 0;
  int threads = 0;
  int maps = 0;
  int memfdMaps = 0;
  int devShm = 0;
};

Sample sample() {
  Sample s;
  const strata::test::ProcStats p = strata::test::procStats();
  s.rssKiB = p.rssKiB;
  s.fds = p.fds;
  s.threads = p.threads;
  std::string line;
  std::ifstream maps("/proc/self/maps");
  while (std::getline(maps, line)) {
    ++s.maps;
    if (line.find("/memfd:") != std::string::npos || line.find("/dev/shm/") != std::string::npos) {
      ++s.memfdMaps;
    }
  }
  s.devShm = countEntries("/dev/shm");
  return s;
}

enum class Op { AllReduce, AllGather, ReduceScatter, Broadcast, AllToAll, Ring, Count };
const char* const kOpNames[] = {"allReduce", "allGather", "reduceScatter",
                                "broadcast", "allToAll",  "ring send/recv"};

// Rank r's element i of call c: a small integer, exact in every type used.
int64_t value(int rank, size_t i, int call) {
  return (rank + 1) * 3 + static_cast<int64_t>(i % 13) + call % 7;
}

struct Check {
  int rank = 0;
  int cycle = 0;
  int call = 0;
  const char* what = "";
  std::string error;
  void expect(bool good, size_t i, double got, double want) {
    if (good || !error.empty()) return;
    char buf[256];
    std::snprintf(buf, sizeof buf, "rank %d: cycle %d call %d (%s): element %zu is %g, expected %g",
                  rank, cycle, call, what, i, got, want);
    error = buf;
  }
};

template <typename T>
DataType typeOf();
template <>
DataType typeOf<float>() {
  return DataType::Float32;
}
template <>
DataType typeOf<double>() {
  return DataType::Float64;
}
template <>
DataType typeOf<int32_t>() {
  return DataType::Int32;
}

template <typename T>
void runOp(Communicator& comm, Op op, size_t count, int call, std::mt19937_64& rng, Check& c) {
  const int n = comm.size();
  const int me = comm.rank();
  const DataType type = typeOf<T>();
  c.call = call;
  c.what = kOpNames[static_cast<int>(op)];
  auto v = [&](int r, size_t i) { return static_cast<T>(value(r, i, call)); };
  std::vector<T> send, recv;
  switch (op) {
    case Op::AllReduce: {
      const bool sum = rng() % 2 == 0;
      send.resize(count);
      recv.assign(count, T(-1));
      for (size_t i = 0; i < count; ++i) send[i] = v(me, i);
      comm.allReduce(send.data(), recv.data(), count, type, sum ? ReduceOp::Sum : ReduceOp::Max);
      for (size_t i = 0; i < count && c.error.empty(); ++i) {
        T want = v(0, i);
        for (int r = 1; r < n; ++r) want = sum ? T(want + v(r, i)) : std::max(want, v(r, i));
        c.expect(recv[i] == want, i, recv[i], want);
      }
      break;
    }
    case Op::AllGather: {
      send.resize(count);
      recv.assign(count * n, T(-1));
      for (size_t i = 0; i < count; ++i) send[i] = v(me, i);
      comm.allGather(send.data(), recv.data(), count, type);
      for (int r = 0; r < n; ++r) {
        for (size_t i = 0; i < count && c.error.empty(); ++i) {
          c.expect(recv[r * count + i] == v(r, i), r * count + i, recv[r * count + i], v(r, i));
        }
      }
      break;
    }
    case Op::ReduceScatter: {
      send.resize(count * n);
      recv.assign(count, T(-1));
      for (size_t i = 0; i < count * n; ++i) send[i] = v(me, i);
      comm.reduceScatter(send.data(), recv.data(), count, type, ReduceOp::Sum);
      for (size_t i = 0; i < count && c.error.empty(); ++i) {
        T want = 0;
        for (int r = 0; r < n; ++r) want = T(want + v(r, me * count + i));
        c.expect(recv[i] == want, i, recv[i], want);
      }
      break;
    }
    case Op::Broadcast: {
      const int root = static_cast<int>(rng() % static_cast<uint64_t>(n));
      send.resize(count);
      recv.assign(count, T(-1));
      for (size_t i = 0; i < count; ++i) send[i] = v(me, i);
      comm.broadcast(send.data(), recv.data(), count, type, root);
      for (size_t i = 0; i < count && c.error.empty(); ++i) {
        c.expect(recv[i] == v(root, i), i, recv[i], v(root, i));
      }
      break;
    }
    case Op::AllToAll: {
      send.resize(count * n);
      recv.assign(count * n, T(-1));
      for (size_t i = 0; i < count * n; ++i) send[i] = v(me, i);
      comm.allToAll(send.data(), recv.data(), count, type);
      for (int r = 0; r < n; ++r) {
        for (size_t i = 0; i < count && c.error.empty(); ++i) {
          T want = v(r, me * count + i);
          c.expect(recv[r * count + i] == want, r * count + i, recv[r * count + i], want);
        }
      }
      break;
    }
    case Op::Ring: {
      send.resize(count);
      recv.assign(count, T(-1));
      for (size_t i = 0; i < count; ++i) send[i] = v(me, i);
      const int next = (me + 1) % n, prev = (me + n - 1) % n;
      comm.send(send.data(), count, type, next);
      comm.recv(recv.data(), count, type, prev);
      for (size_t i = 0; i < count && c.error.empty(); ++i) {
        c.expect(recv[i] == v(prev, i), i, recv[i], v(prev, i));
      }
      break;
    }
    case Op::Count:
      break;
  }
}

// Element counts: both sides of the algorithm thresholds, up to 2.4 MB of doubles.
const size_t kCounts[] = {1, 3, 100, 1000, 4096, 16384, 65537, 131072, 300001};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3 || argc > 5) {
    std::fprintf(stderr, "usage: %s SECONDS DIR [SAMPLE [SEED]]\n", argv[0]);
    return 2;
  }
  const double seconds = std::atof(argv[1]);
  const std::string dir = argv[2];
  const double every = argc > 3 ? std::atof(argv[3]) : 60;
  const uint64_t seed = argc > 4 ? std::strtoull(argv[4], nullptr, 10) : 1;
  if (seconds <= 0 || every <= 0) {
    std::fprintf(stderr, "soak: SECONDS and SAMPLE must be positive\n");
    return 2;
  }
  const auto start = Clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(Clock::now() - start).count(); };
  FILE* out = nullptr;
  int rank = -1;
  int cycle = 0;
  double nextSample = 0;
  auto write = [&] {
    Sample s = sample();
    std::fprintf(out, "%.0f\t%d\t%ld\t%d\t%d\t%d\t%d\t%d\n", elapsed(), cycle, s.rssKiB, s.fds,
                 s.threads, s.maps, s.memfdMaps, s.devShm);
    std::fflush(out);
    nextSample += every;
  };
  try {
    for (bool more = true; more; ++cycle) {
      auto comm = Communicator::create();
      if (!out) {
        rank = comm->rank();
        std::string path = dir + "/rank-" + std::to_string(rank) + ".tsv";
        out = std::fopen(path.c_str(), "w");
        if (!out) {
          std::fprintf(stderr, "soak: rank %d: cannot write %s: %s\n", rank, path.c_str(),
                       std::strerror(errno));
          return 1;
        }
      }
      // Rank 0's clock decides for everyone whether this is the last cycle.
      int32_t go = elapsed() < seconds ? 1 : 0;
      comm->broadcast(&go, &go, 1, DataType::Int32, 0);
      more = go != 0;
      std::mt19937_64 rng(seed * 1000003u + static_cast<uint64_t>(cycle));
      Check check;
      check.rank = rank;
      check.cycle = cycle;
      const int calls = 4 + static_cast<int>(rng() % 12);
      for (int call = 0; call < calls && check.error.empty(); ++call) {
        Op op = static_cast<Op>(rng() % static_cast<uint64_t>(Op::Count));
        size_t count = kCounts[rng() % (sizeof kCounts / sizeof kCounts[0])];
        switch (rng() % 3) {
          case 0:
            runOp<double>(*comm, op, count, call, rng, check);
            break;
          case 1:
            runOp<float>(*comm, op, count, call, rng, check);
            break;
          default:
            runOp<int32_t>(*comm, op, count, call, rng, check);
            break;
        }
      }
      if (!check.error.empty()) {
        std::fprintf(stderr, "soak: %s\n", check.error.c_str());
        return 1;
      }
      comm.reset();
      // Between cycles nothing of a Communicator should be left.
      if (elapsed() >= nextSample || !more) write();
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "soak: rank %d: cycle %d: %s\n", rank, cycle, e.what());
    return 1;
  }
  if (out) std::fclose(out);
  return 0;
}
