#pragma once
#ifndef STRATA_INTERNAL_HEADERS
#error "launch/contract.hpp is internal to strata: applications include <strata/...> only"
#endif

// The launcher contract: STRATA_RANK, STRATA_SIZE, STRATA_LOCAL_RANK, STRATA_LOCAL_SIZE,
// STRATA_ROOT, STRATA_SECRET (set by strata-run), or derived from SLURM_* under srun and from
// OMPI_COMM_WORLD_* under mpirun.

#include <sys/types.h>

#include <string>
#include <vector>

#include <strata/config.hpp>
#include <strata/export.hpp>

namespace strata {

struct LaunchInfo {
  int rank = 0;
  int size = 1;
  int localRank = 0;
  int localSize = 1;
  std::string root;      ///< "host:port" of rank 0's rendezvous; may be empty for size 1
  std::string secret;    ///< the job secret; empty when none was provided
  std::string launcher;  ///< "strata-run", "slurm", "mpirun", "none", or kExplicitLauncher
  int rootFd = -1;       ///< a listening socket inherited from strata-run (rank 0 only), or -1
  /// A multi-root rendezvous (ExplicitLaunch::roots), two or more; empty: `root` alone. The
  /// first rank of each block serves it (on rootFd).
  std::vector<std::string> roots;
};

/// The launcher of a launch a framework gave explicitly (createTcpBootstrap: torch's store),
/// not read from the environment.
inline constexpr const char* kExplicitLauncher = "explicit";

/// Reads the environment (and bootstrap.tcp.root / bootstrap.tcp.port / bootstrap.secret_file
/// from the config). Throws InvalidConfig naming the variable for malformed or inconsistent
/// values (rank >= size, negative numbers, garbage).
STRATA_API LaunchInfo detectLaunch(const Config& config);

}  // namespace strata
