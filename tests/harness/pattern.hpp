#pragma once

// Deterministic byte patterns for payload checks, header-only so that one-process tests use the
// same ones as the multi-process suites without linking the mp_test library.

#include <cstddef>
#include <cstdint>

namespace strata::testing {

/// Byte i of message `seed`.
inline uint8_t patternByte(uint64_t seed, size_t i) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + i * 0xBF58476D1CE4E5B9ull;
  x ^= x >> 31;
  return static_cast<uint8_t>(x ^ (x >> 17));
}

inline void fillPattern(void* data, size_t bytes, uint64_t seed) {
  auto* p = static_cast<uint8_t*>(data);
  for (size_t i = 0; i < bytes; ++i) p[i] = patternByte(seed, i);
}

/// Index of the first byte that differs from the pattern, or bytes if all match.
inline size_t checkPattern(const void* data, size_t bytes, uint64_t seed) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < bytes; ++i) {
    if (p[i] != patternByte(seed, i)) return i;
  }
  return bytes;
}

}  // namespace strata::testing
