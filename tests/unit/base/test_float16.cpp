// The fp16 and bf16 conversions (lib/base/include/base/float16.hpp): exhaustive round trips, every rounding
// midpoint, special values, and the compiler's own _Float16 as an independent reference.
#define BOOST_TEST_MODULE float16
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>

#include "base/float16.hpp"

using namespace strata::collectives;

namespace {

uint32_t bitsOf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

float floatOf(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Value of a binary16 from its definition, computed in double (exact).
double halfValue(uint16_t h) {
  const int sign = h >> 15;
  const int exp = (h >> 10) & 0x1f;
  const int mant = h & 0x3ff;
  double v;
  if (exp == 0x1f) {
    v = mant ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  } else if (exp == 0) {
    v = std::ldexp(mant, -24);
  } else {
    v = std::ldexp(1024 + mant, exp - 25);
  }
  return sign ? -v : v;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(conversions)

BOOST_AUTO_TEST_CASE(half_exhaustive_round_trip_and_values) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const uint16_t bits = static_cast<uint16_t>(h);
    const float f = halfToFloat(bits);
    const double want = halfValue(bits);
    if (std::isnan(want)) {
      BOOST_TEST_REQUIRE(std::isnan(f), "half " << h);
      BOOST_TEST_REQUIRE(std::signbit(f) == std::signbit(want), "half " << h);
    } else {
      BOOST_TEST_REQUIRE(static_cast<double>(f) == want, "half " << h);
      BOOST_TEST_REQUIRE(std::signbit(f) == std::signbit(want), "half " << h);
    }
    BOOST_TEST_REQUIRE(floatToHalf(f) == bits, "half " << h << " round trip");
  }
}

// Every midpoint between adjacent halves (subnormal, normal and the last finite to the overflow
// threshold) must round to the even neighbour, and one float ulp either side to the nearer one.
BOOST_AUTO_TEST_CASE(half_rounding_every_midpoint) {
  for (uint32_t h = 0; h < 0x7c00; ++h) {
    const double lo = halfValue(static_cast<uint16_t>(h));
    // Above 65504 the next "value" is 2^16, where overflow to Inf begins.
    const double hi = h == 0x7bff ? 65536.0 : halfValue(static_cast<uint16_t>(h + 1));
    const float mid = static_cast<float>((lo + hi) / 2);
    BOOST_TEST_REQUIRE(static_cast<double>(mid) == (lo + hi) / 2);  // exact in fp32
    const uint16_t even = (h & 1) ? static_cast<uint16_t>(h + 1) : static_cast<uint16_t>(h);
    for (int sign = 0; sign < 2; ++sign) {
      const float s = sign ? -1.0f : 1.0f;
      const uint16_t sb = sign ? 0x8000 : 0;
      BOOST_TEST_REQUIRE(floatToHalf(s * mid) == (even | sb), "midpoint above " << h);
      BOOST_TEST_REQUIRE(floatToHalf(s * std::nextafter(mid, 0.0f)) == (h | sb), "below " << h);
      BOOST_TEST_REQUIRE(floatToHalf(s * std::nextafter(mid, 1e30f)) == ((h + 1) | sb),
                         "above " << h);
    }
  }
}

BOOST_AUTO_TEST_CASE(half_special_values) {
  BOOST_TEST(floatToHalf(0.0f) == 0x0000);
  BOOST_TEST(floatToHalf(-0.0f) == 0x8000);
  BOOST_TEST(floatToHalf(1.0f) == 0x3c00);
  BOOST_TEST(floatToHalf(65504.0f) == 0x7bff);
  BOOST_TEST(floatToHalf(65519.99f) == 0x7bff);
  BOOST_TEST(floatToHalf(65520.0f) == 0x7c00);
  BOOST_TEST(floatToHalf(1e10f) == 0x7c00);
  BOOST_TEST(floatToHalf(-std::numeric_limits<float>::infinity()) == 0xfc00);
  BOOST_TEST(floatToHalf(std::numeric_limits<float>::max()) == 0x7c00);
  BOOST_TEST(floatToHalf(std::ldexp(1.0f, -24)) == 0x0001);  // smallest subnormal
  BOOST_TEST(floatToHalf(std::ldexp(1.0f, -25)) == 0x0000);  // tie to even (zero)
  BOOST_TEST(floatToHalf(std::ldexp(1.5f, -25)) == 0x0001);
  BOOST_TEST(floatToHalf(std::ldexp(1.0f, -14)) == 0x0400);  // smallest normal
  BOOST_TEST(floatToHalf(std::numeric_limits<float>::denorm_min()) == 0x0000);
  BOOST_TEST(floatToHalf(-std::numeric_limits<float>::denorm_min()) == 0x8000);
  // NaNs stay NaNs, keep their sign and top payload bits.
  BOOST_TEST(floatToHalf(floatOf(0x7fc00000)) == 0x7e00);
  BOOST_TEST(floatToHalf(floatOf(0xff800001)) == 0xfe00);  // payload only in dropped bits
  BOOST_TEST(floatToHalf(floatOf(0x7f802000)) == 0x7c01);  // signalling, payload kept
}

#ifdef __FLT16_MAX__
// The compiler's own _Float16 conversion (libgcc, or F16C) as an independent reference on a
// large sample of floats: random bit patterns and values near the half range.
BOOST_AUTO_TEST_CASE(half_matches_compiler_float16) {
  std::mt19937 rng(7);
  for (int i = 0; i < 2000000; ++i) {
    uint32_t u = rng();
    if (i & 1) u = (u & 0x807fffffu) | ((100u + (rng() % 50)) << 23);  // exponents near half's
    const float f = floatOf(u);
    if (std::isnan(f)) continue;
    const _Float16 ref = static_cast<_Float16>(f);
    uint16_t refBits;
    std::memcpy(&refBits, &ref, 2);
    BOOST_TEST_REQUIRE(floatToHalf(f) == refBits, "float bits " << std::hex << u);
  }
}
#endif

BOOST_AUTO_TEST_CASE(bf16_exhaustive_round_trip) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const float f = bf16ToFloat(static_cast<uint16_t>(b));
    BOOST_TEST_REQUIRE(bitsOf(f) == (b << 16));
    BOOST_TEST_REQUIRE(floatToBf16(f) == b, "bf16 " << b << " round trip");
  }
}

BOOST_AUTO_TEST_CASE(bf16_rounding_every_midpoint) {
  for (uint32_t b = 0; b < 0x7f80; ++b) {
    // Midpoint between b and b+1 (the latter may be Inf: overflow threshold) in fp32 bits.
    const uint32_t mid = (b << 16) | 0x8000u;
    const uint32_t even = (b & 1) ? b + 1 : b;
    for (uint32_t sign : {0u, 0x80000000u}) {
      const uint32_t sb = sign >> 16;
      BOOST_TEST_REQUIRE(floatToBf16(floatOf(mid | sign)) == (even | sb), "midpoint " << b);
      BOOST_TEST_REQUIRE(floatToBf16(floatOf((mid - 1) | sign)) == (b | sb), "below " << b);
      BOOST_TEST_REQUIRE(floatToBf16(floatOf((mid + 1) | sign)) == ((b + 1) | sb), "above " << b);
    }
  }
  BOOST_TEST(floatToBf16(1.0f) == 0x3f80);
  BOOST_TEST(floatToBf16(-0.0f) == 0x8000);
  BOOST_TEST(floatToBf16(std::numeric_limits<float>::max()) == 0x7f80);
  BOOST_TEST(floatToBf16(std::numeric_limits<float>::infinity()) == 0x7f80);
  BOOST_TEST(floatToBf16(std::numeric_limits<float>::denorm_min()) == 0x0000);
  BOOST_TEST(floatToBf16(floatOf(0x00008000)) == 0x0000);  // subnormal tie to even
  BOOST_TEST(floatToBf16(floatOf(0x00018000)) == 0x0002);
  BOOST_TEST(floatToBf16(floatOf(0x7fc00000)) == 0x7fc0);
  BOOST_TEST(floatToBf16(floatOf(0xff800001)) == 0xffc0);  // NaN stays NaN (not Inf)
  BOOST_TEST(floatToBf16(floatOf(0x7fffffff)) == 0x7fff);  // no carry out of a NaN
}

BOOST_AUTO_TEST_SUITE_END()
