#pragma once

// What a collective mode prints on rank 0 (strata-perf allreduce, ...), nccl-tests' layout: the
// header with the flags, the job and each rank's device, a row per size from every rank's
// measurements, and the trailer.

#include <cstdint>
#include <string>
#include <vector>

#include <strata/communicator.hpp>

#include "coll_data.hpp"
#include "coll_options.hpp"
#include "report.hpp"

namespace strata::perf {

/// What each rank tells rank 0 for the header (one allGather slot).
struct RankRecord {
  int32_t pid = 0;
  char host[60] = {};
  int32_t device = -1;  ///< --memory cuda: the rank's CUDA device
  int32_t pciBus = 0;
  char deviceName[64] = {};
};

/// One rank's measurements of one size (one allGather slot).
struct RankResult {
  double outUs = 0;
  double inUs = 0;
  int64_t outWrong = 0;
  int64_t inWrong = 0;
};

/// The header lines: flags, job, memory, algorithm and one line per rank's device.
void printHeader(Reporter& out, CollKind kind, const CollOptions& opt, Communicator& comm,
                 const std::vector<RankRecord>& ranks);

/// Sums of a sweep for the trailer.
struct CollTotals {
  int64_t wrong = 0;
  double busbwSum = 0;
  size_t busbwCount = 0;
};

/// The row of case `c` from every rank's results (index = rank), with the algorithm the
/// communicator's last call ran; adds the row to `totals`. `check`: the results were checked.
CollRow collRow(const CollCase& c, Communicator& comm, const std::vector<RankResult>& all,
                bool check, CollTotals& totals);

/// "cuda/oneshot (grid 8 block 512)"; the name alone when the algorithm launched no kernel.
std::string algorithmText(const CollRow& row);

/// The trailer: wrong values over the whole sweep and the average bus bandwidth.
void printTrailer(Reporter& out, const CollTotals& totals);

}  // namespace strata::perf
