#pragma once
#ifndef STRATA_INTERNAL_HEADERS
#error "base/log.hpp is internal to strata: applications include <strata/...> only"
#endif

// Logging: levels error..trace from log.level / STRATA_LOG_LEVEL, optional log.file.
// Each line: "[strata host:pid rR subsystem] LEVEL message" ("r?" before setRank()), written
// with one write() call. Nothing is printed at the default level (warn) on success.

#include <string_view>

#include <fmt/format.h>

#include <strata/export.hpp>

namespace strata {
class Config;
}

namespace strata::log {

enum class Level { Error = 0, Warn = 1, Info = 2, Debug = 3, Trace = 4 };

/// Parses "error|warn|info|debug|trace"; throws InvalidConfig otherwise.
STRATA_API Level parseLevel(std::string_view text);
/// Applies log.level and log.file from the config (the environment is read at first use anyway).
STRATA_API void configure(const Config& config);
/// The rank shown in the prefix (-1 = unknown).
STRATA_API void setRank(int rank) noexcept;
STRATA_API bool enabled(Level level) noexcept;
STRATA_API void write(Level level, std::string_view subsystem, std::string_view message) noexcept;

}  // namespace strata::log

// Formats only when the level is enabled.
#define STRATA_LOG(level, subsystem, ...)                                                     \
  do {                                                                                        \
    if (::strata::log::enabled(::strata::log::Level::level)) {                                \
      ::strata::log::write(::strata::log::Level::level, subsystem, fmt::format(__VA_ARGS__)); \
    }                                                                                         \
  } while (0)
