#pragma once
#ifndef STRATA_INTERNAL_HEADERS
#error "bootstrap/watched.hpp is internal to strata: applications include <strata/...> only"
#endif

// The watched bootstrap: a decorator over every bootstrap that Bootstrap::create and
// createTcpBootstrap return, which opens the bootstrap's watch scope (watch/watch.hpp) and
// records each of its calls there (base/watch_calls.hpp), so that a call that times out names
// the rank really at fault (docs/errors.md, "When a job stalls").

#include <memory>

#include <strata/bootstrap.hpp>
#include <strata/config.hpp>
#include <strata/error.hpp>
#include <strata/export.hpp>

#include "base/watch_calls.hpp"

namespace strata {
struct LaunchInfo;  // launch/contract.hpp
}

namespace strata::mesh {
struct InterruptKey;  // mesh/peer_mesh.hpp
}  // namespace strata::mesh

namespace strata::bootstrap {

/// Wraps a freshly created bootstrap: opens its scope (one allGather) and records every call
/// through it. Size-1 bootstraps and watch.enabled = false are returned unwrapped. The status
/// port takes `launch.secret` and faces `launch.root`.
STRATA_API std::unique_ptr<Bootstrap> attachWatch(std::unique_ptr<Bootstrap> inner,
                                                  const Config& config, const LaunchInfo& launch);
/// The same, with the launch read from the environment (detectLaunch).
STRATA_API std::unique_ptr<Bootstrap> attachWatch(std::unique_ptr<Bootstrap> inner,
                                                  const Config& config);
/// Ends this rank's calls in progress on b (every thread's) with `why`, for Communicator::revoke:
/// through the wrappers (watched, subset, sharing) to the backend (tcp, ucx, pmix's peer mesh; see
/// mesh::PeerMesh::interrupt). Calls that begin later are not affected; the peers are told
/// nothing. False when the backend cannot (its calls end by bootstrap.timeout).
STRATA_API bool interruptCalls(Bootstrap& b, const Error& why) noexcept;
/// The key of the object whose interrupts end b's calls (mesh::CallScope); empty when none.
STRATA_API mesh::InterruptKey interruptKey(const Bootstrap& b) noexcept;
/// The backend object behind a bootstrap attachWatch() returned (the same object otherwise).
STRATA_API Bootstrap& unwrap(Bootstrap& b);
/// The watch scope of a bootstrap attachWatch() returned; null when it is not watched.
STRATA_API std::shared_ptr<watch::Scope> scopeOf(const Bootstrap* b);

}  // namespace strata::bootstrap
