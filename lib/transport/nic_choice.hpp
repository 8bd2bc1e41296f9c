#pragma once

// Private to lib/transport: which NIC this rank's network transport opens (lib/topology and
// transport.fabric.nic; docs/topology.md).

#include <strata/backend/transport.hpp>
#include <strata/config.hpp>

namespace strata::transport {

/// What chooseNic found beyond the NIC itself, for the Context.
struct NearNic {
  /// The cores near the chosen NIC ("0-55,112-167"; transport.proxy_cpus = auto takes them),
  /// empty when they are every CPU of the machine or unknown.
  std::string cpus;
  /// The NUMA node for this rank's host buffers (its GPU's, else its own; docs/topology.md),
  /// -1 when the machine has one node or the topology is unknown.
  int numaNode = -1;
};

/// Fills init's nic fields (init.localRank and init.localSize must be set). Leaves them empty,
/// with a log line, when the topology cannot be read and topology.file is not set. Throws
/// InvalidConfig for a topology.file hwloc cannot read and for a transport.fabric.nic that
/// names no NIC of the machine.
NearNic chooseNic(const Config& config, backend::TransportInit& init);

/// transport.proxy_cpus resolved: none -> {}, a list -> its CPUs, auto -> nicCpus (chooseNic's,
/// when the ranks span hosts). Throws InvalidConfig for a malformed list.
std::vector<int> proxyCpus(const Config& config, const std::string& nicCpus);

}  // namespace strata::transport
