#pragma once
#ifndef STRATA_INTERNAL_HEADERS
#error "topology/topology.hpp is internal to strata: applications include <strata/...> only"
#endif

// The machine as hwloc sees it (this machine, or an hwloc XML file: `lstopo --of xml`), reduced
// to what placement needs: the tree of CPU packages, NUMA nodes, PCIe host bridges, switches
// and devices, the GPUs and NICs in it, and where each local rank should take its NIC, cores and
// memory from (docs/topology.md).

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <strata/backend/check.hpp>
#include <strata/export.hpp>

namespace strata::topology {

enum class Kind {
  Machine,
  Package,
  NumaNode,
  Cpu,  ///< any other object of the CPU side (group, die, cache) that I/O may hang off
  HostBridge,
  PciBridge,
  PciDevice,
};

/// One object of the tree. PU and Core objects are counted, not kept.
struct Node {
  Kind kind = Kind::Cpu;
  int parent = -1;
  std::vector<int> children;
  int osIndex = -1;      ///< Package, NumaNode: the OS index
  std::string busId;     ///< PCI: "0000:1b:00.0"; host bridge: its bus range "0000:[00-0f]"
  uint16_t vendor = 0;   ///< PciDevice, PciBridge
  uint16_t device = 0;   ///< PciDevice, PciBridge
  uint16_t classId = 0;  ///< PciDevice: 0x0302 3D controller, 0x0207 InfiniBand, ...
  std::vector<std::string> osNames;  ///< PciDevice: its OS devices (mlx5_0, ib0, cuda0)
  std::string cpus;                  ///< CPU-side objects: the cpuset as a list ("0-55,112-167")
  std::vector<int> numa;             ///< CPU-side objects: the NUMA nodes (OS indexes)
};

/// nvidia-smi topo -m's names for the path between two devices, nearest first.
enum class Path {
  PIX,   ///< through at most one PCIe bridge (one switch)
  PXB,   ///< through several PCIe bridges, not the host bridge
  PHB,   ///< through a PCIe host bridge
  NODE,  ///< through the CPU, within one NUMA node
  SYS,   ///< across NUMA nodes (the SMP interconnect)
};
STRATA_API std::string_view toString(Path p);

struct Distance {
  Path path = Path::SYS;
  int hops = 0;  ///< edges of the tree between the two
  bool operator<(const Distance& o) const { return path != o.path ? path < o.path : hops < o.hops; }
  bool operator==(const Distance& o) const { return path == o.path && hops == o.hops; }
};

struct Gpu {
  int node = -1;     ///< its PciDevice
  int index = 0;     ///< CUDA device index: from its cudaN OS device, else PCI bus order
  std::string cpus;  ///< the cores near it (its CPU-side ancestor's cpuset)
  int numa = -1;     ///< its NUMA node (the first of that ancestor's nodes)
};

/// Whether an OS device name is an RDMA device's (mlx5_0, rdmap16s27, efa0, hfi1_0, bnxt_re0,
/// irdma0): the name verbs, efa and NCCL_IB_HCA use, and what makes a NIC RDMA-capable here.
STRATA_API bool isRdmaName(std::string_view name);

struct Nic {
  int node = -1;                   ///< its PciDevice, or -1 for a NIC hwloc found no PCI device of
  std::string name;                ///< OpenFabrics name (mlx5_0), else the network interface (eth0)
  std::vector<std::string> names;  ///< every OS name (mlx5_0, ib0)
  std::string cpus;
  int numa = -1;
};

struct NumaInfo {
  int osIndex = 0;
  std::string cpus;
  int package = -1;  ///< OS index of its package, -1 unknown
};

class STRATA_API Machine {
 public:
  /// Loads this machine (xmlFile empty) or an hwloc XML file. Throws InvalidConfig for a file
  /// hwloc cannot read, NotSupported when strata was built without hwloc.
  static Machine load(const std::string& xmlFile = "");

  std::string source;       ///< "this machine" or the file
  std::vector<Node> nodes;  ///< nodes[0] is the root
  std::vector<Gpu> gpus;    ///< by index
  std::vector<Nic> nics;    ///< PCI NICs in bus order, then the others
  std::vector<NumaInfo> numaNodes;
  int packages = 0;
  int cores = 0;
  int pus = 0;

  /// The path between two nodes of the tree.
  Distance distance(int a, int b) const;
  /// The way between two nodes of the tree: their nearest common ancestor, and the nodes
  /// strictly between each end and it (nearest the end first). common is a or b when one
  /// holds the other; -1 when they are not in one tree.
  struct Route {
    int common = -1;
    std::vector<int> belowA, belowB;
  };
  Route route(int a, int b) const;
  /// The path from the cores of NUMA node numaIndex (OS index) to a node.
  Distance distanceFromNuma(int numaIndex, int node) const;
  /// The tree, one object per line, indented (CPU-side objects, bridges, GPUs and NICs).
  std::string tree() const;
  /// Finishes a hand-built machine (tests): parents' children, gpus, nics, numaNodes.
  void index();
};

/// transport.fabric.nic: auto, names in NCCL_IB_HCA's grammar (mlx5_0,mlx5_1 prefixes, =exact,
/// ^ to exclude, :port ignored), or a rank map (0=mlx5_0,1=mlx5_3: local rank = NIC name).
struct STRATA_API NicPolicy {
  enum class Mode { Auto, Names, RankMap } mode = Mode::Auto;
  bool exclude = false;
  bool exact = false;
  std::vector<std::string> names;                ///< Names: the list
  std::vector<std::pair<int, std::string>> map;  ///< RankMap: (local rank, name)
  /// Throws InvalidConfig naming the text and what is wrong.
  static NicPolicy parse(std::string_view text);
  /// Names mode: whether a NIC (any of its OS names) passes.
  bool allows(const Nic& nic) const;
};

struct Placement {
  int localRank = 0;
  int gpu = -1;  ///< index into Machine::gpus; -1 for a host-only rank
  int nic = -1;  ///< index into Machine::nics; -1 when the machine shows none
  Distance nicDistance;
  std::string cpus;       ///< the cores for this rank's threads: near its GPU, or its NUMA node
  std::string proxyCpus;  ///< the cores near its NIC (the proxy and progress threads)
  int numa = -1;          ///< NUMA node for its host staging buffers
  std::string why;        ///< one line: how the NIC was chosen
};

/// Where each of localRanks ranks of this host should take its NIC, cores and memory from.
/// gpuOfRank[r]: the GPU index local rank r uses (-1: host only); empty: local rank r uses GPU
/// r mod the GPUs, or none when the machine has none. numaOfRank[r] >= 0: host-only local rank
/// r is bound to that NUMA node (numaOfCpus of its affinity); the others are spread over the
/// NUMA nodes in blocks (local rank r of L on node r x nodes / L). Each rank takes a NIC at its
/// nearest distance; among equally near ones the least used, then the first; ranks with fewer
/// nearest NICs choose first. Throws InvalidConfig for a policy naming no NIC of the machine
/// or a GPU index it does not have.
STRATA_API std::vector<Placement> place(const Machine& m, int localRanks,
                                        const std::vector<int>& gpuOfRank, const NicPolicy& policy,
                                        const std::vector<int>& numaOfRank = {});

/// The NUMA node (OS index) whose cores hold every one of cpus (a rank's affinity mask), or -1
/// when they span several nodes (an unbound rank) or cpus is empty.
STRATA_API int numaOfCpus(const Machine& m, const std::vector<int>& cpus);

/// The GPU (index into m.gpus) that CUDA device `device` of this process is, through
/// CUDA_VISIBLE_DEVICES (visibleDevices; null or empty: device itself). Its entries are the
/// machine's GPU ordinals or GPU UUIDs (GPU-..., or a unique prefix of one, as CUDA takes them),
/// resolved to a PCI address through the NVIDIA driver's procRoot/driver/nvidia/gpus/*/information
/// (procRoot "/proc", or a recorded tree). -1 for a MIG instance (MIG-...), a UUID no GPU has, an
/// index past the list or the machine's GPUs, or a malformed entry: the rank is then host-only
/// for placement.
STRATA_API int gpuOfDevice(const Machine& m, int device, const char* visibleDevices,
                           const std::string& procRoot);

/// strata-info --topology: the machine, the GPU x NIC paths and every local rank's placement.
STRATA_API std::string describe(const Machine& m, const std::vector<Placement>& placements);

/// One line of the pre-flight check (the SDK's, so that modules can add theirs).
using CheckLine = backend::CheckLine;

/// strata-info --check: what this node can and cannot do for the placements, from the topology
/// and sysfs (sysfsRoot: "/sys", or a recorded tree): the NICs and whether they have an RDMA
/// device, the IOMMU mode of each GPU and NIC, PCIe ACS on the bridges between each rank's GPU
/// and NIC (peer-to-peer redirected to the root complex breaks or slows GPUDirect RDMA), and
/// the MPS daemon. What needs CUDA or libfabric (peer access, FI_HMEM, multicast) the transport
/// modules add (ModuleInfo::preflight; strata-info --check asks them).
STRATA_API std::vector<CheckLine> preflight(const Machine& m,
                                            const std::vector<Placement>& placements,
                                            const std::string& sysfsRoot);
STRATA_API std::string describe(const std::vector<CheckLine>& lines);

}  // namespace strata::topology
