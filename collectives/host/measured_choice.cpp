#include "measured_choice.hpp"

#include <algorithm>
#include <bit>
#include <utility>

#include <fmt/format.h>

namespace strata::collectives {

using backend::CollectiveOp;

namespace {

/// The index of a reading op, or -1.
int opIndex(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::AllReduce:
      return 0;
    case CollectiveOp::AllGather:
      return 1;
    case CollectiveOp::ReduceScatter:
      return 2;
    case CollectiveOp::Broadcast:
      return 3;
    case CollectiveOp::AllToAll:
      return 4;
    case CollectiveOp::Send:
    case CollectiveOp::Recv:
    case CollectiveOp::SendRecv:
      break;
  }
  return -1;
}

constexpr const char* kOpNames[] = {"allReduce", "allGather", "reduceScatter", "broadcast",
                                    "allToAll"};

/// The power-of-two class of bytes, counted from kMinBytes (0) up; -1 outside.
int classIndex(uint64_t bytes) {
  if (bytes < MeasuredChoice::kMinBytes || bytes >= MeasuredChoice::kMaxBytes) return -1;
  return std::bit_width(bytes) - std::bit_width(MeasuredChoice::kMinBytes);
}

std::string sizeText(uint64_t bytes) {
  return bytes >= 1024 * 1024 ? fmt::format("{} MiB", bytes / (1024 * 1024))
                              : fmt::format("{} KiB", bytes / 1024);
}

}  // namespace

const char* toString(MeasuredChoice::Way way) {
  switch (way) {
    case MeasuredChoice::Way::Slots:
      return "slots";
    case MeasuredChoice::Way::SingleCopy:
      return "singlecopy";
    case MeasuredChoice::Way::Static:
      break;
  }
  return "static";
}

MeasuredChoice::MeasuredChoice(uint32_t calls) : calls_(std::min(calls, kMaxCalls)) {}

uint32_t MeasuredChoice::callsFor(uint64_t bytes) const {
  const int c = classIndex(bytes);
  if (calls_ == 0 || c < 0) return 0;
  // Below 256 KiB (classes 0..3) all of them; then half per doubling, at least 2.
  const int shift = std::max(0, c - 3);
  return std::max(std::min(calls_, 2u), calls_ >> shift);
}

const MeasuredChoice::Class* MeasuredChoice::find(CollectiveOp op, uint64_t bytes) const {
  const int o = opIndex(op);
  const int c = classIndex(bytes);
  if (calls_ == 0 || o < 0 || c < 0) return nullptr;
  return &classes_[static_cast<size_t>(o)][static_cast<size_t>(c)];
}

MeasuredChoice::Class* MeasuredChoice::find(CollectiveOp op, uint64_t bytes) {
  return const_cast<Class*>(std::as_const(*this).find(op, bytes));
}

MeasuredChoice::Way MeasuredChoice::pick(CollectiveOp op, uint64_t bytes) const {
  const Class* k = find(op, bytes);
  if (!k) return Way::Static;
  if (k->decided != Way::Static) return k->decided;
  // Two blocks of calls per way, in the order slots, single copy, slots, single copy, each a
  // warm-up and then half the timed calls (the second block the rest).
  const size_t need = callsFor(bytes);
  const size_t half = (need + 1) / 2;
  const size_t slots = k->ns[0].size(), single = k->ns[1].size();
  if (k->warm[0] < 1 || slots < half) return Way::Slots;
  if (k->warm[1] < 1 || single < half) return Way::SingleCopy;
  if (k->warm[0] < 2 || slots < need) return Way::Slots;
  return Way::SingleCopy;
}

MeasuredChoice::Way MeasuredChoice::decided(CollectiveOp op, uint64_t bytes) const {
  const Class* k = find(op, bytes);
  return k ? k->decided : Way::Static;
}

bool MeasuredChoice::timed(CollectiveOp op, uint64_t bytes, Way way) const {
  const Class* k = find(op, bytes);
  return k && k->decided == Way::Static && way != Way::Static && pick(op, bytes) == way;
}

bool MeasuredChoice::record(CollectiveOp op, uint64_t bytes, Way way, uint64_t ns) {
  if (!timed(op, bytes, way)) return false;
  Class& k = *find(op, bytes);
  const size_t w = static_cast<size_t>(way);
  // The first call of each block warms up: of the first block at once, of the second after
  // the first block's timed calls.
  const uint32_t need = callsFor(bytes);
  const size_t half = (need + 1) / 2;
  if (k.warm[w] == 0 || (k.warm[w] == 1 && k.ns[w].size() == half && need > 1)) {
    ++k.warm[w];
  } else {
    k.ns[w].push_back(ns);
  }
  return k.ns[0].size() >= need && k.ns[1].size() >= need;
}

std::array<uint64_t, 2> MeasuredChoice::medians(CollectiveOp op, uint64_t bytes) const {
  std::array<uint64_t, 2> out{};
  const Class* k = find(op, bytes);
  if (!k) return out;
  for (size_t w = 0; w < 2; ++w) {
    std::vector<uint64_t> v = k->ns[w];
    if (v.empty()) continue;
    std::sort(v.begin(), v.end());
    // The lower median of an even count.
    out[w] = v[(v.size() - 1) / 2];
  }
  return out;
}

MeasuredChoice::Way MeasuredChoice::decide(CollectiveOp op, uint64_t bytes,
                                           std::array<uint64_t, 2> totals, int ranks) {
  Class* k = find(op, bytes);
  if (!k) return Way::Static;
  k->decided = totals[1] < totals[0] ? Way::SingleCopy : Way::Slots;
  k->totals = totals;
  k->ranks = ranks;
  k->sinceDecided = 0;
  ++k->measurements;
  return k->decided;
}

void MeasuredChoice::ran(CollectiveOp op, uint64_t bytes) {
  Class* k = find(op, bytes);
  if (!k || k->decided == Way::Static) return;
  const uint32_t shift = 2 * std::min<uint32_t>(k->measurements - 1, 6);
  const uint64_t interval = std::min(kRemeasureFirst << shift, kRemeasureMost);
  if (++k->sinceDecided < interval) return;
  k->decided = Way::Static;
  k->ns[0].clear();
  k->ns[1].clear();
  k->warm = {};
}

std::string MeasuredChoice::decision(CollectiveOp op, uint64_t bytes) const {
  const Class* k = find(op, bytes);
  if (!k || k->measurements == 0 || k->ranks <= 0) return {};
  const uint64_t low = uint64_t{1} << (std::bit_width(bytes) - 1);
  const uint32_t n = callsFor(bytes);
  auto perCall = [&](size_t w) {
    return static_cast<double>(k->totals[w]) / 1e3 / static_cast<double>(k->ranks);
  };
  // While a class is measured again, its last decision.
  const Way way = k->totals[1] < k->totals[0] ? Way::SingleCopy : Way::Slots;
  const size_t chosen = static_cast<size_t>(way);
  return fmt::format(
      "{} {}-{} per rank: {}, {:.1f} us per call against {:.1f} {} (median of {} calls each, "
      "in two blocks after a warm-up call each; mean over {} ranks; measurement {})",
      kOpNames[opIndex(op)], sizeText(low), sizeText(low * 2), toString(way), perCall(chosen),
      perCall(1 - chosen), way == Way::SingleCopy ? "through the slots" : "by single copy", n,
      k->ranks, k->measurements);
}

std::vector<std::string> MeasuredChoice::decisions() const {
  constexpr CollectiveOp kOrder[] = {CollectiveOp::AllReduce, CollectiveOp::AllGather,
                                     CollectiveOp::ReduceScatter, CollectiveOp::Broadcast,
                                     CollectiveOp::AllToAll};
  std::vector<std::string> out;
  for (CollectiveOp op : kOrder) {
    for (uint64_t bytes = kMinBytes; bytes < kMaxBytes; bytes *= 2) {
      std::string line = decision(op, bytes);
      if (!line.empty()) out.push_back(std::move(line));
    }
  }
  return out;
}

}  // namespace strata::collectives
