// Placement: which NIC, cores and NUMA node each local rank takes (docs/topology.md).

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>

#include <fmt/format.h>

#include <strata/error.hpp>

#include "base/process.hpp"
#include "base/strings.hpp"
#include "topology/topology.hpp"

namespace strata::topology {

using strings::trim;

namespace {

Error badPolicy(std::string_view text, const std::string& why) {
  return Error(ErrorCode::InvalidConfig,
               fmt::format("transport.fabric.nic = \"{}\": {} (auto; names as NCCL_IB_HCA "
                           "writes them: mlx5_0,mlx5_1, =mlx5_0 exact, ^mlx5_2 excluded; or a "
                           "rank map: 0=mlx5_0,1=mlx5_1)",
                           text, why));
}

bool nameMatches(const NicPolicy& p, std::string_view pattern, const std::string& name) {
  return p.exact ? name == pattern : name.compare(0, pattern.size(), pattern) == 0;
}

std::string nicList(const Machine& m) {
  std::string out;
  for (const Nic& n : m.nics) {
    std::string names;
    for (const std::string& s : n.names) names += (names.empty() ? "" : "/") + s;
    out += (out.empty() ? "" : ", ") + (names.empty() ? n.name : names);
  }
  return out.empty() ? "none" : out;
}

}  // namespace

NicPolicy NicPolicy::parse(std::string_view text) {
  NicPolicy p;
  std::string_view t = trim(text);
  if (t.empty() || t == "auto") return p;
  std::string_view body = t;
  if (body.front() == '^') {
    p.exclude = true;
    body.remove_prefix(1);
  }
  if (!body.empty() && body.front() == '=') {
    p.exact = true;
    body.remove_prefix(1);
  }
  std::vector<std::string_view> items = strings::split(body);
  for (std::string_view& item : items) item = trim(item);
  // A rank map: every item LOCAL=NAME.
  const bool map = std::any_of(items.begin(), items.end(), [](std::string_view i) {
    return i.find('=') != std::string_view::npos;
  });
  if (map) {
    if (p.exclude || p.exact) throw badPolicy(text, "a rank map takes no ^ or leading =");
    p.mode = Mode::RankMap;
    std::set<int> seen;
    for (std::string_view item : items) {
      const size_t eq = item.find('=');
      std::string_view rank = eq == std::string_view::npos ? item : trim(item.substr(0, eq));
      std::string_view name = eq == std::string_view::npos ? "" : trim(item.substr(eq + 1));
      if (eq == std::string_view::npos || rank.empty() || name.empty() ||
          !std::all_of(rank.begin(), rank.end(), [](char c) { return c >= '0' && c <= '9'; }) ||
          rank.size() > 6) {
        throw badPolicy(text, fmt::format("\"{}\" is not LOCAL_RANK=NAME", item));
      }
      const int r = std::stoi(std::string(rank));
      if (!seen.insert(r).second) {
        throw badPolicy(text, fmt::format("local rank {} is mapped twice", r));
      }
      const size_t colon = name.find(':');  // a port (mlx5_0:1): the device is what we choose
      p.map.emplace_back(r, std::string(name.substr(0, colon)));
    }
    return p;
  }
  p.mode = Mode::Names;
  for (std::string_view item : items) {
    const size_t colon = item.find(':');
    std::string_view name = trim(item.substr(0, colon));
    if (name.empty()) throw badPolicy(text, "an empty name in the list");
    p.names.emplace_back(name);
  }
  return p;
}

bool NicPolicy::allows(const Nic& nic) const {
  if (mode != Mode::Names) return true;
  bool hit = false;
  for (const std::string& pattern : names) {
    for (const std::string& n : nic.names) hit = hit || nameMatches(*this, pattern, n);
    hit = hit || nameMatches(*this, pattern, nic.name);
  }
  return exclude ? !hit : hit;
}

int numaOfCpus(const Machine& m, const std::vector<int>& cpus) {
  if (cpus.empty()) return -1;
  for (const NumaInfo& n : m.numaNodes) {
    if (n.cpus.empty()) continue;
    const std::vector<int> own = process::parseCpuList(n.cpus, "a NUMA node's cpuset");
    if (std::includes(own.begin(), own.end(), cpus.begin(), cpus.end())) return n.osIndex;
  }
  return -1;
}

namespace {

/// The PCI address (lower case) of the GPU whose UUID starts with `uuid` ("GPU-..."), from the
/// driver's information files; "" when none or several match.
std::string busOfUuid(const std::string& uuid, const std::string& procRoot) {
  std::error_code ec;
  std::string found;
  int matches = 0;
  for (const auto& dir :
       std::filesystem::directory_iterator(procRoot + "/driver/nvidia/gpus", ec)) {
    std::ifstream in(dir.path() / "information");
    std::string line, id, bus;
    while (std::getline(in, line)) {
      const size_t colon = line.find(':');
      if (colon == std::string::npos) continue;
      const std::string_view key = strings::trim(std::string_view(line).substr(0, colon));
      const std::string value(strings::trim(std::string_view(line).substr(colon + 1)));
      if (key == "GPU UUID") id = value;
      if (key == "Bus Location") bus = value;
    }
    if (!id.empty() && !bus.empty() && id.compare(0, uuid.size(), uuid) == 0) {
      ++matches;
      found = bus;
    }
  }
  if (matches != 1) return {};
  std::transform(found.begin(), found.end(), found.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return found;
}

}  // namespace

int gpuOfDevice(const Machine& m, int device, const char* visibleDevices,
                const std::string& procRoot) {
  if (device < 0) return -1;
  const int gpus = static_cast<int>(m.gpus.size());
  if (visibleDevices == nullptr || *visibleDevices == '\0') return device < gpus ? device : -1;
  const std::vector<std::string_view> list = strings::split(visibleDevices);
  if (static_cast<size_t>(device) >= list.size()) return -1;
  const std::string entry(strings::trim(list[size_t(device)]));
  if (!entry.empty() && entry.size() <= 6 &&
      entry.find_first_not_of("0123456789") == std::string::npos) {
    const int g = std::stoi(entry);
    return g < gpus ? g : -1;
  }
  if (entry.rfind("GPU-", 0) != 0 || entry.size() <= 4) return -1;  // MIG-..., malformed
  const std::string bus = busOfUuid(entry, procRoot);
  for (int g = 0; g < gpus && !bus.empty(); ++g) {
    const int node = m.gpus[size_t(g)].node;
    if (node >= 0 && m.nodes[size_t(node)].busId == bus) return g;
  }
  return -1;
}

std::vector<Placement> place(const Machine& m, int localRanks, const std::vector<int>& gpuOfRank,
                             const NicPolicy& policy, const std::vector<int>& numaOfRank) {
  if (localRanks < 1) {
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("placing {} local ranks: at least one is needed", localRanks));
  }
  std::vector<Placement> out(static_cast<size_t>(localRanks));
  // The NICs the policy allows.
  std::vector<int> allowed;
  for (size_t i = 0; i < m.nics.size(); ++i) {
    if (policy.allows(m.nics[i])) allowed.push_back(int(i));
  }
  if (policy.mode == NicPolicy::Mode::Names && allowed.empty()) {
    throw Error(ErrorCode::InvalidConfig,
                fmt::format(
                    "transport.fabric.nic = \"{}{}{}\" leaves no NIC of {} (its NICs: {})",
                    policy.exclude ? "^" : "", policy.exact ? "=" : "",
                    [&] {
                      std::string s;
                      for (const auto& n : policy.names) s += (s.empty() ? "" : ",") + n;
                      return s;
                    }(),
                    m.source, nicList(m)));
  }
  // Each rank's GPU, cores and NUMA node, and the node its distances count from.
  std::vector<int> from(out.size(), -1);  // a tree node (the GPU), or -1: from the NUMA node
  for (int r = 0; r < localRanks; ++r) {
    Placement& p = out[size_t(r)];
    p.localRank = r;
    int g = -1;
    if (!gpuOfRank.empty()) {
      g = size_t(r) < gpuOfRank.size() ? gpuOfRank[size_t(r)] : -1;
      if (g >= static_cast<int>(m.gpus.size())) {
        throw Error(ErrorCode::InvalidConfig,
                    fmt::format("local rank {} uses GPU {}, but {} has {} GPU(s)", r, g, m.source,
                                m.gpus.size()));
      }
    } else if (!m.gpus.empty()) {
      g = r % static_cast<int>(m.gpus.size());
    }
    p.gpu = g;
    if (g >= 0) {
      const Gpu& gpu = m.gpus[size_t(g)];
      p.cpus = gpu.cpus;
      p.numa = gpu.numa;
      from[size_t(r)] = gpu.node;
    } else if (!m.numaNodes.empty()) {
      // Where the rank is bound, else a block of the nodes.
      size_t k = size_t(r) * m.numaNodes.size() / size_t(localRanks);
      const int bound = size_t(r) < numaOfRank.size() ? numaOfRank[size_t(r)] : -1;
      for (size_t i = 0; i < m.numaNodes.size() && bound >= 0; ++i) {
        if (m.numaNodes[i].osIndex == bound) k = i;
      }
      p.numa = m.numaNodes[k].osIndex;
      p.cpus = m.numaNodes[k].cpus;
    }
  }
  auto distanceTo = [&](int r, int nic) -> Distance {
    const Nic& n = m.nics[size_t(nic)];
    if (n.node < 0) {
      // No PCI position: near the cores it hangs off, as far as a NUMA node can tell.
      const int numa = out[size_t(r)].numa;
      return {numa >= 0 && numa == n.numa ? Path::NODE : Path::SYS, 0};
    }
    if (from[size_t(r)] >= 0) return m.distance(from[size_t(r)], n.node);
    if (out[size_t(r)].numa >= 0) return m.distanceFromNuma(out[size_t(r)].numa, n.node);
    return {Path::SYS, 0};
  };
  std::vector<int> load(m.nics.size(), 0);
  auto setNic = [&](int r, int nic, std::string why) {
    Placement& p = out[size_t(r)];
    p.nic = nic;
    p.nicDistance = distanceTo(r, nic);
    p.proxyCpus = m.nics[size_t(nic)].cpus.empty() ? p.cpus : m.nics[size_t(nic)].cpus;
    p.why = std::move(why);
    ++load[size_t(nic)];
  };
  if (policy.mode == NicPolicy::Mode::RankMap) {
    for (const auto& [r, name] : policy.map) {
      if (r >= localRanks) continue;  // a map for a bigger host: the ranks this one has
      int found = -1;
      for (size_t i = 0; i < m.nics.size() && found < 0; ++i) {
        const Nic& n = m.nics[i];
        if (n.name == name || std::find(n.names.begin(), n.names.end(), name) != n.names.end()) {
          found = int(i);
        }
      }
      if (found < 0) {
        throw Error(ErrorCode::InvalidConfig,
                    fmt::format("transport.fabric.nic maps local rank {} to {}, which {} does not "
                                "have (its NICs: {})",
                                r, name, m.source, nicList(m)));
      }
      setNic(r, found, "transport.fabric.nic maps it");
    }
  }
  // The rest: nearest first; ranks with fewer nearest NICs choose first.
  std::vector<int> order;
  std::vector<size_t> nearestCount(out.size(), 0);
  for (int r = 0; r < localRanks; ++r) {
    if (out[size_t(r)].nic >= 0 || allowed.empty()) continue;
    Distance best{Path::SYS, std::numeric_limits<int>::max()};
    for (int n : allowed) best = std::min(best, distanceTo(r, n));
    for (int n : allowed) nearestCount[size_t(r)] += distanceTo(r, n) == best;
    order.push_back(r);
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return nearestCount[size_t(a)] < nearestCount[size_t(b)]; });
  for (int r : order) {
    int pick = -1;
    Distance best{};
    for (int n : allowed) {
      const Distance d = distanceTo(r, n);
      if (pick < 0 || d < best || (d == best && load[size_t(n)] < load[size_t(pick)])) {
        pick = n;
        best = d;
      }
    }
    const size_t ties = nearestCount[size_t(r)];
    std::string why =
        fmt::format("nearest ({}{})", toString(best.path),
                    out[size_t(r)].gpu >= 0
                        ? fmt::format(", {} hops from GPU {}", best.hops, out[size_t(r)].gpu)
                        : fmt::format(" from NUMA node {}", out[size_t(r)].numa));
    if (ties > 1) {
      why += fmt::format("; {} NICs equally near, this one the least used", ties);
    }
    if (policy.mode == NicPolicy::Mode::Names) why += " among those transport.fabric.nic allows";
    setNic(r, pick, why);
  }
  for (Placement& p : out) {
    if (p.nic < 0 && p.why.empty()) {
      p.why = m.nics.empty() ? "no NIC in the topology: the transport's own choice" : "not mapped";
      p.proxyCpus = p.cpus;
    }
  }
  return out;
}

std::string describe(const Machine& m, const std::vector<Placement>& placements) {
  std::string out = fmt::format("topology: {}\n", m.source);
  out += fmt::format("  {} package(s), {} NUMA node(s), {} cores, {} PUs, {} GPU(s), {} NIC(s)\n",
                     m.packages, m.numaNodes.size(), m.cores, m.pus, m.gpus.size(), m.nics.size());
  out += "\ntree:\n" + m.tree();
  if (!m.gpus.empty()) {
    out += "\nGPUs:\n";
    for (const Gpu& g : m.gpus) {
      out += fmt::format("  GPU {}: {}, NUMA node {}, cpus {}\n", g.index,
                         m.nodes[size_t(g.node)].busId, g.numa, g.cpus);
    }
  }
  if (!m.nics.empty()) {
    out += "\nNICs:\n";
    for (size_t i = 0; i < m.nics.size(); ++i) {
      const Nic& n = m.nics[i];
      std::string names;
      for (const std::string& s : n.names) names += (names.empty() ? "" : ", ") + s;
      out += fmt::format("  NIC {}: {} ({}), {}, NUMA node {}, cpus {}\n", i, n.name, names,
                         n.node >= 0 ? m.nodes[size_t(n.node)].busId : "no PCI device", n.numa,
                         n.cpus);
    }
  }
  if (!m.gpus.empty() && !m.nics.empty()) {
    out += "\npaths (nvidia-smi topo -m's names; hops in the tree):\n        ";
    for (size_t i = 0; i < m.nics.size(); ++i) out += fmt::format(" {:>9}", m.nics[i].name);
    out += "\n";
    for (const Gpu& g : m.gpus) {
      out += fmt::format("  GPU {:<2}", g.index);
      for (const Nic& n : m.nics) {
        if (n.node < 0) {
          out += fmt::format(" {:>9}", "-");
          continue;
        }
        const Distance d = m.distance(g.node, n.node);
        out += fmt::format(" {:>9}", fmt::format("{} {}", toString(d.path), d.hops));
      }
      out += "\n";
    }
  }
  out += fmt::format("\nplacement of {} local rank(s):\n", placements.size());
  for (const Placement& p : placements) {
    out += fmt::format("  local rank {}: {}, NIC {}, cpus {}, proxy cpus {}, NUMA node {}: {}\n",
                       p.localRank, p.gpu >= 0 ? fmt::format("GPU {}", p.gpu) : "no GPU",
                       p.nic >= 0 ? m.nics[size_t(p.nic)].name : "-", p.cpus.empty() ? "-" : p.cpus,
                       p.proxyCpus.empty() ? "-" : p.proxyCpus, p.numa, p.why);
  }
  return out;
}

}  // namespace strata::topology
