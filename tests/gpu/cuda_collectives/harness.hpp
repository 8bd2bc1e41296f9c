#pragma once

// What the files of test-cuda-collectives (tests/gpu/test_cuda_collectives.cpp) share: the
// options, what every rank is doing (for the watchdog), and each rank's buffers and copies.

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <strata/bootstrap.hpp>
#include <strata/communicator.hpp>
#include <strata/config.hpp>
#include <strata/error.hpp>

#include "tests/harness/reference_fold.hpp"

namespace cuda_coll_test {

using strata::Bootstrap;
using strata::Communicator;
using strata::Config;
using strata::DataType;
using strata::Error;
using strata::ErrorCode;
using strata::ReduceOp;
using strata::testing::elemSize;

using Clock = std::chrono::steady_clock;

struct Options {
  bool shortRun = false;
  bool host = false;
  double watchdogSeconds = 240;
  std::vector<int> ranks;
};

extern Options gOpt;

/// What every rank is doing, for the watchdog.
struct Progress {
  std::mutex mu;
  int n = 0;
  std::vector<std::string> what;
  void start(int ranks) {
    std::lock_guard<std::mutex> lock(mu);
    n = ranks;
    what.assign(static_cast<size_t>(ranks), "starting");
  }
  void set(int rank, std::string text) {
    std::lock_guard<std::mutex> lock(mu);
    if (rank >= 0 && rank < static_cast<int>(what.size())) what[rank] = std::move(text);
  }
  std::string dump() {
    std::lock_guard<std::mutex> lock(mu);
    std::string out = fmt::format("N={}:", n);
    for (size_t r = 0; r < what.size(); ++r) out += fmt::format("\n  rank {}: {}", r, what[r]);
    return out;
  }
};
extern Progress gProgress;

inline void cudaCheck(cudaError_t e, const char* call) {
  if (e != cudaSuccess) {
    throw std::runtime_error(
        fmt::format("{} failed: {} ({})", call, cudaGetErrorString(e), cudaGetErrorName(e)));
  }
}
#define CUDA_CHECK(call) cudaCheck((call), #call)

/// Buffers and copies of one rank: device memory and the rank's stream, or (--host) host memory.
/// Every copy is ordered on the rank's stream (pageable cudaMemcpy runs on the legacy stream,
/// which does not order with non-blocking streams; cudaDeviceSynchronize would wait for the
/// other ranks' kernels, which may wait for this rank) and goes through pinned bounce buffers,
/// so that a copy never blocks the thread while its stream waits for a peer's kernel.
struct Memory {
  bool device = true;
  cudaStream_t stream = nullptr;

  char* allocate(size_t bytes) const {
    void* p = nullptr;
    if (device) {
      CUDA_CHECK(cudaMalloc(&p, bytes));
    } else {
      p = hostAllocate(bytes);
    }
    return static_cast<char*>(p);
  }
  void release(char* p) const noexcept {
    if (p == nullptr) return;
    if (device) {
      cudaFree(p);
    } else {
      std::free(p);
    }
  }
  /// A bounce buffer: pinned host memory (plain host memory with --host).
  char* allocateBounce(size_t bytes) const {
    void* p = nullptr;
    if (device) {
      CUDA_CHECK(cudaMallocHost(&p, bytes));
    } else {
      p = hostAllocate(bytes);
    }
    return static_cast<char*>(p);
  }
  void releaseBounce(char* p) const noexcept {
    if (p == nullptr) return;
    if (device) {
      cudaFreeHost(p);
    } else {
      std::free(p);
    }
  }
  /// Enqueues a copy of src to dst through bounce, which must not be reused before sync().
  void toDevice(char* dst, const void* src, size_t bytes, char* bounce) const {
    if (bytes == 0) return;
    if (device) {
      std::memcpy(bounce, src, bytes);
      CUDA_CHECK(cudaMemcpyAsync(dst, bounce, bytes, cudaMemcpyHostToDevice, stream));
    } else {
      std::memcpy(dst, src, bytes);
    }
  }
  /// Where bytes at src can be read on the host after sync(): bounce, with the copy enqueued.
  const char* fetch(const char* src, size_t bytes, char* bounce) const {
    if (!device) return src;
    if (bytes > 0) CUDA_CHECK(cudaMemcpyAsync(bounce, src, bytes, cudaMemcpyDeviceToHost, stream));
    return bounce;
  }
  void sync() const {
    if (device) CUDA_CHECK(cudaStreamSynchronize(stream));
  }
  strata::Stream handle() const { return strata::Stream{device ? stream : nullptr}; }

 private:
  static void* hostAllocate(size_t bytes) {
    void* p = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
    if (p == nullptr) throw std::bad_alloc();
    return p;
  }
};

}  // namespace cuda_coll_test
