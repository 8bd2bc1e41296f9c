#pragma once

/// Umbrella header.
#include <strata/bootstrap.hpp>
#include <strata/channel.hpp>
#include <strata/communicator.hpp>
#include <strata/config.hpp>
#include <strata/error.hpp>
#include <strata/memory.hpp>
#include <strata/transport.hpp>
#include <strata/types.hpp>
#include <strata/version.hpp>
