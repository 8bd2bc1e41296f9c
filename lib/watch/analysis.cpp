// The analysis of the peers' answers: which ranks are the culprits of a stall, who waited for
// each, and the texts the errors and `strata-info --job` print.

#include "analysis.hpp"

#include <algorithm>
#include <map>
#include <tuple>

#include <fmt/format.h>

namespace strata::watch {

std::string rankList(std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  std::string s;
  size_t shown = 0;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (shown >= 12) {
      s += fmt::format(" and {} more", ranks.size() - i);
      break;
    }
    if (!s.empty()) s += ", ";
    if (j - i >= 2) {
      s += fmt::format("{}-{}", ranks[i], ranks[j]);
    } else {
      s += std::to_string(ranks[i]);
      if (j > i) s += ", " + std::to_string(ranks[j]);
    }
    ++shown;
    i = j + 1;
  }
  return s;
}

namespace {

std::string ranksWord(const std::vector<int>& ranks) {
  size_t n = ranks.size();
  return fmt::format("{} {}", n == 1 ? "rank" : "ranks", rankList(ranks));
}

std::string callLabel(const CallReport& c, bool withDomain) {
  std::string s = c.seq > 0 ? fmt::format("{} #{}", c.op, c.seq) : c.op;
  if (withDomain && c.domain != "bootstrap" && c.domain.rfind("communicator", 0) != 0) return s;
  if (withDomain && c.domain == "bootstrap") return "bootstrap " + s;
  return s;
}

/// The innermost call of a state in a domain (the last started).
const CallReport* inDomain(const RankReport& s, const std::string& domain) {
  for (auto it = s.calls.rbegin(); it != s.calls.rend(); ++it) {
    if (it->domain == domain) return &*it;
  }
  return nullptr;
}

std::string whoIs(const Answer& a, int rank, int selfRank) {
  std::string self = rank == selfRank ? " (this rank)" : "";
  if (a.report.host.empty()) return fmt::format("rank {}{}", rank, self);
  return fmt::format("rank {}{} on host {} (pid {})", rank, self, a.report.host, a.report.pid);
}

std::string stateLine(const Answer& a, int rank) {
  std::string head = fmt::format("rank {:>4}  {}  pid {}", rank,
                                 a.report.host.empty() ? "?" : a.report.host, a.report.pid);
  switch (a.kind) {
    case Answer::Kind::NoAnswer:
      return head +
             "  NOT ANSWERING (stopped by a signal or a debugger, swapping, or starved of CPU)";
    case Answer::Kind::Exited:
      return head + "  EXITED or LEFT (its status port refuses connections)";
    case Answer::Kind::Unreachable:
      return head + "  UNREACHABLE: " + a.error;
    case Answer::Kind::Failed:
      return head + "  no answer: " + a.error;
    default:
      break;
  }
  if (a.report.calls.empty()) return head + "  not in any call";
  std::string s = head;
  for (const CallReport& c : a.report.calls) {
    s += fmt::format("  {} {} for {:.1f} s", c.domain, callLabel(c, false), c.seconds);
    if (c.waitingFor >= 0) {
      s += fmt::format(", waiting for rank {} for {:.1f} s", c.waitingFor, c.waitingSeconds);
      if (!c.detail.empty()) s += " (" + c.detail + ")";
    }
    if (c.failed) s += " [failed]";
  }
  return s;
}

}  // namespace

/// ref: the call the job is in (the failing call of this rank, or the most common one).
Analysis analyse(const std::vector<Answer>& answers, const CallReport& ref, int selfRank) {
  const int n = static_cast<int>(answers.size());
  Analysis v;
  std::vector<const CallReport*> cur(static_cast<size_t>(n), nullptr);
  std::map<std::pair<std::string, uint64_t>, std::vector<int>> byCall;
  for (int p = 0; p < n; ++p) {
    const Answer& a = answers[static_cast<size_t>(p)];
    if (a.kind != Answer::Kind::Answered && a.kind != Answer::Kind::Self) continue;
    cur[static_cast<size_t>(p)] = inDomain(a.report, ref.domain);
    if (cur[static_cast<size_t>(p)] && ref.seq > 0 && cur[static_cast<size_t>(p)]->seq > 0) {
      byCall[{cur[static_cast<size_t>(p)]->op, cur[static_cast<size_t>(p)]->seq}].push_back(p);
    }
  }
  // The call most ranks are in (ties: the reference's).
  std::pair<std::string, uint64_t> major{ref.op, ref.seq};
  size_t best = byCall.count(major) ? byCall[major].size() : 0;
  for (auto& [k, ranks] : byCall) {
    if (ranks.size() > best) {
      best = ranks.size();
      major = k;
    }
  }
  // For a point-to-point wait (no sequence number) only the ranks on this rank's chain of
  // waits matter: the others may be anywhere.
  std::vector<bool> onChain(static_cast<size_t>(n), ref.seq > 0);
  if (ref.seq == 0 && selfRank >= 0 && selfRank < n) {
    int q = selfRank;
    for (int hop = 0; hop < n; ++hop) {
      onChain[static_cast<size_t>(q)] = true;
      const CallReport* c = cur[static_cast<size_t>(q)];
      if (!c || c->waitingFor < 0 || c->waitingFor >= n) break;
      q = c->waitingFor;
      if (onChain[static_cast<size_t>(q)]) break;
      onChain[static_cast<size_t>(q)] = true;
      if (!cur[static_cast<size_t>(q)]) break;
    }
  }
  // At each sequence number the ranks are in, the operation most of them are in there (ties:
  // this rank's, else the first by name).
  std::map<uint64_t, std::string> opAt;
  for (auto& [k, ranks] : byCall) {
    auto& best = opAt[k.second];
    const bool mine = selfRank >= 0 && selfRank < n && cur[static_cast<size_t>(selfRank)] &&
                      cur[static_cast<size_t>(selfRank)]->seq == k.second &&
                      cur[static_cast<size_t>(selfRank)]->op == k.first;
    if (best.empty()) {
      best = k.first;
      continue;
    }
    const size_t have = byCall[{best, k.second}].size();
    if (ranks.size() > have || (ranks.size() == have && mine)) best = k.first;
  }
  const std::string majorLabel =
      major.second > 0 ? fmt::format("{} #{}", major.first, major.second) : major.first;
  for (int p = 0; p < n; ++p) {
    const Answer& a = answers[static_cast<size_t>(p)];
    const CallReport* c = cur[static_cast<size_t>(p)];
    Culprit r;
    r.rank = p;
    switch (a.kind) {
      case Answer::Kind::NoAnswer:
        r.kind = CulpritKind::NoAnswer;
        r.why =
            "made no progress: it is not answering (stopped by a signal or a debugger, "
            "swapping, or starved of CPU)";
        break;
      case Answer::Kind::Exited:
        r.kind = CulpritKind::Exited;
        r.why =
            "has exited or destroyed its end of this communicator (its status port refuses "
            "connections)";
        break;
      case Answer::Kind::Unreachable:
        r.kind = CulpritKind::Unreachable;
        r.why = fmt::format(
            "cannot be reached from rank {} ({}): the network between the two hosts may be down",
            selfRank, a.error);
        break;
      case Answer::Kind::Failed:
        continue;
      case Answer::Kind::Answered:
      case Answer::Kind::Self:
        if (!c) {
          if (!onChain[static_cast<size_t>(p)]) continue;
          r.kind = CulpritKind::Elsewhere;
          if (!a.report.calls.empty()) {
            const CallReport& other = a.report.calls.back();
            r.why = fmt::format("is in {} while {} in {}", callLabel(other, true),
                                byCall.count(major) && byCall[major].size() > 1
                                    ? ranksWord(byCall[major]) + " are"
                                    : "this rank is",
                                majorLabel);
          } else {
            r.why =
                "is in no strata call: it is running the application's own code (or "
                "finished its calls early)";
          }
          break;
        }
        if (ref.seq > 0 && c->seq > 0) {
          // Another operation at the same sequence number is a mismatch. Another sequence
          // number is not by itself: a rank that got all it needed from a call goes on to the
          // next one while the others still wait (a broadcast's root may run ahead further).
          const std::string& right = opAt[c->seq];
          if (!right.empty() && c->op != right) {
            r.kind = CulpritKind::Mismatch;
            const std::vector<int>& others = byCall[{right, c->seq}];
            r.why =
                fmt::format("is in {} #{} while {} {} in {} #{}", c->op, c->seq, ranksWord(others),
                            others.size() == 1 ? "is" : "are", right, c->seq);
            break;
          }
          if (c->op != major.first || c->seq != major.second) {
            // Tentative: kept below only when its waits come back to it (it skipped a call).
            r.kind = CulpritKind::Mismatch;
            r.tentative = true;
            std::vector<int> majors = byCall[major];
            r.why = fmt::format("is in {} #{} while {} {} in {}", c->op, c->seq, ranksWord(majors),
                                majors.size() == 1 ? "is" : "are", majorLabel);
            break;
          }
        }
        continue;
    }
    v.culprits.push_back(std::move(r));
  }
  // A rank in another sequence number of the same operation that waits, directly or through
  // others, for a rank at fault for another reason (not answering, exited, elsewhere) only lags
  // behind because of it: a stopped rank that sent its part of allReduce #50 to some ranks
  // and not to others leaves those in #50 while the rest are in #51. It waited; it is not the
  // cause. (A rank that skipped a call waits for ranks that wait for it: it stays named.)
  std::vector<bool> otherCulprit(static_cast<size_t>(n), false);
  for (auto& r : v.culprits) {
    if (r.kind != CulpritKind::Mismatch) otherCulprit[static_cast<size_t>(r.rank)] = true;
  }
  // Likewise a rank one call ahead or behind whose waits simply end (skew: it got all it
  // needed from one call and went on). Only one whose waits come back to it is kept.
  std::erase_if(v.culprits, [&](const Culprit& r) {
    if (!r.tentative) return false;
    std::vector<bool> seen(static_cast<size_t>(n), false);
    int q = r.rank;
    for (int hop = 0; hop <= n; ++hop) {
      const CallReport* w = cur[static_cast<size_t>(q)];
      if (!w || w->waitingFor < 0 || w->waitingFor >= n) return true;
      seen[static_cast<size_t>(q)] = true;
      q = w->waitingFor;
      if (otherCulprit[static_cast<size_t>(q)]) return true;
      if (seen[static_cast<size_t>(q)]) return false;
    }
    return true;
  });
  // Who waited for whom: follow each rank's waits to a culprit.
  std::vector<bool> isCulprit(static_cast<size_t>(n), false);
  for (auto& r : v.culprits) isCulprit[static_cast<size_t>(r.rank)] = true;
  for (int p = 0; p < n; ++p) {
    if (isCulprit[static_cast<size_t>(p)]) continue;
    int q = p;
    for (int hop = 0; hop < n; ++hop) {
      const CallReport* c = cur[static_cast<size_t>(q)];
      if (!c || c->waitingFor < 0 || c->waitingFor >= n) break;
      q = c->waitingFor;
      if (isCulprit[static_cast<size_t>(q)]) {
        v.waiters[q].push_back(p);
        break;
      }
    }
  }
  // By kind; within a kind, ranks that others wait for first.
  std::stable_sort(v.culprits.begin(), v.culprits.end(), [&](const Culprit& a, const Culprit& b) {
    if (a.kind != b.kind) return a.kind < b.kind;
    return v.waiters.count(a.rank) > v.waiters.count(b.rank);
  });
  return v;
}

std::string verdictText(const Analysis& v, const std::vector<Answer>& answers, int selfRank) {
  std::string s;
  size_t shown = 0;
  for (const Culprit& r : v.culprits) {
    if (shown == 4) {
      s += fmt::format("; and {} more rank(s) at fault", v.culprits.size() - shown);
      break;
    }
    if (!s.empty()) s += "; also ";
    s += whoIs(answers[static_cast<size_t>(r.rank)], r.rank, selfRank) + " " + r.why;
    auto w = v.waiters.find(r.rank);
    if (w != v.waiters.end() && !w->second.empty()) {
      s += fmt::format("; {} waited for it", ranksWord(w->second));
    }
    ++shown;
  }
  return s;
}

std::string describeAnswers(uint64_t jobId, int size, int rank, const std::vector<Answer>& answers,
                            const std::vector<PeerInfo>& peers) {
  std::string out = fmt::format("job {:016x}: {} ranks, asked from rank {}\n", jobId, size, rank);
  for (size_t p = 0; p < answers.size(); ++p) {
    out += stateLine(answers[p], static_cast<int>(p));
    if (p < peers.size() && !peers[p].address.empty()) {
      out += "  [status " + peers[p].address + "]";
    }
    out += "\n";
  }
  // The reference: the most common innermost (domain, op, seq) among ranks in a call.
  std::map<std::tuple<std::string, std::string, uint64_t>, int> count;
  for (auto& a : answers) {
    if ((a.kind == Answer::Kind::Answered || a.kind == Answer::Kind::Self) &&
        !a.report.calls.empty()) {
      const CallReport& c = a.report.calls.back();
      ++count[{c.domain, c.op, c.seq}];
    }
  }
  if (count.empty()) {
    bool allAnswered = std::all_of(answers.begin(), answers.end(), [](const Answer& a) {
      return a.kind == Answer::Kind::Answered || a.kind == Answer::Kind::Self;
    });
    out += allAnswered ? "verdict: every rank answered; none is in a strata call\n"
                       : "verdict: no rank is in a strata call; some did not answer (above)\n";
    return out;
  }
  auto best = std::max_element(count.begin(), count.end(),
                               [](auto& a, auto& b) { return a.second < b.second; });
  CallReport ref;
  std::tie(ref.domain, ref.op, ref.seq) = best->first;
  Analysis v = analyse(answers, ref, rank);
  if (v.culprits.empty()) {
    out += fmt::format(
        "verdict: every rank answered; the ranks in a call are in {} {} "
        "(nobody is stopped or in another call)\n",
        ref.domain, ref.seq > 0 ? fmt::format("{} #{}", ref.op, ref.seq) : ref.op);
  } else {
    out += "verdict: " + verdictText(v, answers, -1) + "\n";
  }
  return out;
}

std::string describeJob(const ServedScope& scope, const std::vector<Answer>& answers) {
  return describeAnswers(scope.jobId(), scope.size(), scope.rank(), answers, scope.peers);
}

Verdict ServedScope::findCulprits(const CallRecord& failing) noexcept {
  try {
    auto answers = collect(*this, queryTimeout);
    Analysis v = analyse(answers, report(failing), rank());
    if (v.culprits.empty()) return {};
    return {v.culprits.front().rank, verdictText(v, answers, -1), verdictText(v, answers, rank())};
  } catch (...) {
    return {};
  }
}

}  // namespace strata::watch
