#include "buffer_kind.hpp"

#include <dlfcn.h>
#include <link.h>

#include <atomic>
#include <cstdint>

#include <fmt/format.h>

#include <strata/error.hpp>

namespace strata::core {
namespace {

// From cuda.h (the driver API's ABI, stable across versions): CUresult
// cuPointerGetAttribute(void* data, CUpointer_attribute attribute, CUdeviceptr ptr).
using PointerGetAttribute = int (*)(void* data, int attribute, uintptr_t ptr);
/// CUresult cuStreamSynchronize(CUstream stream).
using StreamSynchronize = int (*)(void* stream);
constexpr int kAttributeMemoryType = 2;  // CU_POINTER_ATTRIBUTE_MEMORY_TYPE
constexpr int kAttributeIsManaged = 8;   // CU_POINTER_ATTRIBUTE_IS_MANAGED
constexpr unsigned kMemoryTypeHost = 1;  // CU_MEMORYTYPE_HOST
constexpr unsigned kMemoryTypeDevice = 2;
constexpr unsigned kMemoryTypeUnified = 4;

std::atomic<PointerGetAttribute> gQuery{nullptr};
std::atomic<StreamSynchronize> gSynchronize{nullptr};
/// The process's count of shared-object loads when libcuda was last looked for and not found.
std::atomic<unsigned long long> gMissingAt{~0ull};

int firstObject(dl_phdr_info* info, size_t, void* data) {
  *static_cast<unsigned long long*>(data) = info->dlpi_adds;
  return 1;  // the counter is the same in every entry: stop at the first
}

/// How many shared objects this process has loaded so far (glibc's dlpi_adds): about 10 ns,
/// where a dlopen(RTLD_NOLOAD) that finds nothing costs about 9 us.
unsigned long long loadCount() noexcept {
  unsigned long long n = 0;
  dl_iterate_phdr(firstObject, &n);
  return n;
}

/// The driver's query if the process has loaded libcuda (never loads it: a process without it
/// has no CUDA memory). Looked up again whenever the process has loaded another shared object
/// since the last miss, since the application may load CUDA after it created the communicator.
PointerGetAttribute query() noexcept {
  if (auto q = gQuery.load(std::memory_order_acquire)) return q;
  const unsigned long long loads = loadCount();
  if (loads == gMissingAt.load(std::memory_order_relaxed)) return nullptr;
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (!lib) {
    gMissingAt.store(loads, std::memory_order_relaxed);
    return nullptr;
  }
  auto q = reinterpret_cast<PointerGetAttribute>(dlsym(lib, "cuPointerGetAttribute"));
  // The handle stays open (a reference that keeps the already loaded driver where it is).
  gSynchronize.store(reinterpret_cast<StreamSynchronize>(dlsym(lib, "cuStreamSynchronize")),
                     std::memory_order_relaxed);
  if (q) gQuery.store(q, std::memory_order_release);
  return q;
}

}  // namespace

backend::BufferKind classifyBuffer(const void* p) noexcept {
  if (p == nullptr) return backend::BufferKind::Host;
  PointerGetAttribute q = query();
  if (!q) return backend::BufferKind::Host;
  unsigned type = 0;
  // Fails (CUDA_ERROR_INVALID_VALUE) for memory CUDA does not know: plain host memory.
  if (q(&type, kAttributeMemoryType, reinterpret_cast<uintptr_t>(p)) != 0) {
    return backend::BufferKind::Host;
  }
  uint32_t managed = 0;
  if (q(&managed, kAttributeIsManaged, reinterpret_cast<uintptr_t>(p)) == 0 && managed != 0) {
    return backend::BufferKind::CudaHost;  // managed: the CPU may touch it
  }
  if (type == kMemoryTypeDevice) return backend::BufferKind::CudaDevice;
  if (type == kMemoryTypeHost || type == kMemoryTypeUnified) return backend::BufferKind::CudaHost;
  return backend::BufferKind::Host;
}

void synchronizeStream(void* stream) {
  if (stream == nullptr || query() == nullptr) return;
  StreamSynchronize sync = gSynchronize.load(std::memory_order_relaxed);
  if (sync == nullptr) return;
  if (int rc = sync(stream); rc != 0) {
    throw Error(ErrorCode::BackendError,
                fmt::format("cuStreamSynchronize failed ({}) on the CUDA stream of a call on host "
                            "memory: an earlier operation on that stream failed",
                            rc));
  }
}

}  // namespace strata::core

namespace strata {

bool isDeviceMemory(const void* p) noexcept {
  return core::classifyBuffer(p) == backend::BufferKind::CudaDevice;
}

Stream hostOrdered(const void* buffer, Stream stream) {
  if (stream.handle == nullptr) return stream;
  if (core::classifyBuffer(buffer) == backend::BufferKind::CudaDevice) return stream;
  core::synchronizeStream(stream.handle);
  return Stream{};
}

}  // namespace strata
