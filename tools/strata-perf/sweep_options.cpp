#include <algorithm>

#include <fmt/format.h>
#include <strata/error.hpp>

#include "mode.hpp"
#include "stats.hpp"

namespace strata::perf {

namespace {

// CLI11 validator so that a bad size is a parse error (exit 2), not a run-time one.
const CLI::Validator kByteCount(
    [](std::string& text) {
      try {
        parseBytes(text);
        return std::string();
      } catch (const std::invalid_argument& e) {
        return std::string(e.what());
      }
    },
    "BYTES", "byte count");

size_t scaled(size_t value, size_t bytes, size_t floor) {
  if (bytes <= SweepOptions::kLargeBytes) return value;
  return std::max(floor, value * SweepOptions::kLargeBytes / bytes);
}

}  // namespace

void SweepOptions::addTo(CLI::App& command) {
  command.add_option("-b,--minbytes", minBytes, "smallest size per rank (K, M, G suffixes)")
      ->check(kByteCount)
      ->capture_default_str();
  command.add_option("-e,--maxbytes", maxBytes, "largest size per rank (always measured)")
      ->check(kByteCount)
      ->capture_default_str();
  command.add_option("-f,--stepfactor", factor, "multiply the size by this between rows")
      ->check(CLI::Range(size_t{2}, size_t{1} << 20))
      ->capture_default_str();
  itersOption = command
                    .add_option("-n,--iters", iters,
                                "timed iterations per row (default 1000, fewer above 64 KiB)")
                    ->check(CLI::Range(size_t{1}, size_t{100000000}));
  warmupOption = command
                     .add_option("-w,--warmup", warmup,
                                 "untimed iterations before each row (default 50, fewer above "
                                 "64 KiB)")
                     ->check(CLI::Range(size_t{0}, size_t{100000000}));
  command.add_option("--json", json, "also write one JSON object per row to FILE ('-': stdout)")
      ->type_name("FILE");
}

std::vector<size_t> SweepOptions::sizes() const {
  return sizeList(parseBytes(minBytes), parseBytes(maxBytes), factor, {64});
}

std::vector<size_t> SweepOptions::checkedSizes(bool onlyRequested) const {
  std::vector<size_t> out;
  try {
    out = sizes();
  } catch (const std::invalid_argument& e) {
    throw CLI::ValidationError(e.what());
  }
  const size_t lo = parseBytes(minBytes), hi = parseBytes(maxBytes);
  if (lo > hi) {
    throw CLI::ValidationError(
        fmt::format("--minbytes {} is larger than --maxbytes {}", minBytes, maxBytes));
  }
  if (onlyRequested) {
    out.erase(std::remove_if(out.begin(), out.end(), [&](size_t s) { return s < lo || s > hi; }),
              out.end());
  }
  return out;
}

void abortJobAndRethrow(Bootstrap& boot) {
  try {
    throw;
  } catch (const Error& e) {
    if (e.code() != ErrorCode::Aborted) boot.abort(e.what());
    throw;
  } catch (const std::exception& e) {
    boot.abort(e.what());
    throw;
  }
}

size_t SweepOptions::itersFor(size_t bytes) const {
  return itersOption && itersOption->count() ? iters : scaled(iters, bytes, 20);
}

size_t SweepOptions::warmupFor(size_t bytes) const {
  return warmupOption && warmupOption->count() ? warmup : scaled(warmup, bytes, 2);
}

}  // namespace strata::perf
