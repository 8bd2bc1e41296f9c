#pragma once

// The boundary between the module's host code (backend.cpp, g++) and its kernels (kernels.cu,
// nvcc): one launch function over kernel ids and element types.

#include <string>

#include "plan.hpp"

namespace strata::cuda {

/// Enqueues kernel id (element type t) on stream (a cudaStream_t) with the given grid and block;
/// returns the cudaError_t of the launch (0: enqueued).
/// Loads every kernel of the module on the current device (cudaFuncGetAttributes) and checks
/// that each runs `threads` threads per block with no local memory; empty when all do, else what
/// does not. Called at set-up: with CUDA's lazy loading the first launch of a kernel loads it
/// and may wait for the context's running kernels, so a rank whose first recv launch queued
/// behind its peer's spinning send would deadlock.
std::string preloadKernels(uint32_t threads);

int launchKernel(KernelId id, ElemType t, const KernelArgs& args, Shape shape, void* stream);

}  // namespace strata::cuda
