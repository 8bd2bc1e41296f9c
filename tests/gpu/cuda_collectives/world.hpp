#pragma once

// One world of test-cuda-collectives: N ranks as threads, each with its own Communicator, run
// through every phase (auto, burst, graph, forced).

namespace cuda_coll_test {

struct WorldResult {
  bool ok = false;    ///< every check passed
  bool hard = false;  ///< a rank stopped on an error (not a wrong result)
};

/// Runs every phase with n ranks; prints a line per phase.
WorldResult runWorld(int n);

}  // namespace cuda_coll_test
