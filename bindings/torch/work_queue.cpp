// The work queue: every call becomes an Item that one worker thread runs in the order issued;
// WorkStrata reports its completion, and a strata::Error becomes the RuntimeError Python sees.

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>

#include <strata/error.hpp>

#include "internal.hpp"
#include "process_group.hpp"

namespace strata::torchbind {
namespace {

/// A strata::Error as the std::runtime_error Python sees (RuntimeError), with what a user needs.
std::exception_ptr translate(const Error& e) {
  std::string msg = std::string("strata: ") + e.what();
  if (e.code() == ErrorCode::Timeout) {
    msg += " (strata_torch sets transport.timeout from init_process_group(timeout=...))";
  }
  return std::make_exception_ptr(std::runtime_error(msg));
}

bool breaksCommunicator(ErrorCode code) {
  return code != ErrorCode::InvalidArgument && code != ErrorCode::NotSupported;
}

}  // namespace

WorkStrata::WorkStrata(int rank, c10d::OpType type, std::vector<at::Tensor> outputs)
    : c10d::Work(rank, type),
      outputs_(std::move(outputs)),
      future_(
          c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {
}

void WorkStrata::complete(std::exception_ptr error) {
  // The future first: a caller that returns from wait() may read get_future().value() at once.
  if (error) {
    future_->setError(error);
  } else {
    future_->markCompleted(c10::IValue(outputs_));
  }
  finish(error);
}

std::string ProcessGroupStrata::lastAlgorithm() const {
  std::lock_guard lock(mu_);
  return lastAlgorithm_;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupStrata::enqueue(c10d::OpType type,
                                                           std::vector<at::Tensor> outputs,
                                                           std::function<void()> run, Kind kind) {
  auto work = c10::make_intrusive<WorkStrata>(rank_, type, std::move(outputs));
  {
    std::lock_guard lock(mu_);
    ++sequence_;
    if (coalescing_) {
      held_.push_back(Item{work, std::move(run), kind});
      return work;
    }
    queue_.push_back(Item{work, std::move(run), kind});
  }
  cv_.notify_all();
  return work;
}

void ProcessGroupStrata::startCoalescing() {
  std::lock_guard lock(mu_);
  TORCH_CHECK(!coalescing_, "strata: startCoalescing while already coalescing");
  coalescing_ = true;
}

void ProcessGroupStrata::endCoalescing(std::vector<c10::intrusive_ptr<c10d::Work>>&) {
  {
    std::lock_guard lock(mu_);
    coalescing_ = false;
    for (Item& item : held_) queue_.push_back(std::move(item));
    held_.clear();
  }
  cv_.notify_all();
}

void ProcessGroupStrata::runItem(Item& item) {
  std::exception_ptr error;
  {
    std::lock_guard lock(mu_);
    error = broken_;
  }
  if (error) {
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      error = std::make_exception_ptr(std::runtime_error(
          std::string("strata: the process group is unusable after an earlier error: ") +
          e.what()));
    }
  } else {
    try {
      item.run();
    } catch (const Error& e) {
      error = translate(e);
      if (breaksCommunicator(e.code())) {
        std::lock_guard lock(mu_);
        if (!broken_) broken_ = error;
      }
    } catch (const std::exception& e) {
      error = std::current_exception();
    }
  }
  if (!error) {
    std::string algorithm = comm_->lastAlgorithm();
    std::lock_guard lock(mu_);
    lastAlgorithm_ = std::move(algorithm);
  }
  item.work->complete(error);
}

void ProcessGroupStrata::workerLoop() {
  for (;;) {
    std::vector<Item> batch;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ and nothing left: pending work is never dropped
      // A run of point-to-point calls at the head runs sends first (a host send never waits for
      // the receiver), so isend/irecv pairs issued as recv-then-send on both sides (as
      // batch_isend_irecv does) do not wait on each other. Order per peer and direction holds.
      batch.push_back(std::move(queue_.front()));
      queue_.pop_front();
      if (batch.front().kind != Kind::Collective) {
        while (!queue_.empty() && queue_.front().kind != Kind::Collective) {
          batch.push_back(std::move(queue_.front()));
          queue_.pop_front();
        }
      }
    }
    std::stable_partition(batch.begin(), batch.end(),
                          [](const Item& i) { return i.kind != Kind::Recv; });
    for (Item& item : batch) runItem(item);
  }
}

void ProcessGroupStrata::setSequenceNumberForGroup() {
  std::lock_guard lock(mu_);
  sequence_ = 0;
}

uint64_t ProcessGroupStrata::getSequenceNumberForGroup() {
  std::lock_guard lock(mu_);
  return sequence_;
}

}  // namespace strata::torchbind
