// libFuzzer target for configuration values as they come from the environment (STRATA_*
// variables) and Config::set (config::validate in lib/base/config_keys.cpp). Byte 0 picks the
// key, the rest is the value. Checked:
//   * a value is refused only with Error(InvalidConfig) naming the key and the variable;
//   * an accepted value's canonical text is a fixed point (validating it again gives the same
//     text), what set() stores and get() returns, and what the typed getter reads.
#include <string>

#include "base/config_keys.hpp"
#include "fuzz_common.hpp"

namespace cfg = strata::config;
using strata::Config;
using strata::Error;
using strata::ErrorCode;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Input input(data, size);
  auto keys = cfg::keys();
  const cfg::KeyInfo& info = keys[input.byte() % keys.size()];
  auto rest = input.rest();
  std::string_view value(reinterpret_cast<const char*>(rest.data()), rest.size());
  const std::string var = cfg::envName(info.key);
  std::string canonical;
  try {
    canonical = cfg::validate(info, value, "environment variable " + var);
  } catch (const Error& e) {
    fuzz::expectCode(e, ErrorCode::InvalidConfig);
    FUZZ_CHECK(std::string_view(e.what()).find(var) != std::string_view::npos);
    // Config::set refuses what validate refuses.
    try {
      Config().set(info.key, value);
      FUZZ_CHECK(false);
    } catch (const Error& e2) {
      fuzz::expectCode(e2, ErrorCode::InvalidConfig);
    }
    return 0;
  }
  FUZZ_CHECK(cfg::validate(info, canonical, "again") == canonical);
  Config config;
  config.set(info.key, value);
  auto got = config.get(info.key);
  FUZZ_CHECK(got.value_or("") == canonical);
  if (canonical.empty()) return 0;  // an empty string is "no value"
  switch (info.type) {
    case cfg::Type::Int:
      FUZZ_CHECK(std::to_string(cfg::getInt(config, info.key)) == canonical);
      break;
    case cfg::Type::Double:
      cfg::getDouble(config, info.key);
      break;
    case cfg::Type::Bool:
      FUZZ_CHECK(cfg::getBool(config, info.key) == (canonical == "true"));
      break;
    case cfg::Type::Bytes:
      FUZZ_CHECK(std::to_string(cfg::getBytes(config, info.key)) == canonical);
      break;
    case cfg::Type::String:
    case cfg::Type::Enum:
      FUZZ_CHECK(cfg::getString(config, info.key) == canonical);
      break;
  }
  return 0;
}
