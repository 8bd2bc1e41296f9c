// Config, the key table and logging (lib/base/config*.cpp, log.cpp).
#define BOOST_TEST_MODULE config
#include <boost/test/unit_test.hpp>

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <strata/config.hpp>
#include <strata/error.hpp>

#include "base/config_keys.hpp"
#include "base/log.hpp"

namespace fs = std::filesystem;
using strata::Config;
using strata::Error;
using strata::ErrorCode;

namespace {

// Saves the variables a test may touch, clears every key mirror, and restores all on exit, so
// that tests neither see the meson test environment (STRATA_BOOTSTRAP_TCP_INTERFACE=lo, ...)
// nor leak into each other.
class CleanEnv {
 public:
  CleanEnv() {
    std::vector<std::string> names{"STRATA_CONFIG", "XDG_CONFIG_HOME", "HOME"};
    for (const auto& key : strata::config::keys())
      names.push_back(strata::config::envName(key.key));
    for (const auto& name : names) {
      const char* value = std::getenv(name.c_str());
      saved_[name] = value ? std::optional<std::string>(value) : std::nullopt;
    }
    for (const auto& key : strata::config::keys()) {
      ::unsetenv(strata::config::envName(key.key).c_str());
    }
    ::setenv("STRATA_CONFIG", "/dev/null/none", 1);
  }
  ~CleanEnv() {
    for (const auto& [name, value] : saved_) {
      if (value) {
        ::setenv(name.c_str(), value->c_str(), 1);
      } else {
        ::unsetenv(name.c_str());
      }
    }
  }

 private:
  std::map<std::string, std::optional<std::string>> saved_;
};

class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "strata-config-XXXXXX").string();
    BOOST_REQUIRE(::mkdtemp(pattern.data()) != nullptr);
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }
  // Writes `text` to path()/relative, creating directories.
  fs::path write(const fs::path& relative, const std::string& text) const {
    fs::path file = path_ / relative;
    fs::create_directories(file.parent_path());
    std::ofstream(file) << text;
    return file;
  }

 private:
  fs::path path_;
};

class ChangeDir {
 public:
  explicit ChangeDir(const fs::path& dir) : old_(fs::current_path()) { fs::current_path(dir); }
  ~ChangeDir() {
    std::error_code ec;
    fs::current_path(old_, ec);
  }

 private:
  fs::path old_;
};

// Runs `f`, which must throw InvalidConfig; returns the message.
template <typename F>
std::string invalidConfig(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    BOOST_TEST((e.code() == ErrorCode::InvalidConfig), "code " << strata::toString(e.code()));
    return e.what();
  } catch (const std::exception& e) {
    BOOST_ERROR("unexpected exception: " << e.what());
    return {};
  }
  BOOST_ERROR("expected InvalidConfig, nothing was thrown");
  return {};
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

std::string readAll(const fs::path& file) {
  std::ifstream in(file);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

// The source tree: $STRATA_SOURCE_ROOT, else found from __FILE__ (relative to the build
// directory under meson) by trying the working directory and the executable's ancestors.
std::optional<fs::path> sourceRoot() {
  if (const char* root = std::getenv("STRATA_SOURCE_ROOT"); root && *root) return fs::path(root);
  const fs::path self(__FILE__);
  std::vector<fs::path> bases;
  if (self.is_absolute()) {
    bases.push_back("/");
  } else {
    bases.push_back(fs::current_path());
    std::error_code ec;
    for (fs::path dir = fs::read_symlink("/proc/self/exe", ec).parent_path();
         !ec && !dir.empty() && dir != dir.root_path(); dir = dir.parent_path()) {
      bases.push_back(dir);
    }
  }
  for (const auto& base : bases) {
    fs::path candidate = fs::weakly_canonical(base / self);
    // This file is <root>/tests/unit/base/test_config.cpp.
    if (fs::exists(candidate)) {
      return candidate.parent_path().parent_path().parent_path().parent_path();
    }
  }
  return std::nullopt;
}

}  // namespace

BOOST_FIXTURE_TEST_SUITE(config, CleanEnv)

BOOST_AUTO_TEST_CASE(table_is_well_formed) {
  std::set<std::string_view> seen;
  for (const auto& key : strata::config::keys()) {
    BOOST_TEST_CONTEXT(key.key) {
      BOOST_TEST(seen.insert(key.key).second, "declared twice");
      BOOST_TEST(!key.help.empty());
      BOOST_TEST(strata::config::find(key.key) == &key);
      if (!key.defaultValue.empty()) {
        BOOST_CHECK_NO_THROW(strata::config::validate(key, key.defaultValue, "default"));
      }
      BOOST_TEST((key.type != strata::config::Type::Enum || !key.choices.empty()));
    }
  }
  for (const char* required :
       {"log.level", "log.file", "module.path", "bootstrap.backend", "bootstrap.timeout",
        "bootstrap.connect_timeout", "bootstrap.handshake_timeout", "bootstrap.secret_file",
        "bootstrap.max_message", "bootstrap.tcp.root", "bootstrap.tcp.port",
        "bootstrap.tcp.interface", "bootstrap.tcp.family", "bootstrap.spin_us"}) {
    BOOST_TEST(strata::config::find(required) != nullptr, required);
  }
  BOOST_TEST(strata::config::find("no.such.key") == nullptr);
  BOOST_TEST(strata::config::find("bootstrap.backend")->mustMatch);
  BOOST_TEST(strata::config::find("bootstrap.max_message")->mustMatch);
  BOOST_TEST(strata::config::envName("bootstrap.tcp.interface") ==
             "STRATA_BOOTSTRAP_TCP_INTERFACE");
  BOOST_TEST(strata::config::envName("module.path") == "STRATA_MODULE_PATH");
  BOOST_TEST(strata::config::envName("bootstrap.spin_us") == "STRATA_BOOTSTRAP_SPIN_US");
}

BOOST_AUTO_TEST_CASE(defaults) {
  Config config = Config::load();
  BOOST_TEST(config.get("log.level").value() == "warn");
  BOOST_TEST(!config.get("log.file").has_value());
  BOOST_TEST(!config.get("bootstrap.tcp.interface").has_value());
  BOOST_TEST(config.get("bootstrap.backend").value() == "auto");
  BOOST_TEST(strata::config::getDouble(config, "bootstrap.timeout") == 30.0);
  BOOST_TEST(strata::config::getDouble(config, "bootstrap.connect_timeout") == 60.0);
  BOOST_TEST(strata::config::getDouble(config, "bootstrap.handshake_timeout") == 5.0);
  BOOST_TEST(strata::config::getBytes(config, "bootstrap.max_message") == (uint64_t{1} << 30));
  BOOST_TEST(strata::config::getInt(config, "bootstrap.tcp.port") == 0);
  BOOST_TEST(strata::config::getInt(config, "bootstrap.spin_us") == -1);  // auto
  BOOST_TEST(strata::config::getString(config, "bootstrap.tcp.root") == "");
  for (const auto& key : strata::config::keys()) {
    BOOST_TEST(strata::config::source(config, key.key) == "default", key.key);
  }
  // A default-constructed Config holds only defaults.
  BOOST_TEST(Config().get("bootstrap.tcp.family").value() == "auto");
}

BOOST_AUTO_TEST_CASE(precedence_default_file_env_set) {
  TempDir dir;
  fs::path file = dir.write("strata.toml",
                            "# comment\n"
                            "[log]\n"
                            "level = \"info\"\n"
                            "[bootstrap]\n"
                            "timeout = 12\n"
                            "tcp.interface = \"eth\"\n");
  const std::string name = file.string();

  Config fromFile = Config::fromFile(file);
  BOOST_TEST(fromFile.get("log.level").value() == "info");
  BOOST_TEST(strata::config::source(fromFile, "log.level") == "file " + name + ":3");
  BOOST_TEST(strata::config::source(fromFile, "bootstrap.tcp.interface") == "file " + name + ":6");
  BOOST_TEST(strata::config::getDouble(fromFile, "bootstrap.timeout") == 12.0);
  BOOST_TEST(strata::config::source(fromFile, "bootstrap.backend") == "default");

  ::setenv("STRATA_LOG_LEVEL", "debug", 1);
  ::setenv("STRATA_BOOTSTRAP_TCP_INTERFACE", "lo", 1);
  Config withEnv = Config::fromFile(file);
  BOOST_TEST(withEnv.get("log.level").value() == "debug");
  BOOST_TEST(strata::config::source(withEnv, "log.level") == "env STRATA_LOG_LEVEL");
  BOOST_TEST(withEnv.get("bootstrap.tcp.interface").value() == "lo");
  BOOST_TEST(strata::config::getDouble(withEnv, "bootstrap.timeout") == 12.0);

  withEnv.set("log.level", "trace");
  BOOST_TEST(withEnv.get("log.level").value() == "trace");
  BOOST_TEST(strata::config::source(withEnv, "log.level") == "set()");

  // An empty environment variable counts as unset.
  ::setenv("STRATA_LOG_LEVEL", "", 1);
  BOOST_TEST(Config::fromFile(file).get("log.level").value() == "info");

  // set() also works on a Config that has only defaults, and returns *this for chaining.
  Config chained;
  chained.set("bootstrap.tcp.port", "29500").set("bootstrap.tcp.family", "IPv6");
  BOOST_TEST(strata::config::getInt(chained, "bootstrap.tcp.port") == 29500);
  BOOST_TEST(chained.get("bootstrap.tcp.family").value() == "ipv6");
}

BOOST_AUTO_TEST_CASE(search_path) {
  TempDir dir;
  fs::path work = dir.path() / "work";
  fs::create_directories(work);
  ChangeDir cd(work);
  ::unsetenv("STRATA_CONFIG");
  ::setenv("HOME", (dir.path() / "home").c_str(), 1);
  ::unsetenv("XDG_CONFIG_HOME");

  // Nothing anywhere (unless the installed sysconfdir has a file, which this test cannot control).
  {
    Config config = Config::load();
    if (strata::config::source(config, "log.level").starts_with("file ")) {
      BOOST_TEST_MESSAGE("a system-wide strata.toml exists; skipping the empty-search check");
    } else {
      BOOST_TEST(strata::config::source(config, "log.level") == "default");
    }
  }

  // ~/.config/strata/strata.toml when XDG_CONFIG_HOME is unset.
  fs::path homeFile = dir.write("home/.config/strata/strata.toml", "log.level = \"error\"\n");
  BOOST_TEST(Config::load().get("log.level").value() == "error");
  BOOST_TEST(strata::config::source(Config::load(), "log.level") ==
             "file " + homeFile.string() + ":1");

  // $XDG_CONFIG_HOME/strata/strata.toml replaces ~/.config when set.
  ::setenv("XDG_CONFIG_HOME", (dir.path() / "xdg").c_str(), 1);
  fs::path xdgFile = dir.write("xdg/strata/strata.toml", "\nlog.level = \"info\"\n");
  BOOST_TEST(Config::load().get("log.level").value() == "info");
  BOOST_TEST(strata::config::source(Config::load(), "log.level") ==
             "file " + xdgFile.string() + ":2");

  // ./strata.toml comes before both.
  dir.write("work/strata.toml", "log.level = \"debug\"\n");
  BOOST_TEST(Config::load().get("log.level").value() == "debug");
  BOOST_TEST(strata::config::source(Config::load(), "log.level") == "file strata.toml:1");

  // $STRATA_CONFIG comes first of all.
  fs::path explicitFile = dir.write("explicit.toml", "log.level = \"trace\"\n");
  ::setenv("STRATA_CONFIG", explicitFile.c_str(), 1);
  BOOST_TEST(Config::load().get("log.level").value() == "trace");

  // Under /dev/null/ it means "no file at all", even with ./strata.toml present.
  ::setenv("STRATA_CONFIG", "/dev/null/none", 1);
  BOOST_TEST(strata::config::source(Config::load(), "log.level") == "default");

  // Any other missing $STRATA_CONFIG is an error naming it.
  fs::path missing = dir.path() / "missing.toml";
  ::setenv("STRATA_CONFIG", missing.c_str(), 1);
  std::string message = invalidConfig([] { Config::load(); });
  BOOST_TEST(contains(message, "STRATA_CONFIG"), message);
  BOOST_TEST(contains(message, missing.string()), message);

  // The environment still overrides whatever file was found.
  ::unsetenv("STRATA_CONFIG");
  ::setenv("STRATA_LOG_LEVEL", "error", 1);
  BOOST_TEST(Config::load().get("log.level").value() == "error");

  // fromFile() needs an existing file.
  message = invalidConfig([&] { Config::fromFile(missing); });
  BOOST_TEST(contains(message, missing.string()), message);
}

BOOST_AUTO_TEST_CASE(file_errors_name_file_and_line) {
  TempDir dir;
  struct Case {
    std::string text;
    int line;
    std::vector<std::string> parts;
  };
  const std::vector<Case> cases = {
      {"[log]\nlevel = \"info\"\nlevle = \"debug\"\n",
       3,
       {"unknown configuration key 'log.levle'", "log.level"}},
      {"[bootstrap]\n\nbackend = \"mpi\"\n",
       3,
       {"bootstrap.backend", "'mpi'", "auto|tcp|pmix|ucx"}},
      {"[bootstrap.tcp]\ninterface = \"lo\"\nport = [1, 2]\n", 3, {"bootstrap.tcp.port", "array"}},
      {"log.level = \"warn\"\nbootstrap.timeout = \"soon\"\n", 2, {"bootstrap.timeout", "'soon'"}},
      {"bootstrap.timeout = -1\n", 1, {"bootstrap.timeout", "at least 0"}},
      {"bootstrap.tcp.port = 70000\n", 1, {"bootstrap.tcp.port", "65535"}},
      {"bootstrap.max_message = \"12Q\"\n", 1, {"bootstrap.max_message", "'12Q'"}},
      {"[log]\nlevel = \"info\"\nfile = \n", 3, {"TOML"}},
      {"a = 1\n\n[nosuch]\nx = 1\n", 1, {"unknown configuration key 'a'"}},
      {"\n[nosuch]\nx = 1\n", 2, {"unknown configuration section 'nosuch'"}},
      {"[log.level]\nx = 1\n", 1, {"log.level", "table"}},
      {"log.level = \"info\"\nlog.level = \"warn\"\n", 2, {"TOML"}},
      {"bootstrap.tcp.port = 5.0\n", 1, {"bootstrap.tcp.port", "'5.0'"}},
      {"log.date = 1979-05-27\n", 1, {"unknown configuration key 'log.date'"}},
      {"bootstrap.timeout = 1979-05-27\n", 1, {"bootstrap.timeout", "date"}},
      // Errors come in file order, not in the key order toml++ iterates in.
      {"log.levle = 1\nalpha = 2\n", 1, {"log.levle"}},
  };
  int index = 0;
  for (const Case& c : cases) {
    fs::path file = dir.write("case" + std::to_string(index++) + ".toml", c.text);
    BOOST_TEST_CONTEXT(c.text) {
      std::string message = invalidConfig([&] { Config::fromFile(file); });
      std::string where = file.string() + ":" + std::to_string(c.line) + ":";
      BOOST_TEST(contains(message, where), message << " lacks " << where);
      for (const auto& part : c.parts) BOOST_TEST(contains(message, part), message);
    }
  }

  // TOML integers, floats and booleans are converted to text and checked by type.
  fs::path good = dir.write("good.toml",
                            "bootstrap.tcp.port = 29500\nbootstrap.timeout = 2.5\n"
                            "bootstrap.max_message = \"64M\"\nbootstrap.tcp.root = 1234\n");
  Config config = Config::fromFile(good);
  BOOST_TEST(strata::config::getInt(config, "bootstrap.tcp.port") == 29500);
  BOOST_TEST(strata::config::getDouble(config, "bootstrap.timeout") == 2.5);
  BOOST_TEST(strata::config::getBytes(config, "bootstrap.max_message") == 64u << 20);
  BOOST_TEST(config.get("bootstrap.tcp.root").value() == "1234");
}

BOOST_AUTO_TEST_CASE(environment_mirror_with_bad_value) {
  ::setenv("STRATA_BOOTSTRAP_TIMEOUT", "ten", 1);
  std::string message = invalidConfig([] { Config::load(); });
  BOOST_TEST(contains(message, "STRATA_BOOTSTRAP_TIMEOUT"), message);
  BOOST_TEST(contains(message, "'ten'"), message);
  ::unsetenv("STRATA_BOOTSTRAP_TIMEOUT");

  ::setenv("STRATA_BOOTSTRAP_BACKEND", "mpi", 1);
  message = invalidConfig([] { Config::load(); });
  BOOST_TEST(contains(message, "STRATA_BOOTSTRAP_BACKEND"), message);
  BOOST_TEST(contains(message, "auto|tcp|pmix|ucx"), message);
  ::unsetenv("STRATA_BOOTSTRAP_BACKEND");

  // Launcher-contract and unknown STRATA_* variables are not errors.
  ::setenv("STRATA_RANK", "0", 1);
  ::setenv("STRATA_NOT_A_KEY", "whatever", 1);
  BOOST_CHECK_NO_THROW(Config::load());
  ::unsetenv("STRATA_NOT_A_KEY");
  ::unsetenv("STRATA_RANK");
}

BOOST_AUTO_TEST_CASE(value_validation) {
  using strata::config::find;
  using strata::config::validate;
  const auto& bytes = *find("bootstrap.max_message");
  BOOST_TEST(validate(bytes, "4096", "t") == "4096");
  BOOST_TEST(validate(bytes, "64K", "t") == "65536");
  BOOST_TEST(validate(bytes, "64k", "t") == "65536");
  BOOST_TEST(validate(bytes, "64M", "t") == std::to_string(64u << 20));
  BOOST_TEST(validate(bytes, "64MB", "t") == std::to_string(64u << 20));
  BOOST_TEST(validate(bytes, "64MiB", "t") == std::to_string(64u << 20));
  BOOST_TEST(validate(bytes, "1G", "t") == std::to_string(uint64_t{1} << 30));
  BOOST_TEST(validate(bytes, "2T", "t") == std::to_string(uint64_t{2} << 40));
  BOOST_TEST(validate(bytes, "512B", "t") == "512");
  BOOST_TEST(validate(bytes, " 8 M ", "t") == std::to_string(8u << 20));
  for (const char* bad :
       {"", "M", "-1", "1.5G", "12Q", "1iB", "1GG", "99999999999999999999", "20000000T"}) {
    std::string message = invalidConfig([&] { validate(bytes, bad, "here"); });
    BOOST_TEST(contains(message, "here"), message);
    BOOST_TEST(contains(message, "bootstrap.max_message"), message);
  }

  const auto& port = *find("bootstrap.tcp.port");
  BOOST_TEST(validate(port, "65535", "t") == "65535");
  BOOST_TEST(validate(port, "0", "t") == "0");
  for (const char* bad : {"65536", "-1", "80x", "8.0", "", "0x50"}) {
    invalidConfig([&] { validate(port, bad, "t"); });
  }
  const auto& spin = *find("bootstrap.spin_us");
  BOOST_TEST(validate(spin, "1000000", "t") == "1000000");
  invalidConfig([&] { validate(spin, "-5", "t"); });

  const auto& timeout = *find("bootstrap.timeout");
  BOOST_TEST(validate(timeout, "0", "t") == "0");
  BOOST_TEST(validate(timeout, "2.5", "t") == "2.5");
  BOOST_TEST(validate(timeout, "30.0", "t") == "30");
  for (const char* bad : {"-0.5", "inf", "nan", "1e999", "soon", ""}) {
    invalidConfig([&] { validate(timeout, bad, "t"); });
  }

  const auto& level = *find("log.level");
  BOOST_TEST(validate(level, "DEBUG", "t") == "debug");
  std::string message = invalidConfig([&] { validate(level, "verbose", "STRATA_LOG_LEVEL"); });
  BOOST_TEST(contains(message, "error|warn|info|debug|trace"), message);
  BOOST_TEST(contains(message, "STRATA_LOG_LEVEL"), message);

  // No Bool key is declared yet; check the parser through a local declaration.
  const strata::config::KeyInfo flag{"test.flag", strata::config::Type::Bool, "false", "", "t",
                                     false};
  for (const char* yes : {"true", "1", "yes", "on", "TRUE", "On"}) {
    BOOST_TEST(validate(flag, yes, "t") == "true", yes);
  }
  for (const char* no : {"false", "0", "no", "off", "False"}) {
    BOOST_TEST(validate(flag, no, "t") == "false", no);
  }
  invalidConfig([&] { validate(flag, "maybe", "t"); });

  // Strings are taken as they are, spaces included.
  BOOST_TEST(validate(*find("bootstrap.tcp.interface"), " ^docker ", "t") == " ^docker ");
}

BOOST_AUTO_TEST_CASE(set_and_get_errors) {
  Config config;
  std::string message = invalidConfig([&] { config.get("bootstrap.tcp.iface"); });
  BOOST_TEST(contains(message, "unknown configuration key 'bootstrap.tcp.iface'"), message);
  BOOST_TEST(contains(message, "strata-info --config"), message);
  message = invalidConfig([&] { config.get("interface"); });
  BOOST_TEST(contains(message, "bootstrap.tcp.interface"), message);
  message = invalidConfig([&] { config.set("bootstrap.backnd", "tcp"); });
  BOOST_TEST(contains(message, "did you mean 'bootstrap.backend'"), message);
  message = invalidConfig([&] { config.set("bootstrap.backend", "mpi"); });
  BOOST_TEST(contains(message, "Config::set"), message);
  BOOST_TEST(config.get("bootstrap.backend").value() == "auto");  // unchanged after a failure

  // Typed getters on a key of another type, or an undeclared key, are bugs: Internal.
  BOOST_CHECK_EXCEPTION(strata::config::getInt(config, "log.level"), Error,
                        [](const Error& e) { return e.code() == ErrorCode::Internal; });
  BOOST_CHECK_EXCEPTION(strata::config::getString(config, "no.such"), Error,
                        [](const Error& e) { return e.code() == ErrorCode::Internal; });
}

BOOST_AUTO_TEST_CASE(describe_lists_every_key_with_source) {
  TempDir dir;
  fs::path file = dir.write("s.toml", "[bootstrap.tcp]\nfamily = \"ipv4\"\n");
  ::setenv("STRATA_BOOTSTRAP_TIMEOUT", "7", 1);
  Config config = Config::fromFile(file);
  config.set("log.level", "info");
  const std::string text = config.describe();
  for (const auto& key : strata::config::keys()) {
    BOOST_TEST(contains(text, std::string(key.key) + " = "), key.key);
    BOOST_TEST(contains(text, std::string(key.help)), key.key);
  }
  BOOST_TEST(contains(text, "log.level = info  (set())"), text);
  BOOST_TEST(contains(text, "bootstrap.timeout = 7  (env STRATA_BOOTSTRAP_TIMEOUT)"), text);
  BOOST_TEST(contains(text, "bootstrap.tcp.family = ipv4  (file " + file.string() + ":2)"), text);
  BOOST_TEST(contains(text, "bootstrap.backend = auto  (default)"), text);
  BOOST_TEST(contains(text, "bootstrap.max_message = 1073741824 (1 GiB)  (default)"), text);
}

BOOST_AUTO_TEST_CASE(copy_semantics) {
  Config original;
  original.set("log.level", "info");
  Config copy = original;
  copy.set("log.level", "debug").set("bootstrap.tcp.interface", "lo");
  BOOST_TEST(original.get("log.level").value() == "info");
  BOOST_TEST(!original.get("bootstrap.tcp.interface").has_value());
  BOOST_TEST(copy.get("log.level").value() == "debug");

  Config assigned;
  assigned = copy;
  copy.set("log.level", "error");
  BOOST_TEST(assigned.get("log.level").value() == "debug");
  BOOST_TEST(strata::config::source(assigned, "bootstrap.tcp.interface") == "set()");

  Config moved = std::move(assigned);
  BOOST_TEST(moved.get("log.level").value() == "debug");
  // A moved-from Config still answers with defaults and can be reused.
  BOOST_TEST(assigned.get("log.level").value() == "warn");  // NOLINT(bugprone-use-after-move)
  assigned.set("log.level", "trace");
  BOOST_TEST(assigned.get("log.level").value() == "trace");
  assigned = moved;
  BOOST_TEST(assigned.get("log.level").value() == "debug");
}

BOOST_AUTO_TEST_CASE(documentation_matches_table) {
  auto root = sourceRoot();
  BOOST_REQUIRE_MESSAGE(root, "cannot find the source tree; set STRATA_SOURCE_ROOT");
  fs::path doc = *root / "docs" / "configuration.md";
  BOOST_REQUIRE_MESSAGE(fs::exists(doc), doc.string() << " is missing");
  const std::string text = readAll(doc);

  std::set<std::string> documented;
  std::map<std::string, std::string> sections;
  std::string current;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    // A key's heading: ### `key`
    size_t close = line.rfind('`');
    if (line.rfind("### `", 0) == 0 && close > 5) {
      current = line.substr(5, close - 5);
      documented.insert(current);
    } else if (!current.empty()) {
      sections[current] += line + "\n";
    }
  }
  std::set<std::string> declared;
  for (const auto& key : strata::config::keys()) declared.insert(std::string(key.key));
  for (const auto& key : declared) {
    BOOST_TEST(documented.count(key) == 1u,
               key << " is not in docs/configuration.md; run tools/dev/gen-config-doc.py");
  }
  for (const auto& key : documented) {
    BOOST_TEST(declared.count(key) == 1u,
               key << " is documented but not declared; run tools/dev/gen-config-doc.py");
  }
  for (const auto& key : strata::config::keys()) {
    const std::string& section = sections[std::string(key.key)];
    BOOST_TEST(contains(section, "`" + strata::config::envName(key.key) + "`"), key.key);
    if (!key.defaultValue.empty()) {
      BOOST_TEST(contains(section, "Default: `" + std::string(key.defaultValue) + "`"), key.key);
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_FIXTURE_TEST_SUITE(logging, CleanEnv)

BOOST_AUTO_TEST_CASE(parse_level) {
  using strata::log::Level;
  BOOST_TEST((strata::log::parseLevel("error") == Level::Error));
  BOOST_TEST((strata::log::parseLevel("warn") == Level::Warn));
  BOOST_TEST((strata::log::parseLevel("INFO") == Level::Info));
  BOOST_TEST((strata::log::parseLevel("debug") == Level::Debug));
  BOOST_TEST((strata::log::parseLevel("trace") == Level::Trace));
  invalidConfig([] { strata::log::parseLevel("loud"); });
}

BOOST_AUTO_TEST_CASE(lines_go_to_log_file_whole) {
  TempDir dir;
  fs::path file = dir.path() / "strata.log";
  Config config;
  config.set("log.level", "info").set("log.file", file.string());
  strata::log::configure(config);
  strata::log::setRank(3);

  BOOST_TEST(strata::log::enabled(strata::log::Level::Info));
  BOOST_TEST(!strata::log::enabled(strata::log::Level::Debug));
  STRATA_LOG(Info, "test", "hello {}", 42);
  STRATA_LOG(Debug, "test", "not printed");
  strata::log::write(strata::log::Level::Warn, "test", "with newline\n");

  constexpr int kThreads = 4;
  constexpr int kLines = 200;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([t] {
      for (int i = 0; i < kLines; ++i) {
        STRATA_LOG(Info, "thread", "t{} line {} {}", t, i, std::string(100, 'x'));
      }
    });
  }
  for (auto& thread : threads) thread.join();
  strata::log::setRank(-1);
  STRATA_LOG(Error, "test", "unknown rank");

  std::istringstream lines(readAll(file));
  std::vector<std::string> all;
  for (std::string line; std::getline(lines, line);) all.push_back(line);
  BOOST_REQUIRE_EQUAL(all.size(), size_t{3 + kThreads * kLines});
  const std::string pid = std::to_string(::getpid());
  // "[strata <host>:<pid> r<rank|?> <subsystem>] <LEVEL> <message>", checked piece by piece
  // (std::regex trips GCC 12's -Wmaybe-uninitialized under the sanitizers).
  auto wellFormed = [&](const std::string& line) {
    if (line.rfind("[strata ", 0) != 0) return false;
    size_t colon = line.find(':');
    size_t sp = line.find(' ', 8);
    if (colon == std::string::npos || sp == std::string::npos || colon > sp) return false;
    if (line.substr(colon + 1, sp - colon - 1) != pid) return false;
    if (line.compare(sp + 1, 1, "r") != 0) return false;
    size_t sp2 = line.find(' ', sp + 1);
    std::string rank = line.substr(sp + 2, sp2 - sp - 2);
    if (rank != "?" &&
        (rank.empty() || rank.find_first_not_of("0123456789") != std::string::npos)) {
      return false;
    }
    size_t close = line.find("] ", sp2);
    if (close == std::string::npos) return false;
    std::string sub = line.substr(sp2 + 1, close - sp2 - 1);
    if (sub.empty() || sub.find_first_not_of("abcdefghijklmnopqrstuvwxyz") != std::string::npos) {
      return false;
    }
    std::string rest = line.substr(close + 2);
    for (const char* lvl : {"ERROR ", "WARN ", "INFO ", "DEBUG ", "TRACE "}) {
      if (rest.rfind(lvl, 0) == 0) return true;
    }
    return false;
  };
  for (const auto& line : all) BOOST_TEST(wellFormed(line), line);
  BOOST_TEST(contains(all[0], " r3 test] INFO hello 42"), all[0]);
  BOOST_TEST(contains(all[1], " r3 test] WARN with newline"), all[1]);
  BOOST_TEST(contains(all.back(), " r? test] ERROR unknown rank"), all.back());
  for (size_t i = 2; i + 1 < all.size(); ++i) {
    const std::string& l = all[i];
    size_t at = l.find("] INFO t");
    bool ok = at != std::string::npos && l.size() > 100 &&
              l.compare(l.size() - 100, 100, std::string(100, 'x')) == 0 &&
              l.find(" line ", at) != std::string::npos;
    BOOST_TEST(ok, l);
  }

  // Back to standard error, and warn, for the rest of the process.
  Config reset;
  reset.set("log.level", "warn").set("log.file", "");
  strata::log::configure(reset);
  STRATA_LOG(Warn, "test", "to stderr (expected in the test output)");
  BOOST_TEST(readAll(file).find("to stderr") == std::string::npos);
}

BOOST_AUTO_TEST_CASE(unopenable_log_file_keeps_stderr) {
  Config config;
  config.set("log.file", "/dev/null/cannot/open.log");
  BOOST_CHECK_NO_THROW(strata::log::configure(config));
  BOOST_CHECK_NO_THROW(strata::log::configure(config));  // says so only once
  BOOST_CHECK_NO_THROW(STRATA_LOG(Error, "test", "still on stderr (expected in the test output)"));
  // A Config with only defaults changes nothing (it must not undo STRATA_LOG_LEVEL).
  strata::log::configure(Config());
  BOOST_TEST(strata::log::enabled(strata::log::Level::Warn));
  BOOST_TEST(!strata::log::enabled(strata::log::Level::Info));
}

BOOST_AUTO_TEST_SUITE_END()
