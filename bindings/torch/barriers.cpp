// barrier runs through the worker, so that it is ordered with the calls before it;
// monitored_barrier runs on the caller's thread through the Store.

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <string>
#include <vector>

#include <strata/error.hpp>

#include "internal.hpp"
#include "process_group.hpp"

namespace strata::torchbind {

c10::intrusive_ptr<c10d::Work> ProcessGroupStrata::barrier(const c10d::BarrierOptions&) {
  return enqueue(c10d::OpType::BARRIER, {}, [this]() {
    int32_t token = 1;
    comm_->allReduce(&token, &token, 1, DataType::Int32, ReduceOp::Sum);
    if (token != size_) {
      throw Error(ErrorCode::ProtocolError,
                  "barrier: " + std::to_string(token) + " of " + std::to_string(size_) +
                      " ranks counted (the ranks issued different calls)");
    }
  });
}

// Through the store, not the communicator, so that it works (and names the missing ranks) even
// when the communicator is stuck: every rank sets its key, rank 0 waits for each key with the
// timeout, then sets the release key the others wait for.
void ProcessGroupStrata::monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks) {
  TORCH_CHECK(store_,
              "strata: monitored_barrier needs torch's store, which a group from grow or "
              "join_group does not have (the newcomers never saw it); use barrier()");
  uint64_t id = 0;
  {
    std::lock_guard lock(mu_);
    id = monitored_++;
  }
  const auto timeout = opts.timeout.count() > 0 ? opts.timeout : timeout_;
  const std::string base = "strata/monitored/" + std::to_string(id) + "/";
  if (rank_ != 0) {
    store_->set(base + std::to_string(rank_), bytesOf("1"));
    // Rank 0 decides within `timeout` and then publishes: wait for that a while longer.
    const auto release = timeout + std::max(timeout, std::chrono::milliseconds(5000));
    try {
      store_->wait({base + "done"}, release);
    } catch (const std::exception& e) {
      throw std::runtime_error("strata: monitored_barrier: rank " + std::to_string(rank_) +
                               " was not released by rank 0 within " + seconds(release) +
                               " s: " + e.what());
    }
    if (stringOf(store_->get(base + "done")) != "ok") {
      throw std::runtime_error("strata: monitored_barrier: rank 0 reports that ranks " +
                               stringOf(store_->get(base + "done")) + " did not arrive");
    }
    return;
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<int> missing;
  for (int r = 1; r < size_; ++r) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    bool arrived = false;
    if (left.count() > 0 || missing.empty()) {
      try {
        store_->wait({base + std::to_string(r)}, std::max(left, std::chrono::milliseconds(1)));
        arrived = true;
      } catch (const std::exception&) {
      }
    } else {
      arrived = store_->check({base + std::to_string(r)});
    }
    if (!arrived) {
      missing.push_back(r);
      if (!waitAllRanks) break;
    }
  }
  if (missing.empty()) {
    store_->set(base + "done", bytesOf("ok"));
    return;
  }
  std::string list;
  for (int r : missing) list += (list.empty() ? "" : ", ") + std::to_string(r);
  store_->set(base + "done", bytesOf(list));
  throw std::runtime_error("strata: monitored_barrier: rank" +
                           std::string(missing.size() > 1 ? "s " : " ") + list +
                           " did not arrive within " + seconds(timeout) + " s");
}

}  // namespace strata::torchbind
