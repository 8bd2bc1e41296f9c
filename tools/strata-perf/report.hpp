#pragma once

// Output of strata-perf on rank 0: an nccl-tests-like table (header lines start with '#') and,
// optionally, one JSON object per row. Other modes reuse it with their own op names.

#include <cstdint>
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

/// One row of a bandwidth mode (p2p): nccl-tests' size, count, time and algbw, plus the
/// one-way latency of a ping-pong at that size.
struct BandwidthRow {
  size_t bytes = 0;
  size_t count = 0;  ///< elements; for p2p the element is a byte
  size_t iters = 0;
  double timeUs = 0;   ///< per message in the bandwidth loop
  double gbps = 0;     ///< bytes / timeUs, GB = 1e9 B (nccl-tests' algbw)
  Summary latUs;       ///< one-way latency, microseconds
  int64_t wrong = -1;  ///< wrong bytes; -1: not checked (N/A)
};

/// One placement (out-of-place or in-place) of a collective-mode row.
struct CollResult {
  bool measured = false;  ///< false: not applicable (N/A in every column, no JSON line)
  double timeUs = 0;      ///< per iteration, averaged over ranks
  double algbw = 0;       ///< GB/s (1e9 B/s): size / time
  double busbw = 0;       ///< algbw * the op's bus factor
  int64_t wrong = -1;     ///< wrong elements over all ranks; -1: not checked (N/A)
};

/// One row of a collective mode (strata-perf allreduce, ...), nccl-tests' columns.
struct CollRow {
  std::string op;  ///< "allreduce", ...
  size_t bytes = 0;
  size_t count = 0;
  std::string type;
  std::string redop;      ///< "none" for the non-reducing ops
  int root = -1;          ///< -1 except broadcast
  std::string algorithm;  ///< "host/twoshot": what the last measured call ran
  std::string launch;     ///< "grid 8 block 512": its kernel launch; empty for host algorithms
  CollResult outOfPlace;
  CollResult inPlace;
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
  /// A line printed as given (nccl-tests' exact header lines).
  void line(std::string_view text);
  /// Collective modes: "label" and "memory" of every JSON row.
  void setLabel(std::string label) { label_ = std::move(label); }
  void setMemory(std::string memory) { memory_ = std::move(memory); }
  /// -G: launches of the CUDA graph per row; 0 (the default) adds no "graph" key.
  void setGraph(int graph) { graph_ = graph; }
  /// nccl-tests' two-level column header (out-of-place | in-place).
  void collColumns();
  /// One table row and one JSON line per measured placement: "tool", "label", "op", "nranks",
  /// "backend" (the constructor's), "memory", "size", "count", "type", "redop", "root",
  /// "algorithm", "launch" (only when the algorithm launched a kernel), "graph" (only with
  /// -G), "inplace", "time_us", "algbw", "busbw", "wrong" (null when not checked).
  void row(const CollRow& row);
  /// Bandwidth modes: a provider (or similar detail) added to every JSON row when not empty.
  void setProvider(std::string provider) { provider_ = std::move(provider); }
  /// Column header of the bandwidth rows; call once after the comments.
  void bandwidthColumns();
  /// JSON: "transport" (the backend given to the constructor), "provider" when set, the
  /// fields of BandwidthRow ("wrong": null when not checked).
  void row(const BandwidthRow& row);

 private:
  std::string mode_;
  std::string backend_;
  std::string provider_;
  std::string label_ = "strata";
  std::string memory_ = "host";
  int graph_ = 0;
  int nranks_;
  std::FILE* table_;
  std::FILE* json_ = nullptr;
  bool ownJson_ = false;
};

/// JSON string literal with quotes and escapes.
std::string jsonString(std::string_view text);

}  // namespace strata::perf
