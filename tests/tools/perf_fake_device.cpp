// A stand-in for strata-perf's device.hpp with no GPU, linked into strata-perf-fake-cuda (the
// objects of strata-perf with this file instead of device_cuda.cpp), so that --memory cuda's
// code in the collective modes runs in CI: separate "device" buffers, the staging copies, the
// offsets of the in-place placements, the graph steps, the header and JSON lines.
//
// The "device" is host memory from aligned_alloc and the stream is null, so the Communicator
// sees host buffers and no stream and runs its host algorithms, which complete before they
// return: the timings mean nothing, and a "graph" records nothing (the captured calls ran when
// they were made). STRATA_PERF_FAKE_DEVICES sets the device count (default 1; 0: no device).

#include <cstdlib>
#include <cstring>
#include <string>

#include <strata/error.hpp>

#include "tools/strata-perf/device.hpp"

namespace strata::perf::device {

bool built() noexcept {
  return true;
}

Probe probe() noexcept {
  const char* env = std::getenv("STRATA_PERF_FAKE_DEVICES");
  Probe p;
  p.count = env ? std::atoi(env) : 1;
  if (p.count <= 0) {
    p.count = 0;
    p.error = "fake: STRATA_PERF_FAKE_DEVICES=0";
  }
  return p;
}

Info select(int index) {
  return Info{index, 0x42 + index, "fake device (host memory)"};
}

void* createStream() {
  return nullptr;
}
void destroyStream(void*) noexcept {}
void synchronize(void*) {}

void* allocate(size_t bytes) {
  void* p = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
  if (!p) throw Error(ErrorCode::SystemError, "fake device: out of memory");
  // Not what the staging buffers hold, so that a missing upload shows as wrong results.
  std::memset(p, 0x5a, bytes);
  return p;
}
void release(void* pointer) noexcept {
  std::free(pointer);
}
void toDevice(void* device, const void* host, size_t bytes, void*) {
  std::memcpy(device, host, bytes);
}
void toHost(void* host, const void* device, size_t bytes, void*) {
  std::memcpy(host, device, bytes);
}
void zero(void* device, size_t bytes, void*) {
  std::memset(device, 0, bytes);
}
void copyAsync(void* dst, const void* src, size_t bytes, void*) {
  std::memcpy(dst, src, bytes);
}

Graph::~Graph() = default;
void Graph::begin(void* stream) {
  stream_ = stream;
  capturing_ = true;
}
void Graph::end() {
  if (!capturing_) throw Error(ErrorCode::Internal, "fake graph: end() without begin()");
  capturing_ = false;
}
void Graph::launch(void*) {
  if (capturing_) throw Error(ErrorCode::Internal, "fake graph: launch() during the capture");
}

}  // namespace strata::perf::device
