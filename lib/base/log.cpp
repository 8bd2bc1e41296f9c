#include "base/log.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>

#include <strata/config.hpp>
#include <strata/error.hpp>

#include "base/config_keys.hpp"
#include "base/process.hpp"

namespace strata::log {

namespace {

constexpr std::string_view kLevelNames[] = {"ERROR", "WARN", "INFO", "DEBUG", "TRACE"};

std::string shortHostname() {
  std::string host = process::hostName();
  // The short name is what users see in Slurm node lists; the domain only lengthens every line.
  if (auto dot = host.find('.'); dot != std::string::npos && dot > 0) host.resize(dot);
  return host;
}

std::optional<Level> tryParse(std::string_view text) {
  std::string lower(text);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  static constexpr std::string_view kNames[] = {"error", "warn", "info", "debug", "trace"};
  for (int i = 0; i < 5; ++i) {
    if (lower == kNames[i]) return static_cast<Level>(i);
  }
  return std::nullopt;
}

// Process-wide logger. Built on first use (a function-local static, so thread-safe), which is
// when STRATA_LOG_LEVEL is read: logging works before and without any Config.
struct Logger {
  std::atomic<int> level{static_cast<int>(Level::Warn)};
  std::atomic<int> rank{-1};
  std::string host = shortHostname();
  std::mutex mutex;  // guards fd, path and failedPath; held across write() so a swap of fd
                     // never lets a line go to a closed (or reused) descriptor
  int fd = STDERR_FILENO;
  std::string path;
  std::string failedPath;
  std::string badLevel;

  Logger() {
    if (const char* env = std::getenv("STRATA_LOG_LEVEL"); env != nullptr && *env != '\0') {
      if (auto parsed = tryParse(env)) {
        level = static_cast<int>(*parsed);
      } else {
        badLevel = env;
      }
    }
  }
};

void emit(Logger& state, Level level, std::string_view subsystem,
          std::string_view message) noexcept;

Logger& logger() noexcept {
  // Never destroyed: threads and static destructors may still log while the process exits.
  static Logger& instance = *new Logger;
  static std::once_flag reported;
  // Reported after construction, through emit() which needs the finished instance.
  if (!instance.badLevel.empty()) {
    std::call_once(reported, [] {
      emit(instance, Level::Warn, "log",
           "STRATA_LOG_LEVEL='" + instance.badLevel +
               "' is not one of error, warn, info, debug, trace; using warn");
    });
  }
  return instance;
}

void writeAll(int fd, const std::string& line) noexcept {
  // One write() per line: the kernel keeps lines from different threads (and, for O_APPEND files
  // and short lines on pipes, different processes) whole. Loop only for a partial write.
  const char* data = line.data();
  size_t left = line.size();
  while (left > 0) {
    ssize_t n = ::write(fd, data, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      return;
    }
    data += n;
    left -= static_cast<size_t>(n);
  }
}

}  // namespace

Level parseLevel(std::string_view text) {
  if (auto level = tryParse(text)) return *level;
  throw Error(
      ErrorCode::InvalidConfig,
      fmt::format("invalid log level '{}': expected one of error, warn, info, debug, trace", text));
}

void configure(const Config& config) {
  Logger& state = logger();
  // A default log.level is not applied: it would override STRATA_LOG_LEVEL when the caller's
  // Config was built without the environment.
  if (config::source(config, "log.level") != "default") {
    state.level = static_cast<int>(parseLevel(config::getString(config, "log.level")));
  }
  const std::string file = config::getString(config, "log.file");
  if (file.empty() && config::source(config, "log.file") == "default") return;

  std::string failure;
  {
    std::lock_guard lock(state.mutex);
    if (file == state.path) return;
    if (file.empty()) {
      if (state.fd != STDERR_FILENO) ::close(state.fd);
      state.fd = STDERR_FILENO;
      state.path.clear();
      return;
    }
    int fd = ::open(file.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
      if (state.failedPath != file) {
        state.failedPath = file;
        failure = std::strerror(errno);
      }
    } else {
      if (state.fd != STDERR_FILENO) ::close(state.fd);
      state.fd = fd;
      state.path = file;
    }
  }
  if (!failure.empty()) {
    write(Level::Warn, "log",
          fmt::format("cannot open log.file '{}' ({}); logging to standard error instead", file,
                      failure));
  }
}

void setRank(int rank) noexcept {
  logger().rank = rank;
}

bool enabled(Level level) noexcept {
  return static_cast<int>(level) <= logger().level.load(std::memory_order_relaxed);
}

void write(Level level, std::string_view subsystem, std::string_view message) noexcept {
  emit(logger(), level, subsystem, message);
}

namespace {

void emit(Logger& state, Level level, std::string_view subsystem,
          std::string_view message) noexcept {
  try {
    if (static_cast<int>(level) > state.level.load(std::memory_order_relaxed)) return;
    while (!message.empty() && message.back() == '\n') message.remove_suffix(1);
    const int rank = state.rank.load(std::memory_order_relaxed);
    const int index = static_cast<int>(level);
    std::string_view name = index >= 0 && index < 5 ? kLevelNames[index] : "?";
    std::string line = rank >= 0 ? fmt::format("[strata {}:{} r{} {}] {} {}\n", state.host,
                                               ::getpid(), rank, subsystem, name, message)
                                 : fmt::format("[strata {}:{} r? {}] {} {}\n", state.host,
                                               ::getpid(), subsystem, name, message);
    std::lock_guard lock(state.mutex);
    writeAll(state.fd, line);
  } catch (...) {
    // Logging must never throw into its caller (often a destructor or error path).
  }
}

}  // namespace

}  // namespace strata::log
