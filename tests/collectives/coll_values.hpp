#pragma once

// Element encoding and the rank-dependent inputs of the collectives suite. The suite computes
// every reference from these functions alone: it never uses the library's own conversions or
// reductions, so a bug shared by both cannot hide.

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include <strata/communicator.hpp>

namespace strata::testing {

/// IEEE binary16 from a float, rounding to nearest even (overflow to inf, NaN kept as NaN).
inline uint16_t floatToHalf(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t absx = x & 0x7FFFFFFFu;
  if (absx > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u);   // NaN
  if (absx >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // rounds past 65504
  if (absx < 0x38800000u) {  // below 2^-14: subnormal half (or zero)
    // The value in units of 2^-24, rounded to nearest even.
    float scaled = std::bit_cast<float>(absx) * 16777216.0f;  // exact: a power of two
    float r = std::nearbyint(scaled);                         // default mode: nearest even
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(r));
  }
  uint32_t exp = (absx >> 23) - 127 + 15;
  uint32_t mant = absx & 0x7FFFFFu;
  uint32_t h = (exp << 10) | (mant >> 13);
  uint32_t rest = mant & 0x1FFFu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // a carry into exp is right
  return static_cast<uint16_t>(sign | h);
}

inline float halfToFloat(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t mant = h & 0x3FFu;
  if (exp == 0) {  // zero or subnormal: mant * 2^-24
    float v = static_cast<float>(mant) / 16777216.0f;
    return sign ? -v : v;
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7F800000u | (mant << 13));
  return std::bit_cast<float>(sign | ((exp - 15 + 127) << 23) | (mant << 13));
}

/// bfloat16 from a float, rounding to nearest even.
inline uint16_t floatToBf16(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  x += 0x7FFFu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

inline float bf16ToFloat(uint16_t b) {
  return std::bit_cast<float>(static_cast<uint32_t>(b) << 16);
}

inline bool isFloat(DataType t) {
  return t == DataType::Float16 || t == DataType::BFloat16 || t == DataType::Float32 ||
         t == DataType::Float64;
}
inline bool isSigned(DataType t) {
  return t == DataType::Int8 || t == DataType::Int32 || t == DataType::Int64 || isFloat(t);
}

/// Element i of a buffer of type t, as a double (every value the suite uses is exact in double).
inline double loadValue(DataType t, const void* base, size_t i) {
  const auto* p = static_cast<const uint8_t*>(base);
  switch (t) {
#define STRATA_LOAD_CASE(DT, CT)                     \
  case DataType::DT: {                               \
    CT v;                                            \
    std::memcpy(&v, p + i * sizeof(CT), sizeof(CT)); \
    return static_cast<double>(v);                   \
  }
    STRATA_LOAD_CASE(Int8, int8_t)
    STRATA_LOAD_CASE(Uint8, uint8_t)
    STRATA_LOAD_CASE(Int32, int32_t)
    STRATA_LOAD_CASE(Uint32, uint32_t)
    STRATA_LOAD_CASE(Int64, int64_t)
    STRATA_LOAD_CASE(Uint64, uint64_t)
    STRATA_LOAD_CASE(Float32, float)
    STRATA_LOAD_CASE(Float64, double)
#undef STRATA_LOAD_CASE
    case DataType::Float16: {
      uint16_t v;
      std::memcpy(&v, p + i * 2, 2);
      return halfToFloat(v);
    }
    case DataType::BFloat16: {
      uint16_t v;
      std::memcpy(&v, p + i * 2, 2);
      return bf16ToFloat(v);
    }
  }
  return 0;
}

/// Stores v (an exact small integer, or for floats any value, rounded to the type).
inline void storeValue(DataType t, void* base, size_t i, double v) {
  auto* p = static_cast<uint8_t*>(base);
  switch (t) {
#define STRATA_STORE_CASE(DT, CT)                    \
  case DataType::DT: {                               \
    CT x = static_cast<CT>(v);                       \
    std::memcpy(p + i * sizeof(CT), &x, sizeof(CT)); \
    return;                                          \
  }
    STRATA_STORE_CASE(Int8, int8_t)
    STRATA_STORE_CASE(Uint8, uint8_t)
    STRATA_STORE_CASE(Int32, int32_t)
    STRATA_STORE_CASE(Uint32, uint32_t)
    STRATA_STORE_CASE(Int64, int64_t)
    STRATA_STORE_CASE(Uint64, uint64_t)
    STRATA_STORE_CASE(Float32, float)
    STRATA_STORE_CASE(Float64, double)
#undef STRATA_STORE_CASE
    case DataType::Float16: {
      uint16_t x = floatToHalf(static_cast<float>(v));
      std::memcpy(p + i * 2, &x, 2);
      return;
    }
    case DataType::BFloat16: {
      uint16_t x = floatToBf16(static_cast<float>(v));
      std::memcpy(p + i * 2, &x, 2);
      return;
    }
  }
}

inline uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/// The inputs of a reduction: element i of rank r is value(r, cls(i)), with cls(i) a hash of i
/// and a per-call salt into [0, kClasses). Values are small integers, so that Sum, Min, Max and
/// Prod are exact in every type (also int8 and bfloat16) at any summation order, and the
/// reference of element i is table[cls(i)], computed once per call. The hash keeps the data
/// from repeating with a short period, so a block landing at a wrong offset shows.
class ReductionInputs {
 public:
  static constexpr uint64_t kClasses = 1024;

  ReductionInputs(DataType type, ReduceOp op, int size, uint64_t salt)
      : type_(type),
        op_(op),
        size_(size),
        salt_(salt),
        perRank_(size),
        reference_(kClasses),
        magnitude_(kClasses) {
    // |sum| stays within int8 and sums stay within uint8 for up to 127 ranks.
    half_ = std::max(1, std::min(15, 127 / std::max(1, size)));
    for (int r = 0; r < size; ++r) {
      perRank_[r].resize(kClasses);
      for (uint64_t c = 0; c < kClasses; ++c) perRank_[r][c] = value(r, c);
    }
    for (uint64_t c = 0; c < kClasses; ++c) {
      double acc = perRank_[0][c], absSum = std::fabs(perRank_[0][c]);
      for (int r = 1; r < size; ++r) {
        double v = perRank_[r][c];
        absSum += std::fabs(v);
        switch (op) {
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
      if (op == ReduceOp::Avg) {
        if (isFloat(type)) {
          acc /= size;
        } else {  // truncating, like C++ integer division
          acc = static_cast<double>(static_cast<int64_t>(acc) / size);
        }
      }
      reference_[c] = acc;
      magnitude_[c] = absSum / size;
    }
  }

  uint64_t classOf(size_t i) const { return mix64(i ^ (salt_ << 40)) % kClasses; }
  double input(int rank, size_t i) const { return perRank_[rank][classOf(i)]; }
  double expected(size_t i) const { return reference_[classOf(i)]; }
  /// The scale of the rounding error of an inexact (Avg) result: the mean of |inputs|.
  double magnitude(size_t i) const { return magnitude_[classOf(i)]; }

  /// Fills count elements of buf with rank's inputs for global indices first..first+count.
  void fill(int rank, void* buf, size_t first, size_t count) const {
    for (size_t i = 0; i < count; ++i) storeValue(type_, buf, i, input(rank, first + i));
  }

  /// True if got is right for global index i; exact except Avg of floats.
  bool matches(size_t i, double got) const {
    double want = expected(i);
    if (op_ != ReduceOp::Avg || !isFloat(type_)) return got == want;
    double tol = type_ == DataType::Float64 ? 1e-12 : type_ == DataType::Float32 ? 1e-5 : 1e-2;
    return std::fabs(got - want) <= tol * std::max({std::fabs(want), magnitude(i), 1e-30});
  }

 private:
  double value(int r, uint64_t c) const {
    bool sgn = isSigned(type_);
    if (op_ == ReduceOp::Prod) {
      // Sparse 2s (ranks 0..5 only: at most two 2s per element) and -1s: exact, no overflow.
      if (r < 6 && (c + r) % 4 == 0) return 2;
      if (sgn && (c + 2 * static_cast<uint64_t>(r)) % 3 == 1) return -1;
      return 1;
    }
    int m = 2 * half_ + 1;
    int v = static_cast<int>((c * 7 + static_cast<uint64_t>(r) * 13 + 5) % m);
    return sgn ? v - half_ : v;
  }

  DataType type_;
  ReduceOp op_;
  int size_;
  uint64_t salt_;
  int half_ = 15;
  std::vector<std::vector<double>> perRank_;
  std::vector<double> reference_;
  std::vector<double> magnitude_;
};

}  // namespace strata::testing
