// One short job of the exit storm (tests/stress/exit_storm.sh runs it many times): every rank
// runs the same random mix of collectives and sizes (drawn from the seed), checks every result,
// ends with an op chosen by the seed, destroys its Communicator and exits at once. A rank that
// finishes early must never make another rank's call fail: its peers may still be in their last
// call (with other ranks) when it is gone.
//
// usage: exit-storm SEED [CALLS]      (launched N times by strata-run, srun or mpirun)
// Exit status: 0 when every call succeeded and every result was right; 1 otherwise (the first
// error is printed with the rank); 2 for bad arguments.

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <strata/communicator.hpp>
#include <strata/error.hpp>

namespace {

using strata::Communicator;
using strata::DataType;
using strata::ReduceOp;

enum class Op { AllReduce, AllGather, ReduceScatter, Broadcast, AllToAll, Ring, Pair, Count };
const char* const kOpNames[] = {"allReduce", "allGather",      "reduceScatter", "broadcast",
                                "allToAll",  "ring send/recv", "pair send/recv"};

// Element counts: both sides of every algorithm threshold (one-shot, single copy, chunking).
const size_t kCounts[] = {1, 7, 1000, 4096, 16384, 65537, 131072, 300001};

// Rank r's element i of call c: a small integer, exact in double.
double value(int rank, size_t i, int call) {
  return static_cast<double>((rank + 1) * 3 + static_cast<int>(i % 11) + call % 5);
}

struct Checker {
  int rank;
  int call = 0;
  const char* what = "";
  bool ok = true;
  void expect(bool good, size_t i, double got, double want) {
    if (good || !ok) return;
    ok = false;
    std::fprintf(stderr, "exit-storm: rank %d: call %d (%s): element %zu is %g, expected %g\n",
                 rank, call, what, i, got, want);
  }
};

void runOp(Communicator& comm, Op op, size_t count, int call, std::mt19937_64& rng, Checker& c) {
  const int n = comm.size();
  const int me = comm.rank();
  c.call = call;
  c.what = kOpNames[static_cast<int>(op)];
  std::vector<double> send, recv;
  switch (op) {
    case Op::AllReduce: {
      send.resize(count);
      recv.assign(count, -1);
      for (size_t i = 0; i < count; ++i) send[i] = value(me, i, call);
      comm.allReduce(send.data(), recv.data(), count, DataType::Float64, ReduceOp::Sum);
      for (size_t i = 0; i < count; ++i) {
        double want = 0;
        for (int r = 0; r < n; ++r) want += value(r, i, call);
        c.expect(recv[i] == want, i, recv[i], want);
      }
      break;
    }
    case Op::AllGather: {
      send.resize(count);
      recv.assign(count * n, -1);
      for (size_t i = 0; i < count; ++i) send[i] = value(me, i, call);
      comm.allGather(send.data(), recv.data(), count, DataType::Float64);
      for (int r = 0; r < n; ++r) {
        for (size_t i = 0; i < count; ++i) {
          double want = value(r, i, call);
          c.expect(recv[r * count + i] == want, r * count + i, recv[r * count + i], want);
        }
      }
      break;
    }
    case Op::ReduceScatter: {
      send.resize(count * n);
      recv.assign(count, -1);
      for (size_t i = 0; i < count * n; ++i) send[i] = value(me, i, call);
      comm.reduceScatter(send.data(), recv.data(), count, DataType::Float64, ReduceOp::Max);
      for (size_t i = 0; i < count; ++i) {
        double want = value(0, me * count + i, call);
        for (int r = 1; r < n; ++r) want = std::max(want, value(r, me * count + i, call));
        c.expect(recv[i] == want, i, recv[i], want);
      }
      break;
    }
    case Op::Broadcast: {
      int root = static_cast<int>(rng() % static_cast<uint64_t>(n));
      send.resize(count);
      recv.assign(count, -1);
      for (size_t i = 0; i < count; ++i) send[i] = value(me, i, call);
      comm.broadcast(send.data(), recv.data(), count, DataType::Float64, root);
      for (size_t i = 0; i < count; ++i) {
        c.expect(recv[i] == value(root, i, call), i, recv[i], value(root, i, call));
      }
      break;
    }
    case Op::AllToAll: {
      send.resize(count * n);
      recv.assign(count * n, -1);
      for (int r = 0; r < n; ++r) {
        for (size_t i = 0; i < count; ++i) send[r * count + i] = value(me, r * count + i, call);
      }
      comm.allToAll(send.data(), recv.data(), count, DataType::Float64);
      for (int r = 0; r < n; ++r) {
        for (size_t i = 0; i < count; ++i) {
          double want = value(r, me * count + i, call);
          c.expect(recv[r * count + i] == want, r * count + i, recv[r * count + i], want);
        }
      }
      break;
    }
    case Op::Ring: {
      // Every rank sends to the next and receives from the previous (send first: buffered).
      send.resize(count);
      recv.assign(count, -1);
      for (size_t i = 0; i < count; ++i) send[i] = value(me, i, call);
      int next = (me + 1) % n, prev = (me + n - 1) % n;
      comm.send(send.data(), count, DataType::Float64, next);
      comm.recv(recv.data(), count, DataType::Float64, prev);
      for (size_t i = 0; i < count; ++i) {
        c.expect(recv[i] == value(prev, i, call), i, recv[i], value(prev, i, call));
      }
      break;
    }
    case Op::Pair: {
      // Ranks 2k and 2k+1 exchange (an odd last rank sits out): most ranks are not partners.
      int partner = me ^ 1;
      if (partner >= n) break;
      send.resize(count);
      recv.assign(count, -1);
      for (size_t i = 0; i < count; ++i) send[i] = value(me, i, call);
      if (me % 2 == 0) {
        comm.send(send.data(), count, DataType::Float64, partner);
        comm.recv(recv.data(), count, DataType::Float64, partner);
      } else {
        comm.recv(recv.data(), count, DataType::Float64, partner);
        comm.send(send.data(), count, DataType::Float64, partner);
      }
      for (size_t i = 0; i < count; ++i) {
        c.expect(recv[i] == value(partner, i, call), i, recv[i], value(partner, i, call));
      }
      break;
    }
    case Op::Count:
      break;
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3) {
    std::fprintf(stderr, "usage: %s SEED [CALLS]\n", argv[0]);
    return 2;
  }
  char* end = nullptr;
  uint64_t seed = std::strtoull(argv[1], &end, 10);
  if (*end != '\0') {
    std::fprintf(stderr, "exit-storm: SEED must be a number, not '%s'\n", argv[1]);
    return 2;
  }
  int calls = argc == 3 ? std::atoi(argv[2]) : 12;
  if (calls < 1 || calls > 10000) {
    std::fprintf(stderr, "exit-storm: CALLS must be 1..10000, not '%s'\n", argv[2]);
    return 2;
  }
  int rank = -1;
  try {
    auto comm = Communicator::create();
    rank = comm->rank();
    Checker check{rank};
    std::mt19937_64 rng(seed);  // the same sequence on every rank
    const int nOps = static_cast<int>(Op::Count);
    for (int call = 0; call < calls; ++call) {
      // The last call's op cycles with the seed, so a series of seeds ends in every op.
      Op op = call == calls - 1 ? static_cast<Op>(seed % nOps) : static_cast<Op>(rng() % nOps);
      size_t count = kCounts[rng() % (sizeof kCounts / sizeof kCounts[0])];
      if (call == calls - 1 && (op == Op::Ring || op == Op::Pair)) count = 65537;
      runOp(*comm, op, count, call, rng, check);
      if (!check.ok) return 1;
    }
    comm.reset();
  } catch (const strata::Error& e) {
    std::fprintf(stderr, "exit-storm: rank %d: %s\n", rank, e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "exit-storm: rank %d: %s\n", rank, e.what());
    return 1;
  }
  return 0;
}
