#pragma once

// A test seam over the status service's analysis (lib/base/watch.cpp), whose helpers stay
// private to it: the rank-list formatting, the wait-for analysis that diagnose() runs over the
// peers' answers, and the text `strata-info --job` prints. Only tests include this header.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "base/watch.hpp"

namespace strata::watch::testing {

/// Ranks as error messages list them: sorted, runs of three or more as "a-b", pairs as "a, b",
/// at most 12 groups and then " and N more".
std::string rankList(std::vector<int> ranks);

/// What diagnose() finds in `answers` (one per rank, index = rank) when the failing call of rank
/// `selfRank` is `ref`.
struct Finding {
  std::vector<int> roots;                   ///< the ranks at fault, the most telling first
  std::map<int, std::vector<int>> waiters;  ///< root -> the ranks whose waits lead to it
  std::string text;                         ///< the verdict as rank `selfRank`'s error puts it
};
Finding analyse(const std::vector<Answer>& answers, const CallState& ref, int selfRank);

/// describeJob()'s text for job `jobId`, asked from rank `rank`, of `answers.size()` ranks.
std::string describe(uint64_t jobId, int rank, const std::vector<Answer>& answers);

}  // namespace strata::watch::testing
