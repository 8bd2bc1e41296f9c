#pragma once

// The flags of a collective mode (strata-perf allreduce, ...), as coll_mode.cpp declares them
// and coll_report.cpp echoes them in the header.

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "mode.hpp"

namespace strata::perf {

struct CollOptions {
  SweepOptions sweep;
  std::string stepBytes;  ///< -i: a linear step instead of -f
  CLI::Option* stepBytesOption = nullptr;
  CLI::Option* factorOption = nullptr;
  int check = 1;
  std::string datatype = "float";
  std::string redop = "sum";
  int root = 0;
  int blocking = 0;
  std::string memory = "host";
  std::string alloc = "malloc";
  int graph = 0;  ///< -G: launches of a CUDA graph of the timed calls (0: no graph)
  std::string label = "strata";
  std::string algorithm;          ///< -a: forced through collectives.<op>.algorithm
  std::string api = "strata";     ///< strata (Communicator), nccl or nccl-group (NCCL API)
  std::string ncclLib = "libstrata-nccl.so.2";  ///< --nccl-lib: what --api nccl loads
  std::vector<std::string> argv;  ///< echoed in the header
};

}  // namespace strata::perf
