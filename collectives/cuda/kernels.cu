// The CUDA collectives' kernels: each (kernel id, element type) pair of kernels.hpp as
// its own __global__ function, run with the CUDA thread context. Built by nvcc for sm_80 and
// sm_90 with spills and local memory as errors (meson.build).

#include <cuda_runtime.h>

#include "kernels.hpp"
#include "launch.hpp"

namespace strata::cuda {

/// The thread context of a real launch (tests/cuda-emu/emu.hpp has the host one).
struct CudaThread {
  STRATA_HOST_DEVICE uint32_t thread() const {
#if defined(__CUDA_ARCH__)
    return threadIdx.x;
#else
    return 0;
#endif
  }
  STRATA_HOST_DEVICE uint32_t threads() const {
#if defined(__CUDA_ARCH__)
    return blockDim.x;
#else
    return 1;
#endif
  }
  STRATA_HOST_DEVICE uint32_t block() const {
#if defined(__CUDA_ARCH__)
    return blockIdx.x;
#else
    return 0;
#endif
  }
  STRATA_HOST_DEVICE uint32_t blocks() const {
#if defined(__CUDA_ARCH__)
    return gridDim.x;
#else
    return 1;
#endif
  }
  STRATA_HOST_DEVICE void sync() {
#if defined(__CUDA_ARCH__)
    __syncthreads();
#endif
  }
  STRATA_HOST_DEVICE bool syncAnd(bool ok) {
#if defined(__CUDA_ARCH__)
    return __syncthreads_and(ok) != 0;
#else
    return ok;
#endif
  }
  STRATA_HOST_DEVICE void spin() {
    device::spinPause();
  }
};

template <KernelId Id, class T>
__global__ void __launch_bounds__(kMaxThreads, 1)
    collectiveKernel(const __grid_constant__ KernelArgs a) {
  CudaThread ctx;
  runKernel<Id, T>(ctx, a);
}

namespace {

using KernelFn = void (*)(KernelArgs);

template <class T>
KernelFn reducingKernel(KernelId id) {
  switch (id) {
    case KernelId::AllReduceOneShot:
      return collectiveKernel<KernelId::AllReduceOneShot, T>;
    case KernelId::AllReduceTwoShot:
      return collectiveKernel<KernelId::AllReduceTwoShot, T>;
    case KernelId::AllReduceDirect:
      return collectiveKernel<KernelId::AllReduceDirect, T>;
    case KernelId::ReduceScatterPackets:
      return collectiveKernel<KernelId::ReduceScatterPackets, T>;
    case KernelId::ReduceScatterDirect:
      return collectiveKernel<KernelId::ReduceScatterDirect, T>;
    default:
      return nullptr;
  }
}

KernelFn copyingKernel(KernelId id) {
  switch (id) {
    case KernelId::AllGatherPackets:
      return collectiveKernel<KernelId::AllGatherPackets, uint8_t>;
    case KernelId::AllGatherDirect:
      return collectiveKernel<KernelId::AllGatherDirect, uint8_t>;
    case KernelId::BroadcastPackets:
      return collectiveKernel<KernelId::BroadcastPackets, uint8_t>;
    case KernelId::BroadcastDirect:
      return collectiveKernel<KernelId::BroadcastDirect, uint8_t>;
    case KernelId::AllToAllPackets:
      return collectiveKernel<KernelId::AllToAllPackets, uint8_t>;
    case KernelId::AllToAllDirect:
      return collectiveKernel<KernelId::AllToAllDirect, uint8_t>;
    case KernelId::Send:
      return collectiveKernel<KernelId::Send, uint8_t>;
    case KernelId::Recv:
      return collectiveKernel<KernelId::Recv, uint8_t>;
    default:
      return nullptr;
  }
}

}  // namespace

int launchKernel(KernelId id, ElemType t, const KernelArgs& args, Shape shape, void* stream) {
  KernelFn fn = nullptr;
  if (reduces(id)) {
    withElemType(t, [&]<class T>() { fn = reducingKernel<T>(id); });
  } else {
    fn = copyingKernel(id);
  }
  if (fn == nullptr) return static_cast<int>(cudaErrorInvalidValue);
  fn<<<shape.blocks, shape.threads, 0, static_cast<cudaStream_t>(stream)>>>(args);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace strata::cuda
