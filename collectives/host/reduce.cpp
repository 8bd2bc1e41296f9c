// The build's default is -O2, whose vectorizer gives up on loops that need a scalar tail; these
// loops are the whole cost of a host allReduce, so this file gets -O3. The pragma comes before
// every include so that all functions in the file share the options and inline into each other.
#pragma GCC optimize("O3")

#include "reduce.hpp"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include <strata/error.hpp>

#include "base/float16.hpp"

// The kernels are memory bound at large sizes, but in cache (the pipelined chunks of the host
// algorithms) 256-bit vectors roughly double their speed; x86-64's baseline only has SSE2, so
// the dispatchers are cloned for AVX2 and picked at load time (no -march=native).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(STRATA_REDUCE_NO_CLONES)
#define STRATA_REDUCE_CLONES __attribute__((target_clones("avx2", "default"), flatten))
#else
#define STRATA_REDUCE_CLONES __attribute__((flatten))
#endif

// The portable fp16/bf16 kernels convert in software (select chains on bit patterns), which
// leaves them ~10x slower than float. On x86-64 with F16C and AVX2 (every such CPU since 2013)
// hand-written kernels convert with vcvtph2ps/vcvtps2ph (fp16) and a few integer ops (bf16);
// they are chosen at run time, so the build still runs on plain x86-64.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(STRATA_REDUCE_NO_SIMD)
#define STRATA_REDUCE_X86 1
#include <immintrin.h>
#define STRATA_AVX2_F16C __attribute__((target("avx2,f16c")))
#define STRATA_AVX2_F16C_INLINE __attribute__((target("avx2,f16c"), always_inline)) inline
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

#ifdef STRATA_REDUCE_X86

// The kernels below move 16 elements (32 bytes, any alignment) at a time as two fp32 vectors.
// Which element sits in which lane is the converter's business: load16 and store16 are exact
// inverses, and the operations are element-wise. Every fp16/bf16 result of the portable kernels
// is reproduced bit for bit, except that vcvtph2ps quiets a signalling fp16 NaN (reduce.hpp).
struct V16 {
  __m256 lo, hi;
};

struct HalfX86 {
  STRATA_AVX2_F16C_INLINE static V16 load16(const char* p) {
    return {_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))),
            _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16)))};
  }
  STRATA_AVX2_F16C_INLINE static void store16(char* p, V16 v) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                     _mm256_cvtps_ph(v.lo, _MM_FROUND_TO_NEAREST_INT));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p + 16),
                     _mm256_cvtps_ph(v.hi, _MM_FROUND_TO_NEAREST_INT));
  }
};

// bf16 is the top half of an fp32. Interleaving with zeros widens exactly in one shuffle (lo gets
// elements 0-3 and 8-11, hi 4-7 and 12-15; the pack in store16 undoes that). Narrowing is
// floatToBf16 (float16.hpp) lane by lane: RNE by integer rounding, and NaNs truncated with the
// quiet bit set when no payload bit would survive; NaNs are rare, so they take a separate branch.
struct BHalfX86 {
  STRATA_AVX2_F16C_INLINE static V16 load16(const char* p) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    const __m256i zero = _mm256_setzero_si256();
    return {_mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, x)),
            _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, x))};
  }
  // (u + 0x7fff + lsb) >> 16, for non-NaN lanes.
  STRATA_AVX2_F16C_INLINE static __m256i round(__m256 v) {
    const __m256i u = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    return _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb),
                             16);
  }
  STRATA_AVX2_F16C_INLINE static __m256i roundWithNans(__m256 v) {
    const __m256i top = _mm256_srli_epi32(_mm256_castps_si256(v), 16);
    const __m256i noPayload =
        _mm256_cmpeq_epi32(_mm256_and_si256(top, _mm256_set1_epi32(0x7f)), _mm256_setzero_si256());
    const __m256i nan = _mm256_or_si256(top, _mm256_and_si256(noPayload, _mm256_set1_epi32(0x40)));
    const __m256i isNan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    return _mm256_blendv_epi8(round(v), nan, isNan);
  }
  STRATA_AVX2_F16C_INLINE static void store16(char* p, V16 v) {
    const __m256 anyNan = _mm256_or_ps(_mm256_cmp_ps(v.lo, v.lo, _CMP_UNORD_Q),
                                       _mm256_cmp_ps(v.hi, v.hi, _CMP_UNORD_Q));
    // Every lane is < 2^16, so the saturating pack is a plain narrowing.
    const __m256i bits = __builtin_expect(_mm256_movemask_ps(anyNan) == 0, 1)
                             ? _mm256_packus_epi32(round(v.lo), round(v.hi))
                             : _mm256_packus_epi32(roundWithNans(v.lo), roundWithNans(v.hi));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), bits);
  }
};

// SumOp..MaxOp on 8 lanes: a is the accumulator, b the operand. When both are NaNs, x86
// arithmetic returns its first operand's. g++ puts b first in the portable kernels, so the fast
// ones do too, and the two paths agree on payloads as well (the tests compare them bit for bit).
// That takes asm: the intrinsics are plain vector + and *, which g++ may commute.
template <typename Op>
STRATA_AVX2_F16C_INLINE __m256 applyX86(__m256 a, __m256 b) {
  if constexpr (std::is_same_v<Op, SumOp>) {
    __m256 r;
    asm("vaddps %2, %1, %0" : "=x"(r) : "x"(b), "x"(a));  // AT&T order: r = b + a
    return r;
  } else if constexpr (std::is_same_v<Op, ProdOp>) {
    __m256 r;
    asm("vmulps %2, %1, %0" : "=x"(r) : "x"(b), "x"(a));
    return r;
  } else {
    constexpr int kCmp = std::is_same_v<Op, MinOp> ? _CMP_LT_OQ : _CMP_GT_OQ;
    const __m256 takeB = _mm256_or_ps(_mm256_cmp_ps(b, a, kCmp), _mm256_cmp_ps(b, b, _CMP_UNORD_Q));
    return _mm256_blendv_ps(a, b, takeB);
  }
}

template <typename Op>
STRATA_AVX2_F16C_INLINE V16 applyX86(V16 a, V16 b) {
  return {applyX86<Op>(a.lo, b.lo), applyX86<Op>(a.hi, b.hi)};
}

// Tails (< 16 elements) go through a zero-padded copy, so that they use the same conversions as
// the body and never touch bytes past the end.
template <typename Cv>
STRATA_AVX2_F16C_INLINE V16 loadPartial(const char* p, size_t len) {
  alignas(32) char tmp[32] = {};
  std::memcpy(tmp, p, len * 2);
  return Cv::load16(tmp);
}

template <typename Cv>
STRATA_AVX2_F16C_INLINE void storePartial(char* p, size_t len, V16 v) {
  alignas(32) char tmp[32];
  Cv::store16(tmp, v);
  std::memcpy(p, tmp, len * 2);
}

template <typename Cv, typename Op>
STRATA_AVX2_F16C void intoX86(char* dst, const char* src, size_t count) {
  size_t i = 0;
  for (; i + 16 <= count; i += 16) {
    Cv::store16(dst + 2 * i, applyX86<Op>(Cv::load16(dst + 2 * i), Cv::load16(src + 2 * i)));
  }
  if (i < count) {
    const size_t len = count - i;
    storePartial<Cv>(
        dst + 2 * i, len,
        applyX86<Op>(loadPartial<Cv>(dst + 2 * i, len), loadPartial<Cv>(src + 2 * i, len)));
  }
}

// 32 elements (one cache line of each source) are folded in registers over all n sources, in
// source order, and rounded once; every source of a group is read before dst is written, so dst
// may be any source.
template <typename Cv, typename Op>
STRATA_AVX2_F16C void manyX86(char* dst, const void* const* srcs, size_t n, size_t count) {
  auto at = [srcs](size_t k, size_t i) { return static_cast<const char*>(srcs[k]) + 2 * i; };
  size_t i = 0;
  for (; i + 32 <= count; i += 32) {
    V16 a0 = Cv::load16(at(0, i)), a1 = Cv::load16(at(0, i) + 32);
    for (size_t k = 1; k < n; ++k) {
      const char* s = at(k, i);
      a0 = applyX86<Op>(a0, Cv::load16(s));
      a1 = applyX86<Op>(a1, Cv::load16(s + 32));
    }
    Cv::store16(dst + 2 * i, a0);
    Cv::store16(dst + 2 * i + 32, a1);
  }
  for (; i < count; i += 16) {
    const size_t len = std::min<size_t>(16, count - i);
    V16 a = loadPartial<Cv>(at(0, i), len);
    for (size_t k = 1; k < n; ++k) a = applyX86<Op>(a, loadPartial<Cv>(at(k, i), len));
    storePartial<Cv>(dst + 2 * i, len, a);
  }
}

STRATA_AVX2_F16C_INLINE V16 divideV16(V16 v, __m256 d) {
  return {_mm256_div_ps(v.lo, d), _mm256_div_ps(v.hi, d)};
}

template <typename Cv>
STRATA_AVX2_F16C void divideX86(char* data, size_t count, int divisor) {
  const __m256 d = _mm256_set1_ps(static_cast<float>(divisor));
  size_t i = 0;
  for (; i + 16 <= count; i += 16)
    Cv::store16(data + 2 * i, divideV16(Cv::load16(data + 2 * i), d));
  if (i < count) {
    const size_t len = count - i;
    storePartial<Cv>(data + 2 * i, len, divideV16(loadPartial<Cv>(data + 2 * i, len), d));
  }
}

bool x86Supported() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
}

// Decided once from the CPU; detail::setReduceSimd (tests) may turn it off and on again.
std::atomic<bool>& simdEnabled() {
  static std::atomic<bool> enabled{x86Supported()};
  return enabled;
}

// Calls f(HalfX86{} or BHalfX86{}, Op{}) and returns true when the fast path takes (type, op).
template <typename F>
bool dispatchX86(DataType type, ReduceOp op, F&& f) {
  if (type != DataType::Float16 && type != DataType::BFloat16) return false;
  if (!simdEnabled().load(std::memory_order_relaxed)) return false;
  auto withOp = [&](auto cv) {
    switch (op) {
      case ReduceOp::Sum:
      case ReduceOp::Avg:
        f(cv, SumOp{});
        return true;
      case ReduceOp::Prod:
        f(cv, ProdOp{});
        return true;
      case ReduceOp::Min:
        f(cv, MinOp{});
        return true;
      case ReduceOp::Max:
        f(cv, MaxOp{});
        return true;
    }
    return false;  // a bad op: the portable dispatch reports it
  };
  return type == DataType::Float16 ? withOp(HalfX86{}) : withOp(BHalfX86{});
}

#endif  // STRATA_REDUCE_X86

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
#ifdef STRATA_REDUCE_X86
  if (dispatchX86(type, op, [&](auto cv, auto fn) {
        intoX86<decltype(cv), decltype(fn)>(static_cast<char*>(dst), static_cast<const char*>(src),
                                            count);
      })) {
    return;
  }
#endif
  reduceIntoImpl(static_cast<char*>(dst), static_cast<const char*>(src), count, type, op);
}

void reduceMany(void* dst, const void* const* srcs, size_t n, size_t count, DataType type,
                ReduceOp op) {
  if (n == 0) {
    throw Error(ErrorCode::InvalidArgument, "host reduction: reduceMany needs at least one source");
  }
  if (count == 0) return;
#ifdef STRATA_REDUCE_X86
  if (dispatchX86(type, op, [&](auto cv, auto fn) {
        manyX86<decltype(cv), decltype(fn)>(static_cast<char*>(dst), srcs, n, count);
      })) {
    return;
  }
#endif
  reduceManyImpl(static_cast<char*>(dst), srcs, n, count, type, op);
}

void divideBy(void* data, size_t count, DataType type, int divisor) {
  if (divisor < 1) {
    throw Error(ErrorCode::InvalidArgument,
                "host reduction: divideBy needs a divisor >= 1, got " + std::to_string(divisor));
  }
  if (count == 0 || divisor == 1) return;
#ifdef STRATA_REDUCE_X86
  if (dispatchX86(type, ReduceOp::Sum, [&](auto cv, auto) {
        divideX86<decltype(cv)>(static_cast<char*>(data), count, divisor);
      })) {
    return;
  }
#endif
  divideByImpl(static_cast<char*>(data), count, type, divisor);
}

namespace detail {

// Internal, for tests (declared there): turns the F16C/AVX2 fp16/bf16 kernels off or back on and
// returns whether they are now in use (never where the CPU or the build lacks them).
bool setReduceSimd(bool enabled) {
#ifdef STRATA_REDUCE_X86
  const bool on = enabled && x86Supported();
  simdEnabled().store(on);
  return on;
#else
  (void)enabled;
  return false;
#endif
}

}  // namespace detail
}  // namespace strata::collectives
