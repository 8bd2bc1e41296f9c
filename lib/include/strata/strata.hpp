#pragma once

/// Umbrella header.
#include <strata/bootstrap.hpp>
#include <strata/config.hpp>
#include <strata/error.hpp>
#include <strata/version.hpp>
