#pragma once
#ifndef STRATA_INTERNAL_HEADERS
#error "base/crypto.hpp is internal to strata: applications include <strata/...> only"
#endif

// Job-secret authentication helpers (OpenSSL libcrypto).

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <strata/export.hpp>

namespace strata::crypto {

using Digest = std::array<uint8_t, 32>;

STRATA_API Digest hmacSha256(std::span<const uint8_t> key, std::span<const uint8_t> data);
STRATA_API Digest sha256(std::span<const uint8_t> data);
/// Cryptographically random bytes; throws SystemError on failure.
STRATA_API void randomBytes(std::span<uint8_t> out);
/// A fresh random secret as 64 hex characters.
STRATA_API std::string randomSecretHex();
STRATA_API bool equalConstantTime(std::span<const uint8_t> a, std::span<const uint8_t> b);
STRATA_API std::string toHex(std::span<const uint8_t> data);

}  // namespace strata::crypto
