#pragma once

// Where a buffer handed to the Communicator lives. libstrata links no CUDA: a buffer can be
// CUDA memory only in a process that has loaded the CUDA driver, so the driver is looked up
// without loading it (dlopen RTLD_NOLOAD) and asked with cuPointerGetAttribute; without it,
// every buffer is host memory.

#include <strata/backend/collectives.hpp>

namespace strata::core {

backend::BufferKind classifyBuffer(const void* p) noexcept;

}  // namespace strata::core
