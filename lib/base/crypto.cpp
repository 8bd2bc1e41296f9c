#include "base/crypto.hpp"

#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <openssl/sha.h>

#include <algorithm>
#include <climits>

#include <fmt/format.h>

#include <strata/error.hpp>

namespace strata::crypto {

namespace {

std::string opensslError() {
  unsigned long code = ERR_get_error();
  if (code == 0) return "no OpenSSL error queued";
  char text[256];
  ERR_error_string_n(code, text, sizeof text);
  ERR_clear_error();
  return text;
}

}  // namespace

Digest hmacSha256(std::span<const uint8_t> key, std::span<const uint8_t> data) {
  if (key.size() > INT_MAX) {
    throw Error(ErrorCode::InvalidArgument, "HMAC key longer than 2 GiB; use a shorter secret");
  }
  Digest out{};
  unsigned int len = 0;
  // OpenSSL rejects a null key pointer even for an empty key, so point at a dummy byte.
  static const uint8_t kEmpty = 0;
  const uint8_t* keyPtr = key.empty() ? &kEmpty : key.data();
  const uint8_t* dataPtr = data.empty() ? &kEmpty : data.data();
  if (HMAC(EVP_sha256(), keyPtr, static_cast<int>(key.size()), dataPtr, data.size(), out.data(),
           &len) == nullptr ||
      len != out.size()) {
    throw Error(ErrorCode::SystemError,
                fmt::format("HMAC-SHA256 failed in OpenSSL: {}", opensslError()));
  }
  return out;
}

Digest sha256(std::span<const uint8_t> data) {
  Digest out{};
  static const uint8_t kEmpty = 0;
  if (SHA256(data.empty() ? &kEmpty : data.data(), data.size(), out.data()) == nullptr) {
    throw Error(ErrorCode::SystemError,
                fmt::format("SHA-256 failed in OpenSSL: {}", opensslError()));
  }
  return out;
}

void randomBytes(std::span<uint8_t> out) {
  // RAND_bytes takes an int count; large requests are split rather than truncated.
  size_t done = 0;
  while (done < out.size()) {
    size_t chunk = std::min<size_t>(out.size() - done, 1u << 30);
    if (RAND_bytes(out.data() + done, static_cast<int>(chunk)) != 1) {
      throw Error(ErrorCode::SystemError,
                  fmt::format("cannot generate random bytes (OpenSSL RAND_bytes: {}); check that "
                              "the system's entropy source (getrandom, /dev/urandom) works",
                              opensslError()));
    }
    done += chunk;
  }
}

std::string randomSecretHex() {
  std::array<uint8_t, 32> secret{};
  randomBytes(secret);
  std::string hex = toHex(secret);
  OPENSSL_cleanse(secret.data(), secret.size());
  return hex;
}

bool equalConstantTime(std::span<const uint8_t> a, std::span<const uint8_t> b) {
  // The sizes are public (a digest is always 32 bytes), so comparing them first leaks nothing.
  if (a.size() != b.size()) return false;
  if (a.empty()) return true;
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

std::string toHex(std::span<const uint8_t> data) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(data.size() * 2);
  for (uint8_t b : data) {
    out += kDigits[b >> 4];
    out += kDigits[b & 0xf];
  }
  return out;
}

}  // namespace strata::crypto
