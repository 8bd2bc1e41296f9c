#pragma once

// Makes a device current for a scope and gives the calling thread back exactly what it had.
// CUDA's runtime reports device 0 from cudaGetDevice in a thread that never chose a device;
// restoring that with cudaSetDevice(0) would create (and make current) a context on GPU 0 in a
// thread, and a process, that never used it: NCCL-style libraries called from a thread pool
// must not. So the guard saves the thread's current context (the driver's cuCtxGetCurrent,
// which says "none" truthfully) and restores that context, or none. No CUDA here: the calls
// come from Api, so that the rule is tested without a GPU (tests/cuda-emu). For CUDA modules
// (the CUDA collectives, the nvlink transport): each supplies an Api over the driver entry
// points it resolves through the runtime.

namespace strata::backend {

/// Api has static int getContext(void** ctx), int setContext(void* ctx) (0: success, as the
/// driver's CUresult) and int setDevice(int device) (cudaSetDevice). A guard whose getContext
/// failed restores nothing.
template <class Api>
class DeviceGuardT {
 public:
  explicit DeviceGuardT(int device) {
    saved_ = Api::getContext(&previous_) == 0;
    Api::setDevice(device);
  }
  ~DeviceGuardT() {
    if (saved_) Api::setContext(previous_);  // previous_ may be null: no context, as before
  }
  DeviceGuardT(const DeviceGuardT&) = delete;
  DeviceGuardT& operator=(const DeviceGuardT&) = delete;

 private:
  void* previous_ = nullptr;
  bool saved_ = false;
};

}  // namespace strata::backend
