#pragma once

// Which of the two ways auto runs a call on one host (single copy, or the algorithm it would
// run through the shared slots), decided by timing both on the job's first calls of each size
// class.
//
// The probe at create (tuning.hpp) compares a kernel copy with a mapped copy of a peer's page
// just written, and the cost model turns that into crossovers. What it cannot see is how the
// job's own buffers sit in the caches: a send buffer that no one writes between calls (a
// benchmark loop, weights broadcast again) stays in the reader's cache, so process_vm_readv
// reads it without moving a line between cores, while the slots move every byte between the
// cores twice per call. On one AMD EPYC (2 vCPUs) allGather at 2 ranks of 64 KiB per rank ran
// in 11.4-12.3 us by single copy and 12.6-13.9 us through the slots, where the probe's ratio
// (0.2-0.4) chose the slots. So within [kMinBytes, kMaxBytes) per rank, auto runs the first
// calls of each (op, power-of-two size) class in blocks of one way, then the other (slots,
// single copy, slots, single copy: two blocks each, against drift and the job's first calls),
// every rank times them (the first call of each block only warms up: it pays the page faults
// of buffers touched for the first time and the switch from the other way), and on the call
// that completes the class the ranks add up their median times (one 16-byte allReduce) and all
// take the way with the smaller sum. Blocks, not alternate calls: alternating, each call ran
// right after the other way's and took its toll (allReduce of 64 KiB per rank at 2 ranks: the
// slots timed 17.6-20.1 us alternating, 14.5-15.4 in a block, 15.5 forced). Medians, because one
// call in a few meets a preemption or a page fault that is no property of the way. A decision
// is measured again after kRemeasureFirst further calls of its class, then after four times as
// many each time (at most kRemeasureMost): a machine's speed moves (one virtual machine ran its
// cross-core copies 3-7x slower for a minute at a time), and a choice made in such a minute
// should not stay for the whole job. Every rank sees the same calls in the same order and
// records the same ones, so every rank measures, agrees and decides on the same call.

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include <strata/backend/collectives.hpp>

namespace strata::collectives {

class MeasuredChoice {
 public:
  /// The classes measured: bytes per rank from kMinBytes (below it single copy's two message
  /// rounds cost more than any copy it saves) up to kMaxBytes (above it the calls are
  /// bandwidth-bound and the probe's model holds; measuring them would cost whole calls).
  static constexpr uint64_t kMinBytes = 16 * 1024;
  static constexpr uint64_t kMaxBytes = 4 * 1024 * 1024;
  static constexpr uint32_t kMaxCalls = 64;
  static constexpr uint64_t kRemeasureFirst = 1024;
  static constexpr uint64_t kRemeasureMost = 65536;

  enum class Way : int8_t {
    Static = -1,     ///< not measured: the crossovers of the probe (or configuration) decide
    Slots = 0,       ///< oneshot or twoshot (allReduce), direct (the others)
    SingleCopy = 1,  ///< process_vm_readv from the peers' buffers
  };

  /// calls: timed calls of each way per class (collectives.measure_calls); 0: never measure.
  /// Classes of 256 KiB per rank and more take proportionally fewer, at least 2 (a larger call
  /// varies less, and each costs more).
  explicit MeasuredChoice(uint32_t calls = 0);

  /// How auto runs a call of op with bytes per rank: the way this call takes while its class is
  /// measured (blocks: slots, single copy, slots, single copy), the decided way after, Static
  /// outside the classes or when off. Depends only on state that record and decide change, so every
  /// rank answers alike.
  Way pick(backend::CollectiveOp op, uint64_t bytes) const;
  /// The decided way of the class (Static while it is measured, outside the classes or when
  /// off): for calls that take no turn in the measuring (zero copy's fallback).
  Way decided(backend::CollectiveOp op, uint64_t bytes) const;
  /// Whether a call that runs `way` is one of its class's timed calls (pick gave that way and
  /// the class is not decided yet).
  bool timed(backend::CollectiveOp op, uint64_t bytes, Way way) const;
  /// Adds a timed call's nanoseconds on this rank (the first call of each block is a warm-up
  /// and only counted); true when this completed the class's samples, so that the caller must
  /// now agree with the other ranks (medians, then decide).
  bool record(backend::CollectiveOp op, uint64_t bytes, Way way, uint64_t ns);
  /// Counts a call of a decided class that ran its decided way; after the class's interval it
  /// starts measuring the class again (from the next call on).
  void ran(backend::CollectiveOp op, uint64_t bytes);
  /// This rank's median nanoseconds per way for the class (index: Slots, SingleCopy).
  std::array<uint64_t, 2> medians(backend::CollectiveOp op, uint64_t bytes) const;
  /// Decides the class from the medians summed over every rank (the same on every rank): the
  /// way with the smaller total; a tie keeps the slots. Returns the decision.
  Way decide(backend::CollectiveOp op, uint64_t bytes, std::array<uint64_t, 2> totals, int ranks);

  /// Timed calls per way for a class of bytes per rank, warm-up not counted (0 when off or out
  /// of the classes).
  uint32_t callsFor(uint64_t bytes) const;
  uint32_t calls() const { return calls_; }
  /// The decision of the class of a call of op with bytes per rank, in one line: "allGather
  /// 64 KiB-128 KiB per rank: singlecopy, 11.8 us per call against 13.1 through the slots
  /// (median of 8 calls each, ...)"; empty until its first decision (or outside the classes).
  std::string decision(backend::CollectiveOp op, uint64_t bytes) const;
  /// The lines of every decided class, by op then size.
  std::vector<std::string> decisions() const;

 private:
  static constexpr int kClasses = 8;  // 16 KiB .. 4 MiB, powers of two
  static constexpr int kOps = 5;      // the reading ops: allReduce, allGather, reduceScatter,
                                      // broadcast, allToAll
  struct Class {
    std::array<std::vector<uint64_t>, 2> ns;  ///< the timed calls of each way
    std::array<uint8_t, 2> warm{};            ///< each way's warm-up calls so far
    Way decided = Way::Static;
    std::array<uint64_t, 2> totals{};  ///< over the ranks, once decided
    int ranks = 0;
    uint64_t sinceDecided = 0;  ///< calls run since the decision
    uint32_t measurements = 0;  ///< decisions taken so far
  };
  /// The class of a call, or nullptr outside them.
  const Class* find(backend::CollectiveOp op, uint64_t bytes) const;
  Class* find(backend::CollectiveOp op, uint64_t bytes);

  uint32_t calls_;
  std::array<std::array<Class, kClasses>, kOps> classes_{};
};

const char* toString(MeasuredChoice::Way way);

}  // namespace strata::collectives
