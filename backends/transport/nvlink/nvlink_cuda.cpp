#include "nvlink_cuda.hpp"

#include <fmt/format.h>

#include <mutex>

#include <strata/error.hpp>

namespace strata::nvlink {

std::string cudaErrorText(cudaError_t err) {
  return fmt::format("{}: {}", cudaGetErrorName(err), cudaGetErrorString(err));
}

void clearCudaError() noexcept {
  (void)cudaGetLastError();
}

void checkCuda(cudaError_t err, std::string_view what, int peer) {
  if (err == cudaSuccess) return;
  clearCudaError();
  std::string msg = fmt::format("nvlink: {} failed: {}", what, cudaErrorText(err));
  if (peer >= 0) msg += fmt::format(" (peer rank {})", peer);
  throw Error(ErrorCode::BackendError, msg, peer);
}

namespace {

template <typename Fn>
void resolve(const char* symbol, Fn& fn) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult status{};
  // Version 12000 pins the signatures of the PFN_*_v* typedefs above (the _v2 variants);
  // a newer driver still serves them.
  if (cudaGetDriverEntryPointByVersion(symbol, &p, 12000, cudaEnableDefault, &status) !=
          cudaSuccess ||
      status != cudaDriverEntryPointSuccess) {
    clearCudaError();
    p = nullptr;
  }
  fn = reinterpret_cast<Fn>(p);
}

Driver load() {
  Driver d;
  resolve("cuGetErrorString", d.getErrorString);
  resolve("cuDeviceGet", d.deviceGet);
  resolve("cuDeviceGetAttribute", d.deviceGetAttribute);
  resolve("cuMemGetAddressRange", d.memGetAddressRange);
  resolve("cuMemRetainAllocationHandle", d.memRetainAllocationHandle);
  resolve("cuMemGetAllocationPropertiesFromHandle", d.memGetAllocationPropertiesFromHandle);
  resolve("cuMemExportToShareableHandle", d.memExportToShareableHandle);
  resolve("cuMemImportFromShareableHandle", d.memImportFromShareableHandle);
  resolve("cuMemAddressReserve", d.memAddressReserve);
  resolve("cuMemAddressFree", d.memAddressFree);
  resolve("cuMemMap", d.memMap);
  resolve("cuMemUnmap", d.memUnmap);
  resolve("cuMemSetAccess", d.memSetAccess);
  resolve("cuMemRelease", d.memRelease);
  return d;
}

}  // namespace

bool Driver::hasFabricCalls() const noexcept {
  return deviceGet && deviceGetAttribute && memRetainAllocationHandle &&
         memGetAllocationPropertiesFromHandle && memExportToShareableHandle &&
         memImportFromShareableHandle && memAddressReserve && memAddressFree && memMap &&
         memUnmap && memSetAccess && memRelease;
}

std::string Driver::errorText(CUresult res) const {
  const char* s = nullptr;
  if (getErrorString && getErrorString(res, &s) == CUDA_SUCCESS && s) {
    return fmt::format("CUresult {}: {}", static_cast<int>(res), s);
  }
  return fmt::format("CUresult {}", static_cast<int>(res));
}

bool Driver::fabricSupported(int device) const noexcept {
  if (!hasFabricCalls()) return false;
  CUdevice dev = 0;
  int value = 0;
  if (deviceGet(&dev, device) != CUDA_SUCCESS) return false;
  if (deviceGetAttribute(&value, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED, dev) !=
      CUDA_SUCCESS) {
    return false;
  }
  return value != 0;
}

const Driver& driver() {
  static std::once_flag once;
  static Driver d;
  std::call_once(once, [] { d = load(); });
  if (!d.memGetAddressRange) {
    throw Error(ErrorCode::NotSupported,
                "nvlink: the CUDA driver does not provide cuMemGetAddressRange through "
                "cudaGetDriverEntryPointByVersion; update the NVIDIA driver");
  }
  return d;
}

int ContextApi::getContext(void** ctx) {
  static const PFN_cuCtxGetCurrent_v4000 fn = [] {
    PFN_cuCtxGetCurrent_v4000 f = nullptr;
    resolve("cuCtxGetCurrent", f);
    return f;
  }();
  return fn != nullptr ? static_cast<int>(fn(reinterpret_cast<CUcontext*>(ctx))) : -1;
}

int ContextApi::setContext(void* ctx) {
  static const PFN_cuCtxSetCurrent_v4000 fn = [] {
    PFN_cuCtxSetCurrent_v4000 f = nullptr;
    resolve("cuCtxSetCurrent", f);
    return f;
  }();
  return fn != nullptr ? static_cast<int>(fn(static_cast<CUcontext>(ctx))) : -1;
}

int ContextApi::setDevice(int device) {
  const cudaError_t e = cudaSetDevice(device);
  if (e != cudaSuccess) clearCudaError();
  return static_cast<int>(e);
}

}  // namespace strata::nvlink
