// The pre-flight check (strata-info --check): what this node can and cannot do, from the
// topology and sysfs, one line each with the fallback strata takes (docs/topology.md).

#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <set>

#include <fmt/format.h>

#include "topology/topology.hpp"

namespace strata::topology {

namespace {

using State = CheckLine::State;

std::string readLine(const std::string& file) {
  std::ifstream in(file);
  std::string line;
  std::getline(in, line);
  return line;
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

/// ACS control bits that keep peer-to-peer traffic from going straight through a switch:
/// P2P Request Redirect (2), P2P Completion Redirect (3), P2P Egress Control (5).
constexpr uint16_t kAcsRedirect = (1u << 2) | (1u << 3) | (1u << 5);

/// The ACS control register of a PCI function from its config space file, or -1 when the file
/// has no extended space (not root: sysfs gives 64 or 256 bytes) or no ACS capability, -2 when
/// the file cannot be read.
int acsControl(const std::string& configFile) {
  std::ifstream in(configFile, std::ios::binary);
  if (!in) return -2;
  std::string cfg((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto u32 = [&](size_t off) {
    return static_cast<uint32_t>(static_cast<uint8_t>(cfg[off])) |
           static_cast<uint32_t>(static_cast<uint8_t>(cfg[off + 1])) << 8 |
           static_cast<uint32_t>(static_cast<uint8_t>(cfg[off + 2])) << 16 |
           static_cast<uint32_t>(static_cast<uint8_t>(cfg[off + 3])) << 24;
  };
  if (cfg.size() < 0x104) return -1;
  size_t off = 0x100;
  for (int hops = 0; hops < 64 && off >= 0x100 && off + 8 <= cfg.size(); ++hops) {
    const uint32_t header = u32(off);
    if (header == 0 || header == 0xffffffffu) return -1;
    if ((header & 0xffff) == 0x000d) return static_cast<int>(u32(off + 4) >> 16);  // +6: control
    off = (header >> 20) & 0xffc;
    if (off == 0) break;
  }
  return -1;
}

std::string acsBits(int control) {
  std::string out;
  if (control & (1 << 2)) out += "P2P request redirect";
  if (control & (1 << 3)) out += std::string(out.empty() ? "" : ", ") + "P2P completion redirect";
  if (control & (1 << 5)) out += std::string(out.empty() ? "" : ", ") + "P2P egress control";
  return out;
}

}  // namespace

std::vector<CheckLine> preflight(const Machine& m, const std::vector<Placement>& placements,
                                 const std::string& sysfsRoot) {
  std::vector<CheckLine> out;
  const std::string pci = sysfsRoot + "/bus/pci/devices/";
  out.push_back({"topology", State::Ok,
                 fmt::format("{}: {} GPU(s), {} NIC(s), {} NUMA node(s)", m.source, m.gpus.size(),
                             m.nics.size(), m.numaNodes.size()),
                 ""});
  // NICs: RDMA devices (verbs, efa) or interfaces only (tcp).
  if (m.nics.empty()) {
    out.push_back({"NICs", State::Warn, "none in the topology",
                   "the fabric transport takes its provider's first domain (tcp: FI_TCP_IFACE)"});
  }
  for (const Nic& n : m.nics) {
    const std::string where = n.node >= 0 ? m.nodes[size_t(n.node)].busId : "no PCI device";
    const bool rdma = isRdmaName(n.name);
    out.push_back({fmt::format("NIC {}", n.name), rdma ? State::Ok : State::Warn,
                   fmt::format("{}, {}", where, rdma ? "RDMA device" : "no RDMA device"),
                   rdma ? "" : "tcp;ofi_rxm through its interface (no GPUDirect RDMA)"});
  }
  // IOMMU: translated DMA (DMA, DMA-FQ) vs passthrough (identity) for each GPU and NIC.
  // An IOMMU that translates puts every device in a group; no group 0: off or not exposed.
  const bool iommu = exists(sysfsRoot + "/kernel/iommu_groups/0");
  std::set<int> devices;
  for (const Gpu& g : m.gpus) devices.insert(g.node);
  for (const Nic& n : m.nics) {
    if (n.node >= 0) devices.insert(n.node);
  }
  if (!iommu) {
    out.push_back({"IOMMU", State::Ok, "no IOMMU group in sysfs: off (DMA is not translated)", ""});
  } else {
    std::string translated, passthrough;
    for (int d : devices) {
      const std::string& bdf = m.nodes[size_t(d)].busId;
      const std::string type = readLine(pci + bdf + "/iommu_group/type");
      if (type.rfind("DMA", 0) == 0) {
        translated += (translated.empty() ? "" : ", ") + bdf + " (" + type + ")";
      } else if (!type.empty()) {
        passthrough += (passthrough.empty() ? "" : ", ") + bdf + " (" + type + ")";
      }
    }
    if (!translated.empty()) {
      out.push_back({"IOMMU", State::Warn, "translated DMA for " + translated,
                     "GPUDirect RDMA between these needs ATS or runs through translation (slower; "
                     "NCCL advises iommu=pt); strata's cross-host path copies through host bounce "
                     "buffers, which translation does not affect"});
    } else {
      out.push_back({"IOMMU", State::Ok,
                     passthrough.empty() ? "on; no GPU or NIC in an IOMMU group here"
                                         : "passthrough for " + passthrough,
                     ""});
    }
  }
  // ACS on the bridges between each rank's GPU and NIC.
  std::set<std::string> seenBridges;
  int unreadable = 0;
  bool anyPath = false;
  for (const Placement& p : placements) {
    if (p.gpu < 0 || p.nic < 0 || m.nics[size_t(p.nic)].node < 0) continue;
    anyPath = true;
    // The nodes from the GPU up to the common ancestor and down to the NIC.
    const Machine::Route r = m.route(m.gpus[size_t(p.gpu)].node, m.nics[size_t(p.nic)].node);
    std::vector<int> path = r.belowA;
    if (r.common >= 0) path.push_back(r.common);
    path.insert(path.end(), r.belowB.rbegin(), r.belowB.rend());
    for (int b : path) {
      const Node& node = m.nodes[size_t(b)];
      if (node.kind != Kind::PciBridge || !seenBridges.insert(node.busId).second) continue;
      const int control = acsControl(pci + node.busId + "/config");
      if (control < 0) {
        ++unreadable;
        continue;
      }
      if (control & kAcsRedirect) {
        out.push_back(
            {fmt::format("PCIe ACS {}", node.busId), State::Warn,
             fmt::format("{} on the bridge between GPU {} and NIC {}", acsBits(control), p.gpu,
                         m.nics[size_t(p.nic)].name),
             "peer-to-peer between them goes up to the root complex: GPUDirect RDMA is slow or "
             "hangs (NCCL's troubleshooting: disable ACS, setpci -s BDF ECAP_ACS+6.w=0); strata's "
             "cross-host path copies through host bounce buffers, which ACS does not affect"});
      }
    }
  }
  if (!anyPath) {
    out.push_back(
        {"PCIe ACS", State::Ok, "no rank has both a GPU and a PCI NIC: not relevant", ""});
  } else if (unreadable > 0) {
    out.push_back({"PCIe ACS", State::Unknown,
                   fmt::format("{} bridge(s) between GPUs and NICs without a readable ACS "
                               "capability (the extended config space needs root, or the bridge "
                               "has none)",
                               unreadable),
                   ""});
  } else if (std::none_of(out.begin(), out.end(),
                          [](const CheckLine& l) { return l.what.rfind("PCIe ACS", 0) == 0; })) {
    out.push_back({"PCIe ACS", State::Ok,
                   fmt::format("no redirect on the {} bridge(s) between GPUs and their NICs",
                               seenBridges.size()),
                   ""});
  }
  // MPS: its control pipe.
  const char* pipeDir = std::getenv("CUDA_MPS_PIPE_DIRECTORY");
  const std::string control =
      std::string(pipeDir && *pipeDir ? pipeDir : "/tmp/nvidia-mps") + "/control";
  if (m.gpus.empty()) {
    out.push_back({"MPS", State::Ok, "no GPU", ""});
  } else {
    const bool mps = exists(control);
    out.push_back({"MPS", State::Ok,
                   mps ? "daemon running (" + control + ")" : "no daemon (" + control + ")",
                   mps ? "" : "one rank per GPU: the CUDA collectives refuse two on one GPU"});
  }
  return out;
}

std::string describe(const std::vector<CheckLine>& lines) {
  std::string out;
  for (const CheckLine& l : lines) {
    const char* mark = l.state == State::Ok ? "ok  " : l.state == State::Warn ? "WARN" : "??  ";
    out += fmt::format("{} {}: {}{}\n", mark, l.what, l.found,
                       l.fallback.empty() ? "" : " -> " + l.fallback);
  }
  return out;
}

}  // namespace strata::topology
