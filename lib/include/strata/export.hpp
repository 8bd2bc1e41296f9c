#pragma once

// Symbols of libstrata.so are hidden by default; STRATA_API marks what is exported
// (the public API and the parts of lib/base that backend modules use).
#if defined(_WIN32)
#define STRATA_API
#else
#define STRATA_API __attribute__((visibility("default")))
#endif
