// The fabric transport opens the NIC lib/topology chose (TransportInit's nic fields;
// docs/topology.md): selectNic on crafted provider lists, and the module with the real provider.

#include <rdma/fabric.h>
#include <rdma/fi_errno.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "backends/transport/fabric/fabric_provider.hpp"
#include "tests/transport/fabric/fabric_fixtures.hpp"

namespace {

namespace fabric = strata::fabric;

int closeNic(fid_t fid) {
  auto* nic = reinterpret_cast<fid_nic*>(fid);
  std::free(nic->bus_attr);
  std::free(nic);
  return 0;
}
// fi_dupinfo copies a NIC through fi_control(FI_DUP).
int controlNic(fid_t fid, int command, void* arg) {
  if (command != FI_DUP) return -FI_ENOSYS;
  const auto* nic = reinterpret_cast<const fid_nic*>(fid);
  auto* copy = static_cast<fid_nic*>(std::calloc(1, sizeof(fid_nic)));
  *copy = *nic;
  copy->bus_attr = static_cast<fi_bus_attr*>(std::calloc(1, sizeof(fi_bus_attr)));
  *copy->bus_attr = *nic->bus_attr;
  *static_cast<fid_nic**>(arg) = copy;
  return 0;
}
fi_ops nicOps = {sizeof(fi_ops), closeNic, nullptr, controlNic, nullptr, nullptr, nullptr};

/// One entry of a provider's list: a domain, and a NIC on the PCI bus where `pci` is given.
fi_info* entry(const char* prov, const char* domain, const char* pci = nullptr) {
  fi_info* i = fi_allocinfo();
  BOOST_REQUIRE(i != nullptr);
  i->fabric_attr->prov_name = strdup(prov);
  i->domain_attr->name = strdup(domain);
  if (pci != nullptr) {
    auto* nic = static_cast<fid_nic*>(std::calloc(1, sizeof(fid_nic)));
    nic->fid.fclass = FI_CLASS_NIC;
    nic->fid.ops = &nicOps;
    nic->bus_attr = static_cast<fi_bus_attr*>(std::calloc(1, sizeof(fi_bus_attr)));
    nic->bus_attr->bus_type = FI_BUS_PCI;
    unsigned d = 0, b = 0, dev = 0, f = 0;
    BOOST_REQUIRE(std::sscanf(pci, "%x:%x:%x.%x", &d, &b, &dev, &f) == 4);
    nic->bus_attr->attr.pci.domain_id = static_cast<uint16_t>(d);
    nic->bus_attr->attr.pci.bus_id = static_cast<uint8_t>(b);
    nic->bus_attr->attr.pci.device_id = static_cast<uint8_t>(dev);
    nic->bus_attr->attr.pci.function_id = static_cast<uint8_t>(f);
    i->nic = nic;
  }
  return i;
}

/// verbs' list on a DGX-like node: one entry per NIC (and a second provider's, never taken).
fabric::ProviderChoice verbsList() {
  fi_info* a = entry("verbs;ofi_rxm", "mlx5_0", "0000:15:00.0");
  fi_info* b = entry("verbs;ofi_rxm", "mlx5_1", "0000:18:00.0");
  fi_info* c = entry("tcp;ofi_rxm", "mlx5_2");
  fi_info* d = entry("verbs;ofi_rxm", "mlx5_3", "0000:38:00.0");
  a->next = b;
  b->next = c;
  c->next = d;
  fabric::ProviderChoice choice;
  choice.info.reset(a);
  return choice;
}

std::string chosen(const fabric::ProviderChoice& c) {
  return c.info->domain_attr->name;
}

}  // namespace

BOOST_AUTO_TEST_CASE(select_nic_takes_the_wished_domain) {
  {
    auto c = verbsList();
    fabric::selectNic(c, {{"mlx5_3", "ibp57s0"}, "", "mlx5_3 for local rank 3", false}, "test");
    BOOST_TEST(chosen(c) == "mlx5_3");
    BOOST_TEST(c.info->next == nullptr);  // one entry: the endpoint opens it
  }
  {
    // By PCI address alone (the names differ: a renamed device).
    auto c = verbsList();
    fabric::selectNic(c, {{"ib9"}, "0000:18:00.0", "ib9", false}, "test");
    BOOST_TEST(chosen(c) == "mlx5_1");
    BOOST_REQUIRE(c.info->nic != nullptr);  // fi_dupinfo copied the NIC's attributes
    BOOST_TEST(c.info->nic->bus_attr->attr.pci.bus_id == 0x18);
  }
  {
    // efa's domains carry a suffix: rdmap16s27-rdm for the device rdmap16s27.
    fabric::ProviderChoice c;
    fi_info* a = entry("efa", "rdmap0s31-rdm");
    a->next = entry("efa", "rdmap16s27-rdm");
    c.info.reset(a);
    fabric::selectNic(c, {{"rdmap16s27"}, "", "rdmap16s27", false}, "test");
    BOOST_TEST(chosen(c) == "rdmap16s27-rdm");
  }
  {
    // Another provider's entry is never taken, even by name.
    auto c = verbsList();
    fabric::selectNic(c, {{"mlx5_2"}, "", "mlx5_2", false}, "test");
    BOOST_TEST(chosen(c) == "mlx5_0");
    BOOST_TEST(c.info->next != nullptr);  // untouched
  }
  {
    // No wish (no topology, or no NIC in it): untouched.
    auto c = verbsList();
    fabric::selectNic(c, {}, "test");
    BOOST_TEST(chosen(c) == "mlx5_0");
  }
}

BOOST_AUTO_TEST_CASE(a_required_nic_the_provider_lacks_is_a_clear_error) {
  auto c = verbsList();
  auto e = catchError([&] {
    fabric::selectNic(c, {{"mlx5_7"}, "0000:b8:00.0", "mlx5_7 for local rank 7", true}, "test");
  });
  BOOST_REQUIRE(e.has_value());
  BOOST_TEST((e->code() == ErrorCode::InvalidConfig));
  const std::string what = e->what();
  BOOST_TEST(what.find("mlx5_7") != std::string::npos);
  // The provider's own domains, once each, with their PCI addresses.
  BOOST_TEST(what.find("mlx5_0 (0000:15:00.0), mlx5_1 (0000:18:00.0), mlx5_3 (0000:38:00.0)") !=
                 std::string::npos,
             what);
  BOOST_TEST(what.find("mlx5_2") == std::string::npos);
}

BOOST_AUTO_TEST_CASE(the_module_opens_the_wished_nic_or_says_why_not) {
  // With the real provider (tcp on lo, or shm): a NIC it does not offer is taken as a wish
  // (the transport still opens), and refused when transport.fabric.nic named it.
  auto init = strata::testing::pairInit(0, 0, &config());
  init.nicNames = {"mlx5_9"};
  init.nicBusId = "0000:e1:00.0";
  init.nicWhy = "mlx5_9 for local rank 0";
  auto t = g_info->createTransport(init);
  BOOST_TEST(t->supportsMemory(MemoryKind::Host));
  t.reset();
  init.nicRequired = true;
  auto e = catchError([&] { g_info->createTransport(init); });
  BOOST_REQUIRE(e.has_value());
  BOOST_TEST((e->code() == ErrorCode::InvalidConfig));
  BOOST_TEST(std::string(e->what()).find("offers only") != std::string::npos, e->what());
}

namespace {

using strata::backend::CheckLine;

const CheckLine* lineFor(const std::vector<CheckLine>& lines, const std::string& what) {
  for (const CheckLine& l : lines) {
    if (l.what == what) return &l;
  }
  return nullptr;
}

}  // namespace

BOOST_AUTO_TEST_CASE(preflight_says_which_nics_register_cuda_memory) {
  // A DGX-like verbs list: mlx5_0 and mlx5_1 offer FI_HMEM (GPUDirect RDMA), mlx5_3 does not
  // (a node whose peer-memory module is missing there); entries repeat per endpoint flavour.
  auto plain = verbsList();
  fi_info* hmemA = entry("verbs;ofi_rxm", "mlx5_0", "0000:15:00.0");
  fi_info* hmemB = entry("verbs;ofi_rxm", "mlx5_1", "0000:18:00.0");
  hmemA->caps = hmemB->caps = FI_RMA | FI_HMEM;
  hmemA->next = hmemB;
  fabric::InfoPtr withHmem(hmemA);
  for (bool gpuDriver : {true, false}) {
    const auto lines =
        fabric::hmemLines("verbs;ofi_rxm", plain.info.get(), withHmem.get(), gpuDriver);
    BOOST_TEST(lines.size() == 4u);  // mlx5_0, mlx5_1, the other provider's mlx5_2, mlx5_3
    const CheckLine* a = lineFor(lines, "fabric verbs;ofi_rxm domain mlx5_0");
    const CheckLine* d = lineFor(lines, "fabric verbs;ofi_rxm domain mlx5_3");
    BOOST_REQUIRE(a != nullptr);
    BOOST_REQUIRE(d != nullptr);
    BOOST_TEST((a->state == CheckLine::State::Ok));
    BOOST_TEST(a->found.find("PCI 0000:15:00.0, FI_HMEM") == 0, a->found);
    BOOST_TEST(d->found.find("no FI_HMEM") != std::string::npos, d->found);
    if (gpuDriver) {
      // Without FI_HMEM on a GPU node: a warning, and the fallback (bounce buffers).
      BOOST_TEST((d->state == CheckLine::State::Warn));
      BOOST_TEST(d->fallback.find("bounce buffers") != std::string::npos, d->fallback);
    } else {
      BOOST_TEST((d->state == CheckLine::State::Ok));
      BOOST_TEST(d->found.find("not needed") != std::string::npos, d->found);
    }
  }
  // No provider answers with FI_HMEM at all (withHmem null): every domain lacks it.
  const auto none = fabric::hmemLines("verbs;ofi_rxm", plain.info.get(), nullptr, true);
  BOOST_TEST(std::count_if(none.begin(), none.end(), [](const CheckLine& l) {
               return l.state == CheckLine::State::Warn;
             }) == 4);
}

BOOST_AUTO_TEST_CASE(preflight_through_the_module_on_this_node) {
  // The real provider (tcp on lo: no FI_HMEM; shm: FI_HMEM) through ModuleInfo::preflight.
  BOOST_REQUIRE(g_info->preflight != nullptr);
  const auto lines = g_info->preflight(config());
  BOOST_REQUIRE(lines.size() >= 2u);
  const std::string provider = std::getenv("STRATA_TRANSPORT_FABRIC_PROVIDER");
  BOOST_TEST(lines[0].what == "fabric provider");
  BOOST_TEST(lines[0].found == provider + " (transport.fabric.provider)", lines[0].found);
  BOOST_TEST(lines[1].what.find("fabric " + provider + " domain ") == 0, lines[1].what);
  const bool hmem = lines[1].found.find(", FI_HMEM") != std::string::npos;
  BOOST_TEST(hmem == (provider == "shm"), lines[1].found);
  // A provider libfabric does not offer: one warning naming it and what is offered.
  const auto missing = fabric::preflight("nosuchprov", false);
  BOOST_REQUIRE(missing.size() == 1u);
  BOOST_TEST((missing[0].state == CheckLine::State::Warn));
  BOOST_TEST(missing[0].found.find("\"nosuchprov\" offers no RDM endpoint") == 0, missing[0].found);
  BOOST_TEST(missing[0].found.find(provider) != std::string::npos, missing[0].found);
}
