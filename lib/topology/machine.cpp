// Machine: the hwloc tree reduced to placement's needs, its distances and its printed form.

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <functional>

#include <fmt/format.h>

#include <strata/error.hpp>

#include "topology/topology.hpp"

#if STRATA_HAVE_HWLOC
#include <hwloc.h>
#endif

namespace strata::topology {

namespace {

bool isGpu(const Node& n) {
  // NVIDIA display (0x0300) and 3D (0x0302) controllers: the GPUs CUDA drives.
  return n.kind == Kind::PciDevice && n.vendor == 0x10de &&
         (n.classId == 0x0300 || n.classId == 0x0302);
}

bool isNic(const Node& n) {
  // Ethernet, InfiniBand, other network controllers.
  return n.kind == Kind::PciDevice &&
         (n.classId == 0x0200 || n.classId == 0x0207 || n.classId == 0x0280);
}

bool cpuSide(Kind k) {
  return k == Kind::Machine || k == Kind::Package || k == Kind::NumaNode || k == Kind::Cpu;
}

/// The CUDA index a GPU's OS devices name (cudaN), or -1.
int cudaIndex(const Node& n) {
  for (const std::string& name : n.osNames) {
    if (name.size() > 4 && name.compare(0, 4, "cuda") == 0 &&
        std::all_of(name.begin() + 4, name.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      return std::atoi(name.c_str() + 4);
    }
  }
  return -1;
}

#if STRATA_HAVE_HWLOC
}  // namespace

/// Machine::load's topology that keeps hwloc's plugins loaded (external linkage: the store is
/// kept, and LeakSanitizer sees it reachable).
hwloc_topology_t keptTopology = nullptr;

namespace {

std::string listOf(hwloc_const_bitmap_t set) {
  if (set == nullptr) return {};
  char* text = nullptr;
  if (hwloc_bitmap_list_asprintf(&text, set) < 0 || text == nullptr) return {};
  std::string out(text);
  std::free(text);
  return out;
}

std::vector<int> indexesOf(hwloc_const_bitmap_t set) {
  std::vector<int> out;
  if (set == nullptr) return out;
  for (int i = hwloc_bitmap_first(set); i >= 0; i = hwloc_bitmap_next(set, i)) out.push_back(i);
  return out;
}

std::string pciBusId(const hwloc_obj_attr_u::hwloc_pcidev_attr_s& a) {
  return fmt::format("{:04x}:{:02x}:{:02x}.{:x}", a.domain, a.bus, a.dev, a.func);
}

/// Adds obj and what hangs off it under parent. PUs and cores are counted, not kept (a core's
/// children hang off its parent); an OS device names its PCI device (or, a network device
/// without one, becomes a NIC of its own).
void addTree(Machine& m, hwloc_obj_t obj, int parent) {
  Node n;
  n.parent = parent;
  int self = parent;
  switch (obj->type) {
    case HWLOC_OBJ_PU:
      ++m.pus;
      return;
    case HWLOC_OBJ_CORE:
      ++m.cores;
      break;  // its PUs are counted below; the core itself is not kept
    case HWLOC_OBJ_OS_DEVICE:
      if (parent < 0 || obj->name == nullptr) return;
      if (m.nodes[size_t(parent)].kind == Kind::PciDevice) {
        m.nodes[size_t(parent)].osNames.push_back(obj->name);
      } else if (obj->attr->osdev.type == HWLOC_OBJ_OSDEV_NETWORK ||
                 obj->attr->osdev.type == HWLOC_OBJ_OSDEV_OPENFABRICS) {
        // A NIC without a PCI device (virtio over MMIO, a software device): a NIC with only
        // the cores of where it hangs.
        Nic nic;
        nic.name = obj->name;
        nic.names = {obj->name};
        nic.cpus = m.nodes[size_t(parent)].cpus;
        const auto& numa = m.nodes[size_t(parent)].numa;
        nic.numa = numa.empty() ? -1 : numa.front();
        m.nics.push_back(std::move(nic));
      }
      return;
    case HWLOC_OBJ_MISC:
      return;
    case HWLOC_OBJ_BRIDGE:
      if (obj->attr->bridge.upstream_type == HWLOC_OBJ_BRIDGE_HOST) {
        n.kind = Kind::HostBridge;
        const auto& d = obj->attr->bridge.downstream.pci;
        n.busId =
            fmt::format("{:04x}:[{:02x}-{:02x}]", d.domain, d.secondary_bus, d.subordinate_bus);
      } else {
        n.kind = Kind::PciBridge;
        n.busId = pciBusId(obj->attr->bridge.upstream.pci);
        n.vendor = obj->attr->bridge.upstream.pci.vendor_id;
        n.device = obj->attr->bridge.upstream.pci.device_id;
      }
      break;
    case HWLOC_OBJ_PCI_DEVICE:
      n.kind = Kind::PciDevice;
      n.busId = pciBusId(obj->attr->pcidev);
      n.vendor = obj->attr->pcidev.vendor_id;
      n.device = obj->attr->pcidev.device_id;
      n.classId = obj->attr->pcidev.class_id;
      break;
    default:
      n.kind = obj->type == HWLOC_OBJ_MACHINE    ? Kind::Machine
               : obj->type == HWLOC_OBJ_PACKAGE  ? Kind::Package
               : obj->type == HWLOC_OBJ_NUMANODE ? Kind::NumaNode
                                                 : Kind::Cpu;
      if (obj->type == HWLOC_OBJ_PACKAGE) ++m.packages;
      if (obj->type == HWLOC_OBJ_PACKAGE || obj->type == HWLOC_OBJ_NUMANODE) {
        n.osIndex = static_cast<int>(obj->os_index);
      }
      n.cpus = listOf(obj->cpuset);
      n.numa = indexesOf(obj->nodeset);
      break;
  }
  if (obj->type != HWLOC_OBJ_CORE) {
    self = static_cast<int>(m.nodes.size());
    m.nodes.push_back(std::move(n));
  }
  for (hwloc_obj_t c = obj->memory_first_child; c != nullptr; c = c->next_sibling) {
    addTree(m, c, self);
  }
  for (hwloc_obj_t c = obj->first_child; c != nullptr; c = c->next_sibling) addTree(m, c, self);
  for (hwloc_obj_t c = obj->io_first_child; c != nullptr; c = c->next_sibling) {
    addTree(m, c, self);
  }
}
#endif

std::string nodeLabel(const Node& n) {
  switch (n.kind) {
    case Kind::Machine:
      return fmt::format("machine: cpus {}", n.cpus);
    case Kind::Package:
      return fmt::format("package {}: cpus {}", n.osIndex, n.cpus);
    case Kind::NumaNode:
      return fmt::format("NUMA node {}: cpus {}", n.osIndex, n.cpus);
    case Kind::Cpu:
      return fmt::format("cpus {}", n.cpus);
    case Kind::HostBridge:
      return fmt::format("host bridge {}", n.busId);
    case Kind::PciBridge:
      return fmt::format("PCIe bridge {} [{:04x}:{:04x}]", n.busId, n.vendor, n.device);
    case Kind::PciDevice:
      break;
  }
  std::string what = isGpu(n) ? "GPU" : isNic(n) ? "NIC" : "PCI device";
  std::string names;
  for (const std::string& s : n.osNames) names += (names.empty() ? " " : ",") + s;
  return fmt::format("{} {} [{:04x}:{:04x}] class {:04x}{}", what, n.busId, n.vendor, n.device,
                     n.classId, names);
}

}  // namespace

bool isRdmaName(std::string_view name) {
  for (std::string_view prefix : {"mlx", "rdmap", "efa", "hfi", "bnxt_re", "irdma"}) {
    if (name.substr(0, prefix.size()) == prefix) return true;
  }
  return false;
}

std::string_view toString(Path p) {
  switch (p) {
    case Path::PIX:
      return "PIX";
    case Path::PXB:
      return "PXB";
    case Path::PHB:
      return "PHB";
    case Path::NODE:
      return "NODE";
    case Path::SYS:
      return "SYS";
  }
  return "?";
}

Machine Machine::load(const std::string& xmlFile) {
#if STRATA_HAVE_HWLOC
  // hwloc loads its plugins with its first live topology and unloads them with the last; each
  // unload left the XML plugin's libxml2 state unreachable (LeakSanitizer: 1 KiB per load of a
  // file). One initialized topology kept for the process keeps them loaded once.
  static const bool kept = [] { return hwloc_topology_init(&keptTopology) == 0; }();
  (void)kept;
  hwloc_topology_t t = nullptr;
  if (hwloc_topology_init(&t) != 0) {
    throw Error(ErrorCode::SystemError, "hwloc_topology_init failed");
  }
  struct Free {
    hwloc_topology_t t;
    ~Free() { hwloc_topology_destroy(t); }
  } guard{t};
  // GPUs, NICs and the bridges above them; no OpenCL or OpenGL plugin (they would open the
  // GPUs' drivers in the calling process).
  hwloc_topology_set_io_types_filter(t, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
  for (const char* plugin : {"opencl", "gl"}) {
    hwloc_topology_set_components(t, HWLOC_TOPOLOGY_COMPONENTS_FLAG_BLACKLIST, plugin);
  }
  if (!xmlFile.empty() && hwloc_topology_set_xml(t, xmlFile.c_str()) != 0) {
    throw Error(ErrorCode::InvalidConfig,
                fmt::format("topology file {}: hwloc cannot use it ({}); record a machine with "
                            "lstopo --of xml",
                            xmlFile, std::strerror(errno)));
  }
  if (hwloc_topology_load(t) != 0) {
    throw Error(
        ErrorCode::InvalidConfig,
        fmt::format("{}: hwloc could not load it ({}){}",
                    xmlFile.empty() ? "this machine's topology" : "topology file " + xmlFile,
                    std::strerror(errno),
                    xmlFile.empty() ? "" : "; is it an hwloc XML file (lstopo --of xml)?"));
  }
  Machine m;
  m.source = xmlFile.empty() ? "this machine" : xmlFile;
  addTree(m, hwloc_get_root_obj(t), -1);
  std::vector<Nic> loose = std::move(m.nics);
  m.index();
  for (Nic& n : loose) m.nics.push_back(std::move(n));
  return m;
#else
  throw Error(ErrorCode::NotSupported,
              fmt::format("topology of {}: strata was built without hwloc (install libhwloc-dev "
                          "and rebuild)",
                          xmlFile.empty() ? "this machine" : xmlFile));
#endif
}

void Machine::index() {
  for (Node& n : nodes) n.children.clear();
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (nodes[i].parent >= 0)
      nodes[static_cast<size_t>(nodes[i].parent)].children.push_back(int(i));
  }
  auto cpuAncestor = [&](int i) {
    while (i >= 0 && !cpuSide(nodes[static_cast<size_t>(i)].kind)) i = nodes[size_t(i)].parent;
    return i;
  };
  gpus.clear();
  nics.clear();
  numaNodes.clear();
  std::vector<int> gpuNodes;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = nodes[i];
    if (n.kind == Kind::NumaNode) {
      NumaInfo info;
      info.osIndex = n.osIndex;
      info.cpus = n.cpus;
      for (int a = n.parent; a >= 0; a = nodes[size_t(a)].parent) {
        if (nodes[size_t(a)].kind == Kind::Package) {
          info.package = nodes[size_t(a)].osIndex;
          break;
        }
      }
      numaNodes.push_back(info);
    }
    if (isGpu(n)) gpuNodes.push_back(int(i));
    if (isNic(n)) {
      Nic nic;
      nic.node = int(i);
      nic.names = n.osNames;
      // The OpenFabrics name (mlx5_0) when there is one: it is what verbs and NCCL_IB_HCA use.
      for (const std::string& s : n.osNames) {
        if (nic.name.empty() && isRdmaName(s)) nic.name = s;
      }
      if (nic.name.empty()) nic.name = n.osNames.empty() ? n.busId : n.osNames.front();
      const int c = cpuAncestor(int(i));
      if (c >= 0) {
        nic.cpus = nodes[size_t(c)].cpus;
        nic.numa = nodes[size_t(c)].numa.empty() ? -1 : nodes[size_t(c)].numa.front();
      }
      nics.push_back(std::move(nic));
    }
  }
  std::sort(nics.begin(), nics.end(), [&](const Nic& a, const Nic& b) {
    return nodes[size_t(a.node)].busId < nodes[size_t(b.node)].busId;
  });
  std::sort(numaNodes.begin(), numaNodes.end(),
            [](const NumaInfo& a, const NumaInfo& b) { return a.osIndex < b.osIndex; });
  // GPUs by CUDA index where their OS devices say it, else in PCI bus order (what
  // CUDA_DEVICE_ORDER=PCI_BUS_ID gives).
  std::sort(gpuNodes.begin(), gpuNodes.end(),
            [&](int a, int b) { return nodes[size_t(a)].busId < nodes[size_t(b)].busId; });
  bool named = !gpuNodes.empty();
  for (int g : gpuNodes) named = named && cudaIndex(nodes[size_t(g)]) >= 0;
  if (named) {
    std::stable_sort(gpuNodes.begin(), gpuNodes.end(), [&](int a, int b) {
      return cudaIndex(nodes[size_t(a)]) < cudaIndex(nodes[size_t(b)]);
    });
  }
  for (size_t k = 0; k < gpuNodes.size(); ++k) {
    Gpu g;
    g.node = gpuNodes[k];
    g.index = static_cast<int>(k);
    const int c = cpuAncestor(g.node);
    if (c >= 0) {
      g.cpus = nodes[size_t(c)].cpus;
      g.numa = nodes[size_t(c)].numa.empty() ? -1 : nodes[size_t(c)].numa.front();
    }
    gpus.push_back(g);
  }
}

Machine::Route Machine::route(int a, int b) const {
  Route r;
  std::vector<int> up;  // a and its ancestors
  for (int i = a; i >= 0; i = nodes[size_t(i)].parent) up.push_back(i);
  for (r.common = b; r.common >= 0 && std::find(up.begin(), up.end(), r.common) == up.end();
       r.common = nodes[size_t(r.common)].parent) {
    if (r.common != b) r.belowB.push_back(r.common);
  }
  if (r.common < 0) return r;
  for (int i : up) {
    if (i == r.common) break;
    if (i != a) r.belowA.push_back(i);
  }
  return r;
}

Distance Machine::distance(int a, int b) const {
  const Route r = route(a, b);
  if (r.common < 0) return {Path::SYS, 1 << 20};  // not one tree (cannot happen in a load)
  // Edges: from each end that is not the common ancestor, one more than the nodes between.
  auto edges = [&](int end, const std::vector<int>& below) {
    return end == r.common ? 0 : static_cast<int>(below.size()) + 1;
  };
  auto bridges = [&](const std::vector<int>& below) {
    return std::count_if(below.begin(), below.end(),
                         [&](int i) { return nodes[size_t(i)].kind == Kind::PciBridge; });
  };
  Distance d;
  d.hops = edges(a, r.belowA) + edges(b, r.belowB);
  const int common = r.common;
  const Node& c = nodes[size_t(common)];
  if (c.kind == Kind::PciBridge || c.kind == Kind::PciDevice) {
    d.path = a == b || std::max(bridges(r.belowA), bridges(r.belowB)) <= 1 ? Path::PIX : Path::PXB;
  } else if (c.kind == Kind::HostBridge) {
    d.path = Path::PHB;
  } else {
    d.path = c.numa.size() <= 1 ? Path::NODE : Path::SYS;
  }
  return d;
}

Distance Machine::distanceFromNuma(int numaIndex, int node) const {
  // The NUMA node's object, then the path from it as from a device hanging there.
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (nodes[i].kind == Kind::NumaNode && nodes[i].osIndex == numaIndex) {
      Distance d = distance(int(i), node);
      if (d.path < Path::NODE) d.path = Path::NODE;  // from the cores: through the CPU
      return d;
    }
  }
  return {Path::SYS, 1 << 20};
}

std::string Machine::tree() const {
  // Packages, NUMA nodes and the I/O tree; other CPU-side objects (groups, dies, caches) are
  // transparent: what hangs off them shows under the nearest shown ancestor.
  std::string out;
  std::function<void(int, int)> walk = [&](int i, int depth) {
    const Node& n = nodes[size_t(i)];
    if (n.kind != Kind::Cpu) {
      out += fmt::format("{:{}}{}\n", "", depth * 2, nodeLabel(n));
      ++depth;
    }
    for (int c : n.children) walk(c, depth);
  };
  if (!nodes.empty()) walk(0, 1);
  return out;
}

}  // namespace strata::topology
