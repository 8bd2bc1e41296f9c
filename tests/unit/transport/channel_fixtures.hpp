#pragma once

// What the files of the unit test `channels` share: buffers of known alignment, the byte their
// guards hold, and the first failure a worker thread saw (header-only).

#include <atomic>
#include <mutex>
#include <new>
#include <string>
#include <utility>

namespace channels_test {

// Buffers with a known base alignment (so "misalignment k" means address % 16 == k).
struct AlignedBuffer {
  explicit AlignedBuffer(size_t bytes)
      : data(new (std::align_val_t{64}) char[bytes]), size(bytes) {}
  ~AlignedBuffer() { ::operator delete[](data, std::align_val_t{64}); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  char* data;
  size_t size;
};

// The first failure seen by a worker thread (Boost.Test assertions are not thread-safe), reported
// by the main thread after join.
struct FirstFailure {
  std::mutex mu;
  std::string message;
  std::atomic<bool> failed{false};
  void set(std::string m) {
    std::lock_guard<std::mutex> lock(mu);
    if (message.empty()) message = std::move(m);
    failed.store(true);
  }
};

inline constexpr char kGuard = static_cast<char>(0xA5);

}  // namespace channels_test
