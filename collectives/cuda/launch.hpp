#pragma once

// The boundary between the module's host code (backend.cpp, g++) and its kernels (kernels.cu,
// nvcc): one launch function over kernel ids and element types.

#include "plan.hpp"

namespace strata::cuda {

/// Enqueues kernel id (element type t) on stream (a cudaStream_t) with the given grid and block;
/// returns the cudaError_t of the launch (0: enqueued).
int launchKernel(KernelId id, ElemType t, const KernelArgs& args, Shape shape, void* stream);

}  // namespace strata::cuda
