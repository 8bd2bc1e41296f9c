#pragma once

// Private to lib/bootstrap: what every bootstrap goes through once its backend is up.

#include <functional>
#include <memory>

#include <strata/bootstrap.hpp>
#include <strata/config.hpp>

#include "launch/contract.hpp"

namespace strata::bootstrap {

/// Applies log.level and log.file, creates the backend, puts its rank in log lines, runs the
/// start-up agreement and attaches the watch (with `launch`, else the environment's launch).
/// Bootstrap::create and createTcpBootstrap both come through here.
std::unique_ptr<Bootstrap> assemble(const Config& config, const LaunchInfo* launch,
                                    const std::function<std::unique_ptr<Bootstrap>()>& backend);

}  // namespace strata::bootstrap
