// The job secret's crypto (lib/base/crypto.cpp): HMAC-SHA256 and SHA-256 known answers, random
// secrets, the constant-time compare.
#define BOOST_TEST_MODULE crypto
#include <boost/test/unit_test.hpp>

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/crypto.hpp"

using namespace strata;

namespace {

std::span<const uint8_t> asBytes(std::string_view s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

}  // namespace

BOOST_AUTO_TEST_SUITE(hmac)

BOOST_AUTO_TEST_CASE(rfc4231_test_case_2) {
  auto d = crypto::hmacSha256(asBytes("Jefe"), asBytes("what do ya want for nothing?"));
  BOOST_TEST(crypto::toHex(d) ==
             "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
}

BOOST_AUTO_TEST_CASE(sha256_known_answer) {
  BOOST_TEST(crypto::toHex(crypto::sha256(asBytes("abc"))) ==
             "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  BOOST_TEST(crypto::toHex(crypto::sha256({})) ==
             "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

BOOST_AUTO_TEST_CASE(empty_key_and_data) {
  // RFC-independent value computed with `openssl dgst -sha256 -hmac ''` on empty input.
  BOOST_TEST(crypto::toHex(crypto::hmacSha256({}, {})) ==
             "b613679a0814d9ec772f95d778c35fc5ff1697c493715653c6c712144292c5ad");
}

BOOST_AUTO_TEST_CASE(random_secret_and_compare) {
  auto a = crypto::randomSecretHex();
  auto b = crypto::randomSecretHex();
  BOOST_TEST(a.size() == 64u);
  BOOST_TEST(a.find_first_not_of("0123456789abcdef") == std::string::npos);
  BOOST_TEST(a != b);
  BOOST_TEST(crypto::toHex(std::vector<uint8_t>{0x00, 0x0f, 0xa5, 0xff}) == "000fa5ff");
  BOOST_TEST(crypto::equalConstantTime(asBytes(a), asBytes(a)));
  BOOST_TEST(!crypto::equalConstantTime(asBytes(a), asBytes(b)));
  BOOST_TEST(!crypto::equalConstantTime(asBytes("abc"), asBytes("abcd")));
  BOOST_TEST(crypto::equalConstantTime({}, {}));
}

BOOST_AUTO_TEST_SUITE_END()
