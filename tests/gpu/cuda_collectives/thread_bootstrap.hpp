#pragma once

// An in-process bootstrap for test-cuda-collectives: every rank is a thread of this process.

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include <fmt/format.h>
#include <strata/bootstrap.hpp>
#include <strata/error.hpp>

#include "tests/gpu/cuda_collectives/harness.hpp"

namespace cuda_coll_test {

/// The message queues of all ranks: one FIFO per (sender, receiver, tag), under one mutex.
class Hub {
 public:
  Hub(int size, double timeoutSeconds) : size_(size), timeout_(timeoutSeconds) {}

  int size() const { return size_; }

  void put(int src, int dst, int tag, const void* data, size_t bytes) {
    const auto* p = static_cast<const uint8_t*>(data);
    std::lock_guard<std::mutex> lock(mu_);
    throwIfAborted();
    queues_[{src, dst, tag}].emplace_back(p, p + bytes);
    cv_.notify_all();
  }

  void take(int src, int dst, int tag, void* data, size_t bytes, const char* what) {
    std::unique_lock<std::mutex> lock(mu_);
    auto& q = queues_[{src, dst, tag}];
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(timeout_);
    for (;;) {
      throwIfAborted();
      if (!q.empty()) break;
      if (cv_.wait_until(lock, deadline) == std::cv_status::timeout) {
        throwIfAborted();
        if (!q.empty()) break;
        throw Error(ErrorCode::Timeout,
                    fmt::format("thread bootstrap: rank {} waited {} s in {} for rank {} (tag {})",
                                dst, timeout_.count(), what, src, tag),
                    src);
      }
    }
    std::vector<uint8_t> m = std::move(q.front());
    q.pop_front();
    if (m.size() != bytes) {
      throw Error(ErrorCode::ProtocolError,
                  fmt::format("thread bootstrap: rank {} expected {} bytes from rank {} with tag "
                              "{} in {}, rank {} sent {}",
                              dst, bytes, src, tag, what, src, m.size()),
                  src);
    }
    if (bytes > 0) std::memcpy(data, m.data(), bytes);
  }

  void abort(int origin, std::string_view reason) noexcept {
    std::lock_guard<std::mutex> lock(mu_);
    if (abortOrigin_ < 0) {
      abortOrigin_ = origin;
      abortReason_ = std::string(reason);
    }
    cv_.notify_all();
  }

  bool aborted() {
    std::lock_guard<std::mutex> lock(mu_);
    return abortOrigin_ >= 0;
  }

 private:
  void throwIfAborted() const {
    if (abortOrigin_ >= 0) {
      throw Error(ErrorCode::Aborted,
                  fmt::format("thread bootstrap: rank {} aborted: {}", abortOrigin_, abortReason_),
                  abortOrigin_);
    }
  }

  const int size_;
  const std::chrono::duration<double> timeout_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::tuple<int, int, int>, std::deque<std::vector<uint8_t>>> queues_;
  int abortOrigin_ = -1;
  std::string abortReason_;
};

/// A Bootstrap whose ranks are threads of this process. Collectives are built on send/recv
/// with tags below 0 (users' tags are >= 0), one at a time per rank.
class ThreadBootstrap final : public Bootstrap {
 public:
  ThreadBootstrap(std::shared_ptr<Hub> hub, int rank) : hub_(std::move(hub)), rank_(rank) {}

  std::string_view backend() const noexcept override { return "thread"; }
  int rank() const noexcept override { return rank_; }
  int size() const noexcept override { return hub_->size(); }
  int localRank() const noexcept override { return rank_; }
  int localSize() const noexcept override { return hub_->size(); }

  void send(int peer, int tag, const void* data, size_t bytes) override {
    checkPeer(peer, tag, "send");
    hub_->put(rank_, peer, tag, data, bytes);
  }
  void recv(int peer, int tag, void* data, size_t bytes) override {
    checkPeer(peer, tag, "recv");
    hub_->take(peer, rank_, tag, data, bytes, "recv");
  }
  void allGather(void* data, size_t bytesPerRank) override {
    std::lock_guard<std::mutex> lock(collectiveMu_);
    gather(data, bytesPerRank, kTagAllGather, "allGather");
  }
  void broadcast(void* data, size_t bytes, int root) override {
    std::lock_guard<std::mutex> lock(collectiveMu_);
    if (root < 0 || root >= size()) {
      throw Error(ErrorCode::InvalidArgument,
                  fmt::format("thread bootstrap: broadcast root {} of {} ranks", root, size()));
    }
    if (root == rank_) {
      for (int q = 0; q < size(); ++q) {
        if (q != rank_) hub_->put(rank_, q, kTagBroadcast, data, bytes);
      }
    } else {
      hub_->take(root, rank_, kTagBroadcast, data, bytes, "broadcast");
    }
  }
  void barrier() override {
    std::lock_guard<std::mutex> lock(collectiveMu_);
    std::vector<uint8_t> slots(static_cast<size_t>(size()));
    gather(slots.data(), 1, kTagBarrier, "barrier");
  }
  void abort(std::string_view reason) noexcept override { hub_->abort(rank_, reason); }

 private:
  static constexpr int kTagAllGather = -1;
  static constexpr int kTagBroadcast = -2;
  static constexpr int kTagBarrier = -3;

  void checkPeer(int peer, int tag, const char* what) const {
    if (peer < 0 || peer >= size() || tag < 0) {
      throw Error(ErrorCode::InvalidArgument,
                  fmt::format("thread bootstrap: {} to peer {} with tag {} ({} ranks, tags >= 0)",
                              what, peer, tag, size()));
    }
  }
  void gather(void* data, size_t bytesPerRank, int tag, const char* what) {
    auto* base = static_cast<uint8_t*>(data);
    for (int q = 0; q < size(); ++q) {
      if (q != rank_) hub_->put(rank_, q, tag, base + bytesPerRank * rank_, bytesPerRank);
    }
    for (int q = 0; q < size(); ++q) {
      if (q != rank_) hub_->take(q, rank_, tag, base + bytesPerRank * q, bytesPerRank, what);
    }
  }

  std::shared_ptr<Hub> hub_;
  const int rank_;
  std::mutex collectiveMu_;
};

}  // namespace cuda_coll_test
