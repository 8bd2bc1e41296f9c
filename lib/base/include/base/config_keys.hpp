#pragma once
#ifndef STRATA_INTERNAL_HEADERS
#error "base/config_keys.hpp is internal to strata: applications include <strata/...> only"
#endif

// The table of every configuration key (declared once, in config_keys.cpp) and typed access
// to a Config's effective values. docs/configuration.md is generated from this table.

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include <strata/config.hpp>
#include <strata/export.hpp>

namespace strata::config {

enum class Type { String, Int, Double, Bool, Enum, Bytes };

struct KeyInfo {
  std::string_view key;  ///< "bootstrap.tcp.interface"
  Type type;
  std::string_view defaultValue;  ///< as text; "" = no value
  std::string_view choices;       ///< Enum: "auto|tcp|pmix|ucx"; Int/Double: optional range
                                  ///< "min..max", either side may be empty ("0..65535", "0..")
  std::string_view help;
  bool mustMatch;  ///< every rank must have the same value (agreement check)
};

STRATA_API std::span<const KeyInfo> keys();
/// nullptr for an undeclared key.
STRATA_API const KeyInfo* find(std::string_view key);
/// "bootstrap.tcp.interface" -> "STRATA_BOOTSTRAP_TCP_INTERFACE".
STRATA_API std::string envName(std::string_view key);
/// Checks a value against the key's type; returns the canonical text or throws InvalidConfig
/// naming the key, the value and `where` (e.g. "strata.toml:12" or "STRATA_LOG_LEVEL").
STRATA_API std::string validate(const KeyInfo& key, std::string_view value, std::string_view where);

// Typed effective values. Throw InvalidConfig (naming the key and where the value came from)
// if the value does not convert, and Internal for an undeclared key.
STRATA_API std::string getString(const Config& config, std::string_view key);  ///< "" if unset
STRATA_API int64_t getInt(const Config& config, std::string_view key);
STRATA_API double getDouble(const Config& config, std::string_view key);
STRATA_API bool getBool(const Config& config, std::string_view key);
/// Accepts plain numbers and K/M/G/T suffixes (powers of 1024), "64M".
STRATA_API uint64_t getBytes(const Config& config, std::string_view key);
/// A Config from the text of a TOML configuration file (`name` stands for its path in
/// messages), without the environment: what Config::fromFile reads, for tests and fuzzing.
/// Throws InvalidConfig like fromFile.
STRATA_API Config fromText(std::string_view text, std::string_view name);
/// Where the effective value came from: "default", "file <path>:<line>", "env <NAME>", "set()".
STRATA_API std::string source(const Config& config, std::string_view key);

}  // namespace strata::config
