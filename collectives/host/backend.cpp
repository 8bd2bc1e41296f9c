// The host collectives as a built-in collectives backend: one Engine per Communicator and the
// algorithms of algorithms.cpp behind the SDK's Algorithm interface.

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
#include "engine.hpp"

namespace strata::collectives::host {
namespace {

using backend::BufferKind;
using backend::CollectiveOp;
using backend::CollectiveRequest;

/// The engine and what every algorithm of this backend shares: the lock that the delivery
/// thread of buffered sends also takes, and the rule that a failed call forgets its queue.
struct Shared {
  std::unique_ptr<Engine> engine;
  size_t oneshotMax = 0;  ///< auto's oneshot limit at this rank count

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

/// allGather, reduceScatter, broadcast and allToAll through the slots or by single copy.
void runGatherLike(Engine& e, const CollectiveRequest& r, Path path, const char* name) {
  switch (r.op) {
    case CollectiveOp::AllGather:
      return allGather(e, r, path);
    case CollectiveOp::ReduceScatter:
      return reduceScatter(e, r, path);
    case CollectiveOp::Broadcast:
      return broadcast(e, r, path);
    case CollectiveOp::AllToAll:
      return allToAll(e, r, path);
    case CollectiveOp::AllReduce:
    case CollectiveOp::Send:
    case CollectiveOp::Recv:
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
        "(collectives.oneshot_max_bytes x (2/N)^2 above 2 ranks)",
        kib(s_.oneshotMax));
  }
  std::string unsuitable(const CollectiveRequest& r) const override { return s_.noStream(r); }
  bool prefers(const CollectiveRequest& r) const override { return r.bytes() <= s_.oneshotMax; }
  void run(const CollectiveRequest& r) override {
    s_.guarded([&](Engine& e) { allReduceOneShot(e, r); });
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
    s_.guarded([&](Engine& e) { allReduceTwoShot(e, r); });
  }
};

/// allReduce, allGather, reduceScatter, broadcast, allToAll reading peers' buffers directly.
class SingleCopy final : public HostAlgorithm {
 public:
  explicit SingleCopy(Shared& s) : HostAlgorithm(s, "singlecopy") {}
  std::vector<CollectiveOp> ops() const override {
    return {CollectiveOp::AllReduce, CollectiveOp::AllGather, CollectiveOp::ReduceScatter,
            CollectiveOp::Broadcast, CollectiveOp::AllToAll};
  }
  std::string describe() const override {
    return fmt::format(
        "each rank reads what it needs straight from the peers' buffers with process_vm_readv "
        "(one copy); host memory, every rank on one host with ptrace permitted; auto takes it "
        "from {} per rank for allGather, reduceScatter, broadcast and allToAll "
        "(collectives.single_copy_min_bytes), never for allReduce",
        kib(s_.engine->singleCopyMinBytes()));
  }
  std::string unsuitable(const CollectiveRequest& r) const override {
    std::string why = s_.noStream(r);
    return why.empty() ? s_.singleCopyMissing() : why;
  }
  bool prefers(const CollectiveRequest& r) const override {
    // allReduce reads twice (the second time what the peers just reduced): it ran at 0.55x
    // Open MPI on an AMD EPYC machine where the slot path ran at 2x (docs/benchmarks.md).
    return r.op != CollectiveOp::AllReduce && r.bytes() >= s_.engine->singleCopyMinBytes();
  }
  void run(const CollectiveRequest& r) override {
    s_.guarded([&](Engine& e) {
      if (r.op == CollectiveOp::AllReduce) return allReduceSingleCopy(e, r);
      runGatherLike(e, r, Path::SingleCopy, "host/singlecopy");
    });
  }
};

/// Everything but allReduce through the shared slots, and send/recv.
class Direct final : public HostAlgorithm {
 public:
  explicit Direct(Shared& s) : HostAlgorithm(s, "direct") {}
  std::vector<CollectiveOp> ops() const override {
    return {CollectiveOp::AllGather, CollectiveOp::ReduceScatter, CollectiveOp::Broadcast,
            CollectiveOp::AllToAll,  CollectiveOp::Send,          CollectiveOp::Recv};
  }
  std::string describe() const override {
    return "every rank sends each peer what it needs through the shared slots (pipelined "
           "chunks); host memory, any layout; auto's choice where single copy is not taken";
  }
  std::string unsuitable(const CollectiveRequest& r) const override { return s_.noStream(r); }
  bool prefers(const CollectiveRequest&) const override { return true; }
  void run(const CollectiveRequest& r) override {
    s_.guarded([&](Engine& e) {
      if (r.op == CollectiveOp::Send) return send(e, r);
      if (r.op == CollectiveOp::Recv) return recv(e, r);
      runGatherLike(e, r, Path::Slots, "host/direct");
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
      // One-shot moves (N-1) x the message per rank, two-shot about 2x in two steps: measured,
      // the crossover falls from 64 KiB at N = 2 to 16-32 KiB at 3, 8-16 KiB at 4 and 4 KiB at
      // 8 (docs/collectives.md).
      shared_.oneshotMax = shared_.oneshotMax * 4 / (n * n);
    }
    algorithms_.push_back(std::make_unique<OneShot>(shared_));
    algorithms_.push_back(std::make_unique<Hierarchical>(shared_));
    algorithms_.push_back(std::make_unique<TwoShot>(shared_));
    algorithms_.push_back(std::make_unique<SingleCopy>(shared_));
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

 private:
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
  };
  return &info;
}

}  // namespace strata::collectives::host
