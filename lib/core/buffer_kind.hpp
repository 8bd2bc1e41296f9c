#pragma once

// Where a buffer handed to the Communicator lives. libstrata links no CUDA: a buffer can be
// CUDA memory only in a process that has loaded the CUDA driver, so the driver is looked up
// without loading it (dlopen RTLD_NOLOAD) and asked with cuPointerGetAttribute; without it,
// every buffer is host memory.

#include <strata/backend/collectives.hpp>

namespace strata::core {

backend::BufferKind classifyBuffer(const void* p) noexcept;

/// cuStreamSynchronize(stream) through the driver where the process has loaded it; nothing
/// without it (no CUDA work can be pending). Throws BackendError when the stream reports an
/// error (an earlier kernel on it failed).
void synchronizeStream(void* stream);

}  // namespace strata::core
