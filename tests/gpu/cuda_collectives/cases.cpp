#include "tests/gpu/cuda_collectives/cases.hpp"

#include <algorithm>
#include <random>
#include <string_view>
#include <tuple>

namespace cuda_coll_test {

int gMaxBlocks = kMaxBlocks;

const char* opName(Op op) {
  switch (op) {
    case Op::AllReduce:
      return "allReduce";
    case Op::ReduceScatter:
      return "reduceScatter";
    case Op::AllGather:
      return "allGather";
    case Op::Broadcast:
      return "broadcast";
    case Op::AllToAll:
      return "allToAll";
    case Op::SendRecv:
      return "send/recv";
  }
  return "?";
}

std::vector<std::string> apiOps(Op op) {
  if (op == Op::SendRecv) return {"send", "recv"};
  return {opName(op)};
}

const char* forceKey(Op op) {
  switch (op) {
    case Op::AllReduce:
      return "collectives.allreduce.algorithm";
    case Op::ReduceScatter:
      return "collectives.reducescatter.algorithm";
    case Op::AllGather:
      return "collectives.allgather.algorithm";
    case Op::Broadcast:
      return "collectives.broadcast.algorithm";
    case Op::AllToAll:
      return "collectives.alltoall.algorithm";
    case Op::SendRecv:
      return "collectives.sendrecv.algorithm";
  }
  return "";
}

bool hasOp(const AlgoSpec& a, Op op) {
  return std::find(a.ops.begin(), a.ops.end(), op) != a.ops.end();
}

std::string autoAlgorithm(Op op, size_t bytes) {
  switch (op) {
    case Op::AllReduce:
      return bytes <= kOneShotMax   ? "cuda/oneshot-ll8"
             : bytes <= kTwoShotMax ? "cuda/twoshot-ll16"
                                    : "cuda/direct-staged";
    case Op::ReduceScatter:
      return bytes <= kPacketsMax ? "cuda/twoshot-ll16" : "cuda/direct-staged";
    case Op::AllGather:
    case Op::Broadcast:
    case Op::AllToAll:
      return bytes <= kPacketsMax ? "cuda/oneshot-ll8" : "cuda/direct-staged";
    case Op::SendRecv:
      break;
  }
  return "cuda/direct-staged";
}

namespace {

const DataType kAllTypes[] = {
    DataType::Int8,   DataType::Uint8,   DataType::Int32,    DataType::Uint32,  DataType::Int64,
    DataType::Uint64, DataType::Float16, DataType::BFloat16, DataType::Float32, DataType::Float64};
const DataType kShortTypes[] = {DataType::Int8,    DataType::Int32,    DataType::Int64,
                                DataType::Float16, DataType::BFloat16, DataType::Float32,
                                DataType::Float64};
const ReduceOp kOps[] = {ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max,
                         ReduceOp::Avg};

/// A size: a count of elements (small) or bytes past a threshold (count = bytes / size, odd).
struct Size {
  size_t value;
  bool isBytes;
  size_t count(DataType t) const {
    if (!isBytes) return value;
    return std::max<size_t>(1, value / elemSize(t)) | 1;
  }
};
constexpr Size elems(size_t n) {
  return {n, false};
}
constexpr Size bytesOver(size_t b) {
  return {b + 40, true};
}

/// Builds a phase's cases; every rank builds the same list.
class Cases {
 public:
  Cases(int n, const AlgoSpec* forced) : n_(n), forced_(forced) {}

  std::vector<Case> take() { return std::move(cases_); }

  void add(Op op, DataType t, ReduceOp redop, Size size, bool inPlace, int root = 0,
           bool nullSend = false) {
    if (gOpt.host && (t == DataType::Float16 || t == DataType::BFloat16)) return;
    Case c;
    c.op = op;
    c.type = t;
    c.redop = redop;
    c.count = size.count(t);
    c.inPlace = op != Op::AllToAll && op != Op::SendRecv && inPlace;
    c.offset = (serial_++ % 3 == 1) ? 1 : 0;
    c.root = root;
    c.nullSend = nullSend;
    if (gOpt.host) {
      c.expect.clear();
    } else if (forced_ != nullptr && hasOp(*forced_, op)) {
      c.expect = std::string("cuda/") + forced_->name;
    } else {
      c.expect = autoAlgorithm(op, c.bytes());
    }
    cases_.push_back(std::move(c));
  }

  /// Every type x every op x sizes: counts below bothBelow in place and out of place, the
  /// others alternating (so that each size gets both over the types and ops).
  template <class Types>
  void reducing(Op op, const Types& types, const std::vector<Size>& sizes, size_t bothBelow) {
    size_t ti = 0;
    for (DataType t : types) {
      for (size_t ri = 0; ri < std::size(kOps); ++ri) {
        for (size_t si = 0; si < sizes.size(); ++si) {
          if (sizes[si].count(t) < bothBelow) {
            add(op, t, kOps[ri], sizes[si], false);
            add(op, t, kOps[ri], sizes[si], true);
          } else {
            add(op, t, kOps[ri], sizes[si], (ti + ri + si) % 2 == 0);
          }
        }
      }
      ++ti;
    }
  }

  template <class Types>
  void copying(Op op, const Types& types, const std::vector<Size>& sizes) {
    size_t ti = 0;
    for (DataType t : types) {
      ++ti;
      for (size_t si = 0; si < sizes.size(); ++si) {
        const Size s = sizes[si];
        const size_t k = ti + si;
        if (op == Op::Broadcast) {
          for (int root = 0; root < n_; ++root) {
            if (gOpt.shortRun && forced_ != nullptr && root != 0 && root != n_ - 1) continue;
            const bool inPlace = (k + root) % 2 == 0;
            add(op, t, ReduceOp::Sum, s, inPlace, root, !inPlace && (k + root) % 4 == 1);
          }
        } else if (op == Op::SendRecv) {
          add(op, t, ReduceOp::Sum, s, false, 1);
          if (n_ > 2) add(op, t, ReduceOp::Sum, s, false, n_ - 1);
        } else {
          add(op, t, ReduceOp::Sum, s, k % 2 == 0);
        }
      }
    }
  }

 private:
  int n_;
  const AlgoSpec* forced_;
  std::vector<Case> cases_;
  unsigned serial_ = 0;
};

const std::vector<DataType> kCopyTypes = {DataType::Int8, DataType::Float16, DataType::Int32,
                                          DataType::Float64};
const std::vector<DataType> kShortCopyTypes = {DataType::Int8, DataType::Float64};

}  // namespace

std::vector<Case> autoCases(int n) {
  Cases c(n, nullptr);
  const bool s = gOpt.shortRun;
  const auto& copyTypes = s ? kShortCopyTypes : kCopyTypes;
  if (s) {
    c.reducing(Op::AllReduce, kShortTypes,
               {elems(1), elems(4099), bytesOver(kOneShotMax), bytesOver(kTwoShotMax + 4096)}, 0);
    c.reducing(Op::ReduceScatter, kShortTypes, {elems(37), bytesOver(kPacketsMax)}, 0);
    for (Op op : {Op::AllGather, Op::Broadcast, Op::AllToAll, Op::SendRecv}) {
      c.copying(op, copyTypes, {elems(37), bytesOver(kPacketsMax)});
    }
    return c.take();
  }
  c.reducing(
      Op::AllReduce, kAllTypes,
      {elems(1), elems(37), elems(4099), bytesOver(kOneShotMax), bytesOver(kTwoShotMax + 4096)},
      4100);
  // Past the 8 MiB staging area: two chunks of the direct algorithm.
  c.add(Op::AllReduce, DataType::Float32, ReduceOp::Sum, bytesOver(9 << 20), false);
  c.add(Op::AllReduce, DataType::Uint8, ReduceOp::Max, bytesOver(9 << 20), true);
  c.add(Op::AllReduce, DataType::BFloat16, ReduceOp::Avg, bytesOver(9 << 20), false);
  c.reducing(Op::ReduceScatter, kAllTypes,
             {elems(1), elems(37), elems(4099), bytesOver(kPacketsMax)}, 38);
  for (Op op : {Op::AllGather, Op::Broadcast, Op::AllToAll}) {
    c.copying(op, copyTypes,
              {elems(1), elems(37), elems(4099), bytesOver(kPacketsMax), bytesOver(1 << 20)});
  }
  const std::vector<DataType> p2pTypes = {DataType::Int8, DataType::Float32, DataType::Float64};
  c.copying(Op::SendRecv, p2pTypes,
            {elems(1), elems(37), elems(4099), bytesOver(kPacketsMax), bytesOver(9 << 20)});
  return c.take();
}

std::vector<Case> forcedCases(int n, const AlgoSpec& a) {
  Cases c(n, &a);
  const bool twoShot = std::string_view(a.name) == "twoshot-ll16";
  for (Op op : a.ops) {
    const bool reduces = op == Op::AllReduce || op == Op::ReduceScatter;
    if (gOpt.shortRun) {
      if (reduces) {
        c.reducing(op, kShortTypes, {elems(37), bytesOver(48 << 10)}, 0);
      } else {
        c.copying(op, kShortCopyTypes, {elems(37), bytesOver(48 << 10)});
      }
      continue;
    }
    std::vector<Size> sizes = {elems(1), elems(37), elems(4099), bytesOver(48 << 10)};
    if (reduces) {
      c.reducing(op, kAllTypes, sizes, 38);
      if (op == Op::AllReduce && twoShot) c.reducing(op, kShortTypes, {bytesOver(1 << 20)}, 0);
      if (!a.packets) {
        c.reducing(op, kShortTypes, {bytesOver(op == Op::AllReduce ? kTwoShotMax : kPacketsMax)},
                   0);
      }
    } else {
      if (!a.packets) sizes.push_back(bytesOver(1 << 20));
      c.copying(op, kCopyTypes, sizes);
    }
  }
  return c.take();
}

std::vector<Case> burstCases(int n, int b) {
  Cases c(n, nullptr);
  c.add(Op::AllReduce, DataType::Float32, ReduceOp::Sum, elems(1001), true);
  c.add(Op::ReduceScatter, DataType::BFloat16, ReduceOp::Avg, elems(37), false);
  c.add(Op::AllGather, DataType::Int8, ReduceOp::Sum, elems(4099), false);
  c.add(Op::Broadcast, DataType::Float16, ReduceOp::Sum, elems(3001), true, b % n);
  c.add(Op::AllToAll, DataType::Float64, ReduceOp::Sum, elems(513), false);
  c.add(Op::AllReduce, DataType::Int32, ReduceOp::Max, elems(40001), false);
  c.add(Op::AllReduce, DataType::Float16, ReduceOp::Sum, bytesOver(kTwoShotMax + 4096), false);
  c.add(Op::AllGather, DataType::Float32, ReduceOp::Sum, bytesOver(kPacketsMax), true);
  c.add(Op::Broadcast, DataType::Int8, ReduceOp::Sum, bytesOver(kPacketsMax), false, n - 1 - b % n);
  c.add(Op::SendRecv, DataType::Float64, ReduceOp::Sum, elems(4099), false, b % 2 ? n - 1 : 1);
  c.add(Op::ReduceScatter, DataType::Int64, ReduceOp::Prod, bytesOver(kPacketsMax), true);
  c.add(Op::AllReduce, DataType::Int64, ReduceOp::Prod, elems(3), false);
  std::vector<Case> cases = c.take();
  std::mt19937_64 rng(1234 + b);
  std::shuffle(cases.begin(), cases.end(), rng);
  return cases;
}

std::vector<Case> graphCases() {
  std::vector<Case> cases(3);
  const std::tuple<DataType, ReduceOp, size_t, bool> calls[] = {
      {DataType::Float32, ReduceOp::Sum, 1001, true},      // 4 KB: oneshot-ll8
      {DataType::BFloat16, ReduceOp::Avg, 300001, false},  // 600 KB: twoshot-ll16
      {DataType::Int32, ReduceOp::Max, 700001, false},     // 2.8 MB: direct-staged
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    std::tie(cases[i].type, cases[i].redop, cases[i].count, cases[i].inPlace) = calls[i];
    cases[i].offset = i;
    cases[i].expect = gOpt.host ? "" : autoAlgorithm(Op::AllReduce, cases[i].bytes());
  }
  return cases;
}

size_t layout(const std::vector<Case>& cases, int n, std::vector<std::pair<size_t, size_t>>* at) {
  size_t aAt = 0, bAt = 0;
  for (const Case& c : cases) {
    const size_t es = elemSize(c.type), skew = c.offset * es;
    if (at != nullptr) at->emplace_back(aAt + skew, bAt + skew);
    const size_t bBytes = std::max(c.recvElems(n), c.inPlace ? c.sendElems(n) : 0) * es;
    aAt += (c.sendElems(n) * es + skew + 4095) / 4096 * 4096;
    bAt += (bBytes + skew + 4095) / 4096 * 4096;
  }
  return std::max(aAt, bAt);
}

}  // namespace cuda_coll_test
