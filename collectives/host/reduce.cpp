// The build's default is -O2, whose vectorizer gives up on loops that need a scalar tail; these
// loops are the whole cost of a host allReduce, so this file gets -O3. The pragma comes before
// every include so that all functions in the file share the options and inline into each other.
#pragma GCC optimize("O3")

#include "collectives/host/reduce.hpp"

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>

#include <strata/error.hpp>

#include "collectives/host/float16.hpp"

// The kernels are memory bound at large sizes, but in cache (the pipelined chunks of the host
// algorithms) 256-bit vectors roughly double their speed; x86-64's baseline only has SSE2, so
// the dispatchers are cloned for AVX2 and picked at load time (no -march=native).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(STRATA_REDUCE_NO_CLONES)
#define STRATA_REDUCE_CLONES __attribute__((target_clones("avx2", "default"), flatten))
#else
#define STRATA_REDUCE_CLONES __attribute__((flatten))
#endif

namespace strata::collectives {
namespace {

// Loads and stores through memcpy: the pointers may have any alignment, and memcpy of a fixed
// size compiles to one (vectorizable, unaligned) access.
template <typename T>
inline T load(const char* p, size_t i) {
  T v;
  __builtin_memcpy(&v, p + i * sizeof(T), sizeof(T));
  return v;
}

template <typename T>
inline void store(char* p, size_t i, T v) {
  __builtin_memcpy(p + i * sizeof(T), &v, sizeof(T));
}

// Storage type, accumulation type and the conversions between them.
template <typename T>
struct Plain {
  using Storage = T;
  using Acc = T;
  static Acc toAcc(Storage s) { return s; }
  static Storage fromAcc(Acc a) { return a; }
};

struct Half {
  using Storage = uint16_t;
  using Acc = float;
  static Acc toAcc(Storage s) { return halfToFloat(s); }
  static Storage fromAcc(Acc a) { return floatToHalf(a); }
};

struct BHalf {
  using Storage = uint16_t;
  using Acc = float;
  static Acc toAcc(Storage s) { return bf16ToFloat(s); }
  static Storage fromAcc(Acc a) { return floatToBf16(a); }
};

// a is the accumulator, b the incoming operand.
struct SumOp {
  template <typename A>
  static A apply(A a, A b) {
    if constexpr (std::is_integral_v<A>) {
      // Unsigned arithmetic wraps where signed overflow would be undefined.
      using U = std::make_unsigned_t<A>;
      return static_cast<A>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
    } else {
      return a + b;
    }
  }
};

struct ProdOp {
  template <typename A>
  static A apply(A a, A b) {
    if constexpr (std::is_integral_v<A>) {
      using U = std::make_unsigned_t<A>;
      return static_cast<A>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
    } else {
      return a * b;
    }
  }
};

// For floats, `b != b` makes a NaN operand win from either side (see reduce.hpp); for integers
// it is always false and folds away.
struct MinOp {
  template <typename A>
  static A apply(A a, A b) {
    return ((b < a) | (b != b)) ? b : a;
  }
};

struct MaxOp {
  template <typename A>
  static A apply(A a, A b) {
    return ((b > a) | (b != b)) ? b : a;
  }
};

template <typename Tr, typename Op>
inline void intoKernel(char* __restrict dst, const char* __restrict src, size_t count) {
  using S = typename Tr::Storage;
  for (size_t i = 0; i < count; ++i) {
    const S a = load<S>(dst, i);
    const S b = load<S>(src, i);
    store<S>(dst, i, Tr::fromAcc(Op::apply(Tr::toAcc(a), Tr::toAcc(b))));
  }
}

// Folds the sources block by block into an accumulator on the stack that stays in L1, and writes
// dst only once all sources of a block were read: that makes dst == srcs[k] safe and keeps the
// fp16/bf16 accumulation in fp32 until the single rounding.
template <typename Tr, typename Op>
inline void manyKernel(char* dst, const void* const* srcs, size_t n, size_t count) {
  using S = typename Tr::Storage;
  using Acc = typename Tr::Acc;
  constexpr size_t kBlock = 8192 / sizeof(Acc);
  alignas(64) Acc acc[kBlock];
  for (size_t base = 0; base < count; base += kBlock) {
    const size_t len = std::min(kBlock, count - base);
    Acc* __restrict a = acc;
    {
      const char* __restrict s = static_cast<const char*>(srcs[0]) + base * sizeof(S);
      for (size_t i = 0; i < len; ++i) a[i] = Tr::toAcc(load<S>(s, i));
    }
    for (size_t k = 1; k < n; ++k) {
      const char* __restrict s = static_cast<const char*>(srcs[k]) + base * sizeof(S);
      for (size_t i = 0; i < len; ++i) a[i] = Op::apply(a[i], Tr::toAcc(load<S>(s, i)));
    }
    char* __restrict d = dst + base * sizeof(S);
    for (size_t i = 0; i < len; ++i) store<S>(d, i, Tr::fromAcc(a[i]));
  }
}

template <typename T>
inline void divideKernel(char* __restrict data, size_t count, int divisor) {
  if constexpr (std::is_integral_v<T>) {
    // Narrow types divide in int (the quotient always fits back); C++ division truncates.
    using C = std::conditional_t<(sizeof(T) < sizeof(int)), int, T>;
    const C d = static_cast<C>(divisor);
    for (size_t i = 0; i < count; ++i) {
      store<T>(data, i, static_cast<T>(static_cast<C>(load<T>(data, i)) / d));
    }
  } else {
    const T d = static_cast<T>(divisor);
    for (size_t i = 0; i < count; ++i) store<T>(data, i, load<T>(data, i) / d);
  }
}

template <typename Tr>
inline void divideKernel16(char* __restrict data, size_t count, int divisor) {
  const float d = static_cast<float>(divisor);
  for (size_t i = 0; i < count; ++i) {
    store<uint16_t>(data, i, Tr::fromAcc(Tr::toAcc(load<uint16_t>(data, i)) / d));
  }
}

[[noreturn]] void badType(DataType type) {
  throw Error(ErrorCode::InvalidArgument,
              "host reduction: unknown DataType value " + std::to_string(static_cast<int>(type)));
}

[[noreturn]] void badOp(ReduceOp op) {
  throw Error(ErrorCode::InvalidArgument,
              "host reduction: unknown ReduceOp value " + std::to_string(static_cast<int>(op)));
}

// Calls f(Traits{}, Op{}) for the (type, op) pair; Avg is Sum.
template <typename F>
inline void dispatch(DataType type, ReduceOp op, F&& f) {
  auto withOp = [&](auto traits) {
    switch (op) {
      case ReduceOp::Sum:
      case ReduceOp::Avg:
        return f(traits, SumOp{});
      case ReduceOp::Prod:
        return f(traits, ProdOp{});
      case ReduceOp::Min:
        return f(traits, MinOp{});
      case ReduceOp::Max:
        return f(traits, MaxOp{});
    }
    badOp(op);
  };
  switch (type) {
    case DataType::Int8:
      return withOp(Plain<int8_t>{});
    case DataType::Uint8:
      return withOp(Plain<uint8_t>{});
    case DataType::Int32:
      return withOp(Plain<int32_t>{});
    case DataType::Uint32:
      return withOp(Plain<uint32_t>{});
    case DataType::Int64:
      return withOp(Plain<int64_t>{});
    case DataType::Uint64:
      return withOp(Plain<uint64_t>{});
    case DataType::Float16:
      return withOp(Half{});
    case DataType::BFloat16:
      return withOp(BHalf{});
    case DataType::Float32:
      return withOp(Plain<float>{});
    case DataType::Float64:
      return withOp(Plain<double>{});
  }
  badType(type);
}

STRATA_REDUCE_CLONES void reduceIntoImpl(char* dst, const char* src, size_t count, DataType type,
                                         ReduceOp op) {
  dispatch(type, op, [&](auto traits, auto fn) {
    intoKernel<decltype(traits), decltype(fn)>(dst, src, count);
  });
}

STRATA_REDUCE_CLONES void reduceManyImpl(char* dst, const void* const* srcs, size_t n, size_t count,
                                         DataType type, ReduceOp op) {
  dispatch(type, op, [&](auto traits, auto fn) {
    manyKernel<decltype(traits), decltype(fn)>(dst, srcs, n, count);
  });
}

STRATA_REDUCE_CLONES void divideByImpl(char* data, size_t count, DataType type, int divisor) {
  switch (type) {
    case DataType::Int8:
      return divideKernel<int8_t>(data, count, divisor);
    case DataType::Uint8:
      return divideKernel<uint8_t>(data, count, divisor);
    case DataType::Int32:
      return divideKernel<int32_t>(data, count, divisor);
    case DataType::Uint32:
      return divideKernel<uint32_t>(data, count, divisor);
    case DataType::Int64:
      return divideKernel<int64_t>(data, count, divisor);
    case DataType::Uint64:
      return divideKernel<uint64_t>(data, count, divisor);
    case DataType::Float16:
      return divideKernel16<Half>(data, count, divisor);
    case DataType::BFloat16:
      return divideKernel16<BHalf>(data, count, divisor);
    case DataType::Float32:
      return divideKernel<float>(data, count, divisor);
    case DataType::Float64:
      return divideKernel<double>(data, count, divisor);
  }
  badType(type);
}

}  // namespace

void reduceInto(void* dst, const void* src, size_t count, DataType type, ReduceOp op) {
  if (count == 0) return;
  reduceIntoImpl(static_cast<char*>(dst), static_cast<const char*>(src), count, type, op);
}

void reduceMany(void* dst, const void* const* srcs, size_t n, size_t count, DataType type,
                ReduceOp op) {
  if (n == 0) {
    throw Error(ErrorCode::InvalidArgument, "host reduction: reduceMany needs at least one source");
  }
  if (count == 0) return;
  reduceManyImpl(static_cast<char*>(dst), srcs, n, count, type, op);
}

void divideBy(void* data, size_t count, DataType type, int divisor) {
  if (divisor < 1) {
    throw Error(ErrorCode::InvalidArgument,
                "host reduction: divideBy needs a divisor >= 1, got " + std::to_string(divisor));
  }
  if (count == 0 || divisor == 1) return;
  divideByImpl(static_cast<char*>(data), count, type, divisor);
}

}  // namespace strata::collectives
