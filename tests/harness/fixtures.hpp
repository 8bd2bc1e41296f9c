#pragma once

// What every multi-process suite (tests/conformance, tests/transport/core, tests/collectives)
// names without its namespace, declared once: the public API's types, the harness's helpers
// (mp_test.hpp, which also brings RANK_SCOPE and REQUIRE_RANKS) and the clock the cases time
// with. For suite sources only: it declares names in the global namespace.

#include <chrono>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include <strata/bootstrap.hpp>
#include <strata/communicator.hpp>
#include <strata/config.hpp>
#include <strata/error.hpp>
#include <strata/transport.hpp>

#include "tests/harness/mp_test.hpp"

using strata::Bootstrap;
using strata::Communicator;
using strata::Config;
using strata::Connection;
using strata::Context;
using strata::DataType;
using strata::Error;
using strata::ErrorCode;
using strata::HostSemaphore;
using strata::MemoryKind;
using strata::ReduceOp;
using strata::RegisteredMemory;

using strata::testing::catchError;
using strata::testing::checkPattern;
using strata::testing::describe;
using strata::testing::fillPattern;
using strata::testing::launchEnv;
using strata::testing::namesRank;
using strata::testing::secondsSince;

using Clock = std::chrono::steady_clock;

/// A fresh communicator from the launcher's environment plus `settings` (highest precedence).
inline std::unique_ptr<Communicator> makeComm(
    std::initializer_list<std::pair<const char*, const char*>> settings = {}) {
  Config cfg = Config::load();
  for (const auto& [key, value] : settings) cfg.set(key, value);
  return Communicator::create(cfg);
}

/// describe() of an optional error, for messages that Boost.Test builds even when the check
/// passes.
inline std::string errText(const std::optional<Error>& e) {
  return e ? describe(*e) : "no error";
}
