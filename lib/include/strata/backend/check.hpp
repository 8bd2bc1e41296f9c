#pragma once

// One line of the pre-flight check (strata-info --check, docs/topology.md): what was looked at,
// whether it is fine, what was found, and what strata does about it. lib/topology writes the
// lines it learns from hwloc and sysfs; a transport or collectives module that knows more about
// its own hardware (libfabric's FI_HMEM per NIC, CUDA peer access) adds its lines through
// ModuleInfo::preflight.

#include <string>

namespace strata::backend {

struct CheckLine {
  std::string what;
  enum class State { Ok, Warn, Unknown } state = State::Ok;
  std::string found;
  std::string fallback;  ///< empty when nothing changes
};

}  // namespace strata::backend
