// lib/topology on recorded machines (tests/topology/data/, written by make_machines.py) and on
// this machine: every local rank's NIC, cores and NUMA node, and the rules placement keeps.

#define BOOST_TEST_MODULE topology
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <set>
#include <string>

#include <strata/error.hpp>

#include "topology/topology.hpp"

using namespace strata::topology;

namespace {

std::string data(const std::string& name) {
  return std::string(TOPOLOGY_DATA_DIR) + "/" + name;
}

const std::string& nicName(const Machine& m, const Placement& p) {
  static const std::string none = "-";
  return p.nic >= 0 ? m.nics[size_t(p.nic)].name : none;
}

/// The rules every placement keeps: each rank's NIC is at its nearest distance among the
/// allowed NICs (so no idle NIC is nearer than a shared one), and among equally near NICs the
/// use differs by at most one.
void checkRules(const Machine& m, const std::vector<Placement>& ps, const NicPolicy& policy) {
  std::vector<int> load(m.nics.size(), 0);
  for (const Placement& p : ps) {
    if (p.nic >= 0) ++load[size_t(p.nic)];
  }
  for (const Placement& p : ps) {
    BOOST_TEST_CONTEXT("local rank " << p.localRank << " (" << p.why << ")") {
      BOOST_REQUIRE(p.nic >= 0);
      if (p.gpu < 0) continue;
      const int from = m.gpus[size_t(p.gpu)].node;
      const Distance mine = m.distance(from, m.nics[size_t(p.nic)].node);
      BOOST_TEST((mine == p.nicDistance));
      for (size_t n = 0; n < m.nics.size(); ++n) {
        if (!policy.allows(m.nics[n]) || m.nics[n].node < 0) continue;
        const Distance other = m.distance(from, m.nics[n].node);
        BOOST_TEST(!(other < mine),
                   "NIC " << m.nics[n].name << " is nearer than " << nicName(m, p));
        if (other == mine) BOOST_TEST(load[n] >= load[size_t(p.nic)] - 1);
      }
    }
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(dgx_like_gpu_i_takes_nic_i_and_its_socket) {
  const Machine m = Machine::load(data("dgx-h100.xml"));
  BOOST_TEST(m.packages == 2);
  BOOST_TEST(m.numaNodes.size() == 2u);
  BOOST_TEST(m.cores == 112);
  BOOST_TEST(m.pus == 224);
  BOOST_REQUIRE(m.gpus.size() == 8u);
  BOOST_TEST(m.nics.size() == 10u);  // 8 compute, 2 storage
  const NicPolicy policy;
  const auto ps = place(m, 8, {}, policy);
  for (int r = 0; r < 8; ++r) {
    BOOST_TEST_CONTEXT("local rank " << r) {
      const Placement& p = ps[size_t(r)];
      BOOST_TEST(p.gpu == r);
      BOOST_TEST(nicName(m, p) == "mlx5_" + std::to_string(r));
      BOOST_TEST((p.nicDistance.path == Path::PIX));
      const std::string cpus = r < 4 ? "0-55,112-167" : "56-111,168-223";
      BOOST_TEST(p.cpus == cpus);
      BOOST_TEST(p.proxyCpus == cpus);
      BOOST_TEST(p.numa == (r < 4 ? 0 : 1));
    }
  }
  checkRules(m, ps, policy);
  // The paths nvidia-smi would print: the GPU's own NIC PIX, its neighbour's PXB, the other
  // switch of the socket NODE, the other socket SYS.
  BOOST_TEST((m.distance(m.gpus[0].node, m.nics[1].node).path == Path::PXB));
  BOOST_TEST((m.distance(m.gpus[0].node, m.nics[2].node).path == Path::NODE));
  BOOST_TEST((m.distance(m.gpus[0].node, m.nics[6].node).path == Path::SYS));
}

BOOST_AUTO_TEST_CASE(four_gpus_share_two_nics_by_switch) {
  const Machine m = Machine::load(data("gpu4-nic2.xml"));
  BOOST_REQUIRE(m.gpus.size() == 4u);
  BOOST_REQUIRE(m.nics.size() == 2u);
  const auto ps = place(m, 4, {}, NicPolicy{});
  const char* expect[] = {"mlx5_0", "mlx5_0", "mlx5_1", "mlx5_1"};
  for (int r = 0; r < 4; ++r) {
    BOOST_TEST(nicName(m, ps[size_t(r)]) == expect[r]);
    BOOST_TEST(ps[size_t(r)].numa == 0);
    BOOST_TEST(ps[size_t(r)].cpus == "0-63");
  }
  checkRules(m, ps, NicPolicy{});
  // Excluding mlx5_0 moves its GPUs to mlx5_1 (farther, but the only one allowed).
  const NicPolicy noZero = NicPolicy::parse("^mlx5_0");
  const auto ex = place(m, 4, {}, noZero);
  for (const Placement& p : ex) BOOST_TEST(nicName(m, p) == "mlx5_1");
  checkRules(m, ex, noZero);
  // Two ranks on GPU 2: both on its switch's NIC.
  const auto two = place(m, 2, {2, 2}, NicPolicy{});
  BOOST_TEST(nicName(m, two[0]) == "mlx5_1");
  BOOST_TEST(nicName(m, two[1]) == "mlx5_1");
}

BOOST_AUTO_TEST_CASE(host_only_ranks_take_their_numa_nodes_nic) {
  const Machine m = Machine::load(data("cpu-only.xml"));
  BOOST_TEST(m.gpus.empty());
  BOOST_REQUIRE(m.nics.size() == 2u);
  BOOST_TEST(m.nics[0].name == "ens1f0");
  const auto ps = place(m, 4, {}, NicPolicy{});
  for (int r = 0; r < 4; ++r) {
    BOOST_TEST_CONTEXT("local rank " << r) {
      const Placement& p = ps[size_t(r)];
      BOOST_TEST(p.gpu == -1);
      BOOST_TEST(p.numa == r / 2);
      BOOST_TEST(nicName(m, p) == (r < 2 ? "ens1f0" : "ens2f0"));
      BOOST_TEST(p.cpus == (r < 2 ? "0-15,32-47" : "16-31,48-63"));
    }
  }
}

BOOST_AUTO_TEST_CASE(host_only_ranks_bound_to_a_node_take_that_node) {
  const Machine m = Machine::load(data("cpu-only.xml"));
  // Affinity masks: inside node 1 (a core and its hyperthread), inside node 0, across both.
  BOOST_TEST(numaOfCpus(m, {17, 49}) == 1);
  BOOST_TEST(numaOfCpus(m, {0, 1, 2, 3}) == 0);
  BOOST_TEST(numaOfCpus(m, {15, 16}) == -1);
  BOOST_TEST(numaOfCpus(m, {}) == -1);
  BOOST_TEST(numaOfCpus(m, {200}) == -1);
  // Ranks bound against the block order (srun --cpu-bind=map_ldom:1,0): rank 0 on node 1 takes
  // node 1's NIC and cores; unknown bindings (-1) stay in blocks.
  const auto ps = place(m, 4, {}, NicPolicy{}, {1, 0, -1, -1});
  BOOST_TEST(ps[0].numa == 1);
  BOOST_TEST(nicName(m, ps[0]) == "ens2f0");
  BOOST_TEST(ps[0].cpus == "16-31,48-63");
  BOOST_TEST(ps[1].numa == 0);
  BOOST_TEST(nicName(m, ps[1]) == "ens1f0");
  BOOST_TEST(ps[2].numa == 1);
  BOOST_TEST(ps[3].numa == 1);
  // A node the machine does not have: blocks, as unbound.
  BOOST_TEST(place(m, 2, {}, NicPolicy{}, {7, 7})[0].numa == 0);
}

BOOST_AUTO_TEST_CASE(cuda_visible_devices_by_index_and_by_uuid) {
  const Machine m = Machine::load(data("dgx-h100.xml"));
  const std::string proc = data("proc-dgx");
  BOOST_TEST(gpuOfDevice(m, 0, nullptr, proc) == 0);
  BOOST_TEST(gpuOfDevice(m, 7, "", proc) == 7);
  BOOST_TEST(gpuOfDevice(m, 8, nullptr, proc) == -1);
  BOOST_TEST(gpuOfDevice(m, 1, "2,3", proc) == 3);
  BOOST_TEST(gpuOfDevice(m, 2, "2,3", proc) == -1);
  BOOST_TEST(gpuOfDevice(m, 0, "12", proc) == -1);
  BOOST_TEST(gpuOfDevice(m, 0, "x1", proc) == -1);
  // UUIDs (the driver's information files give their PCI addresses), a unique prefix too.
  BOOST_TEST(gpuOfDevice(m, 0, "GPU-5a1e2b05-0b1d-4c3e-8f21-000000000005", proc) == 5);
  BOOST_TEST(gpuOfDevice(m, 1, "GPU-5a1e2b05, GPU-5a1e2b02", proc) == 2);
  BOOST_TEST(gpuOfDevice(m, 0, "GPU-5a1e2b0", proc) == -1);  // all eight: ambiguous
  BOOST_TEST(gpuOfDevice(m, 0, "GPU-ffff", proc) == -1);
  BOOST_TEST(gpuOfDevice(m, 0, "GPU-", proc) == -1);
  BOOST_TEST(gpuOfDevice(m, 0, "MIG-5a1e2b05-0b1d-4c3e-8f21-000000000005", proc) == -1);
  BOOST_TEST(gpuOfDevice(m, 0, "GPU-5a1e2b05", data("sysfs-dgx-clean")) == -1);  // no driver
  // The rank given GPU 5 by UUID takes GPU 5's NIC.
  const auto ps = place(m, 1, {gpuOfDevice(m, 0, "GPU-5a1e2b05", proc)}, NicPolicy{});
  BOOST_TEST(nicName(m, ps[0]) == "mlx5_5");
}

BOOST_AUTO_TEST_CASE(far_socket_gpus_spread_over_the_near_socket_nics) {
  const Machine m = Machine::load(data("nics-socket0.xml"));
  BOOST_REQUIRE(m.gpus.size() == 8u);
  BOOST_REQUIRE(m.nics.size() == 2u);
  const auto ps = place(m, 8, {}, NicPolicy{});
  std::vector<int> load(2, 0);
  for (const Placement& p : ps) ++load[size_t(p.nic)];
  BOOST_TEST(load[0] == 4);
  BOOST_TEST(load[1] == 4);
  BOOST_TEST(nicName(m, ps[0]) == "mlx5_0");
  BOOST_TEST(nicName(m, ps[2]) == "mlx5_1");
  for (int r = 4; r < 8; ++r) {
    BOOST_TEST((ps[size_t(r)].nicDistance.path == Path::SYS));
    BOOST_TEST(ps[size_t(r)].numa == 1);
    // Its own cores for the rank, the NIC's for the proxy.
    BOOST_TEST(ps[size_t(r)].cpus == "32-63,96-127");
    BOOST_TEST(ps[size_t(r)].proxyCpus == "0-31,64-95");
  }
  checkRules(m, ps, NicPolicy{});
}

BOOST_AUTO_TEST_CASE(rank_map_and_names) {
  const Machine m = Machine::load(data("dgx-h100.xml"));
  const auto mapped = place(m, 2, {}, NicPolicy::parse("0=mlx5_3, 1=mlx5_2:1"));
  BOOST_TEST(nicName(m, mapped[0]) == "mlx5_3");
  BOOST_TEST(nicName(m, mapped[1]) == "mlx5_2");
  // Ranks the map leaves out choose as usual.
  const auto partial = place(m, 3, {}, NicPolicy::parse("1=mlx5_7"));
  BOOST_TEST(nicName(m, partial[0]) == "mlx5_0");
  BOOST_TEST(nicName(m, partial[1]) == "mlx5_7");
  BOOST_TEST(nicName(m, partial[2]) == "mlx5_2");
  // Exact names: =mlx5_1 is only mlx5_1; a prefix mlx5_1 also takes nothing else here.
  const auto exact = place(m, 2, {}, NicPolicy::parse("=mlx5_1"));
  for (const Placement& p : exact) BOOST_TEST(nicName(m, p) == "mlx5_1");
  // The storage NICs: only by name.
  const auto storage = place(m, 2, {}, NicPolicy::parse("mlx5_8,mlx5_9"));
  BOOST_TEST(nicName(m, storage[0]) == "mlx5_8");
  BOOST_TEST(nicName(m, storage[1]) == "mlx5_8");  // GPU 1 is on socket 0 too
  // Network interface names work as well as OpenFabrics names.
  const auto byInterface = place(m, 1, {}, NicPolicy::parse("=ibp52s0"));
  BOOST_TEST(nicName(m, byInterface[0]) == "mlx5_2");
}

BOOST_AUTO_TEST_CASE(bad_policies_and_files_are_clear_errors) {
  const Machine m = Machine::load(data("gpu4-nic2.xml"));
  auto code = [](auto f) {
    try {
      f();
    } catch (const strata::Error& e) {
      BOOST_TEST_MESSAGE(e.what());
      return e.code();
    }
    return strata::ErrorCode::Internal;
  };
  using strata::ErrorCode;
  BOOST_TEST(
      (code([&] { place(m, 4, {}, NicPolicy::parse("mlx4")); }) == ErrorCode::InvalidConfig));
  BOOST_TEST(
      (code([&] { place(m, 2, {}, NicPolicy::parse("0=mlx5_9")); }) == ErrorCode::InvalidConfig));
  BOOST_TEST((code([&] { place(m, 2, {7, 0}, NicPolicy{}); }) == ErrorCode::InvalidConfig));
  BOOST_TEST((code([&] { place(m, 0, {}, NicPolicy{}); }) == ErrorCode::InvalidArgument));
  for (const char* bad : {"0=mlx5_0,0=mlx5_1", "x=mlx5_0", "0=", "mlx5_0,,mlx5_1", "^0=mlx5_0"}) {
    BOOST_TEST_CONTEXT(bad) {
      BOOST_TEST((code([&] { NicPolicy::parse(bad); }) == ErrorCode::InvalidConfig));
    }
  }
  BOOST_TEST(
      (code([&] { Machine::load(data("no-such-machine.xml")); }) == ErrorCode::InvalidConfig));
  BOOST_TEST(
      (code([&] { Machine::load(data("../make_machines.py")); }) == ErrorCode::InvalidConfig));
}

BOOST_AUTO_TEST_CASE(this_machine_loads_and_places_host_only_ranks) {
  const Machine m = Machine::load();
  BOOST_TEST(m.source == "this machine");
  BOOST_TEST(m.pus >= 1);
  BOOST_TEST(!m.numaNodes.empty());
  const auto ps = place(m, 2, {}, NicPolicy{});
  for (const Placement& p : ps) {
    BOOST_TEST(!p.cpus.empty());
    BOOST_TEST(!p.why.empty());
    if (m.gpus.empty()) BOOST_TEST(p.gpu == -1);
  }
  BOOST_TEST_MESSAGE(describe(m, ps));
}

namespace {

const CheckLine* lineOf(const std::vector<CheckLine>& lines, const std::string& what) {
  for (const CheckLine& l : lines) {
    if (l.what == what) return &l;
  }
  return nullptr;
}

}  // namespace

BOOST_AUTO_TEST_CASE(preflight_finds_acs_redirect_and_translated_iommu) {
  const Machine m = Machine::load(data("dgx-h100.xml"));
  const auto ps = place(m, 1, {}, NicPolicy{});
  const auto bad = preflight(m, ps, data("sysfs-dgx-acs"));
  BOOST_TEST_MESSAGE(describe(bad));
  const CheckLine* acs = lineOf(bad, "PCIe ACS 0000:12:00.0");
  BOOST_REQUIRE(acs != nullptr);
  BOOST_TEST((acs->state == CheckLine::State::Warn));
  BOOST_TEST(acs->found.find("P2P request redirect") != std::string::npos);
  BOOST_TEST(acs->found.find("GPU 0 and NIC mlx5_0") != std::string::npos);
  BOOST_TEST(acs->fallback.find("bounce buffers") != std::string::npos);
  // Only the redirecting bridge is named (the two others on the path are clean).
  BOOST_TEST(std::count_if(bad.begin(), bad.end(), [](const CheckLine& l) {
               return l.what.rfind("PCIe ACS", 0) == 0;
             }) == 1);
  const CheckLine* iommu = lineOf(bad, "IOMMU");
  BOOST_REQUIRE(iommu != nullptr);
  BOOST_TEST((iommu->state == CheckLine::State::Warn));
  BOOST_TEST(iommu->found.find("0000:14:00.0 (DMA-FQ)") != std::string::npos);
  const CheckLine* nic = lineOf(bad, "NIC mlx5_0");
  BOOST_REQUIRE(nic != nullptr);
  BOOST_TEST((nic->state == CheckLine::State::Ok));

  const auto good = preflight(m, ps, data("sysfs-dgx-clean"));
  BOOST_TEST_MESSAGE(describe(good));
  const CheckLine* clean = lineOf(good, "PCIe ACS");
  BOOST_REQUIRE(clean != nullptr);
  BOOST_TEST((clean->state == CheckLine::State::Ok));
  BOOST_TEST(clean->found.find("3 bridge(s)") != std::string::npos);
  BOOST_TEST((lineOf(good, "IOMMU")->state == CheckLine::State::Ok));
  BOOST_TEST(lineOf(good, "IOMMU")->found.find("passthrough") != std::string::npos);
  // Ranks whose bridges have no recorded config space: unknown, not fine.
  const auto eight = preflight(m, place(m, 8, {}, NicPolicy{}), data("sysfs-dgx-clean"));
  const CheckLine* unknown = lineOf(eight, "PCIe ACS");
  BOOST_REQUIRE(unknown != nullptr);
  BOOST_TEST((unknown->state == CheckLine::State::Unknown));
}

BOOST_AUTO_TEST_CASE(preflight_on_machines_without_gpus_or_rdma) {
  const Machine m = Machine::load(data("cpu-only.xml"));
  const auto lines = preflight(m, place(m, 2, {}, NicPolicy{}), data("sysfs-dgx-clean"));
  BOOST_TEST_MESSAGE(describe(lines));
  const CheckLine* nic = lineOf(lines, "NIC ens1f0");
  BOOST_REQUIRE(nic != nullptr);
  BOOST_TEST((nic->state == CheckLine::State::Warn));
  BOOST_TEST(nic->fallback.find("tcp") != std::string::npos);
  BOOST_TEST((lineOf(lines, "PCIe ACS")->state == CheckLine::State::Ok));
  BOOST_TEST(lineOf(lines, "MPS")->found == "no GPU");
  // This machine, its own sysfs: every line is there, nothing throws.
  const Machine here = Machine::load();
  const auto mine = preflight(here, place(here, 1, {}, NicPolicy{}), "/sys");
  BOOST_TEST_MESSAGE(describe(mine));
  BOOST_TEST(lineOf(mine, "topology") != nullptr);
  BOOST_TEST(lineOf(mine, "IOMMU") != nullptr);
}
