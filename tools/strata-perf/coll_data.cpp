#include "coll_data.hpp"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "base/float16.hpp"

namespace strata::perf {

namespace {

// Storage of the 16-bit float types; the host has no arithmetic on them, so values go through
// float, converted by the library's own base/float16.hpp (the same rounding as its reductions).
struct Half {
  uint16_t bits;
};
struct BFloat16 {
  uint16_t bits;
};

template <class T>
double toDouble(T v) {
  if constexpr (std::is_same_v<T, Half>) {
    return collectives::halfToFloat(v.bits);
  } else if constexpr (std::is_same_v<T, BFloat16>) {
    return collectives::bf16ToFloat(v.bits);
  } else {
    return static_cast<double>(v);
  }
}

template <class T>
constexpr bool kIsInteger = std::is_integral_v<T>;

// Integers convert modulo 2^bits (C++20), which is what a wrapping integer reduction gives.
template <class T>
T fromInteger(int64_t v) {
  if constexpr (std::is_same_v<T, Half>) {
    return Half{collectives::floatToHalf(static_cast<float>(v))};
  } else if constexpr (std::is_same_v<T, BFloat16>) {
    return BFloat16{collectives::floatToBf16(static_cast<float>(v))};
  } else {
    return static_cast<T>(v);
  }
}

template <class T>
T fromDouble(double v) {
  if constexpr (std::is_same_v<T, Half>) {
    return Half{collectives::floatToHalf(static_cast<float>(v))};
  } else if constexpr (std::is_same_v<T, BFloat16>) {
    return BFloat16{collectives::floatToBf16(static_cast<float>(v))};
  } else if constexpr (kIsInteger<T>) {
    return static_cast<T>(static_cast<int64_t>(v));
  } else {
    return static_cast<T>(v);
  }
}

template <class T>
struct Tag {
  using type = T;
};

template <class F>
decltype(auto) visitType(DataType type, F&& f) {
  switch (type) {
    case DataType::Int8:
      return f(Tag<int8_t>{});
    case DataType::Uint8:
      return f(Tag<uint8_t>{});
    case DataType::Int32:
      return f(Tag<int32_t>{});
    case DataType::Uint32:
      return f(Tag<uint32_t>{});
    case DataType::Int64:
      return f(Tag<int64_t>{});
    case DataType::Uint64:
      return f(Tag<uint64_t>{});
    case DataType::Float16:
      return f(Tag<Half>{});
    case DataType::BFloat16:
      return f(Tag<BFloat16>{});
    case DataType::Float32:
      return f(Tag<float>{});
    case DataType::Float64:
      return f(Tag<double>{});
  }
  return f(Tag<float>{});
}

// Rank r's input at index k. Prod gets mostly 1s and a 2 at every 11th index (shifted per rank),
// so a product over up to ~600 ranks stays far from overflow; the other reductions get 1..7
// (a sum over 18 ranks still fits int8); copies get 1..101, shifted per rank so that a block
// from the wrong rank shows.
int64_t inputValue(const CollCase& c, int r, size_t k) {
  const size_t seed = static_cast<size_t>(c.seed);
  const size_t rank = static_cast<size_t>(r);
  if (!isReducing(c.kind)) return static_cast<int64_t>((k + 13 * rank + seed) % 101 + 1);
  if (c.op == ReduceOp::Prod) return (k + 5 * rank + seed) % 11 == 0 ? 2 : 1;
  return static_cast<int64_t>((k + rank + seed) % 7 + 1);
}

// The reduction of every rank's input at index k, as the type T holds it.
template <class T>
T reduced(const CollCase& c, size_t k) {
  int64_t acc = inputValue(c, 0, k);
  for (int r = 1; r < c.nranks; ++r) {
    const int64_t v = inputValue(c, r, k);
    switch (c.op) {
      case ReduceOp::Sum:
      case ReduceOp::Avg:
        acc += v;
        break;
      case ReduceOp::Prod:
        acc *= v;
        break;
      case ReduceOp::Min:
        acc = std::min(acc, v);
        break;
      case ReduceOp::Max:
        acc = std::max(acc, v);
        break;
    }
  }
  if (c.op == ReduceOp::Avg) {
    if constexpr (kIsInteger<T>) return fromInteger<T>(acc / c.nranks);  // truncating, as NCCL
    return fromDouble<T>(static_cast<double>(acc) / c.nranks);
  }
  return fromInteger<T>(acc);
}

template <class T>
T expectedAt(const CollCase& c, size_t j) {
  const size_t count = c.count;
  const size_t rank = static_cast<size_t>(c.rank);
  switch (c.kind) {
    case CollKind::AllReduce:
      return reduced<T>(c, j);
    case CollKind::ReduceScatter:
      return reduced<T>(c, rank * count + j);
    case CollKind::AllGather:
      return fromInteger<T>(inputValue(c, static_cast<int>(j / count), j % count));
    case CollKind::Broadcast:
      return fromInteger<T>(inputValue(c, c.root, j));
    case CollKind::AllToAll:
      return fromInteger<T>(inputValue(c, static_cast<int>(j / count), rank * count + j % count));
    case CollKind::SendRecv:
      return fromInteger<T>(inputValue(c, (c.rank - 1 + c.nranks) % c.nranks, j));
  }
  return fromInteger<T>(0);
}

template <class T>
double tolerance(const CollCase& c) {
  if (!isReducing(c.kind) || kIsInteger<T>) return 0;
  if constexpr (std::is_same_v<T, Half>) return 1e-2;
  if constexpr (std::is_same_v<T, BFloat16>) return 2e-2;
  if constexpr (std::is_same_v<T, float>) return 1e-5;
  return 1e-12;
}

template <class T>
void fillInput(const CollCase& c, T* out, size_t elements) {
  for (size_t k = 0; k < elements; ++k) out[k] = fromInteger<T>(inputValue(c, c.rank, k));
}

}  // namespace

const char* collName(CollKind kind) {
  switch (kind) {
    case CollKind::AllReduce:
      return "allreduce";
    case CollKind::AllGather:
      return "allgather";
    case CollKind::ReduceScatter:
      return "reducescatter";
    case CollKind::Broadcast:
      return "broadcast";
    case CollKind::AllToAll:
      return "alltoall";
    case CollKind::SendRecv:
      return "sendrecv";
  }
  return "?";
}

bool isReducing(CollKind kind) {
  return kind == CollKind::AllReduce || kind == CollKind::ReduceScatter;
}

double busBwFactor(CollKind kind, int nranks) {
  const double n = nranks;
  switch (kind) {
    case CollKind::AllReduce:
      return 2 * (n - 1) / n;
    case CollKind::AllGather:
    case CollKind::ReduceScatter:
    case CollKind::AllToAll:
      return (n - 1) / n;
    case CollKind::Broadcast:
    case CollKind::SendRecv:
      return 1;
  }
  return 1;
}

size_t sendElements(const CollCase& c) {
  const size_t n = static_cast<size_t>(c.nranks);
  switch (c.kind) {
    case CollKind::ReduceScatter:
    case CollKind::AllToAll:
      return n * c.count;
    default:
      return c.count;
  }
}

size_t recvElements(const CollCase& c) {
  const size_t n = static_cast<size_t>(c.nranks);
  switch (c.kind) {
    case CollKind::AllGather:
    case CollKind::AllToAll:
      return n * c.count;
    default:
      return c.count;
  }
}

void fillSend(const CollCase& c, void* send) {
  visitType(c.type, [&](auto tag) {
    using T = typename decltype(tag)::type;
    fillInput(c, static_cast<T*>(send), sendElements(c));
  });
}

void fillInPlace(const CollCase& c, void* buffer) {
  visitType(c.type, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* out = static_cast<T*>(buffer);
    if (c.kind == CollKind::AllGather) {
      // This rank's block is the input; the others must be written by the collective.
      const size_t n = static_cast<size_t>(c.nranks);
      std::fill(out, out + n * c.count, fromInteger<T>(0));
      fillInput(c, out + static_cast<size_t>(c.rank) * c.count, c.count);
    } else {
      fillInput(c, out, sendElements(c));
    }
  });
}

void poison(DataType type, void* buffer, size_t elements) {
  std::memset(buffer, 0, elements * sizeOf(type));  // 0 is 0 in every type
}

int64_t countWrong(const CollCase& c, const void* result) {
  return visitType(c.type, [&](auto tag) -> int64_t {
    using T = typename decltype(tag)::type;
    const T* got = static_cast<const T*>(result);
    const double tol = tolerance<T>(c);
    const size_t elements = recvElements(c);
    int64_t wrong = 0;
    for (size_t j = 0; j < elements; ++j) {
      const double want = toDouble(expectedAt<T>(c, j));
      const double have = toDouble(got[j]);
      // Written so that a NaN counts as wrong.
      if (!(std::fabs(have - want) <= tol * std::max(1.0, std::fabs(want)))) ++wrong;
    }
    return wrong;
  });
}

}  // namespace strata::perf
