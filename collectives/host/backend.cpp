// The host collectives as a built-in collectives backend: one Engine per Communicator and the
// algorithms of algorithms.cpp behind the SDK's Algorithm interface.

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <strata/backend/collectives.hpp>
#include <strata/backend/module.hpp>
#include <strata/error.hpp>
#include <strata/version.hpp>

#include "algorithms.hpp"
#include "base/config_keys.hpp"
#include "base/log.hpp"
#include "engine.hpp"
#include "measured_choice.hpp"

namespace strata::collectives::host {
namespace {

using backend::BufferKind;
using backend::CollectiveOp;
using backend::CollectiveRequest;

void runGatherLike(Engine& e, const CollectiveRequest& r, const char* name);

/// The engine and what every algorithm of this backend shares: the lock that the delivery
/// thread of buffered sends also takes, and the rule that a failed call forgets its queue.
struct Shared {
  std::unique_ptr<Engine> engine;
  size_t oneshotMax = 0;     ///< auto's oneshot limit at this rank count
  uint64_t zeroCopyMin = 0;  ///< collectives.zero_copy_min_bytes
  MeasuredChoice measured;   ///< single copy against the slots, timed on the first calls
  std::string measuredWhy;   ///< whether and where auto measures (strata-info --tuning)

  using Way = MeasuredChoice::Way;
  /// The measured way for r (Static: the crossovers decide).
  Way measuredWay(const CollectiveRequest& r) const { return measured.pick(r.op, r.bytes()); }

  /// Whether auto runs the call by single copy (process_vm_readv) rather than through the
  /// slots: the measured way where its size class is measured (while it is being measured, the
  /// way of its turn; with measuring false only a decided way), else from the tuned crossover of
  /// its op family on (engine->choices()).
  bool singleCopyPreferred(const CollectiveRequest& r, bool measuring = true) const {
    if (!engine->singleCopy()) return false;
    const Way w = measuring ? measuredWay(r) : measured.decided(r.op, r.bytes());
    if (w != Way::Static) return w == Way::SingleCopy;
    const Choices& c = engine->choices();
    return r.bytes() >=
           (r.op == CollectiveOp::AllReduce ? c.allReduceSingleCopyMin : c.gatherSingleCopyMin);
  }
  /// What auto runs through the slots (one host: no hierarchical); returns its name.
  const char* runSlots(Engine& e, const CollectiveRequest& r) const {
    if (r.op != CollectiveOp::AllReduce) {
      runGatherLike(e, r, "host/direct");
      return "direct";
    }
    if (r.bytes() <= oneshotMax) {
      allReduceOneShot(e, r);
      return "oneshot";
    }
    allReduceTwoShot(e, r);
    return "twoshot";
  }

  template <typename F>
  void guarded(F&& fn) {
    std::lock_guard<std::mutex> lock(engine->mutex());
    try {
      engine->checkDelivery();
      fn(*engine);
    } catch (...) {
      engine->abandon();
      throw;
    }
  }

  /// guarded(fn) for a call that runs `way`; when it is one of its class's timed calls, times
  /// it, and when it completes the class, agrees with the other ranks on the faster way.
  template <typename F>
  void guardedTimed(const CollectiveRequest& r, Way way, F&& fn) {
    if (!measured.timed(r.op, r.bytes(), way)) {
      return guarded([&](Engine& e) {
        fn(e);
        if (measured.pick(r.op, r.bytes()) == way) measured.ran(r.op, r.bytes());
      });
    }
    guarded([&](Engine& e) {
      const auto start = std::chrono::steady_clock::now();
      fn(e);
      const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::steady_clock::now() - start)
                          .count();
      if (measured.record(r.op, r.bytes(), way, static_cast<uint64_t>(std::max<int64_t>(ns, 0)))) {
        agree(e, r);
      }
    });
  }

  /// The ranks add up their median times for r's class (a 16-byte allReduce through the slots,
  /// which every rank runs right after the same call) and take the same decision.
  void agree(Engine& e, const CollectiveRequest& r) {
    const std::array<uint64_t, 2> mine = measured.medians(r.op, r.bytes());
    std::array<uint64_t, 2> total{};
    CollectiveRequest sum;
    sum.op = CollectiveOp::AllReduce;
    sum.send = mine.data();
    sum.recv = total.data();
    sum.count = total.size();
    sum.type = DataType::Uint64;
    sum.redop = ReduceOp::Sum;
    try {
      allReduceOneShot(e, sum);
    } catch (const Error& err) {
      // Name the user's call: the allReduce is ours.
      throw Error(err.code(),
                  fmt::format("{} of {} B, in the ranks' agreement on its measured algorithm (a "
                              "16-byte allReduce every rank runs after that call): {}",
                              toString(r.op), r.bytes(), err.what()),
                  err.peer());
    }
    measured.decide(r.op, r.bytes(), total, e.size());
    if (e.rank() == 0) {
      STRATA_LOG(Info, "coll", "auto measured {}", measured.decision(r.op, r.bytes()));
    }
  }

  /// What every host algorithm needs beyond host memory (the Communicator asks only about
  /// requests whose buffers are of the kinds memoryKinds() lists): no stream.
  std::string noStream(const CollectiveRequest& r) const {
    if (r.stream.handle) {
      return "a CUDA stream was given; host algorithms complete before they return and take "
             "none";
    }
    return "";
  }
  std::string singleCopyMissing() const {
    return engine->singleCopy() ? ""
                                : "process_vm_readv between every pair of ranks is not available "
                                  "(ranks on several hosts, collectives.single_copy = off, or "
                                  "ptrace not permitted)";
  }
};

std::string kib(size_t bytes) {
  return bytes % 1024 == 0 ? fmt::format("{} KiB", bytes / 1024) : fmt::format("{} B", bytes);
}

/// allGather, reduceScatter, broadcast and allToAll through the slots.
void runGatherLike(Engine& e, const CollectiveRequest& r, const char* name) {
  switch (r.op) {
    case CollectiveOp::AllGather:
      return allGather(e, r);
    case CollectiveOp::ReduceScatter:
      return reduceScatter(e, r);
    case CollectiveOp::Broadcast:
      return broadcast(e, r);
    case CollectiveOp::AllToAll:
      return allToAll(e, r);
    case CollectiveOp::AllReduce:
    case CollectiveOp::Send:
    case CollectiveOp::Recv:
    case CollectiveOp::SendRecv:
      break;
  }
  throw Error(ErrorCode::Internal,
              fmt::format("{} was asked to run {}", name, backend::toString(r.op)));
}

class HostAlgorithm : public backend::Algorithm {
 public:
  HostAlgorithm(Shared& shared, std::string name) : s_(shared), name_(std::move(name)) {}
  std::string_view name() const noexcept override { return name_; }

 protected:
  Shared& s_;
  std::string name_;
};

class OneShot final : public HostAlgorithm {
 public:
  explicit OneShot(Shared& s) : HostAlgorithm(s, "oneshot") {}
  std::vector<CollectiveOp> ops() const override { return {CollectiveOp::AllReduce}; }
  std::string describe() const override {
    return fmt::format(
        "every rank sends its whole input to every rank and reduces all of it (latency-optimal); "
        "host memory, any layout; auto takes it up to {} per rank here "
        "(collectives.oneshot_max_bytes x (2/N)^2 above 2 ranks, x (cores/N)^2 more when "
        "the ranks of one host outnumber its CPUs)",
        kib(s_.oneshotMax));
  }
  std::string unsuitable(const CollectiveRequest& r) const override { return s_.noStream(r); }
  bool prefers(const CollectiveRequest& r) const override {
    return r.bytes() <= s_.oneshotMax && s_.measuredWay(r) != Shared::Way::SingleCopy;
  }
  void run(const CollectiveRequest& r) override {
    s_.guardedTimed(r, Shared::Way::Slots, [&](Engine& e) { allReduceOneShot(e, r); });
  }
};

class Hierarchical final : public HostAlgorithm {
 public:
  explicit Hierarchical(Shared& s) : HostAlgorithm(s, "hierarchical") {}
  std::vector<CollectiveOp> ops() const override { return {CollectiveOp::AllReduce}; }
  std::string describe() const override {
    return "reduce-scatter within each host, two-shot across hosts among ranks of the same local "
           "index, all-gather within each host; host memory; needs ranks on several hosts with "
           "the same number (> 1) on each; auto takes it above the oneshot limit";
  }
  std::string unsuitable(const CollectiveRequest& r) const override {
    std::string why = s_.noStream(r);
    if (why.empty() && !hierarchicalLayout(*s_.engine)) {
      why = "needs ranks on several hosts with the same number (> 1) on each";
    }
    return why;
  }
  bool prefers(const CollectiveRequest&) const override { return true; }
  void run(const CollectiveRequest& r) override {
    s_.guarded([&](Engine& e) { allReduceHierarchical(e, r); });
  }
};

class TwoShot final : public HostAlgorithm {
 public:
  explicit TwoShot(Shared& s) : HostAlgorithm(s, "twoshot") {}
  std::vector<CollectiveOp> ops() const override { return {CollectiveOp::AllReduce}; }
  std::string describe() const override {
    return "reduce-scatter then all-gather over all ranks through the shared slots, the two "
           "phases overlapping chunk by chunk (bandwidth-optimal); host memory, any layout; "
           "auto's choice above the oneshot limit on one host";
  }
  std::string unsuitable(const CollectiveRequest& r) const override { return s_.noStream(r); }
  bool prefers(const CollectiveRequest&) const override { return true; }
  void run(const CollectiveRequest& r) override {
    s_.guardedTimed(r, Shared::Way::Slots, [&](Engine& e) { allReduceTwoShot(e, r); });
  }
};

/// The ops single copy and zero copy serve: every one where a rank reads peers' buffers.
std::vector<CollectiveOp> readingOps() {
  return {CollectiveOp::AllReduce, CollectiveOp::AllGather, CollectiveOp::ReduceScatter,
          CollectiveOp::Broadcast, CollectiveOp::AllToAll};
}

std::string thresholdText(uint64_t bytes) {
  return bytes == UINT64_MAX ? std::string("never") : fmt::format("from {}", kib(bytes));
}

/// allReduce, allGather, reduceScatter, broadcast, allToAll reading peers' buffers directly.
class SingleCopy final : public HostAlgorithm {
 public:
  explicit SingleCopy(Shared& s) : HostAlgorithm(s, "singlecopy") {}
  std::vector<CollectiveOp> ops() const override { return readingOps(); }
  std::string describe() const override {
    const Choices& c = s_.engine->choices();
    return fmt::format(
        "each rank reads what it needs straight from the peers' buffers with process_vm_readv "
        "(one copy; allocHost buffers through their mapping); host memory, every rank on one "
        "host with ptrace permitted; auto takes it {} per rank for allGather, reduceScatter, "
        "broadcast and allToAll and {} for allReduce ({})",
        thresholdText(c.gatherSingleCopyMin), thresholdText(c.allReduceSingleCopyMin),
        s_.engine->tuning().source);
  }
  std::string unsuitable(const CollectiveRequest& r) const override {
    std::string why = s_.noStream(r);
    return why.empty() ? s_.singleCopyMissing() : why;
  }
  bool prefers(const CollectiveRequest& r) const override { return s_.singleCopyPreferred(r); }
  void run(const CollectiveRequest& r) override {
    how_.clear();
    s_.guardedTimed(r, Shared::Way::SingleCopy, [&](Engine& e) {
      if (trivialCall(e, r)) return;
      Descriptors d = exchangeDescriptors(e, r);
      if (d.allShared) how_ = "mapped: every buffer is allocHost memory";
      singleCopy(e, r, d);
    });
  }
  std::string launchShape() const override { return how_; }

 private:
  std::string how_;
};

/// The five collectives on allocHost memory: descriptors first, then either every peer's buffer
/// read through its mapping, or what auto would have run without this algorithm.
class ZeroCopy final : public HostAlgorithm {
 public:
  explicit ZeroCopy(Shared& s) : HostAlgorithm(s, "zerocopy") {}
  std::vector<CollectiveOp> ops() const override { return readingOps(); }
  std::string describe() const override {
    return fmt::format(
        "every rank describes its buffers; when the buffers the peers read are "
        "Communicator::allocHost memory on every rank, they read them through shared mappings "
        "(plain loads and in-place reductions, no kernel or slot copy), else the call runs as "
        "auto would have chosen without it, one message round later; host memory, every rank "
        "on one host; auto takes it from {} per rank (collectives.zero_copy_min_bytes), and after "
        "8 calls in a row that fell back only every 64th call",
        kib(s_.zeroCopyMin));
  }
  std::string unsuitable(const CollectiveRequest& r) const override {
    std::string why = s_.noStream(r);
    if (why.empty() && !s_.engine->zeroCopy()) {
      why =
          "mapping the peers' allocHost memory is not available (ranks on several hosts, "
          "collectives.zero_copy = off, or /proc/<pid>/fd of a peer not readable)";
    }
    return why;
  }
  /// From zero_copy_min_bytes on; after kGiveUp calls in a row whose buffers were not all
  /// allocHost memory, only every kRetry-th such call tries again, so that a job that never
  /// uses allocHost pays the descriptor round on 1 call in kRetry. Every rank sees the same calls
  /// and the same descriptors, so every rank counts alike.
  bool prefers(const CollectiveRequest& r) const override {
    if (r.bytes() < s_.zeroCopyMin) return false;
    const uint64_t n = eligible_++;
    return misses_ < kGiveUp || n % kRetry == 0;
  }
  void run(const CollectiveRequest& r) override {
    how_.clear();
    s_.guarded([&](Engine& e) {
      if (trivialCall(e, r)) return;
      Descriptors d = exchangeDescriptors(e, r);
      misses_ = d.allShared ? 0 : std::min(misses_ + 1, kGiveUp);
      if (d.allShared) {
        how_ = "mapped";
        return singleCopy(e, r, d);
      }
      // Not a measured call (the descriptor round would weigh on it): a decided way or the
      // crossovers, never a measuring turn.
      if (s_.singleCopyPreferred(r, false)) {
        how_ = "singlecopy: not every buffer is allocHost memory";
        return singleCopy(e, r, d);
      }
      how_ = fmt::format("{}: not every buffer is allocHost memory", s_.runSlots(e, r));
    });
  }
  std::string launchShape() const override { return how_; }

  static constexpr int kGiveUp = 8;
  static constexpr uint64_t kRetry = 64;

 private:
  std::string how_;
  int misses_ = 0;                 ///< calls in a row that fell back (at most kGiveUp)
  mutable uint64_t eligible_ = 0;  ///< calls from zero_copy_min_bytes on that auto asked about
};

/// Everything but allReduce through the shared slots, and send/recv.
class Direct final : public HostAlgorithm {
 public:
  explicit Direct(Shared& s) : HostAlgorithm(s, "direct") {}
  std::vector<CollectiveOp> ops() const override {
    return {CollectiveOp::AllGather, CollectiveOp::ReduceScatter, CollectiveOp::Broadcast,
            CollectiveOp::AllToAll,  CollectiveOp::Send,          CollectiveOp::Recv,
            CollectiveOp::SendRecv};
  }
  std::string describe() const override {
    return "every rank sends each peer what it needs through the shared slots (pipelined "
           "chunks); host memory, any layout; auto's choice where single copy is not taken; "
           "send/recv and their batches (sends first: a send never waits for its receiver)";
  }
  std::string unsuitable(const CollectiveRequest& r) const override { return s_.noStream(r); }
  bool prefers(const CollectiveRequest&) const override { return true; }
  void run(const CollectiveRequest& r) override {
    s_.guardedTimed(r, Shared::Way::Slots, [&](Engine& e) {
      if (r.op == CollectiveOp::Send) return send(e, r);
      if (r.op == CollectiveOp::Recv) return recv(e, r);
      if (r.op == CollectiveOp::SendRecv) return sendRecv(e, r);
      runGatherLike(e, r, "host/direct");
    });
  }
};

class HostBackend final : public backend::CollectivesBackend {
 public:
  explicit HostBackend(const backend::CollectivesInit& init) {
    shared_.engine = std::make_unique<Engine>(init.context, *init.config);
    const size_t n = static_cast<size_t>(init.topology.size);
    shared_.oneshotMax =
        static_cast<size_t>(config::getInt(*init.config, "collectives.oneshot_max_bytes"));
    if (n > 2) {
      // One-shot moves (N-1) x the message per rank, two-shot about 2x in two steps, so the
      // crossover falls with (2/N)^2 (docs/collectives.md).
      shared_.oneshotMax = shared_.oneshotMax * 4 / (n * n);
    }
    const size_t cores = static_cast<size_t>(shared_.engine->sharedCores());
    if (cores > 0 && n > cores) {
      // Ranks that share cores: one-shot's (N-1) copies per rank queue behind each other
      // (measured with 2 cores: crossover 256 KiB at 2 ranks, 6-8 KiB at 4).
      shared_.oneshotMax = shared_.oneshotMax * cores * cores / (n * n);
    }
    shared_.zeroCopyMin = config::getBytes(*init.config, "collectives.zero_copy_min_bytes");
    setUpMeasuring(*init.config);
    // In order of preference: the first that accepts a call and prefers it runs it.
    algorithms_.push_back(std::make_unique<ZeroCopy>(shared_));
    algorithms_.push_back(std::make_unique<OneShot>(shared_));
    algorithms_.push_back(std::make_unique<Hierarchical>(shared_));
    algorithms_.push_back(std::make_unique<SingleCopy>(shared_));
    algorithms_.push_back(std::make_unique<TwoShot>(shared_));
    algorithms_.push_back(std::make_unique<Direct>(shared_));
  }
  std::string_view name() const noexcept override { return "host"; }
  std::vector<BufferKind> memoryKinds() const override {
    return {BufferKind::Host, BufferKind::CudaHost};
  }
  std::vector<backend::Algorithm*> algorithms() override {
    std::vector<backend::Algorithm*> out;
    for (auto& a : algorithms_) out.push_back(a.get());
    return out;
  }
  std::string tuningReport() const override {
    const Engine& e = *shared_.engine;
    const HostTuning& t = e.tuning();
    std::string out = fmt::format("host collectives tuning: {}\n", t.source);
    if (!t.machine.empty()) out += fmt::format("machine: {}\n", t.machine);
    for (const ProbeSample& s : t.samples) {
      out += fmt::format("  {} B: process_vm_readv {:.2f} GB/s, mapped copy {:.2f} GB/s, ", s.bytes,
                         s.vmGBs, s.mapGBs);
      out += s.mapGBs > 0 ? fmt::format("ratio {:.2f}\n", s.vmGBs / s.mapGBs)
                          : std::string("ratio -\n");
    }
    for (const std::string& why : t.choices.why) out += why + '\n';
    // What auto does: without single copy between every pair no threshold applies.
    auto from = [&](uint64_t min) {
      if (!e.singleCopy()) return std::string("never (single copy is not available to this job)");
      return min == UINT64_MAX ? std::string("never") : fmt::format("from {} B", min);
    };
    // Where the measured choice decides, these crossovers hold only outside its classes.
    const std::string where = shared_.measured.calls() == 0
                                  ? std::string()
                                  : fmt::format(
                                        " (below {} and from {} B per rank; between, "
                                        "the measured choice)",
                                        MeasuredChoice::kMinBytes, MeasuredChoice::kMaxBytes);
    out +=
        fmt::format("allReduce single copy{}: {}\n", where, from(t.choices.allReduceSingleCopyMin));
    for (const char* op : {"allGather", "reduceScatter", "broadcast", "allToAll"}) {
      out += fmt::format("{} single copy{}: {}\n", op, where, from(t.choices.gatherSingleCopyMin));
    }
    out += fmt::format("zero copy (allocHost buffers): {}, auto from {} B per rank\n",
                       e.zeroCopy() ? "available" : "not available", shared_.zeroCopyMin);
    out += e.streamWhy() + '\n';
    out += shared_.measuredWhy + '\n';
    for (const std::string& line : shared_.measured.decisions()) out += "  " + line + '\n';
    return out;
  }

 private:
  /// Whether auto times single copy against the slots on the first calls of each size class
  /// (collectives.measure_calls): only where both can run, and not where the user fixed the
  /// choice (tuning off, an explicit single_copy_min_bytes).
  static constexpr uint32_t kDefaultMeasureCalls = 8;  ///< collectives.measure_calls' default

  void setUpMeasuring(const Config& config) {
    const auto calls = static_cast<uint32_t>(config::getInt(config, "collectives.measure_calls"));
    std::string off;
    if (calls == 0) {
      off = "collectives.measure_calls = 0";
    } else if (!shared_.engine->singleCopy()) {
      off = "single copy is not available to this job";
    } else if (config::getString(config, "collectives.tuning") == "off") {
      off = "collectives.tuning = off";
    } else if (shared_.engine->singleCopyMinSet()) {
      off = "collectives.single_copy_min_bytes is set";
    } else if (const int cores = shared_.engine->sharedCores();
               cores > 0 && shared_.engine->size() > cores && calls == kDefaultMeasureCalls) {
      // With more ranks than CPUs a call's time depends on how the scheduler interleaves the
      // ranks, which a few calls do not predict: at 4 ranks on 2 CPUs allGather of 1 MiB per
      // rank timed 766-1142 us by single copy in its blocks and 623 us forced, and the
      // measurement chose the slots (1078 us forced). The probe's rule for shared CPUs holds.
      // Another value measures anyway: a value, not whether the key was set, so that every rank
      // (their values must match) decides alike.
      off = fmt::format(
          "{} ranks share {} CPUs on this host; the crossovers decide unless "
          "collectives.measure_calls has another value than {}",
          shared_.engine->size(), cores, kDefaultMeasureCalls);
    }
    if (!off.empty()) {
      shared_.measuredWhy = fmt::format("measured choice: off ({})", off);
      return;
    }
    shared_.measured = MeasuredChoice(calls);
    shared_.measuredWhy = fmt::format(
        "measured choice: auto times single copy against the slots on {} calls of each way "
        "per size class from {} B to {} B per rank (fewer from 256 KiB, at least 2; two blocks "
        "per way, each after a warm-up call), then every rank takes the faster and measures "
        "again after 1024 calls, then 4x as many (collectives.measure_calls); decided so far:",
        shared_.measured.calls(), MeasuredChoice::kMinBytes, MeasuredChoice::kMaxBytes);
  }

  Shared shared_;
  std::vector<std::unique_ptr<backend::Algorithm>> algorithms_;
};

std::unique_ptr<backend::CollectivesBackend> create(const backend::CollectivesInit& init) {
  return std::make_unique<HostBackend>(init);
}

}  // namespace

const backend::ModuleInfo* builtinModuleInfo() {
  static const backend::ModuleInfo info{
      STRATA_MODULE_ABI_VERSION,
      backend::ModuleKind::Collectives,
      "host",
      STRATA_VERSION_STRING,
      "collectives on host memory: shared-memory slots within a host, the fabric proxy across "
      "hosts, process_vm_readv single copy",
      nullptr,
      nullptr,
      nullptr,
      &create,
      nullptr,
  };
  return &info;
}

}  // namespace strata::collectives::host
