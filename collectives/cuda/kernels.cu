// The CUDA collectives' kernels: each (kernel id, element type) pair of kernels.hpp as
// its own __global__ function, run with the CUDA thread context. Built by nvcc for sm_80 and
// sm_90 with spills and local memory as errors (meson.build).

#include <cuda_runtime.h>

#include <string>

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
  /// A wait polls back to back for its first kSpinPolls polls (the short waits of packets and
  /// handshakes see the data as soon as it lands), then sleeps a little between polls
  /// (__nanosleep), so that long waits leave the memory system to the blocks that work.
  static constexpr uint32_t kSpinPolls = 512;
  STRATA_HOST_DEVICE void spin(uint32_t polls) {
    if (polls > kSpinPolls) device::spinPause();
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
    case KernelId::NetReduce:
      return collectiveKernel<KernelId::NetReduce, T>;
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
    case KernelId::NetGather:
      return collectiveKernel<KernelId::NetGather, uint8_t>;
    default:
      return nullptr;
  }
}

}  // namespace

std::string preloadKernels(uint32_t threads) {
  const ElemType types[] = {ElemType::Int8,  ElemType::Uint8,  ElemType::Int32, ElemType::Uint32,
                            ElemType::Int64, ElemType::Uint64, ElemType::Half,  ElemType::BFloat16,
                            ElemType::Float, ElemType::Double};
  for (int i = 0; i < kKernelIds; ++i) {
    const KernelId id = static_cast<KernelId>(i);
    for (ElemType t : types) {
      KernelFn fn = nullptr;
      if (reduces(id)) {
        withElemType(t, [&]<class T>() { fn = reducingKernel<T>(id); });
      } else if (t == ElemType::Int8) {
        fn = copyingKernel(id);  // one instantiation for every type
      }
      if (fn == nullptr) continue;
      // Loads the kernel now (with lazy loading, CUDA 12.2+, the first launch would, and may
      // wait for the context's running kernels: a peer's spinning kernel among them).
      cudaFuncAttributes attr{};
      const cudaError_t e = cudaFuncGetAttributes(&attr, reinterpret_cast<const void*>(fn));
      const std::string name =
          toString(id) + (reduces(id) ? " (type " + std::to_string(static_cast<int>(t)) + ")" : "");
      if (e != cudaSuccess) {
        return "loading kernel " + name + ": " + cudaGetErrorString(e) + " (" +
               cudaGetErrorName(e) + ")";
      }
      if (static_cast<uint32_t>(attr.maxThreadsPerBlock) < threads) {
        return "kernel " + name + " runs at most " + std::to_string(attr.maxThreadsPerBlock) +
               " threads per block on this device (" + std::to_string(attr.numRegs) +
               " registers per thread), collectives.cuda.threads is " + std::to_string(threads);
      }
      if (attr.localSizeBytes != 0) {
        return "kernel " + name + " uses " + std::to_string(attr.localSizeBytes) +
               " bytes of local memory per thread on this device (the build forbids it)";
      }
    }
  }
  return {};
}

int launchKernel(KernelId id, ElemType t, const KernelArgs& args, Shape shape, void* stream) {
  KernelFn fn = nullptr;
  if (reduces(id)) {
    withElemType(t, [&]<class T>() { fn = reducingKernel<T>(id); });
  } else {
    fn = copyingKernel(id);
  }
  if (fn == nullptr) return static_cast<int>(cudaErrorInvalidValue);
  // The launch's own status: cudaGetLastError() after <<<>>> would also return (and clear) an
  // earlier, unrelated error of the caller's.
  KernelArgs copy = args;
  void* params[] = {&copy};
  return static_cast<int>(cudaLaunchKernel(reinterpret_cast<const void*>(fn), dim3(shape.blocks),
                                           dim3(shape.threads), params, 0,
                                           static_cast<cudaStream_t>(stream)));
}

}  // namespace strata::cuda
