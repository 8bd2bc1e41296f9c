#pragma once

// Output of strata-perf on rank 0: an nccl-tests-like table (header lines start with '#') and,
// optionally, one JSON object per row. Other modes reuse it with their own op names.

#include <cstdio>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "stats.hpp"

namespace strata::perf {

struct Row {
  std::string op;  ///< "rendezvous", "allgather", "barrier", "sendrecv", ...
  size_t bytes = 0;
  size_t iters = 0;
  Summary us;  ///< microseconds
};

class Reporter {
 public:
  /// jsonPath: empty for none, "-" for stdout (the table then goes to stderr so that stdout
  /// holds only JSON lines), else a file that is created or truncated.
  /// Throws std::runtime_error when the file cannot be opened.
  Reporter(std::string mode, std::string backend, int nranks, const std::string& jsonPath);
  ~Reporter();
  Reporter(const Reporter&) = delete;
  Reporter& operator=(const Reporter&) = delete;

  /// A '#' line above the column header (or a note between rows).
  void comment(std::string_view text);
  /// Prints the column header; call once after the comments.
  void columns();
  void row(const Row& row);

 private:
  std::string mode_;
  std::string backend_;
  int nranks_;
  std::FILE* table_;
  std::FILE* json_ = nullptr;
  bool ownJson_ = false;
};

/// JSON string literal with quotes and escapes.
std::string jsonString(std::string_view text);

}  // namespace strata::perf
