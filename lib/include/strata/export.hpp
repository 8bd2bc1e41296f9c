#pragma once

// Symbols of libstrata.so are hidden by default; STRATA_API marks what is exported
// (the public API, and the internal functions that modules and tools call: lib/base; for bootstrap
// modules also lib/net, lib/launch and lib/mesh; for tools lib/launch, lib/watch, lib/bootstrap).
#if defined(_WIN32)
#define STRATA_API
#else
#define STRATA_API __attribute__((visibility("default")))
#endif
