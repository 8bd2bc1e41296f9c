// device.hpp without CUDA: strata-perf was built where meson found no CUDA toolkit, so
// --memory cuda is skipped (exit 77) before anything here throws.

#include <strata/error.hpp>

#include "device.hpp"

namespace strata::perf::device {

namespace {

[[noreturn]] void unavailable() {
  throw Error(ErrorCode::NotSupported,
              "this strata-perf was built without CUDA (meson found no CUDA toolkit); rebuild "
              "with -Dcuda=enabled for --memory cuda");
}

}  // namespace

bool built() noexcept {
  return false;
}

Probe probe() noexcept {
  return Probe{0, "this strata-perf was built without CUDA"};
}

Info select(int) {
  unavailable();
}
void* createStream() {
  unavailable();
}
void destroyStream(void*) noexcept {}
void synchronize(void*) {
  unavailable();
}
void* allocate(size_t) {
  unavailable();
}
void release(void*) noexcept {}
void toDevice(void*, const void*, size_t, void*) {
  unavailable();
}
void toHost(void*, const void*, size_t, void*) {
  unavailable();
}
void zero(void*, size_t, void*) {
  unavailable();
}
void copyAsync(void*, const void*, size_t, void*) {
  unavailable();
}

Graph::~Graph() = default;
void Graph::begin(void*) {
  unavailable();
}
void Graph::end() {
  unavailable();
}
void Graph::launch(void*) {
  unavailable();
}

}  // namespace strata::perf::device
