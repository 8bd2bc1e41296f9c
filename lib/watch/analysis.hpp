#pragma once

// Private to lib/watch (and its test seam, watch/testing.hpp): the analysis of the peers'
// answers (analysis.cpp).

#include <map>
#include <string>
#include <vector>

#include "served_scope.hpp"

namespace strata::watch {

/// Ranks as error messages list them: sorted, runs of three or more as "a-b", pairs as "a, b",
/// at most 12 groups and then " and N more".
std::string rankList(std::vector<int> ranks);

enum class CulpritKind { Mismatch, NoAnswer, Elsewhere, Unreachable, Exited };

struct Culprit {
  int rank = -1;
  CulpritKind kind = CulpritKind::NoAnswer;
  std::string why;
  bool tentative = false;  ///< another sequence number only: see analyse()
};

struct Analysis {
  std::vector<Culprit> culprits;
  std::map<int, std::vector<int>> waiters;  ///< culprit -> ranks whose waits lead to it
};

/// What a set of answers (one per rank, index = rank) says about `ref`, the call the job is in
/// (the failing call of rank `selfRank`, or the call most ranks are in): the culprits, most
/// telling first, and who waited for each.
Analysis analyse(const std::vector<Answer>& answers, const CallReport& ref, int selfRank);
/// The verdict as rank `selfRank` puts it (-1: as any rank; it names itself "this rank").
std::string verdictText(const Analysis& v, const std::vector<Answer>& answers, int selfRank);
/// strata-info --job's text: a line per rank, then the verdict.
std::string describeAnswers(uint64_t jobId, int size, int rank, const std::vector<Answer>& answers,
                            const std::vector<PeerInfo>& peers);

}  // namespace strata::watch
