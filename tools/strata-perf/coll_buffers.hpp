#pragma once

// The buffers of a collective mode's run (strata-perf allreduce, ...). Host memory: from the
// heap (any user buffer) or from strata's allocator, and the inputs are written and the results
// read in place. Device memory: cudaMalloc'ed and zeroed, with host staging buffers of the same
// size (only with -c 1: a sweep to 8 GiB on 8 GPUs would otherwise hold 128 GiB of host memory)
// in which the inputs are written (upload() copies them over) and into which a result is copied
// to be checked.

#include <cstddef>
#include <cstdlib>
#include <memory>
#include <string>

#include <strata/communicator.hpp>
#include <strata/memory.hpp>

namespace strata::perf {

// Where the calls of a run go: host memory (the calls complete before they return), or device
// memory and the stream (device.hpp's) they are enqueued on.
struct Target {
  bool device = false;
  void* stream = nullptr;
};

class Buffers {
 public:
  /// Two buffers of `bytes` (at least 64); `check`: the host staging buffers of device memory.
  Buffers(Communicator& comm, const std::string& alloc, size_t bytes, Target target, bool check);
  ~Buffers();
  Buffers(const Buffers&) = delete;
  Buffers& operator=(const Buffers&) = delete;

  /// Where the collectives read and write.
  std::byte* send() const { return static_cast<std::byte*>(target_.device ? devSend_ : send_); }
  std::byte* recv() const { return static_cast<std::byte*>(target_.device ? devRecv_ : recv_); }
  /// Where the inputs are prepared: send() and recv() themselves for host memory; device
  /// memory has them only with -c 1.
  std::byte* hostSend() const { return static_cast<std::byte*>(send_); }
  std::byte* hostRecv() const { return static_cast<std::byte*>(recv_); }

  /// Device memory: copies the first `bytes` of both staging buffers to the device buffers.
  void upload(size_t bytes) const;
  /// A result in send() or recv() readable on the host: itself for host memory, else a copy in
  /// the receive staging buffer (overwritten by the next prepare).
  const void* result(const void* where, size_t bytes) const;

 private:
  static constexpr size_t kAlign = 4096;
  struct Free {
    void operator()(void* p) const { std::free(p); }
  };
  std::unique_ptr<void, Free> heapSend_, heapRecv_;
  RegisteredMemory sendMem_, recvMem_;
  Communicator* shared_ = nullptr;  ///< --alloc allochost: freed with its freeHost
  void* send_ = nullptr;
  void* recv_ = nullptr;
  Target target_;
  void* devSend_ = nullptr;
  void* devRecv_ = nullptr;
  size_t bytes_ = 0;
};

// A CUDA stream for the run (none for host memory), destroyed after the communicator.
struct StreamDestroy {
  void operator()(void* stream) const noexcept;
};
using StreamHandle = std::unique_ptr<void, StreamDestroy>;

}  // namespace strata::perf
