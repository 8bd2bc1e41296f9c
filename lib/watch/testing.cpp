// The test seam of watch/testing.hpp (in the strata_testing library, for tests only).

#include "watch/testing.hpp"

#include "analysis.hpp"

namespace strata::watch::testing {

std::string rankList(std::vector<int> ranks) {
  return watch::rankList(std::move(ranks));
}

Finding analyse(const std::vector<Answer>& answers, const CallReport& ref, int selfRank) {
  Analysis v = watch::analyse(answers, ref, selfRank);
  Finding f;
  for (const Culprit& c : v.culprits) f.culprits.push_back(c.rank);
  f.waiters = v.waiters;
  f.text = verdictText(v, answers, selfRank);
  return f;
}

std::string describe(uint64_t jobId, int rank, const std::vector<Answer>& answers) {
  return describeAnswers(jobId, static_cast<int>(answers.size()), rank, answers, {});
}

}  // namespace strata::watch::testing
