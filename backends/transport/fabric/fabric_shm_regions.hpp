#pragma once

// libfabric's shm provider (1.17) backs every endpoint with a 16 MiB file in /dev/shm named
// after the endpoint, and removes it only when the process exits normally: a process killed
// with SIGKILL leaves it behind. Here: the names the fabric transport gives its shm endpoints,
// and the sweep that removes the files of such processes at start-up and shutdown
// (docs/transport-fabric.md, "libfabric shm regions in /dev/shm"). No libfabric here, so that
// the test compiles it in.
//
// A file is named "strata-fabric-<pidns>-<pid>-<n>": <pidns> is the inode of the creator's
// /proc/self/ns/pid, <pid> its pid in that namespace, <n> counts the endpoints of the process.
// A pid means something only in its own namespace, and containers may share /dev/shm across
// namespaces, so the sweep judges only files of its own namespace.

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace strata::fabric {

inline constexpr std::string_view kShmRegionPrefix = "strata-fabric-";

/// The PID namespace of this process (the inode of /proc/self/ns/pid), or 0 if it cannot be
/// read (no /proc): then endpoints keep libfabric's own names and nothing is swept.
uint64_t pidNamespace() noexcept;

/// "strata-fabric-<pidns>-<pid>-<index>".
std::string shmRegionName(uint64_t pidns, pid_t pid, uint64_t index);

struct ShmRegionName {
  uint64_t pidns = 0;
  pid_t pid = 0;
  uint64_t index = 0;
};
/// The parts of a name made by shmRegionName(); nullopt for any other name.
std::optional<ShmRegionName> parseShmRegionName(std::string_view name) noexcept;

/// Removes the files in `dir` named by shmRegionName() for namespace `pidns` whose process no
/// longer exists (kill(pid, 0) gives ESRCH), if they are regular files owned by this user.
/// Files of other namespaces and files with other names (libfabric's default "<pid>:<uid>:<n>",
/// whose namespace is unknown) are left alone. Does nothing when pidns is 0. Returns how many
/// files it removed.
size_t sweepStaleShmRegions(const std::string& dir, uint64_t pidns) noexcept;

}  // namespace strata::fabric
