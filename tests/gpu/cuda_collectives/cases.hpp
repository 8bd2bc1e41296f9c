#pragma once

// test-cuda-collectives' cases: the ops, the CUDA module's algorithms, the thresholds the test
// sets, and the lists of calls each phase makes (every rank builds the same lists).

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "tests/gpu/cuda_collectives/harness.hpp"

namespace cuda_coll_test {

enum class Op { AllReduce, ReduceScatter, AllGather, Broadcast, AllToAll, SendRecv };

const char* opName(Op op);
/// The ops as Communicator::algorithms() names them.
std::vector<std::string> apiOps(Op op);
/// The config key that forces an algorithm for op.
const char* forceKey(Op op);

/// The CUDA module's algorithms and their ops (collectives/cuda/backend.cpp: ops()).
struct AlgoSpec {
  const char* name;
  std::vector<Op> ops;
  bool packets;
};
inline const AlgoSpec kAlgos[] = {
    {"oneshot-ll8", {Op::AllReduce, Op::AllGather, Op::Broadcast, Op::AllToAll}, true},
    {"twoshot-ll16", {Op::AllReduce, Op::ReduceScatter}, true},
    {"direct-staged",
     {Op::AllReduce, Op::AllGather, Op::ReduceScatter, Op::Broadcast, Op::AllToAll, Op::SendRecv},
     false},
};

bool hasOp(const AlgoSpec& a, Op op);

// The thresholds the test sets (the documented defaults), so that env or defaults changing
// cannot move a size to another algorithm behind the test's back.
inline constexpr size_t kOneShotMax = 16 << 10;
inline constexpr size_t kTwoShotMax = 2 << 20;
inline constexpr size_t kPacketsMax = 64 << 10;
inline constexpr int kMaxBlocks = 4;  // 8 ranks x 4 blocks stay co-resident
/// collectives.cuda.max_blocks: kMaxBlocks, less on a GPU with fewer than 8 x 4 SMs.
extern int gMaxBlocks;

/// The algorithm auto picks for op at bytes per rank (per peer for allGather/allToAll).
std::string autoAlgorithm(Op op, size_t bytes);

struct Case {
  Op op = Op::AllReduce;
  DataType type = DataType::Float32;
  ReduceOp redop = ReduceOp::Sum;
  size_t count = 1;
  bool inPlace = false;
  size_t offset = 0;      ///< elements the buffers start past their allocation (alignment)
  int root = 0;           ///< broadcast root; send/recv: the shift around the ring
  bool nullSend = false;  ///< broadcast: non-roots pass a null send buffer
  std::string expect;     ///< "cuda/oneshot-ll8": the algorithm that must run it

  size_t bytes() const { return count * elemSize(type); }
  size_t sendElems(int n) const {
    return op == Op::ReduceScatter || op == Op::AllToAll ? count * n : count;
  }
  size_t recvElems(int n) const {
    return op == Op::AllGather || op == Op::AllToAll ? count * n : count;
  }
  std::string describe() const {
    std::string s = fmt::format("{} {} count {}", opName(op), strata::toString(type), count);
    if (op == Op::AllReduce || op == Op::ReduceScatter)
      s += fmt::format(" {}", strata::toString(redop));
    if (op == Op::Broadcast) s += fmt::format(" root {}{}", root, nullSend ? " (null send)" : "");
    if (op == Op::SendRecv) s += fmt::format(" shift {}", root);
    if (inPlace) s += " in place";
    if (offset) s += fmt::format(" offset {}", offset);
    return s;
  }
};

std::vector<Case> autoCases(int n);
/// The ops the forced algorithm has, at sizes it can take (the packet algorithms' slots hold
/// at least 256 KiB per rank and peer at 8 ranks with the thresholds above).
std::vector<Case> forcedCases(int n, const AlgoSpec& a);

/// Bursts of calls enqueued back to back (Rank::burstPhase), and the most calls in a group.
inline constexpr int kBursts = 4;
inline constexpr size_t kMaxGroup = 16;

/// Burst b: every op and algorithm range, in an order of its own.
std::vector<Case> burstCases(int n, int b);
/// The graph's calls: three allReduces, one per algorithm range.
std::vector<Case> graphCases();
/// Places calls one after another in the send and the recv buffers (4 KiB apart, each past its
/// alignment offset): their byte offsets in *at; returns the bytes each buffer needs.
size_t layout(const std::vector<Case>& cases, int n, std::vector<std::pair<size_t, size_t>>* at);

}  // namespace cuda_coll_test
