#include "nic_choice.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <strata/error.hpp>

#include "base/config_keys.hpp"
#include "base/log.hpp"
#include "base/process.hpp"
#include "base/strings.hpp"
#include "base/wire.hpp"
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

namespace {

/// What one rank says about itself for the placement of its host's ranks: its host, GPU (-1:
/// host only, or not mappable) and the NUMA node of its binding (-1: unbound or unknown).
struct RankView {
  uint64_t hostId = 0;
  int32_t gpu = -1;
  int32_t numa = -1;
};
constexpr size_t kViewBytes = 16;

/// Every rank's view, through one bootstrap allGather (every rank calls this when the ranks
/// span hosts, whatever its topology says). The values are decoded as sent; chooseNic checks
/// them against this machine.
std::vector<RankView> exchangeViews(backend::TransportInit& init, const RankView& mine) {
  std::vector<uint8_t> slots(kViewBytes * size_t(init.size));
  wire::Writer w;
  w.u64(mine.hostId).i32(mine.gpu).i32(mine.numa);
  std::memcpy(slots.data() + kViewBytes * size_t(init.rank), w.data().data(), kViewBytes);
  init.bootstrap->allGather(slots.data(), kViewBytes);
  std::vector<RankView> out(size_t(init.size));
  for (int r = 0; r < init.size; ++r) {
    wire::Reader in(std::span<const uint8_t>(slots.data() + kViewBytes * size_t(r), kViewBytes),
                    "placement view");
    RankView& v = out[size_t(r)];
    v.hostId = in.u64("host");
    v.gpu = in.i32("gpu");
    v.numa = in.i32("numa");
  }
  return out;
}

}  // namespace

NearNic chooseNic(const Config& config, backend::TransportInit& init) {
  NearNic near;
  const std::string file = config::getString(config, "topology.file");
  // What fails here is said after the exchange below, which every rank must join.
  std::exception_ptr failed;
  topology::NicPolicy policy;
  topology::Machine machine;
  bool known = false;
  try {
    policy = topology::NicPolicy::parse(config::getString(config, "transport.fabric.nic"));
    machine = topology::Machine::load(file);
    known = true;
  } catch (const Error& e) {
    if (!file.empty() || policy.mode != topology::NicPolicy::Mode::Auto ||
        e.code() == ErrorCode::InvalidConfig) {
      failed = std::current_exception();
    } else {
      STRATA_LOG(Info, "topology",
                 "rank {}: no NIC placement ({}); the transports choose their own", init.rank,
                 e.what());
    }
  }
  // This rank's GPU: transport.cuda.device, else its local rank (the only one when
  // CUDA_VISIBLE_DEVICES lists one GPU: srun --gpus-per-task), through CUDA_VISIBLE_DEVICES
  // (indexes, or UUIDs through the driver's /proc files); its NUMA node: the one its affinity
  // lies in (srun --cpu-bind, numactl). The other ranks of the host say theirs.
  RankView self;
  self.hostId = init.hostId;
  if (known) {
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    if (!machine.gpus.empty()) {
      const int64_t configured = config::getInt(config, "transport.cuda.device");
      int device = configured >= 0 ? static_cast<int>(configured) : std::max(init.localRank, 0);
      if (configured < 0 && visible != nullptr && *visible != '\0' &&
          strings::split(visible).size() == 1) {
        device = 0;
      }
      self.gpu = topology::gpuOfDevice(machine, device, visible, "/proc");
    }
    self.numa = topology::numaOfCpus(machine, process::allowedCpus());
  }
  const std::vector<RankView> views = exchangeViews(init, self);
  if (failed) std::rethrow_exception(failed);
  if (!known) return near;
  // This host's ranks (transport.host_id's grouping), in rank order, as they said; a value
  // outside this machine counts as unknown (it only steers the spreading).
  const int gpus = static_cast<int>(machine.gpus.size());
  std::vector<int> gpuOfRank, numaOfRank;
  int localRank = 0;
  for (int r = 0; r < init.size; ++r) {
    const RankView& v = views[size_t(r)];
    if (v.hostId != init.hostId) continue;
    if (r == init.rank) localRank = static_cast<int>(numaOfRank.size());
    const bool fits = v.gpu >= -1 && v.gpu < gpus && v.numa >= -1 && v.numa <= 65535;
    if (!fits) {
      STRATA_LOG(Debug, "topology",
                 "rank {}: rank {}'s placement view (GPU {}, NUMA node {}) does not fit this "
                 "host ({} GPUs): taken as unknown",
                 init.rank, r, v.gpu, v.numa, gpus);
    }
    gpuOfRank.push_back(fits ? v.gpu : -1);
    numaOfRank.push_back(fits ? v.numa : -1);
  }
  const int localSize = static_cast<int>(numaOfRank.size());
  if (gpus == 0) gpuOfRank.clear();
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
