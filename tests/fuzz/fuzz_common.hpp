#pragma once

// Shared by the libFuzzer targets and their replay (replay_main.cpp): checks that abort with a
// message, so libFuzzer records the input and the gcc replay test fails with the reason.

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <string>
#include <string_view>

#include <strata/error.hpp>

#define FUZZ_CHECK(cond)                                                                  \
  do {                                                                                    \
    if (!(cond)) {                                                                        \
      std::fprintf(stderr, "fuzz check failed: %s (%s:%d)\n", #cond, __FILE__, __LINE__); \
      std::abort();                                                                       \
    }                                                                                     \
  } while (0)

namespace fuzz {

/// A decoder may only refuse input with strata::Error of the documented code and a message.
inline void expectCode(const strata::Error& e, strata::ErrorCode code) {
  if (e.code() != code || std::string_view(e.what()).empty()) {
    std::fprintf(stderr, "fuzz check failed: Error %s (%s), expected %s\n",
                 std::string(strata::toString(e.code())).c_str(), e.what(),
                 std::string(strata::toString(code)).c_str());
    std::abort();
  }
}

/// Consumes input front to back (the fuzzer's bytes as parameters, then the rest as payload).
class Input {
 public:
  Input(const uint8_t* data, size_t size) : rest_(data, size) {}
  uint8_t byte() {
    if (rest_.empty()) return 0;
    uint8_t b = rest_[0];
    rest_ = rest_.subspan(1);
    return b;
  }
  std::span<const uint8_t> rest() const { return rest_; }

 private:
  std::span<const uint8_t> rest_;
};

inline bool same(std::span<const uint8_t> a, std::span<const uint8_t> b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin());
}

}  // namespace fuzz
