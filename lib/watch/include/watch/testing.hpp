#pragma once
#ifndef STRATA_INTERNAL_HEADERS
#error "watch/testing.hpp is internal to strata: applications include <strata/...> only"
#endif

// A test seam over lib/watch's analysis (analysis.cpp), whose helpers stay private to it: the
// rank-list formatting, the wait-for analysis that findCulprits() runs over the peers' answers,
// and the text `strata-info --job` prints. Defined in the strata_testing library, which only
// tests link (not libstrata.so).

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "watch/watch.hpp"

namespace strata::watch::testing {

/// Ranks as error messages list them: sorted, runs of three or more as "a-b", pairs as "a, b",
/// at most 12 groups and then " and N more".
std::string rankList(std::vector<int> ranks);

/// What findCulprits() finds in `answers` (one per rank, index = rank) when the failing call of
/// rank `selfRank` is `ref`.
struct Finding {
  std::vector<int> culprits;                ///< the ranks at fault, the most telling first
  std::map<int, std::vector<int>> waiters;  ///< culprit -> the ranks whose waits lead to it
  std::string text;                         ///< the verdict as rank `selfRank`'s error puts it
};
Finding analyse(const std::vector<Answer>& answers, const CallReport& ref, int selfRank);

/// The text `strata-info --job` prints for job `jobId`, asked from rank `rank`, of
/// `answers.size()` ranks.
std::string describe(uint64_t jobId, int rank, const std::vector<Answer>& answers);

}  // namespace strata::watch::testing
