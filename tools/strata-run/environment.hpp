#pragma once

// The environment every rank gets: strata-run's own, less any inherited launcher contract (and
// with --torch, torch's env:// variables), then the --env values, then the contract for that
// rank: STRATA_RANK, STRATA_SIZE, STRATA_LOCAL_*, STRATA_ROOT, STRATA_SECRET and, for rank 0,
// STRATA_ROOT_FD.

#include <string>
#include <vector>

#include "io.hpp"
#include "options.hpp"

namespace strata::run {

class Environment {
 public:
  explicit Environment(const Options& options) : options_(options) {}

  /// The job secret every rank gets. False with `error` saying why.
  bool makeSecret(std::string& error);
  /// --torch: MASTER_ADDR and MASTER_PORT (a free port other than `rootPort`, reserved until
  /// this object goes away), unless --env gives them. False after saying why.
  bool chooseTorchMaster(int rootPort);
  /// What every rank inherits; with --verbose, says which inherited variables it replaces.
  void buildBase();
  /// Rank r's whole environment as KEY=VALUE entries; `rootFd` is rank 0's root listener.
  std::vector<std::string> forRank(int r, const std::string& rootAddress, int rootFd) const;

 private:
  const Options& options_;
  std::string secret_;
  std::string masterAddr_;  ///< --torch: MASTER_ADDR and MASTER_PORT as the ranks get them
  std::string masterPort_;
  Fd masterPortHold_;  ///< keeps the picked MASTER_PORT from other processes (see pickFreePort)
  std::vector<std::string> base_;
};

}  // namespace strata::run
