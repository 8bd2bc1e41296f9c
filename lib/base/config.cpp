#include <strata/config.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <toml++/toml.h>

#include <strata/error.hpp>

#include "base/config_keys.hpp"
#include "base/log.hpp"

#ifndef STRATA_SYSCONFDIR
#define STRATA_SYSCONFDIR "/etc"
#endif

namespace strata {

namespace {

using config::KeyInfo;
using config::Type;

// STRATA_CONFIG below this prefix means "no file": /dev/null is not a directory, so such a path
// can never exist, and tests use it to shut out a user's strata.toml.
constexpr std::string_view kNoFilePrefix = "/dev/null/";

size_t indexOf(const KeyInfo& info) {
  return static_cast<size_t>(&info - config::keys().data());
}

size_t editDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// " (did you mean 'bootstrap.tcp.interface'?)" or "" when nothing is close.
std::string suggestion(std::string_view key) {
  const KeyInfo* best = nullptr;
  size_t bestDistance = std::max<size_t>(2, key.size() / 3) + 1;
  for (const KeyInfo& info : config::keys()) {
    size_t distance = editDistance(key, info.key);
    // A bare last component ("interface") is a common slip for the full dotted key.
    std::string_view tail = info.key.substr(info.key.rfind('.') + 1);
    if (tail == key) distance = 1;
    if (distance < bestDistance) {
      best = &info;
      bestDistance = distance;
    }
  }
  return best != nullptr ? fmt::format(" (did you mean '{}'?)", best->key) : std::string();
}

[[noreturn]] void unknownKey(std::string_view where, std::string_view key) {
  throw Error(
      ErrorCode::InvalidConfig,
      fmt::format("{}unknown configuration key '{}'{}; see strata-info --config or "
                  "docs/configuration.md for the known keys",
                  where.empty() ? std::string() : std::string(where) + ": ", key, suggestion(key)));
}

const KeyInfo& lookup(std::string_view key) {
  const KeyInfo* info = config::find(key);
  if (info == nullptr) unknownKey("", key);
  return *info;
}

bool isSectionOfSomeKey(std::string_view prefix) {
  for (const KeyInfo& info : config::keys()) {
    if (info.key.size() > prefix.size() && info.key.starts_with(prefix) &&
        info.key[prefix.size()] == '.') {
      return true;
    }
  }
  return false;
}

std::string typeName(Type type) {
  switch (type) {
    case Type::String:
      return "string";
    case Type::Int:
      return "integer";
    case Type::Double:
      return "number";
    case Type::Bool:
      return "boolean";
    case Type::Enum:
      return "enum";
    case Type::Bytes:
      return "byte count";
  }
  return "value";
}

// ", at least 0" from the range "0.." of an Int or Double key.
std::string rangeText(std::string_view range) {
  auto dots = range.find("..");
  if (dots == std::string_view::npos) return std::string();
  std::string_view low = range.substr(0, dots), high = range.substr(dots + 2);
  if (!low.empty() && !high.empty()) return fmt::format(", {} to {}", low, high);
  if (!low.empty()) return fmt::format(", at least {}", low);
  if (!high.empty()) return fmt::format(", at most {}", high);
  return std::string();
}

std::string humanBytes(std::string_view canonical) {
  uint64_t bytes = std::strtoull(std::string(canonical).c_str(), nullptr, 10);
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB"};
  std::string best;
  for (int i = 0; i < 4; ++i) {
    uint64_t unit = uint64_t{1} << (10 * (i + 1));
    if (bytes >= unit && bytes % unit == 0) best = fmt::format("{} {}", bytes / unit, kUnits[i]);
  }
  return best;
}

}  // namespace

struct Config::Impl {
  struct Entry {
    std::string value;   // canonical text from config::validate
    std::string source;  // "file <path>:<line>", "env <NAME>", "set()"
  };
  // One slot per entry of config::keys(), per source, so precedence is decided at read time and
  // a later file or environment read can never hide a set().
  std::vector<std::optional<Entry>> file, env, explicitly;

  Impl()
      : file(config::keys().size()),
        env(config::keys().size()),
        explicitly(config::keys().size()) {}

  // nullptr when the default applies.
  const Entry* effective(size_t index) const {
    if (explicitly[index]) return &*explicitly[index];
    if (env[index]) return &*env[index];
    if (file[index]) return &*file[index];
    return nullptr;
  }

  void readFile(const std::filesystem::path& path);
  /// The content of a configuration file; `name` stands for its path in messages.
  void readText(std::string_view text, const std::string& name);
  void walk(const toml::table& table, const std::string& prefix, const std::string& file);
  void readEnvironment();
};

/// The one way into Config's Impl outside its members (config::source, config::fromText).
struct ConfigAccess {
  static const Config::Impl& impl(const Config& c) { return *c.impl_; }
  static Config::Impl& mutableImpl(Config& c) { return *c.impl_; }
};

void Config::Impl::readFile(const std::filesystem::path& path) {
  const std::string name = path.string();
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    int err = errno;
    throw Error(ErrorCode::InvalidConfig,
                fmt::format("{}: cannot read configuration file: {}; fix its permissions or point "
                            "STRATA_CONFIG elsewhere",
                            name, std::strerror(err)));
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) {
    throw Error(ErrorCode::InvalidConfig,
                fmt::format("{}: cannot read configuration file (is it a directory?)", name));
  }
  readText(text.str(), name);
  STRATA_LOG(Debug, "config", "read configuration file {}", name);
}

void Config::Impl::readText(std::string_view text, const std::string& name) {
  toml::table root;
  try {
    root = toml::parse(text, name);
  } catch (const toml::parse_error& e) {
    throw Error(ErrorCode::InvalidConfig, fmt::format("{}:{}: not valid TOML: {}", name,
                                                      e.source().begin.line, e.description()));
  }
  walk(root, "", name);
}

namespace {

struct FileItem {
  uint32_t line;
  std::string key;
  const toml::node* node;
};

// toml::table iterates in key order; collecting first lets errors be reported in file order, so
// the user sees the first bad line, not the alphabetically first bad key.
void flatten(const toml::table& table, const std::string& prefix, std::vector<FileItem>& items) {
  for (const auto& [tomlKey, node] : table) {
    std::string key =
        prefix.empty() ? std::string(tomlKey.str()) : prefix + "." + std::string(tomlKey.str());
    uint32_t line = tomlKey.source().begin.line;
    if (line == 0) line = node.source().begin.line;
    items.push_back(FileItem{line, key, &node});
    // A table that is itself a key is reported as such, not walked into.
    if (const toml::table* sub = node.as_table(); sub && config::find(key) == nullptr) {
      flatten(*sub, key, items);
    }
  }
}

}  // namespace

void Config::Impl::walk(const toml::table& table, const std::string& prefix,
                        const std::string& file) {
  std::vector<FileItem> items;
  flatten(table, prefix, items);
  std::stable_sort(items.begin(), items.end(),
                   [](const FileItem& a, const FileItem& b) { return a.line < b.line; });
  for (const FileItem& item : items) {
    const std::string& key = item.key;
    const toml::node& node = *item.node;
    const std::string where = fmt::format("{}:{}", file, item.line);
    const KeyInfo* info = config::find(key);

    if (node.is_table()) {
      if (info != nullptr) {
        throw Error(ErrorCode::InvalidConfig,
                    fmt::format("{}: configuration key '{}' takes a single {} value, not a table",
                                where, key, typeName(info->type)));
      }
      if (!isSectionOfSomeKey(key)) {
        throw Error(ErrorCode::InvalidConfig,
                    fmt::format("{}: unknown configuration section '{}'{}; see strata-info "
                                "--config or docs/configuration.md for the known keys",
                                where, key, suggestion(key)));
      }
      continue;
    }
    if (info == nullptr) unknownKey(where, key);

    std::string text;
    if (node.is_string()) {
      text = *node.value<std::string>();
    } else if (node.is_integer()) {
      text = std::to_string(*node.value<int64_t>());
    } else if (node.is_floating_point()) {
      text = fmt::format("{}", *node.value<double>());
      // Keep a float looking like one ("5.0", not "5"), so an integer key rejects it.
      if (text.find_first_not_of("-0123456789") == std::string::npos) text += ".0";
    } else if (node.is_boolean()) {
      text = *node.value<bool>() ? "true" : "false";
    } else {
      const char* kind = node.is_array() ? "an array" : "a date or time";
      throw Error(ErrorCode::InvalidConfig,
                  fmt::format("{}: configuration key '{}' takes a single {} value, not {}", where,
                              key, typeName(info->type), kind));
    }
    std::string value = config::validate(*info, text, where);
    this->file[indexOf(*info)] = Entry{std::move(value), "file " + where};
  }
}

void Config::Impl::readEnvironment() {
  for (const KeyInfo& info : config::keys()) {
    const std::string name = config::envName(info.key);
    const char* value = std::getenv(name.c_str());
    // An empty variable counts as unset: "STRATA_X= cmd" is how shells clear a setting.
    if (value == nullptr || *value == '\0') continue;
    std::string canonical = config::validate(info, value, "environment variable " + name);
    env[indexOf(info)] = Entry{std::move(canonical), "env " + name};
  }
}

namespace {

// The default state, for a moved-from Config (whose impl_ is gone).
const Config::Impl& emptyImpl() {
  static const Config::Impl impl;
  return impl;
}

std::string sourceOf(const Config::Impl& state, const KeyInfo& info) {
  if (const Config::Impl::Entry* entry = state.effective(indexOf(info))) return entry->source;
  return "default";
}

std::optional<std::filesystem::path> findConfigFile() {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (const char* explicitPath = std::getenv("STRATA_CONFIG");
      explicitPath != nullptr && *explicitPath != '\0') {
    fs::path path(explicitPath);
    if (fs::exists(path, ec)) return path;
    if (std::string_view(explicitPath).starts_with(kNoFilePrefix)) return std::nullopt;
    throw Error(ErrorCode::InvalidConfig,
                fmt::format("STRATA_CONFIG names '{}', which does not exist; fix the path or "
                            "unset STRATA_CONFIG to use the search path",
                            explicitPath));
  }
  std::vector<fs::path> candidates{"strata.toml"};
  if (const char* xdg = std::getenv("XDG_CONFIG_HOME"); xdg != nullptr && *xdg != '\0') {
    candidates.push_back(fs::path(xdg) / "strata" / "strata.toml");
  } else if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0') {
    candidates.push_back(fs::path(home) / ".config" / "strata" / "strata.toml");
  }
  candidates.push_back(fs::path(STRATA_SYSCONFDIR) / "strata" / "strata.toml");
  for (const fs::path& path : candidates) {
    if (fs::exists(path, ec)) return path;
  }
  return std::nullopt;
}

}  // namespace

Config::Config() : impl_(std::make_unique<Impl>()) {}
Config::~Config() = default;
Config::Config(const Config& other)
    : impl_(std::make_unique<Impl>(other.impl_ ? *other.impl_ : emptyImpl())) {}
Config& Config::operator=(const Config& other) {
  if (this != &other) impl_ = std::make_unique<Impl>(other.impl_ ? *other.impl_ : emptyImpl());
  return *this;
}
Config::Config(Config&&) noexcept = default;
Config& Config::operator=(Config&&) noexcept = default;

Config Config::load() {
  Config config;
  if (auto file = findConfigFile()) config.impl_->readFile(*file);
  config.impl_->readEnvironment();
  return config;
}

Config Config::fromFile(const std::filesystem::path& file) {
  std::error_code ec;
  if (!std::filesystem::exists(file, ec)) {
    throw Error(ErrorCode::InvalidConfig,
                fmt::format("configuration file '{}' does not exist", file.string()));
  }
  Config config;
  config.impl_->readFile(file);
  config.impl_->readEnvironment();
  return config;
}

Config& Config::set(std::string_view key, std::string_view value) {
  const KeyInfo& info = lookup(key);
  std::string canonical =
      config::validate(info, value, fmt::format("Config::set(\"{}\", \"{}\")", key, value));
  if (!impl_) impl_ = std::make_unique<Impl>();
  impl_->explicitly[indexOf(info)] = Impl::Entry{std::move(canonical), "set()"};
  return *this;
}

std::optional<std::string> Config::get(std::string_view key) const {
  const KeyInfo& info = lookup(key);
  const Impl& state = impl_ ? *impl_ : emptyImpl();
  std::string value;
  if (const Impl::Entry* entry = state.effective(indexOf(info))) {
    value = entry->value;
  } else if (!info.defaultValue.empty()) {
    value = config::validate(info, info.defaultValue, "default");
  }
  if (value.empty()) return std::nullopt;
  return value;
}

std::string Config::describe() const {
  const Impl& state = impl_ ? *impl_ : emptyImpl();
  std::string out;
  for (const KeyInfo& info : config::keys()) {
    std::string value = get(info.key).value_or("");
    if (value.empty()) {
      value = "\"\"";
    } else if (info.type == Type::Bytes) {
      if (std::string human = humanBytes(value); !human.empty()) value += " (" + human + ")";
    }
    std::string details = typeName(info.type);
    if (!info.choices.empty()) {
      details +=
          info.type == Type::Enum ? ": " + std::string(info.choices) : rangeText(info.choices);
    }
    fmt::format_to(std::back_inserter(out), "{} = {}  ({})\n    {}\n    [{}; env {}{}]\n", info.key,
                   value, sourceOf(state, info), info.help, details, config::envName(info.key),
                   info.mustMatch ? "; must match on every rank" : "");
  }
  return out;
}

Config config::fromText(std::string_view text, std::string_view name) {
  Config config;
  ConfigAccess::mutableImpl(config).readText(text, std::string(name));
  return config;
}

std::string config::source(const Config& config, std::string_view key) {
  const KeyInfo* info = config::find(key);
  if (info == nullptr) {
    throw Error(ErrorCode::Internal,
                fmt::format("configuration key '{}' is not declared in config_keys.cpp", key));
  }
  // A moved-from Config has no Impl; like any moved-from object it may only be assigned to or
  // destroyed (its own methods tolerate it, but impl() does not).
  return sourceOf(ConfigAccess::impl(config), *info);
}

}  // namespace strata
