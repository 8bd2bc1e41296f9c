#pragma once

// The nvlink transport's pre-flight lines (strata-info --check, docs/topology.md): what CUDA
// says about this node's GPUs, turned into lines without CUDA (nvlink_transport.cpp gathers the
// facts; tests/gpu feeds recorded ones on machines without a GPU).

#include <string>
#include <vector>

#include <strata/backend/check.hpp>

namespace strata::nvlink {

/// One GPU as the CUDA runtime and driver describe it; -1: the query failed or does not exist.
struct GpuFacts {
  std::string name;
  std::string busId;
  int computeMode = 0;     ///< cudaComputeMode: 0 default, 2 prohibited, 3 exclusive process
  int gpuDirectRdma = -1;  ///< cudaDevAttrGPUDirectRDMASupported
  int multicast = -1;      ///< CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED (NVLink SHARP)
};

struct NodeFacts {
  bool driver = false;  ///< a CUDA driver is installed (/dev/nvidiactl)
  std::string error;    ///< cudaGetDeviceCount's failure; empty when it answered
  std::string visible;  ///< CUDA_VISIBLE_DEVICES as set, "" when unset
  std::vector<GpuFacts> gpus;
  std::vector<std::vector<int>> peer;  ///< peer[a][b]: cudaDeviceCanAccessPeer, -1 unknown
};

/// The lines: the devices, their compute modes, peer access between every pair, GPUDirect
/// RDMA and multicast, each with what strata does where one is missing.
std::vector<backend::CheckLine> checkLines(const NodeFacts& facts);

}  // namespace strata::nvlink
