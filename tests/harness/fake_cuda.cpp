// A stand-in for the CUDA driver (soname libcuda.so.1) for the tests of host memory on a stream
// (tests/nccl/stream_test.c, tests/unit/core/test_selection.cpp): it knows no memory
// (cuPointerGetAttribute fails: host memory) but the range fakeCudaDeviceRange names, which it
// calls device memory (nothing may touch it then: a test of what is refused), and
// cuStreamSynchronize finishes the "kernel" the test queued with fakeCudaPending (it writes the
// buffer then) and counts.
#include <cstddef>
#include <cstdint>

extern "C" {

static float* pendingDst;
static size_t pendingCount;
static float pendingValue;
static int syncs;
static int failNext;
static uintptr_t deviceBegin, deviceEnd;

int cuPointerGetAttribute(void* data, int attribute, uintptr_t ptr) {
  if (ptr < deviceBegin || ptr >= deviceEnd) {
    return 1;  // CUDA_ERROR_INVALID_VALUE: memory CUDA does not know
  }
  if (attribute == 2) {  // CU_POINTER_ATTRIBUTE_MEMORY_TYPE: CU_MEMORYTYPE_DEVICE
    *static_cast<unsigned*>(data) = 2;
    return 0;
  }
  if (attribute == 8) {  // CU_POINTER_ATTRIBUTE_IS_MANAGED: no
    *static_cast<uint32_t*>(data) = 0;
    return 0;
  }
  return 1;
}

void fakeCudaDeviceRange(void* begin, size_t bytes) {
  deviceBegin = reinterpret_cast<uintptr_t>(begin);
  deviceEnd = deviceBegin + bytes;
}

int cuStreamSynchronize(void* stream) {
  (void)stream;
  if (failNext) {
    failNext = 0;
    return 700;  // CUDA_ERROR_ILLEGAL_ADDRESS: an earlier kernel on the stream faulted
  }
  for (size_t i = 0; i < pendingCount; ++i) pendingDst[i] = pendingValue;
  pendingCount = 0;
  ++syncs;
  return 0;
}

void fakeCudaPending(float* dst, size_t count, float value) {
  pendingDst = dst;
  pendingCount = count;
  pendingValue = value;
}

int fakeCudaSyncs(void) {
  return syncs;
}

void fakeCudaFailNext(void) {
  failNext = 1;
}

}  // extern "C"
