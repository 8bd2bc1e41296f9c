#pragma once
#ifndef STRATA_INTERNAL_HEADERS
#error "transport/testing.hpp is internal to strata: applications include <strata/...> only"
#endif

// Stand-ins for unit tests that exercise code above the transports (channels, the proxy)
// without a Context: handles with no transport registration behind them. Only tests include
// this header; the Impl structs stay private to lib/transport.

#include <memory>
#include <string>

#include <strata/backend/transport.hpp>
#include <strata/memory.hpp>
#include <strata/transport.hpp>

namespace strata::transport::testing {

/// A local buffer (data, bytes, owned by rank 0) or a remote view of `bytes` owned by `rank`
/// that claims to be imported through `transportName`; neither is registered anywhere.
RegisteredMemory fakeMemory(bool local, void* data, size_t bytes, int rank = 1,
                            const std::string& transportName = "");
/// A Connection to peer over `conn` (null: a connection whose calls are never made).
std::shared_ptr<Connection> connectionOver(int peer, const std::string& transportName,
                                           std::unique_ptr<backend::TransportConnection> conn);

}  // namespace strata::transport::testing
