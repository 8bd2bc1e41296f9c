// The host reduction kernels (collectives/host/reduce.cpp): every DataType x ReduceOp against a
// scalar reference (odd counts, unaligned pointers, guard bytes), reduceMany's independence from
// dst aliasing, and divideBy's integer and float semantics. The kernel tests run twice, with the
// F16C/AVX2 fp16/bf16 kernels off and on, and the two are compared bit for bit. The conversions
// they use are tested in tests/unit/base/test_float16.cpp.
#define BOOST_TEST_MODULE reduce
#include <boost/test/unit_test.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include <strata/communicator.hpp>
#include <strata/error.hpp>

#include "base/float16.hpp"
#include "collectives/host/reduce.hpp"

namespace strata::collectives::detail {
// Internal switch of reduce.cpp: fast fp16/bf16 kernels off or on; returns whether they are on.
bool setReduceSimd(bool enabled);
}  // namespace strata::collectives::detail

using namespace strata;
using namespace strata::collectives;

namespace {

const DataType kTypes[] = {
    DataType::Int8,   DataType::Uint8,   DataType::Int32,    DataType::Uint32,  DataType::Int64,
    DataType::Uint64, DataType::Float16, DataType::BFloat16, DataType::Float32, DataType::Float64};
const ReduceOp kOps[] = {ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max,
                         ReduceOp::Avg};

std::string name(DataType t, ReduceOp op) {
  return std::to_string(static_cast<int>(t)) + "/" + std::to_string(static_cast<int>(op));
}

// The scalar reference: one element at a time, the way the semantics in reduce.hpp read.
template <typename A>
A refApply(ReduceOp op, A a, A b) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg:
      if constexpr (std::is_integral_v<A>) {
        using U = std::make_unsigned_t<A>;
        return static_cast<A>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
      } else {
        return a + b;
      }
    case ReduceOp::Prod:
      if constexpr (std::is_integral_v<A>) {
        using U = std::make_unsigned_t<A>;
        return static_cast<A>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
      } else {
        return a * b;
      }
    case ReduceOp::Min:
      if constexpr (!std::is_integral_v<A>) {
        if (std::isnan(b)) return b;
        if (std::isnan(a)) return a;
      }
      return b < a ? b : a;
    case ReduceOp::Max:
      if constexpr (!std::is_integral_v<A>) {
        if (std::isnan(b)) return b;
        if (std::isnan(a)) return a;
      }
      return b > a ? b : a;
  }
  return a;
}

template <typename T>
T get(const uint8_t* p, size_t i) {
  T v;
  std::memcpy(&v, p + i * sizeof(T), sizeof(T));
  return v;
}

template <typename T>
void put(uint8_t* p, size_t i, T v) {
  std::memcpy(p + i * sizeof(T), &v, sizeof(T));
}

// Folds srcs[0..n) element i in order, into bytes at out.
void refFold(uint8_t* out, const std::vector<const uint8_t*>& srcs, size_t count, DataType t,
             ReduceOp op) {
  for (size_t i = 0; i < count; ++i) {
    auto fold = [&](auto zero, auto toAcc, auto fromAcc) {
      using S = decltype(zero);
      auto acc = toAcc(get<S>(srcs[0], i));
      for (size_t k = 1; k < srcs.size(); ++k) acc = refApply(op, acc, toAcc(get<S>(srcs[k], i)));
      put<S>(out, i, fromAcc(acc));
    };
    auto id = [](auto v) { return v; };
    switch (t) {
      case DataType::Int8:
        fold(int8_t{}, id, id);
        break;
      case DataType::Uint8:
        fold(uint8_t{}, id, id);
        break;
      case DataType::Int32:
        fold(int32_t{}, id, id);
        break;
      case DataType::Uint32:
        fold(uint32_t{}, id, id);
        break;
      case DataType::Int64:
        fold(int64_t{}, id, id);
        break;
      case DataType::Uint64:
        fold(uint64_t{}, id, id);
        break;
      case DataType::Float16:
        fold(uint16_t{}, halfToFloat, floatToHalf);
        break;
      case DataType::BFloat16:
        fold(uint16_t{}, bf16ToFloat, floatToBf16);
        break;
      case DataType::Float32:
        fold(float{}, id, id);
        break;
      case DataType::Float64:
        fold(double{}, id, id);
        break;
    }
  }
}

// Random elements: integers any bits; floats mostly moderate values (so Prod stays finite), with
// some NaN, Inf, signed zeros and subnormals mixed in.
void fillRandom(uint8_t* p, size_t count, DataType t, std::mt19937_64& rng) {
  for (size_t i = 0; i < count; ++i) {
    const uint64_t r = rng();
    const int special = static_cast<int>(r % 23);
    double v = static_cast<double>(static_cast<int64_t>(r >> 40) % 2000) / 64.0;
    if (special == 0) v = std::numeric_limits<double>::quiet_NaN();
    if (special == 1) v = -std::numeric_limits<double>::infinity();
    if (special == 2) v = -0.0;
    if (special == 3) v = 0.0;
    if (special == 4) v = std::ldexp(1.0, -20);  // half subnormal
    switch (t) {
      case DataType::Float16:
        put<uint16_t>(p, i, floatToHalf(static_cast<float>(v)));
        break;
      case DataType::BFloat16:
        put<uint16_t>(p, i, floatToBf16(static_cast<float>(v)));
        break;
      case DataType::Float32:
        put<float>(p, i, static_cast<float>(v));
        break;
      case DataType::Float64:
        put<double>(p, i, v);
        break;
      default:
        std::memcpy(p + i * strata::sizeOf(t), &r, strata::sizeOf(t));
    }
  }
}

// Bit-identical, except that two NaNs of a float type match whatever their payloads: the
// compiler may swap the operands of the reference's a + b, and x86 returns the first NaN.
bool sameElements(const uint8_t* got, const uint8_t* want, size_t count, DataType t) {
  if (std::memcmp(got, want, count * strata::sizeOf(t)) == 0) return true;
  for (size_t i = 0; i < count; ++i) {
    bool same;
    switch (t) {
      case DataType::Float16: {
        const uint16_t a = get<uint16_t>(got, i), b = get<uint16_t>(want, i);
        same = a == b || (std::isnan(halfToFloat(a)) && std::isnan(halfToFloat(b)));
        break;
      }
      case DataType::BFloat16: {
        const uint16_t a = get<uint16_t>(got, i), b = get<uint16_t>(want, i);
        same = a == b || (std::isnan(bf16ToFloat(a)) && std::isnan(bf16ToFloat(b)));
        break;
      }
      case DataType::Float32: {
        const float a = get<float>(got, i), b = get<float>(want, i);
        same = std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b) ||
               (std::isnan(a) && std::isnan(b));
        break;
      }
      case DataType::Float64: {
        const double a = get<double>(got, i), b = get<double>(want, i);
        same = std::memcmp(&a, &b, 8) == 0 || (std::isnan(a) && std::isnan(b));
        break;
      }
      default:
        same = std::memcmp(got + i * strata::sizeOf(t), want + i * strata::sizeOf(t),
                           strata::sizeOf(t)) == 0;
    }
    if (!same) {
      BOOST_TEST_MESSAGE("element " << i << " differs");
      return false;
    }
  }
  return true;
}

const size_t kCounts[] = {0, 1, 2, 3, 7, 15, 17, 31, 33, 63, 65, 255, 1001, 4097, 9999};

// Runs body with the fast fp16/bf16 kernels off, then on (where the CPU has them), and leaves
// them on.
template <typename F>
void onBothPaths(F&& body) {
  for (bool simd : {false, true}) {
    const bool on = detail::setReduceSimd(simd);
    if (simd && !on) {
      BOOST_TEST_MESSAGE("no F16C/AVX2 kernels on this CPU or build: portable path only");
      break;
    }
    BOOST_TEST_CONTEXT("simd kernels " << (on ? "on" : "off")) {
      body();
    }
  }
  detail::setReduceSimd(true);
}

}  // namespace

// A test case whose body runs on both paths.
#define BOTH_PATHS_TEST_CASE(name) \
  void name##_body();              \
  BOOST_AUTO_TEST_CASE(name) {     \
    onBothPaths(name##_body);      \
  }                                \
  void name##_body()

BOOST_AUTO_TEST_SUITE(kernels)

BOTH_PATHS_TEST_CASE(reduce_into_matches_reference) {
  std::mt19937_64 rng(42);
  const size_t kGuard = 16;
  for (DataType t : kTypes) {
    const size_t es = strata::sizeOf(t);
    for (ReduceOp op : kOps) {
      for (size_t count : kCounts) {
        for (size_t dstOff : {0, 1, 3}) {
          for (size_t srcOff : {0, 2, 5}) {
            const size_t bytes = count * es;
            std::vector<uint8_t> dstBuf(bytes + 2 * kGuard + 8, 0xa5);
            std::vector<uint8_t> srcBuf(bytes + 2 * kGuard + 8, 0x5a);
            uint8_t* dst = dstBuf.data() + kGuard + dstOff;
            uint8_t* src = srcBuf.data() + kGuard + srcOff;
            fillRandom(dst, count, t, rng);
            fillRandom(src, count, t, rng);
            std::vector<uint8_t> want(bytes + 1);
            refFold(want.data(), {dst, src}, count, t, op);
            const std::vector<uint8_t> srcBefore = srcBuf;
            const std::vector<uint8_t> dstBefore = dstBuf;

            reduceInto(dst, src, count, t, op);

            BOOST_TEST_REQUIRE(sameElements(dst, want.data(), count, t),
                               name(t, op)
                                   << " count " << count << " offsets " << dstOff << "," << srcOff);
            BOOST_TEST_REQUIRE((srcBuf == srcBefore));
            // Bytes around dst untouched.
            BOOST_TEST_REQUIRE(std::memcmp(dstBuf.data(), dstBefore.data(), kGuard + dstOff) == 0);
            const size_t tail = kGuard + dstOff + bytes;
            BOOST_TEST_REQUIRE(std::memcmp(dstBuf.data() + tail, dstBefore.data() + tail,
                                           dstBuf.size() - tail) == 0);
          }
        }
      }
    }
  }
}

BOTH_PATHS_TEST_CASE(reduce_into_edge_values) {
  // Integer wrap, signed comparisons, NaN propagation from either side, fp16 accumulation.
  int8_t i8[] = {127, -128, -1, 5};
  const int8_t i8b[] = {1, -1, -1, -7};
  reduceInto(i8, i8b, 4, DataType::Int8, ReduceOp::Sum);
  BOOST_TEST(i8[0] == -128);
  BOOST_TEST(i8[1] == 127);
  BOOST_TEST(i8[2] == -2);
  BOOST_TEST(i8[3] == -2);
  int32_t i32[] = {-5, 7, std::numeric_limits<int32_t>::min()};
  const int32_t i32b[] = {3, -9, -1};
  reduceInto(i32, i32b, 3, DataType::Int32, ReduceOp::Min);
  BOOST_TEST(i32[0] == -5);
  BOOST_TEST(i32[1] == -9);
  BOOST_TEST(i32[2] == std::numeric_limits<int32_t>::min());
  uint32_t u32[] = {0xffffffffu, 2};
  const uint32_t u32b[] = {1, 0x80000000u};
  reduceInto(u32, u32b, 2, DataType::Uint32, ReduceOp::Max);
  BOOST_TEST(u32[0] == 0xffffffffu);
  BOOST_TEST(u32[1] == 0x80000000u);
  int64_t i64[] = {std::numeric_limits<int64_t>::max()};
  const int64_t i64b[] = {2};
  reduceInto(i64, i64b, 1, DataType::Int64, ReduceOp::Prod);
  BOOST_TEST(i64[0] == -2);

  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (ReduceOp op : {ReduceOp::Min, ReduceOp::Max, ReduceOp::Sum, ReduceOp::Prod}) {
    float a[] = {nan, 1.0f, nan};
    const float b[] = {1.0f, nan, nan};
    reduceInto(a, b, 3, DataType::Float32, op);
    BOOST_TEST(std::isnan(a[0]));
    BOOST_TEST(std::isnan(a[1]));
    BOOST_TEST(std::isnan(a[2]));
  }
  double d[] = {-0.0, 2.0};
  const double db[] = {0.0, -3.0};
  reduceInto(d, db, 2, DataType::Float64, ReduceOp::Min);
  BOOST_TEST(std::signbit(d[0]));  // equal operands keep the accumulator
  BOOST_TEST(d[1] == -3.0);

  // 2048 + 1 in fp16 is a tie that rounds to even (2048): the sum is rounded, not truncated.
  uint16_t h[] = {floatToHalf(2048.0f), floatToHalf(2048.0f), floatToHalf(65504.0f),
                  floatToHalf(65504.0f)};
  const uint16_t hb[] = {floatToHalf(1.0f), floatToHalf(3.0f), floatToHalf(8.0f),
                         floatToHalf(16.0f)};
  reduceInto(h, hb, 4, DataType::Float16, ReduceOp::Sum);
  BOOST_TEST(halfToFloat(h[0]) == 2048.0f);
  BOOST_TEST(halfToFloat(h[1]) == 2052.0f);
  BOOST_TEST(halfToFloat(h[2]) == 65504.0f);  // below the overflow threshold
  BOOST_TEST(h[3] == 0x7c00);                 // 65520 is the threshold: Inf
  uint16_t bf[] = {floatToBf16(256.0f)};
  const uint16_t bfb[] = {floatToBf16(3.0f)};
  reduceInto(bf, bfb, 1, DataType::BFloat16, ReduceOp::Sum);
  BOOST_TEST(bf16ToFloat(bf[0]) == 260.0f);  // 259 is a tie between 258 and 260: even is 260
}

BOTH_PATHS_TEST_CASE(reduce_many_matches_reference_and_ignores_aliasing) {
  std::mt19937_64 rng(1234);
  for (DataType t : kTypes) {
    const size_t es = strata::sizeOf(t);
    for (ReduceOp op : kOps) {
      for (size_t count : {size_t{0}, size_t{1}, size_t{33}, size_t{5001}}) {
        for (size_t n : {1, 2, 3, 5}) {
          const size_t bytes = count * es;
          // Sources at odd offsets in one arena; sources are restored before each variant.
          std::vector<std::vector<uint8_t>> bufs(n, std::vector<uint8_t>(bytes + 8));
          std::vector<const uint8_t*> srcs;
          for (size_t k = 0; k < n; ++k) {
            fillRandom(bufs[k].data() + 1 + k % 3, count, t, rng);
            srcs.push_back(bufs[k].data() + 1 + k % 3);
          }
          const auto original = bufs;
          std::vector<uint8_t> want(bytes + 1);
          refFold(want.data(), srcs, count, t, op);

          std::vector<const void*> ptrs(srcs.begin(), srcs.end());
          // Separate dst.
          std::vector<uint8_t> out(bytes + 8, 0);
          reduceMany(out.data() + 3, ptrs.data(), n, count, t, op);
          BOOST_TEST_REQUIRE(sameElements(out.data() + 3, want.data(), count, t),
                             name(t, op) << " count " << count << " n " << n);
          BOOST_TEST_REQUIRE((bufs == original));
          // dst == each source in turn: bit-identical to the separate dst, NaN payloads included.
          for (size_t k = 0; k < n; ++k) {
            bufs = original;
            reduceMany(const_cast<uint8_t*>(srcs[k]), ptrs.data(), n, count, t, op);
            BOOST_TEST_REQUIRE(std::memcmp(srcs[k], out.data() + 3, bytes) == 0,
                               name(t, op) << " count " << count << " n " << n << " dst=src " << k);
          }
          bufs = original;
        }
      }
    }
  }
}

BOTH_PATHS_TEST_CASE(reduce_many_accumulates_half_once) {
  // 2048 + 1 + 1 + 1 + 1: rounding after each step would stay at 2048 (ties to even); fp32
  // accumulation gives 2052 exactly.
  const uint16_t big = floatToHalf(2048.0f);
  const uint16_t one = floatToHalf(1.0f);
  const void* srcs[] = {&big, &one, &one, &one, &one};
  uint16_t out = 0;
  reduceMany(&out, srcs, 5, 1, DataType::Float16, ReduceOp::Sum);
  BOOST_TEST(halfToFloat(out) == 2052.0f);
  const uint16_t bbig = floatToBf16(256.0f);
  const uint16_t bone = floatToBf16(1.0f);
  const void* bsrcs[] = {&bbig, &bone, &bone, &bone, &bone};
  reduceMany(&out, bsrcs, 5, 1, DataType::BFloat16, ReduceOp::Sum);
  BOOST_TEST(bf16ToFloat(out) == 260.0f);
}

BOTH_PATHS_TEST_CASE(divide_by_semantics) {
  int8_t i8[] = {-7, 7, -128, 127, -1};
  divideBy(i8, 5, DataType::Int8, 2);
  BOOST_TEST(i8[0] == -3);
  BOOST_TEST(i8[1] == 3);
  BOOST_TEST(i8[2] == -64);
  BOOST_TEST(i8[3] == 63);
  BOOST_TEST(i8[4] == 0);
  int8_t big[] = {-128};
  divideBy(big, 1, DataType::Int8, 1000);  // divisor wider than the type
  BOOST_TEST(big[0] == 0);
  uint8_t u8[] = {255, 3};
  divideBy(u8, 2, DataType::Uint8, 2);
  BOOST_TEST(u8[0] == 127);
  BOOST_TEST(u8[1] == 1);
  int32_t i32[] = {-7, -9, 9};
  divideBy(i32, 3, DataType::Int32, 4);
  BOOST_TEST(i32[0] == -1);
  BOOST_TEST(i32[1] == -2);
  BOOST_TEST(i32[2] == 2);
  uint32_t u32[] = {0xffffffffu};
  divideBy(u32, 1, DataType::Uint32, 3);
  BOOST_TEST(u32[0] == 0x55555555u);
  int64_t i64[] = {std::numeric_limits<int64_t>::min(), -5};
  divideBy(i64, 2, DataType::Int64, 3);
  BOOST_TEST(i64[0] == std::numeric_limits<int64_t>::min() / 3);
  BOOST_TEST(i64[1] == -1);
  uint64_t u64[] = {~uint64_t{0}};
  divideBy(u64, 1, DataType::Uint64, 5);
  BOOST_TEST(u64[0] == ~uint64_t{0} / 5);

  float f[] = {1.0f, -7.0f};
  divideBy(f, 2, DataType::Float32, 3);
  BOOST_TEST(std::bit_cast<uint32_t>(f[0]) == std::bit_cast<uint32_t>(1.0f / 3.0f));
  BOOST_TEST(f[1] == -7.0f / 3.0f);
  double d[] = {1.0};
  divideBy(d, 1, DataType::Float64, 3);
  BOOST_TEST(d[0] == 1.0 / 3.0);
  uint16_t h[] = {floatToHalf(3.0f), floatToHalf(1.0f)};
  divideBy(h, 2, DataType::Float16, 2);
  BOOST_TEST(halfToFloat(h[0]) == 1.5f);
  BOOST_TEST(h[1] == floatToHalf(0.5f));
  uint16_t h3[] = {floatToHalf(1.0f)};
  divideBy(h3, 1, DataType::Float16, 3);
  BOOST_TEST(h3[0] == floatToHalf(1.0f / 3.0f));
  uint16_t b[] = {floatToBf16(1.0f)};
  divideBy(b, 1, DataType::BFloat16, 3);
  BOOST_TEST(b[0] == floatToBf16(1.0f / 3.0f));

  // Unaligned, odd count, every type: matches element-wise division.
  std::mt19937_64 rng(9);
  for (DataType t : kTypes) {
    const size_t es = strata::sizeOf(t);
    const size_t count = 1003;
    std::vector<uint8_t> buf(count * es + 8);
    uint8_t* p = buf.data() + 3;
    fillRandom(p, count, t, rng);
    std::vector<uint8_t> before(p, p + count * es);
    divideBy(p, count, t, 7);
    for (size_t i = 0; i < count; ++i) {
      bool ok = true;
      switch (t) {
        case DataType::Int8:
          ok = get<int8_t>(p, i) == get<int8_t>(before.data(), i) / 7;
          break;
        case DataType::Uint8:
          ok = get<uint8_t>(p, i) == get<uint8_t>(before.data(), i) / 7;
          break;
        case DataType::Int32:
          ok = get<int32_t>(p, i) == get<int32_t>(before.data(), i) / 7;
          break;
        case DataType::Uint32:
          ok = get<uint32_t>(p, i) == get<uint32_t>(before.data(), i) / 7;
          break;
        case DataType::Int64:
          ok = get<int64_t>(p, i) == get<int64_t>(before.data(), i) / 7;
          break;
        case DataType::Uint64:
          ok = get<uint64_t>(p, i) == get<uint64_t>(before.data(), i) / 7;
          break;
        case DataType::Float16:
          ok = get<uint16_t>(p, i) ==
               floatToHalf(halfToFloat(get<uint16_t>(before.data(), i)) / 7.0f);
          break;
        case DataType::BFloat16:
          ok = get<uint16_t>(p, i) ==
               floatToBf16(bf16ToFloat(get<uint16_t>(before.data(), i)) / 7.0f);
          break;
        case DataType::Float32: {
          const float want = get<float>(before.data(), i) / 7.0f;
          ok = std::bit_cast<uint32_t>(get<float>(p, i)) == std::bit_cast<uint32_t>(want) ||
               std::isnan(want);
          break;
        }
        case DataType::Float64: {
          const double want = get<double>(before.data(), i) / 7.0;
          ok = get<double>(p, i) == want || std::isnan(want);
          break;
        }
      }
      BOOST_TEST_REQUIRE(ok, "type " << static_cast<int>(t) << " element " << i);
    }
  }
}

BOTH_PATHS_TEST_CASE(count_zero_and_bad_arguments) {
  // count 0 touches nothing, even through null pointers.
  reduceInto(nullptr, nullptr, 0, DataType::Float32, ReduceOp::Sum);
  divideBy(nullptr, 0, DataType::Int32, 4);
  const void* none[] = {nullptr};
  reduceMany(nullptr, none, 1, 0, DataType::Float16, ReduceOp::Max);

  int32_t x = 8;
  auto isInvalid = [](const Error& e) { return e.code() == ErrorCode::InvalidArgument; };
  BOOST_CHECK_EXCEPTION(divideBy(&x, 1, DataType::Int32, 0), Error, isInvalid);
  BOOST_CHECK_EXCEPTION(divideBy(&x, 1, DataType::Int32, -2), Error, isInvalid);
  BOOST_TEST(x == 8);
  BOOST_CHECK_EXCEPTION(reduceMany(&x, none, 0, 1, DataType::Int32, ReduceOp::Sum), Error,
                        isInvalid);
  BOOST_CHECK_EXCEPTION(reduceInto(&x, &x, 1, static_cast<DataType>(99), ReduceOp::Sum), Error,
                        isInvalid);
  BOOST_CHECK_EXCEPTION(reduceInto(&x, &x, 1, DataType::Int32, static_cast<ReduceOp>(99)), Error,
                        isInvalid);
  // dst == src is allowed.
  reduceInto(&x, &x, 1, DataType::Int32, ReduceOp::Sum);
  BOOST_TEST(x == 16);
}

// Random bit patterns (every class of value, NaN payloads included) through both paths: the fast
// kernels must reproduce the portable ones bit for bit, for every op, counts 0..1000 (every tail
// length), unaligned pointers and dst aliasing a source. Signalling fp16 NaNs are left out (F16C
// quiets them, see reduce.hpp); bf16 keeps them, its fast path converts in integer ops.
BOOST_AUTO_TEST_CASE(fast_kernels_match_portable_bit_for_bit) {
  if (!detail::setReduceSimd(true)) {
    BOOST_TEST_MESSAGE("no F16C/AVX2 kernels on this CPU or build: nothing to compare");
    return;
  }
  std::mt19937_64 rng(16);
  auto randomBits = [&](uint8_t* p, size_t count, DataType t) {
    for (size_t i = 0; i < count; ++i) {
      uint16_t h = static_cast<uint16_t>(rng());
      if (t == DataType::Float16 && (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0) h |= 0x200;
      put<uint16_t>(p, i, h);
    }
  };
  // Runs f once with the kernels off and once on; returns whether the bytes it wrote match.
  auto same = [](size_t bytes, auto&& f) {
    std::vector<uint8_t> portable(bytes + 64), fast(bytes + 64);
    detail::setReduceSimd(false);
    f(portable.data());
    detail::setReduceSimd(true);
    f(fast.data());
    return portable == fast;
  };
  for (DataType t : {DataType::Float16, DataType::BFloat16}) {
    for (ReduceOp op : kOps) {
      for (size_t count = 0; count <= 1000; ++count) {
        const size_t bytes = count * 2;
        const size_t n = 1 + count % 5;
        std::vector<std::vector<uint8_t>> srcBufs(n, std::vector<uint8_t>(bytes + 8));
        std::vector<const void*> srcs;
        for (size_t k = 0; k < n; ++k) {
          uint8_t* p = srcBufs[k].data() + (count + k) % 5;
          randomBits(p, count, t);
          srcs.push_back(p);
        }
        const size_t off = 1 + count % 3;  // never 32-byte aligned
        BOOST_TEST_REQUIRE(same(bytes,
                                [&](uint8_t* out) {
                                  std::memcpy(out + off, srcs[0], bytes);
                                  reduceInto(out + off, srcs[n - 1], count, t, op);
                                }),
                           "reduceInto " << name(t, op) << " count " << count);
        BOOST_TEST_REQUIRE(
            same(bytes, [&](uint8_t* out) { reduceMany(out + off, srcs.data(), n, count, t, op); }),
            "reduceMany " << name(t, op) << " count " << count << " n " << n);
        // dst is the last source: restored before each run.
        const std::vector<uint8_t> last(static_cast<const uint8_t*>(srcs[n - 1]),
                                        static_cast<const uint8_t*>(srcs[n - 1]) + bytes);
        BOOST_TEST_REQUIRE(same(bytes,
                                [&](uint8_t* out) {
                                  void* dst = const_cast<void*>(srcs[n - 1]);
                                  if (bytes) std::memcpy(dst, last.data(), bytes);
                                  reduceMany(dst, srcs.data(), n, count, t, op);
                                  if (bytes) std::memcpy(out, dst, bytes);
                                }),
                           "reduceMany in place " << name(t, op) << " count " << count);
        if (op == ReduceOp::Avg) {
          BOOST_TEST_REQUIRE(same(bytes,
                                  [&](uint8_t* out) {
                                    if (bytes) std::memcpy(out + off, srcs[0], bytes);
                                    divideBy(out + off, count, t, 3 + static_cast<int>(count % 5));
                                  }),
                             "divideBy " << name(t, op) << " count " << count);
        }
      }
    }
  }
}

// Signalling fp16 NaNs: the portable kernels pass them through Min, Max and a one-source
// reduceMany unchanged, F16C quiets them (sets 0x200). Both are accepted; anything else is not.
BOTH_PATHS_TEST_CASE(half_signalling_nans) {
  const uint16_t sNaN[] = {0x7c01, 0xfd55, 0x7d00};
  const uint16_t one = floatToHalf(1.0f);
  auto ok = [](uint16_t got, uint16_t in) { return got == in || got == (in | 0x200); };
  for (uint16_t s : sNaN) {
    for (ReduceOp op : {ReduceOp::Min, ReduceOp::Max}) {
      // As operand and as accumulator, with counts that take the vector body and the tail.
      for (size_t count : {size_t{1}, size_t{16}, size_t{37}}) {
        std::vector<uint16_t> a(count, one), b(count, one);
        a[count / 2] = s;
        b[count - 1] = s;
        reduceInto(a.data(), b.data(), count, DataType::Float16, op);
        BOOST_TEST(ok(a[count / 2], s));
        BOOST_TEST(ok(a[count - 1], s));
        if (count > 2) BOOST_TEST(a[0] == one);
      }
    }
    uint16_t out = 0;
    const void* srcs[] = {&s};
    reduceMany(&out, srcs, 1, 1, DataType::Float16, ReduceOp::Max);
    BOOST_TEST(ok(out, s));
    // Arithmetic quiets them on every path.
    uint16_t sum = s;
    reduceInto(&sum, &one, 1, DataType::Float16, ReduceOp::Sum);
    BOOST_TEST(sum == (s | 0x200));
  }
}

BOOST_AUTO_TEST_SUITE_END()
