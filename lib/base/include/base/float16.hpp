#pragma once
#ifndef STRATA_INTERNAL_HEADERS
#error "base/float16.hpp is internal to strata: applications include <strata/...> only"
#endif

// IEEE binary16 and bfloat16 <-> fp32 conversions, header-only so that host collectives and CUDA
// kernels share one definition (and therefore round identically).
//
// Rounding is round-to-nearest-even; infinities and signed zeros are preserved, subnormals are
// exact in both directions. NaNs keep their sign and the top payload bits; a float NaN whose
// payload would be all zero after truncation gets the quiet bit, so it stays a NaN. Every
// binary16 and bfloat16 value (NaNs included, signalling ones too) therefore round-trips through
// fp32 bit for bit.
//
// The functions are written as selects on integer bit patterns, with no branches and no library
// calls, so that g++ vectorizes loops over them and nvcc can compile them for the device.
// They rely on the default floating-point environment (round to nearest, no flush to zero).

#include <cstdint>
#include <cstring>

#ifndef STRATA_HOST_DEVICE
#ifdef __CUDACC__
#define STRATA_HOST_DEVICE __host__ __device__
#else
#define STRATA_HOST_DEVICE
#endif
#endif

namespace strata::collectives {

namespace detail {

STRATA_HOST_DEVICE inline uint32_t floatBits(float f) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

STRATA_HOST_DEVICE inline float bitsFloat(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

// a where cond, else b. Written with masks rather than ?: because g++ sinks the float operations
// of the unused side into a branch and then, under -ftrapping-math, will not if-convert (and so
// not vectorize) the loop.
STRATA_HOST_DEVICE inline uint32_t select(bool cond, uint32_t a, uint32_t b) {
  const uint32_t mask = 0u - static_cast<uint32_t>(cond);
  return (a & mask) | (b & ~mask);
}

}  // namespace detail

/// binary16 bits -> fp32 (exact).
STRATA_HOST_DEVICE inline float halfToFloat(uint16_t h) {
  // Shift exponent and mantissa into place and rebias (15 -> 127). Inf/NaN need a further
  // +128-16 on the exponent; subnormals are renormalised by letting the FPU subtract the
  // implicit bit (2^-14), which is exact.
  const uint32_t shiftedExp = 0x7c00u << 13;
  const uint32_t bits = (static_cast<uint32_t>(h) & 0x7fffu) << 13;
  const uint32_t exp = bits & shiftedExp;
  const uint32_t normal = bits + ((127u - 15u) << 23);
  const uint32_t infNan = normal + ((128u - 16u) << 23);
  const uint32_t sub =
      detail::floatBits(detail::bitsFloat(normal + (1u << 23)) - detail::bitsFloat(113u << 23));
  const uint32_t magnitude =
      detail::select(exp == shiftedExp, infNan, detail::select(exp == 0, sub, normal));
  return detail::bitsFloat(magnitude | ((static_cast<uint32_t>(h) & 0x8000u) << 16));
}

/// fp32 -> binary16 bits, round to nearest even; overflow gives Inf.
STRATA_HOST_DEVICE inline uint16_t floatToHalf(float f) {
  const uint32_t u = detail::floatBits(f);
  const uint32_t sign = u & 0x80000000u;
  const uint32_t a = u ^ sign;  // |f|
  // a < 2^31, so the comparisons below are done signed: SSE2 and AVX2 only compare signed.
  const int32_t sa = static_cast<int32_t>(a);
  // Normal range: rebias (127 -> 15, i.e. add -112 << 23 modulo 2^32), add the rounding bias
  // (0xfff plus the lowest kept bit, for ties to even) and drop 13 bits. A carry out of the
  // mantissa bumps the exponent, up to Inf, which is the correctly rounded result.
  const uint32_t normal = (a + 0xc8000fffu + ((a >> 13) & 1u)) >> 13;
  // Below 2^-14 (half subnormal or zero): adding 0.5 (2^-1) makes the FPU shift the value
  // into the low mantissa bits with round-to-nearest-even; subtracting 0.5's bits leaves them.
  const uint32_t denormMagic = ((127u - 15u) + (23u - 10u) + 1u) << 23;
  const uint32_t sub =
      detail::floatBits(detail::bitsFloat(a) + detail::bitsFloat(denormMagic)) - denormMagic;
  const uint32_t nanPayload = (a >> 13) & 0x3ffu;
  const uint32_t nan = 0x7c00u | detail::select(nanPayload == 0, 0x200u, nanPayload);
  const uint32_t magnitude =
      detail::select(sa >= 0x47800000, detail::select(sa > 0x7f800000, nan, 0x7c00u),
                     detail::select(sa < 0x38800000, sub, normal));
  return static_cast<uint16_t>(magnitude | (sign >> 16));
}

/// bfloat16 bits -> fp32 (exact).
STRATA_HOST_DEVICE inline float bf16ToFloat(uint16_t b) {
  return detail::bitsFloat(static_cast<uint32_t>(b) << 16);
}

/// fp32 -> bfloat16 bits, round to nearest even; overflow gives Inf.
STRATA_HOST_DEVICE inline uint16_t floatToBf16(float f) {
  const uint32_t u = detail::floatBits(f);
  // The encoding is monotonic in magnitude, so integer rounding of the low 16 bits is RNE for
  // normals and subnormals alike, and carries into the exponent (up to Inf) where it must.
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t top = u >> 16;
  const uint32_t nan = detail::select((top & 0x7fu) == 0, top | 0x40u, top);
  const bool isNan = static_cast<int32_t>(u & 0x7fffffffu) > 0x7f800000;
  return static_cast<uint16_t>(detail::select(isNan, nan, rounded));
}

}  // namespace strata::collectives
