#pragma once

// ProcessGroupStrata: a torch.distributed backend (c10d::ProcessGroup of PyTorch 1.13) over one
// strata::Communicator. Every call is checked on the caller's thread (unsupported types, ops and
// shapes raise there) and then runs on one worker thread per process group, in the order issued;
// the returned Work completes when it has run.
//
// The class is implemented in process_group.cpp (rendezvous and lifetime), work_queue.cpp
// (WorkStrata, the queue, the worker, error translation), and collectives.cpp,
// point_to_point.cpp and barriers.cpp (the operations), over the checks of tensors.cpp.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <strata/communicator.hpp>

namespace strata::torchbind {

/// One call's completion: Work for wait()/is_completed(), and a Future (a list of the output
/// tensors) for get_future() and DDP's communication hooks.
class WorkStrata : public c10d::Work {
 public:
  WorkStrata(int rank, c10d::OpType type, std::vector<at::Tensor> outputs);
  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  /// True once the future is (complete() marks it first), so that a caller that saw the future
  /// complete also sees the Work complete; wait() may still block for the instant until finish.
  bool isCompleted() override { return future_->completed(); }
  /// Called once by the worker: marks the future (value or error), then the Work.
  void complete(std::exception_ptr error);

 private:
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

class ProcessGroupStrata : public c10d::ProcessGroup {
 public:
  /// Rendezvous through store (rank 0 publishes the root address and a fresh secret; every rank
  /// publishes its host name so that local ranks are known), then the tcp bootstrap and a
  /// Communicator. timeout becomes bootstrap.timeout, bootstrap.connect_timeout and
  /// transport.timeout. Collective over the group.
  ProcessGroupStrata(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                     std::chrono::milliseconds timeout);
  /// The group of a communicator shrink() made (its store: the parent's, under a prefix).
  ProcessGroupStrata(const c10::intrusive_ptr<c10d::Store>& store,
                     std::unique_ptr<Communicator> comm, std::chrono::milliseconds timeout,
                     std::string root);
  ~ProcessGroupStrata() override;

  /// Fault tolerance (docs/fault-tolerance.md, "PyTorch"): the group of the ranks not excluded
  /// (exclude, and every rank found lost; Communicator::shrink), in their order. Revokes this
  /// group first; its pending and later calls fail. Collective over the survivors.
  c10::intrusive_ptr<ProcessGroupStrata> shrink(const std::vector<int>& exclude);
  /// Communicator::growInvitation (rank 0) and grow: a group of newSize ranks with the newcomers
  /// that join() with the invitation; this group's ranks keep their numbers.
  std::string growInvitation(int newSize);
  c10::intrusive_ptr<ProcessGroupStrata> grow(int newSize);
  /// The newcomer's side (Communicator::join); `store` serves its monitored_barrier only.
  static c10::intrusive_ptr<ProcessGroupStrata> join(const std::string& invitation, int index,
                                                     std::chrono::milliseconds timeout);
  /// Communicator::revoke: every rank's calls on this group fail, naming this rank and reason.
  void revoke(const std::string& reason);
  /// Communicator::lostRanks: the ranks this rank found lost or stuck, ascending.
  std::vector<int> lostRanks() const;

  const std::string getBackendName() const override { return "strata"; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& outputLists, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& outputSplits,
                                               std::vector<int64_t>& inputSplits,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks) override;
  /// batch_isend_irecv: calls between start and end reach the worker together, so that its
  /// sends-first rule sees the whole batch.
  void startCoalescing() override;
  void endCoalescing(std::vector<c10::intrusive_ptr<c10d::Work>>& reqs) override;
  void setSequenceNumberForGroup() override;
  uint64_t getSequenceNumberForGroup() override;

  /// "host/twoshot": the algorithm strata chose for the last collective that ran.
  std::string lastAlgorithm() const;
  /// The rendezvous and timeout strata took from torch (for logs and tests).
  std::string describe() const;

 private:
  enum class Kind { Collective, Send, Recv };
  struct Item {
    c10::intrusive_ptr<WorkStrata> work;
    std::function<void()> run;
    Kind kind = Kind::Collective;
  };

  c10::intrusive_ptr<c10d::Work> enqueue(c10d::OpType type, std::vector<at::Tensor> outputs,
                                         std::function<void()> run, Kind kind = Kind::Collective);
  void workerLoop();
  void runItem(Item& item);
  /// allGather of `in` through a flat buffer, then rank r's block into out(r) (any layout).
  void allGatherInto(const at::Tensor& in, DataType type,
                     const std::function<at::Tensor&(int)>& out);
  /// Pairwise exchange (all-to-all with any counts): block j of the send side goes to rank j.
  void exchange(const std::vector<const void*>& sendPtrs, const std::vector<size_t>& sendCounts,
                const std::vector<void*>& recvPtrs, const std::vector<size_t>& recvCounts,
                DataType type);

  c10::intrusive_ptr<c10d::Store> store_;
  std::chrono::milliseconds timeout_;
  std::string root_;
  std::unique_ptr<Communicator> comm_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> queue_;
  bool coalescing_ = false;
  std::vector<Item> held_;  // calls issued while coalescing
  bool stop_ = false;
  std::exception_ptr broken_;  // the first error that left the communicator unusable
  uint64_t sequence_ = 0;      // calls issued (getSequenceNumberForGroup)
  uint64_t monitored_ = 0;     // monitored barriers issued (their store keys)
  std::string lastAlgorithm_;
  int shrinks_ = 0;  // shrink() calls (the store prefix of each new group)
  std::thread worker_;
};

}  // namespace strata::torchbind
