#pragma once

// CUDA helpers of the nvlink transport: error wrapping and the few driver API calls it needs,
// resolved through cudaGetDriverEntryPointByVersion so that the module links only cudart (the
// driver, libcuda.so.1, is whatever the runtime found).

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <string>
#include <string_view>

#include <strata/backend/device_guard.hpp>

namespace strata::nvlink {

/// "cudaErrorNoDevice: no CUDA-capable device is detected".
std::string cudaErrorText(cudaError_t err);
/// Clears the runtime's last error after a call that was allowed to fail.
void clearCudaError() noexcept;

/// Throws Error(BackendError) "nvlink: <what> failed: <cuda error>[ (rank R)]" unless ok.
void checkCuda(cudaError_t err, std::string_view what, int peer = -1);

/// Driver entry points; each is null when the driver lacks it.
struct Driver {
  PFN_cuGetErrorString_v6000 getErrorString = nullptr;
  PFN_cuDeviceGet_v2000 deviceGet = nullptr;
  PFN_cuDeviceGetAttribute_v2000 deviceGetAttribute = nullptr;
  PFN_cuMemGetAddressRange_v3020 memGetAddressRange = nullptr;
  PFN_cuMemRetainAllocationHandle_v11000 memRetainAllocationHandle = nullptr;
  PFN_cuMemGetAllocationPropertiesFromHandle_v10020 memGetAllocationPropertiesFromHandle = nullptr;
  PFN_cuMemExportToShareableHandle_v10020 memExportToShareableHandle = nullptr;
  PFN_cuMemImportFromShareableHandle_v10020 memImportFromShareableHandle = nullptr;
  PFN_cuMemAddressReserve_v10020 memAddressReserve = nullptr;
  PFN_cuMemAddressFree_v10020 memAddressFree = nullptr;
  PFN_cuMemMap_v10020 memMap = nullptr;
  PFN_cuMemUnmap_v10020 memUnmap = nullptr;
  PFN_cuMemSetAccess_v10020 memSetAccess = nullptr;
  PFN_cuMemRelease_v10020 memRelease = nullptr;

  /// Everything the fabric-handle paths need.
  bool hasFabricCalls() const noexcept;
  /// "CUDA_ERROR_NOT_PERMITTED: operation not permitted".
  std::string errorText(CUresult res) const;
  /// CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED of a runtime device ordinal.
  bool fabricSupported(int device) const noexcept;
};

/// Resolved once per process (after the runtime found a device). Throws NotSupported when
/// cuMemGetAddressRange, which every registration needs, cannot be resolved.
const Driver& driver();

/// The driver's context calls for the device guard (<strata/backend/device_guard.hpp>).
struct ContextApi {
  static int getContext(void** ctx);
  static int setContext(void* ctx);
  static int setDevice(int device);
};
/// Makes a device current for a scope and gives the thread back its context, or none (the user
/// owns the current device, as with NCCL; the transport must not change it behind their back,
/// nor create a context on GPU 0 in a thread that never chose a device).
using DeviceGuard = backend::DeviceGuardT<ContextApi>;

}  // namespace strata::nvlink
