#pragma once

// Host memory the ranks of one host share (Communicator::allocHost): each allocation is a memfd
// mapped into its process; a same-host peer that learns (pid, fd, inode) maps the same pages and
// reads the buffer with plain loads, without a kernel copy. The registry is process-wide, so an
// allocation outlives the communicator it came from and serves every communicator.
//
// A reader must never mistake a reused address for the allocation it mapped before: every
// allocation has an id never reused in its process, the inode guards the fd number (a freed
// allocation's fd number may name another file later), and frees() counts frees so that a peer
// can drop its mappings of allocations that are gone (docs/collectives.md, "Zero copy").

#include <cstddef>
#include <cstdint>
#include <optional>

#include <strata/export.hpp>

namespace strata::backend {

/// Where a buffer lies in allocHost memory: what a same-host peer needs to map it.
struct SharedHostRegion {
  uint64_t id = 0;      ///< unique per allocation in this process, never reused, never 0
  int32_t fd = -1;      ///< the memfd in the owner's process (a peer opens /proc/<pid>/fd/<fd>)
  uint64_t inode = 0;   ///< the memfd's inode: the peer checks that the fd names this file
  uint64_t bytes = 0;   ///< the allocation's mapped length
  uint64_t offset = 0;  ///< the looked-up address's distance from the allocation's start
};

/// Page-aligned shared host memory of at least bytes (> 0; InvalidArgument otherwise).
/// SystemError with the reason when the memfd or the mapping cannot be had. Thread-safe.
STRATA_API void* allocSharedHost(size_t bytes);
/// Frees memory from allocSharedHost; nullptr does nothing; any other pointer (not the start of
/// a live allocation) is InvalidArgument. The caller must not free a buffer a call is using.
STRATA_API void freeSharedHost(void* ptr);
/// The allocation that holds all of [ptr, ptr + bytes), or nullopt. A few nanoseconds when this
/// process has no allocation; a shared lock and a tree lookup otherwise. Thread-safe.
STRATA_API std::optional<SharedHostRegion> findSharedHost(const void* ptr, size_t bytes) noexcept;
/// How many allocations this process has freed so far (only grows).
STRATA_API uint64_t sharedHostFrees() noexcept;

}  // namespace strata::backend
