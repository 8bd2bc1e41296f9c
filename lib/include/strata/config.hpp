#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include <strata/export.hpp>

namespace strata {

struct ConfigAccess;

/// Configuration: declared keys with defaults, a TOML file, STRATA_* environment mirrors and
/// explicit set() calls. Precedence: set() > environment > file > default.
/// Unknown keys, bad values and unparsable files throw Error(InvalidConfig) naming file and line.
class STRATA_API Config {
 public:
  /// Search path ($STRATA_CONFIG, ./strata.toml, $XDG_CONFIG_HOME/strata/strata.toml or
  /// ~/.config/strata/strata.toml, <sysconfdir>/strata/strata.toml), then the environment.
  static Config load();
  /// That file (which must exist), then the environment.
  static Config fromFile(const std::filesystem::path& file);
  /// Highest precedence. Throws InvalidConfig for an unknown key or a value of the wrong type.
  Config& set(std::string_view key, std::string_view value);
  /// The effective value (default included) as text; nullopt when the key has no value.
  /// Throws InvalidConfig for an undeclared key.
  std::optional<std::string> get(std::string_view key) const;
  /// Every known key: value, where it came from, help text.
  std::string describe() const;

  Config();
  ~Config();
  Config(const Config&);
  Config& operator=(const Config&);
  Config(Config&&) noexcept;
  Config& operator=(Config&&) noexcept;

  struct Impl;

 private:
  friend struct ConfigAccess;
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata
