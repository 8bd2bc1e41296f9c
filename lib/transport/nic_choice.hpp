#pragma once

// Private to lib/transport: which NIC this rank's network transport opens (lib/topology and
// transport.fabric.nic; docs/topology.md).

#include <strata/backend/transport.hpp>
#include <strata/config.hpp>

namespace strata::transport {

/// Fills init's nic fields (init.localRank and init.localSize must be set). Leaves them empty,
/// with a log line, when the topology cannot be read and topology.file is not set. Throws
/// InvalidConfig for a topology.file hwloc cannot read and for a transport.fabric.nic that
/// names no NIC of the machine.
void chooseNic(const Config& config, backend::TransportInit& init);

/// transport.proxy_cpus resolved: none -> {}, a list -> its CPUs, auto -> init.nicCpus (set
/// by chooseNic when the ranks span hosts). Throws InvalidConfig for a malformed list.
std::vector<int> proxyCpus(const Config& config, const backend::TransportInit& init);

/// The physical GPU (hwloc's, in CUDA order) of CUDA device `device` as this process numbers
/// them: CUDA_VISIBLE_DEVICES=2,3 makes device 1 GPU 3. -1 when the list names GPUs by UUID or
/// MIG instance (not mappable here) or has fewer entries than device.
int physicalGpu(int device, const char* visibleDevices);

}  // namespace strata::transport
