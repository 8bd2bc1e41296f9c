#include "stats.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <stdexcept>

#include <fmt/format.h>

namespace strata::perf {

Summary summarize(std::vector<double> samples) {
  Summary s;
  if (samples.empty()) return s;
  std::sort(samples.begin(), samples.end());
  const size_t n = samples.size();
  s.min = samples.front();
  s.max = samples.back();
  s.median = n % 2 ? samples[n / 2] : (samples[n / 2 - 1] + samples[n / 2]) / 2;
  // Nearest rank, so that p99 is always an observed value (as in nccl-tests -I statistics).
  size_t rank = static_cast<size_t>(std::ceil(0.99 * static_cast<double>(n)));
  s.p99 = samples[std::clamp<size_t>(rank, 1, n) - 1];
  return s;
}

size_t parseBytes(std::string_view text) {
  auto bad = [&] {
    return std::invalid_argument(
        fmt::format("'{}' is not a byte count (examples: 64, 8K, 1M, 2G)", text));
  };
  size_t i = 0;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) ++i;
  if (i == 0 || i > 19) throw bad();
  unsigned long long value = std::stoull(std::string(text.substr(0, i)));
  std::string unit;
  for (char c : text.substr(i))
    unit += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  unsigned shift = 0;
  if (unit.empty() || unit == "B") {
    shift = 0;
  } else if (unit == "K" || unit == "KB" || unit == "KIB") {
    shift = 10;
  } else if (unit == "M" || unit == "MB" || unit == "MIB") {
    shift = 20;
  } else if (unit == "G" || unit == "GB" || unit == "GIB") {
    shift = 30;
  } else {
    throw bad();
  }
  if (value > (std::numeric_limits<size_t>::max() >> shift)) throw bad();
  return static_cast<size_t>(value) << shift;
}

std::string formatBytes(size_t bytes) {
  constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB"};
  size_t unit = 0;
  size_t value = bytes;
  while (unit + 1 < std::size(kUnits) && value >= 1024 && value % 1024 == 0) {
    value /= 1024;
    ++unit;
  }
  return fmt::format("{} {}", value, kUnits[unit]);
}

std::vector<size_t> sizeList(size_t minBytes, size_t maxBytes, size_t factor,
                             const std::vector<size_t>& extra) {
  std::vector<size_t> sizes;
  if (minBytes <= maxBytes) {
    size_t s = minBytes;
    while (s <= maxBytes) {
      sizes.push_back(s);
      size_t next = factor >= 2 ? s * factor : s + std::max<size_t>(minBytes, 1);
      if (next <= s) break;  // overflow, or a zero start with a factor
      s = next;
    }
    sizes.push_back(maxBytes);
  }
  sizes.insert(sizes.end(), extra.begin(), extra.end());
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  return sizes;
}

}  // namespace strata::perf
