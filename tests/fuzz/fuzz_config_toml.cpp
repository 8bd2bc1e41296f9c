// libFuzzer target for the configuration file reader (lib/base/config.cpp, through
// config::fromText, what Config::fromFile does with a file's content): the input is the text of
// a strata.toml. Checked:
//   * a file is refused only with Error(InvalidConfig), whose message starts with the file name;
//   * every key of an accepted file reads back a canonical value: validating it again gives
//     the same text, the typed getter of its type accepts it, and set() takes it unchanged;
//   * describe() lists an accepted configuration.
#include <string>

#include "base/config_keys.hpp"
#include "fuzz_common.hpp"

namespace cfg = strata::config;
using strata::Config;
using strata::Error;
using strata::ErrorCode;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  Config config;
  try {
    config = cfg::fromText(text, "fuzz.toml");
  } catch (const Error& e) {
    fuzz::expectCode(e, ErrorCode::InvalidConfig);
    FUZZ_CHECK(std::string_view(e.what()).starts_with("fuzz.toml"));
    return 0;
  }
  for (const cfg::KeyInfo& info : cfg::keys()) {
    auto value = config.get(info.key);
    if (!value) continue;
    FUZZ_CHECK(cfg::validate(info, *value, "again") == *value);
    switch (info.type) {
      case cfg::Type::Int:
        FUZZ_CHECK(std::to_string(cfg::getInt(config, info.key)) == *value);
        break;
      case cfg::Type::Double:
        cfg::getDouble(config, info.key);
        break;
      case cfg::Type::Bool:
        FUZZ_CHECK(cfg::getBool(config, info.key) == (*value == "true"));
        break;
      case cfg::Type::Bytes:
        FUZZ_CHECK(std::to_string(cfg::getBytes(config, info.key)) == *value);
        break;
      case cfg::Type::String:
      case cfg::Type::Enum:
        FUZZ_CHECK(cfg::getString(config, info.key) == *value);
        break;
    }
    Config copy = config;
    copy.set(info.key, *value);
    FUZZ_CHECK(copy.get(info.key) == value);
  }
  FUZZ_CHECK(!config.describe().empty());
  return 0;
}
