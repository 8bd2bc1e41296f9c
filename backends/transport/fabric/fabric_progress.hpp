#pragma once

// The background thread that drives this rank's endpoint (fabric_endpoint.hpp); its loop is in
// fabric_progress.cpp with the rest of the progress.

#include <atomic>
#include <memory>
#include <thread>

#include "fabric_endpoint.hpp"

namespace strata::fabric {

/// The background thread that drives the endpoint (docs/transport-fabric.md, "Progress
/// thread"): started by the constructor, stopped and joined by the destructor.
class ProgressThread {
 public:
  /// cpus: where the thread runs (TransportInit::proxyCpus; empty: unbound).
  ProgressThread(std::shared_ptr<Endpoint> endpoint, std::vector<int> cpus);
  ~ProgressThread();
  ProgressThread(const ProgressThread&) = delete;
  ProgressThread& operator=(const ProgressThread&) = delete;

 private:
  void loop() noexcept;
  std::shared_ptr<Endpoint> endpoint_;
  int wakeFd_ = -1;  ///< eventfd that wakes the thread (new writes, shutdown)
  std::atomic<bool> stop_{false};
  std::vector<int> cpus_;
  std::thread thread_;
};

}  // namespace strata::fabric
