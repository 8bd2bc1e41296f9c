#include "coll_buffers.hpp"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include <strata/error.hpp>
#include <strata/transport.hpp>

#include "device.hpp"
#include "stats.hpp"

namespace strata::perf {

Buffers::Buffers(Communicator& comm, const std::string& alloc, size_t bytes, Target target,
                 bool check)
    : target_(target) {
  bytes = std::max<size_t>(bytes, 64);
  bytes_ = bytes;
  if (target_.device) {
    devSend_ = device::allocate(bytes);
    devRecv_ = device::allocate(bytes);
    device::zero(devSend_, bytes, target_.stream);
    device::zero(devRecv_, bytes, target_.stream);
    if (!check) return;
  }
  if (alloc == "allochost" && !target_.device) {
    shared_ = &comm;
    send_ = comm.allocHost(bytes);
    try {
      recv_ = comm.allocHost(bytes);
    } catch (...) {
      comm.freeHost(send_);
      throw;
    }
  } else if (alloc == "strata" && !target_.device) {
    sendMem_ = comm.context().allocate(bytes);
    recvMem_ = comm.context().allocate(bytes);
    send_ = sendMem_.data();
    recv_ = recvMem_.data();
  } else {
    const size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
    heapSend_.reset(std::aligned_alloc(kAlign, rounded));
    heapRecv_.reset(std::aligned_alloc(kAlign, rounded));
    if (!heapSend_ || !heapRecv_) {
      throw Error(
          ErrorCode::SystemError,
          fmt::format("cannot allocate 2 x {} of host memory; lower -e", formatBytes(bytes)));
    }
    send_ = heapSend_.get();
    recv_ = heapRecv_.get();
  }
  std::memset(send_, 0, bytes);
  std::memset(recv_, 0, bytes);
}

Buffers::~Buffers() {
  if (shared_) {
    shared_->freeHost(send_);
    shared_->freeHost(recv_);
  }
  device::release(devSend_);
  device::release(devRecv_);
}

void Buffers::upload(size_t bytes) const {
  if (!target_.device) return;
  device::toDevice(devSend_, send_, std::min(bytes, bytes_), target_.stream);
  device::toDevice(devRecv_, recv_, std::min(bytes, bytes_), target_.stream);
}

const void* Buffers::result(const void* where, size_t bytes) const {
  if (!target_.device) return where;
  device::toHost(recv_, where, bytes, target_.stream);
  return recv_;
}

void StreamDestroy::operator()(void* stream) const noexcept {
  device::destroyStream(stream);
}

}  // namespace strata::perf
