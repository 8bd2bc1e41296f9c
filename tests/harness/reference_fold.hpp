#pragma once

// The reference result of a reduction, written independently of any algorithm: element i of
// every rank's input folded in rank order. Integers wrap (computed unsigned), fp16 and bf16
// accumulate in fp32 and round once at the end, Avg is the sum divided by the number of ranks
// (truncating integer division for integers), min and max are `b < a ? b : a` and
// `a < b ? b : a` with the accumulator as a. This is what the CUDA collectives' kernels compute
// (collectives/cuda/kernel_common.hpp); tests/cuda-emu and tests/gpu compare with it bit for bit.
//
// Header-only, no Boost and no libstrata symbols: the element types are the enumerators of
// <strata/communicator.hpp> (the CUDA module's ElemType and RedOp have the same order).

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <type_traits>
#include <vector>

#include <strata/communicator.hpp>

#include "base/float16.hpp"

namespace strata::testing {

/// Bytes per element (the same as strata::sizeOf, without linking libstrata).
inline size_t elemSize(DataType t) {
  switch (t) {
    case DataType::Int8:
    case DataType::Uint8:
      return 1;
    case DataType::Float16:
    case DataType::BFloat16:
      return 2;
    case DataType::Int32:
    case DataType::Uint32:
    case DataType::Float32:
      return 4;
    case DataType::Int64:
    case DataType::Uint64:
    case DataType::Float64:
      return 8;
  }
  return 0;
}

/// Random elements: any bits for integers, small values with fractions for floats (so sums and
/// products round, and NaNs stay rare).
inline std::vector<char> randomData(std::mt19937_64& rng, DataType t, size_t count) {
  const size_t es = elemSize(t);
  std::vector<char> out(count * es);
  std::uniform_real_distribution<float> real(-3.0f, 3.0f);
  for (size_t i = 0; i < count; ++i) {
    char* p = out.data() + i * es;
    if (t == DataType::Float32) {
      float v = real(rng);
      std::memcpy(p, &v, 4);
    } else if (t == DataType::Float64) {
      double v = static_cast<double>(real(rng)) / 3.0;
      std::memcpy(p, &v, 8);
    } else if (t == DataType::Float16) {
      uint16_t h = collectives::floatToHalf(real(rng));
      std::memcpy(p, &h, 2);
    } else if (t == DataType::BFloat16) {
      uint16_t h = collectives::floatToBf16(real(rng));
      std::memcpy(p, &h, 2);
    } else {
      uint64_t v = rng();
      std::memcpy(p, &v, es);
    }
  }
  return out;
}

/// acc op v, in the accumulator type A.
template <class A>
A fold(ReduceOp op, A acc, A v) {
  switch (op) {
    case ReduceOp::Prod:
      if constexpr (std::is_integral_v<A>) {
        return static_cast<A>(static_cast<std::make_unsigned_t<A>>(acc) *
                              static_cast<std::make_unsigned_t<A>>(v));
      } else {
        return acc * v;
      }
    case ReduceOp::Min:  // a NaN operand propagates (v != v is false for integers)
      return (v < acc || v != v) ? v : acc;
    case ReduceOp::Max:
      return (v > acc || v != v) ? v : acc;
    default:  // Sum, Avg
      if constexpr (std::is_integral_v<A>) {
        return static_cast<A>(static_cast<std::make_unsigned_t<A>>(acc) +
                              static_cast<std::make_unsigned_t<A>>(v));
      } else {
        return acc + v;
      }
  }
}

/// The reference for an integer, float or double element type T.
template <class T>
void referenceTyped(ReduceOp op, const std::vector<const char*>& in, size_t count, char* out) {
  const int n = static_cast<int>(in.size());
  for (size_t i = 0; i < count; ++i) {
    T acc, v;
    std::memcpy(&acc, in[0] + i * sizeof(T), sizeof(T));
    for (int r = 1; r < n; ++r) {
      std::memcpy(&v, in[r] + i * sizeof(T), sizeof(T));
      acc = fold<T>(op, acc, v);
    }
    if (op == ReduceOp::Avg) acc = static_cast<T>(acc / static_cast<T>(n));
    std::memcpy(out + i * sizeof(T), &acc, sizeof(T));
  }
}

/// The reference for fp16 (bf16 false) or bf16: fp32 accumulation, one rounding at the end.
inline void referenceHalf(bool bf16, ReduceOp op, const std::vector<const char*>& in, size_t count,
                          char* out) {
  const int n = static_cast<int>(in.size());
  auto load = [bf16](const char* p) {
    uint16_t b;
    std::memcpy(&b, p, 2);
    return bf16 ? collectives::bf16ToFloat(b) : collectives::halfToFloat(b);
  };
  for (size_t i = 0; i < count; ++i) {
    float acc = load(in[0] + i * 2);
    for (int r = 1; r < n; ++r) acc = fold<float>(op, acc, load(in[r] + i * 2));
    if (op == ReduceOp::Avg) acc = acc / static_cast<float>(n);
    const uint16_t b = bf16 ? collectives::floatToBf16(acc) : collectives::floatToHalf(acc);
    std::memcpy(out + i * 2, &b, 2);
  }
}

/// out (count elements) = the fold of in[0..n) (one pointer per rank, count elements each).
inline void reference(DataType t, ReduceOp op, const std::vector<const char*>& in, size_t count,
                      char* out) {
  switch (t) {
    case DataType::Int8:
      return referenceTyped<int8_t>(op, in, count, out);
    case DataType::Uint8:
      return referenceTyped<uint8_t>(op, in, count, out);
    case DataType::Int32:
      return referenceTyped<int32_t>(op, in, count, out);
    case DataType::Uint32:
      return referenceTyped<uint32_t>(op, in, count, out);
    case DataType::Int64:
      return referenceTyped<int64_t>(op, in, count, out);
    case DataType::Uint64:
      return referenceTyped<uint64_t>(op, in, count, out);
    case DataType::Float16:
      return referenceHalf(false, op, in, count, out);
    case DataType::BFloat16:
      return referenceHalf(true, op, in, count, out);
    case DataType::Float32:
      return referenceTyped<float>(op, in, count, out);
    case DataType::Float64:
      return referenceTyped<double>(op, in, count, out);
  }
}

}  // namespace strata::testing
