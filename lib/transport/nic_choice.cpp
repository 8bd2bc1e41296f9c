#include "nic_choice.hpp"

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <strata/error.hpp>

#include "base/config_keys.hpp"
#include "base/log.hpp"
#include "base/process.hpp"
#include "base/strings.hpp"
#include "bootstrap/registry.hpp"
#include "topology/topology.hpp"

namespace strata::transport {

std::vector<int> proxyCpus(const Config& config, const std::string& nicCpus) {
  const std::string text = config::getString(config, "transport.proxy_cpus");
  if (text == "none") return {};
  if (text == "auto" || text.empty()) {
    return nicCpus.empty() ? std::vector<int>{} : process::parseCpuList(nicCpus, "the NIC's cores");
  }
  return process::parseCpuList(text, "transport.proxy_cpus");
}

NearNic chooseNic(const Config& config, backend::TransportInit& init) {
  NearNic near;
  const std::string file = config::getString(config, "topology.file");
  const std::string policyText = config::getString(config, "transport.fabric.nic");
  const topology::NicPolicy policy = topology::NicPolicy::parse(policyText);
  topology::Machine machine;
  try {
    machine = topology::Machine::load(file);
  } catch (const Error& e) {
    if (!file.empty() || policy.mode != topology::NicPolicy::Mode::Auto) throw;
    STRATA_LOG(Info, "topology", "rank {}: no NIC placement ({}); the transports choose their own",
               init.rank, e.what());
    return near;
  }
  const int localSize = std::max(init.localSize, 1);
  const int localRank = std::clamp(init.localRank, 0, localSize - 1);
  // This rank's GPU: transport.cuda.device, else its local rank, through CUDA_VISIBLE_DEVICES
  // (indexes, or UUIDs through the driver's /proc files).
  // The other local ranks (for spreading over equally near NICs): their local rank.
  std::vector<int> gpuOfRank;
  if (!machine.gpus.empty()) {
    const int gpus = static_cast<int>(machine.gpus.size());
    const int64_t configured = config::getInt(config, "transport.cuda.device");
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    for (int r = 0; r < localSize; ++r) {
      int g = r % gpus;
      if (r == localRank) {
        const int device = configured >= 0 ? static_cast<int>(configured) : localRank;
        g = topology::gpuOfDevice(machine, device, visible, "/proc");
      }
      gpuOfRank.push_back(g);
    }
  }
  // A host-only rank's NUMA node: the one its affinity lies in (srun --cpu-bind, numactl).
  std::vector<int> numaOfRank(size_t(localSize), -1);
  numaOfRank[size_t(localRank)] = topology::numaOfCpus(machine, process::allowedCpus());
  const auto placements = topology::place(machine, localSize, gpuOfRank, policy, numaOfRank);
  // The pre-flight check, once per host (local rank 0), when info lines are wanted.
  if (localRank == 0 && log::enabled(log::Level::Info)) {
    auto lines = topology::preflight(machine, placements, "/sys");
    for (auto& l : bootstrap::transportPreflight(config)) lines.push_back(std::move(l));
    for (const topology::CheckLine& l : lines) {
      if (l.state == topology::CheckLine::State::Ok && l.fallback.empty()) continue;
      STRATA_LOG(Info, "topology", "pre-flight: {}: {}{}", l.what, l.found,
                 l.fallback.empty() ? "" : " -> " + l.fallback);
    }
  }
  const topology::Placement& mine = placements[size_t(localRank)];
  if (machine.numaNodes.size() > 1) near.numaNode = mine.numa;
  if (mine.nic < 0) return near;
  const topology::Nic& nic = machine.nics[size_t(mine.nic)];
  init.nicNames = nic.names;
  if (std::find(nic.names.begin(), nic.names.end(), nic.name) == nic.names.end()) {
    init.nicNames.insert(init.nicNames.begin(), nic.name);
  }
  init.nicBusId = nic.node >= 0 ? machine.nodes[size_t(nic.node)].busId : "";
  init.nicWhy = fmt::format("{} for local rank {}{}: {}", nic.name, localRank,
                            mine.gpu >= 0 ? fmt::format(" (GPU {})", mine.gpu) : "", mine.why);
  init.nicRequired = policy.mode != topology::NicPolicy::Mode::Auto;
  // The NIC's cores, unless they are the whole machine (binding there changes nothing).
  if (!mine.proxyCpus.empty() && !machine.nodes.empty() &&
      mine.proxyCpus != machine.nodes[0].cpus) {
    near.cpus = mine.proxyCpus;
  }
  STRATA_LOG(Debug, "topology", "rank {}: NIC {}", init.rank, init.nicWhy);
  return near;
}

}  // namespace strata::transport
