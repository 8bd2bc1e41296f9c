#include <strata/version.hpp>

namespace strata {
const char* versionString() noexcept { return STRATA_VERSION_STRING; }
}  // namespace strata
