#pragma once

// Private to lib/bootstrap: the start-up agreement (agreement.cpp).

#include <strata/bootstrap.hpp>
#include <strata/config.hpp>

namespace strata::bootstrap {

/// One allGather of every rank's must-match choices; throws InvalidConfig naming the key, rank 0's
/// value and the first rank that differs (the same error on every rank). Nothing for one rank.
void checkAgreement(Bootstrap& b, const Config& config);

}  // namespace strata::bootstrap
