// Auto's measured choice between single copy and the slots (collectives/host/measured_choice.hpp):
// which calls are measured, a block of calls per way with one warm-up call each, medians, the
// decision from the ranks' totals, and measuring again after the interval. Times are given,
// never measured: nothing here depends on the machine's speed.
#define BOOST_TEST_MODULE measured_choice
#include <boost/test/unit_test.hpp>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "collectives/host/measured_choice.hpp"

using strata::backend::CollectiveOp;
using strata::collectives::MeasuredChoice;
using Way = MeasuredChoice::Way;

namespace {

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = 1024 * kKiB;

const char* name(Way w) {
  return strata::collectives::toString(w);
}

/// Runs the calls of one class as the backend does: each call takes pick()'s way and records
/// the time `cost(way, call)`; returns the calls made until record() asked for agreement.
template <typename Cost>
int measureClass(MeasuredChoice& m, CollectiveOp op, uint64_t bytes, Cost cost) {
  for (int call = 0; call < 1000; ++call) {
    const Way w = m.pick(op, bytes);
    BOOST_REQUIRE(w != Way::Static);
    BOOST_REQUIRE(m.timed(op, bytes, w));
    if (m.record(op, bytes, w, cost(w, call))) return call + 1;
  }
  BOOST_FAIL("the class never completed");
  return -1;
}

}  // namespace

BOOST_AUTO_TEST_CASE(only_the_reading_ops_between_16_KiB_and_4_MiB_are_measured) {
  MeasuredChoice m(8);
  BOOST_TEST(name(m.pick(CollectiveOp::AllGather, 16 * kKiB)) == name(Way::Slots));
  BOOST_TEST(name(m.pick(CollectiveOp::AllGather, 16 * kKiB - 1)) == name(Way::Static));
  BOOST_TEST(name(m.pick(CollectiveOp::AllReduce, 4 * kMiB - 1)) == name(Way::Slots));
  BOOST_TEST(name(m.pick(CollectiveOp::AllReduce, 4 * kMiB)) == name(Way::Static));
  for (CollectiveOp op : {CollectiveOp::Send, CollectiveOp::Recv, CollectiveOp::SendRecv}) {
    BOOST_TEST(name(m.pick(op, 64 * kKiB)) == name(Way::Static));
    BOOST_TEST(!m.timed(op, 64 * kKiB, Way::Slots));
    BOOST_TEST(!m.record(op, 64 * kKiB, Way::Slots, 1));
  }
  // Off: nothing is measured.
  MeasuredChoice off(0);
  BOOST_TEST(name(off.pick(CollectiveOp::AllGather, 64 * kKiB)) == name(Way::Static));
  BOOST_TEST(!off.timed(CollectiveOp::AllGather, 64 * kKiB, Way::Slots));
  BOOST_TEST(off.callsFor(64 * kKiB) == 0u);
}

BOOST_AUTO_TEST_CASE(calls_per_way_fall_from_256_KiB) {
  MeasuredChoice m(8);
  BOOST_TEST(m.callsFor(16 * kKiB) == 8u);
  BOOST_TEST(m.callsFor(256 * kKiB - 1) == 8u);
  BOOST_TEST(m.callsFor(256 * kKiB) == 4u);
  BOOST_TEST(m.callsFor(512 * kKiB) == 2u);
  BOOST_TEST(m.callsFor(1 * kMiB) == 2u);  // at least 2
  BOOST_TEST(m.callsFor(4 * kMiB - 1) == 2u);
  MeasuredChoice one(1);
  BOOST_TEST(one.callsFor(2 * kMiB) == 1u);  // fewer than 2 only when asked for fewer
  MeasuredChoice many(1000);
  BOOST_TEST(many.calls() == MeasuredChoice::kMaxCalls);
}

BOOST_AUTO_TEST_CASE(two_blocks_per_way_and_the_first_call_of_each_only_warms_up) {
  MeasuredChoice m(3);
  const auto op = CollectiveOp::AllGather;
  const uint64_t bytes = 100 * kKiB;
  // Slots, single copy, slots, single copy; each block a warm-up, then 2 and 1 timed calls.
  const std::vector<Way> want = {Way::Slots,      Way::Slots,      Way::Slots, Way::SingleCopy,
                                 Way::SingleCopy, Way::SingleCopy, Way::Slots, Way::Slots,
                                 Way::SingleCopy, Way::SingleCopy};
  const std::vector<int> warmUps = {0, 3, 6, 8};
  std::vector<Way> ways;
  // The slots cost 10 on every call, single copy 20, except each block's first call (1000:
  // the page faults of new buffers, the switch from the other way).
  int calls = measureClass(m, op, bytes, [&](Way w, int call) -> uint64_t {
    ways.push_back(w);
    for (int c : warmUps) {
      if (call == c) return 1000;
    }
    return w == Way::Slots ? 10 : 20;
  });
  BOOST_TEST(calls == 10);  // 4 warm-ups + 2 x 3
  BOOST_REQUIRE(ways.size() == want.size());
  for (size_t i = 0; i < ways.size(); ++i) {
    BOOST_TEST(name(ways[i]) == name(want[i]), "call " << i);
  }
  const auto med = m.medians(op, bytes);
  BOOST_TEST(med[0] == 10u);  // the warm-ups' 1000 are not in them
  BOOST_TEST(med[1] == 20u);
  // Until the ranks agree, the class is complete but undecided: nothing more is timed.
  BOOST_TEST(m.decision(op, bytes).empty());
}

BOOST_AUTO_TEST_CASE(one_call_per_way_is_one_block_each) {
  MeasuredChoice m(1);
  std::vector<Way> ways;
  int calls = measureClass(m, CollectiveOp::AllReduce, 64 * kKiB, [&](Way w, int) {
    ways.push_back(w);
    return 1;
  });
  BOOST_TEST(calls == 4);
  const std::vector<Way> want = {Way::Slots, Way::Slots, Way::SingleCopy, Way::SingleCopy};
  BOOST_REQUIRE(ways.size() == want.size());
  for (size_t i = 0; i < ways.size(); ++i) {
    BOOST_TEST(name(ways[i]) == name(want[i]), "call " << i);
  }
}

BOOST_AUTO_TEST_CASE(medians_ignore_a_preempted_call) {
  MeasuredChoice m(5);
  const auto op = CollectiveOp::ReduceScatter;
  const uint64_t bytes = 32 * kKiB;
  // Single copy is faster (15 against 20), but one of its calls met a preemption (5000): a
  // sum would choose the slots, the median does not.
  int sc = 0;
  measureClass(m, op, bytes, [&](Way w, int) -> uint64_t {
    if (w == Way::Slots) return 20;
    return ++sc == 3 ? 5000 : 15;
  });
  const auto med = m.medians(op, bytes);
  BOOST_TEST(med[0] == 20u);
  BOOST_TEST(med[1] == 15u);
  BOOST_TEST(name(m.decide(op, bytes, med, 1)) == name(Way::SingleCopy));
}

BOOST_AUTO_TEST_CASE(the_ranks_totals_decide_and_a_tie_keeps_the_slots) {
  MeasuredChoice m(1);
  const auto op = CollectiveOp::AllReduce;
  const uint64_t a = 64 * kKiB, b = 128 * kKiB, c = 1 * kMiB;
  for (uint64_t bytes : {a, b, c}) measureClass(m, op, bytes, [](Way, int) { return 1; });
  // Rank 0 found single copy faster, but the sum over the ranks says the slots.
  BOOST_TEST(name(m.decide(op, a, {3000, 4000}, 2)) == name(Way::Slots));
  BOOST_TEST(name(m.decide(op, b, {4000, 3000}, 2)) == name(Way::SingleCopy));
  BOOST_TEST(name(m.decide(op, c, {5000, 5000}, 2)) == name(Way::Slots));
  BOOST_TEST(name(m.pick(op, a)) == name(Way::Slots));
  BOOST_TEST(name(m.pick(op, b + 1000)) == name(Way::SingleCopy));  // the same class
  BOOST_TEST(name(m.decided(op, b)) == name(Way::SingleCopy));
  BOOST_TEST(name(m.pick(op, c)) == name(Way::Slots));
  // Decided: not timed any more, and record() never asks for agreement again.
  BOOST_TEST(!m.timed(op, b, Way::SingleCopy));
  BOOST_TEST(!m.record(op, b, Way::SingleCopy, 1));
  // Another op of the same size is its own class; while it is measured nothing is decided.
  BOOST_TEST(name(m.pick(CollectiveOp::AllGather, b)) == name(Way::Slots));
  BOOST_TEST(name(m.decided(CollectiveOp::AllGather, b)) == name(Way::Static));
  BOOST_TEST(m.timed(CollectiveOp::AllGather, b, Way::Slots));
  // The report: one line per decided class, with the per-rank mean of the medians in us.
  const std::string line = m.decision(op, b);
  BOOST_TEST(line.find("allReduce 128 KiB-256 KiB per rank: singlecopy, 1.5 us per call against "
                       "2.0 through the slots") != std::string::npos,
             line);
  BOOST_TEST(m.decisions().size() == 3u);
}

BOOST_AUTO_TEST_CASE(a_way_that_did_not_run_is_not_timed) {
  // A forced algorithm runs its way on every call: the other way's turn is never recorded,
  // so the class never completes and no agreement round is ever asked for.
  MeasuredChoice m(2);
  const auto op = CollectiveOp::Broadcast;
  const uint64_t bytes = 48 * kKiB;
  for (int i = 0; i < 2; ++i) BOOST_TEST(!m.record(op, bytes, Way::Slots, 5));
  BOOST_TEST(name(m.pick(op, bytes)) == name(Way::SingleCopy));
  for (int i = 0; i < 10; ++i) {
    BOOST_TEST(!m.timed(op, bytes, Way::Slots));
    BOOST_TEST(!m.record(op, bytes, Way::Slots, 5));
  }
  BOOST_TEST(m.medians(op, bytes)[0] == 5u);
  BOOST_TEST(m.medians(op, bytes)[1] == 0u);
  BOOST_TEST(!m.record(op, bytes, Way::Static, 5));
}

BOOST_AUTO_TEST_CASE(a_decision_is_measured_again_after_its_interval) {
  MeasuredChoice m(1);
  const auto op = CollectiveOp::AllToAll;
  const uint64_t bytes = 20 * kKiB;
  measureClass(m, op, bytes, [](Way, int) { return 1; });
  m.decide(op, bytes, {10, 20}, 2);
  // A call that ran another way (a zero-copy call, say) does not count: only ran() does.
  for (uint64_t i = 1; i < MeasuredChoice::kRemeasureFirst; ++i) m.ran(op, bytes);
  BOOST_TEST(name(m.pick(op, bytes)) == name(Way::Slots));
  BOOST_TEST(!m.timed(op, bytes, Way::Slots));
  m.ran(op, bytes);  // the 1024th
  // Measuring again: both blocks start over, warm-ups included.
  BOOST_TEST(m.timed(op, bytes, Way::Slots));
  BOOST_TEST(m.medians(op, bytes)[0] == 0u);
  BOOST_TEST(!m.decision(op, bytes).empty());  // the last decision still shows
  int calls = measureClass(m, op, bytes, [](Way w, int) { return w == Way::Slots ? 30 : 10; });
  BOOST_TEST(calls == 4);
  BOOST_TEST(name(m.decide(op, bytes, {60, 20}, 2)) == name(Way::SingleCopy));
  BOOST_TEST(m.decision(op, bytes).find("measurement 2") != std::string::npos);
  // The next interval is four times longer.
  for (uint64_t i = 1; i < 4 * MeasuredChoice::kRemeasureFirst; ++i) m.ran(op, bytes);
  BOOST_TEST(!m.timed(op, bytes, Way::SingleCopy));
  m.ran(op, bytes);
  BOOST_TEST(m.timed(op, bytes, Way::Slots));
}
