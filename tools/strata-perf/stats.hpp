#pragma once

// Small helpers shared by every strata-perf mode: summary statistics, byte-size parsing and the
// list of message sizes to sweep.

#include <chrono>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace strata::perf {

/// Summary of a sample in microseconds.
struct Summary {
  double min = 0;
  double median = 0;
  double p99 = 0;  ///< nearest-rank 99th percentile: with fewer than 100 samples it is the max
  double max = 0;
};

/// Microseconds since start on the steady clock.
inline double usSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
      .count();
}

/// Sorts a copy; an empty sample gives all zeros.
Summary summarize(std::vector<double> samples);

/// "64", "8K", "1M", "2G" (binary multiples, as nccl-tests reads -b/-e); also "1KiB", "1MB".
/// Throws std::invalid_argument naming the text.
size_t parseBytes(std::string_view text);

/// "64 B", "8 KiB", "1 MiB" when exact, else the plain byte count.
std::string formatBytes(size_t bytes);

/// minBytes, minBytes * factor, ... up to maxBytes; maxBytes itself is always included, and
/// so is every entry of extra (sorted, duplicates removed). factor < 2 steps by minBytes.
std::vector<size_t> sizeList(size_t minBytes, size_t maxBytes, size_t factor,
                             const std::vector<size_t>& extra = {});

}  // namespace strata::perf
