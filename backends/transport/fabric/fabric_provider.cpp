#include "fabric_provider.hpp"

#include <rdma/fi_errno.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <set>
#include <string_view>

#include <fmt/format.h>

#include <strata/error.hpp>

#include "base/log.hpp"

namespace strata::fabric {
namespace {

constexpr const char* kLog = "fabric";

const char* const kAutoProviders[] = {"verbs;ofi_rxm", "efa", "tcp;ofi_rxm"};

InfoPtr query(const char* provider, bool hmem, bool deliveryComplete, bool waw) {
  InfoPtr hints(fi_allocinfo());
  if (!hints) throw Error(ErrorCode::SystemError, "fabric transport: fi_allocinfo failed");
  hints->caps = FI_RMA | FI_WRITE | FI_REMOTE_WRITE | (hmem ? FI_HMEM : 0);
  hints->ep_attr->type = FI_EP_RDM;
  hints->mode = FI_CONTEXT | FI_CONTEXT2;
  hints->domain_attr->mr_mode = kMrModeHandled | (hmem ? FI_MR_HMEM : 0);
  // One mutex serializes every call on the domain (the progress thread and the caller), so the
  // provider need not be thread-safe itself.
  hints->domain_attr->threading = FI_THREAD_DOMAIN;
  if (deliveryComplete) hints->tx_attr->op_flags = FI_DELIVERY_COMPLETE;
  // Write-after-write must hold where the writes are issued and where they land.
  if (waw) {
    hints->tx_attr->msg_order = FI_ORDER_WAW;
    hints->rx_attr->msg_order = FI_ORDER_WAW;
  }
  if (provider) hints->fabric_attr->prov_name = strdup(provider);
  fi_info* out = nullptr;
  int rc = fi_getinfo(FI_VERSION(1, 17), nullptr, nullptr, 0, hints.get(), &out);
  if (rc != 0) return nullptr;
  return InfoPtr(out);
}

// What fi_getinfo offers for RDM + RMA at all, for error messages.
std::string offeredProviders() {
  InfoPtr all = query(nullptr, false, false, false);
  std::set<std::string> names;
  for (fi_info* i = all.get(); i; i = i->next) {
    if (i->fabric_attr && i->fabric_attr->prov_name) names.insert(i->fabric_attr->prov_name);
  }
  if (names.empty()) return "none";
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "\"" : ", \"") + n + "\"";
  return out;
}

// The provider with the strongest completion/ordering guarantees it accepts.
std::optional<ProviderChoice> choose(const char* provider, bool hmem) {
  for (int pass = 0; pass < 4; ++pass) {
    bool dc = pass < 2, waw = pass % 2 == 0;
    if (auto info = query(provider, hmem, dc, waw)) {
      ProviderChoice c;
      c.deliveryComplete = dc;
      if (waw) {
        // Some providers (shm 1.17) echo a requested msg_order in the returned info although
        // their receive side promises only FI_ORDER_SAS; judge by what they advertise unasked.
        constexpr uint64_t kWaw = FI_ORDER_WAW | FI_ORDER_RMA_WAW;
        InfoPtr plain = query(provider, hmem, dc, false);
        c.waw = plain && (plain->tx_attr->msg_order & kWaw) != 0 &&
                (plain->rx_attr->msg_order & kWaw) != 0;
      }
      c.info = std::move(info);
      return c;
    }
  }
  return std::nullopt;
}

// The interface FI_TCP_IFACE names when the tcp provider's choice is on another one, else
// empty. libfabric 1.17 does not fail when that interface is down, has no carrier or no address:
// it silently offers loopback (127.0.0.1) instead, whose address no other host can reach.
std::string tcpInterfaceMissing(const fi_info* info) {
  const char* wanted = std::getenv("FI_TCP_IFACE");
  if (!wanted || !*wanted || !info || !info->fabric_attr->prov_name) return {};
  if (std::string_view(info->fabric_attr->prov_name).substr(0, 3) != "tcp") return {};
  const char* got = info->domain_attr->name;
  if (got && std::string_view(got) == wanted) return {};
  return wanted;
}

std::string pciAddress(const fi_info* i) {
  if (i->nic == nullptr || i->nic->bus_attr == nullptr ||
      i->nic->bus_attr->bus_type != FI_BUS_PCI) {
    return {};
  }
  const auto& a = i->nic->bus_attr->attr.pci;
  return fmt::format("{:04x}:{:02x}:{:02x}.{:x}", a.domain_id, a.bus_id, a.device_id,
                     a.function_id);
}

/// Whether fi_info entry i is the NIC `nic` names: its PCI address, its domain name (verbs:
/// mlx5_0; tcp: the interface; efa: rdmap16s27-rdm for rdmap16s27) or its device name.
bool isWished(const fi_info* i, const NicWish& nic) {
  if (!nic.busId.empty() && pciAddress(i) == nic.busId) return true;
  const std::string domain = i->domain_attr && i->domain_attr->name ? i->domain_attr->name : "";
  const std::string device =
      i->nic && i->nic->device_attr && i->nic->device_attr->name ? i->nic->device_attr->name : "";
  for (const std::string& n : nic.names) {
    if (n.empty()) continue;
    if (domain == n || device == n || domain.rfind(n + "-", 0) == 0) return true;
  }
  return false;
}

}  // namespace

void selectNic(ProviderChoice& choice, const NicWish& nic, const std::string& who) {
  if (nic.names.empty() && nic.busId.empty()) return;
  const fi_info* head = choice.info.get();
  const std::string prov = head->fabric_attr->prov_name ? head->fabric_attr->prov_name : "";
  std::string offered;  // one entry per domain (fi_getinfo lists one per address and variant)
  std::set<std::string> seen;
  const fi_info* match = nullptr;
  for (const fi_info* i = head; i != nullptr; i = i->next) {
    if (!i->fabric_attr->prov_name || prov != i->fabric_attr->prov_name) continue;
    const std::string domain = i->domain_attr->name ? i->domain_attr->name : "?";
    const std::string pci = pciAddress(i);
    const std::string entry = domain + (pci.empty() ? "" : " (" + pci + ")");
    if (seen.insert(entry).second) offered += (offered.empty() ? "" : ", ") + entry;
    if (match == nullptr && isWished(i, nic)) match = i;
  }
  if (match == nullptr) {
    if (nic.required) {
      throw Error(ErrorCode::InvalidConfig,
                  fmt::format("{}: transport.fabric.nic gives this rank NIC {}, but provider {} "
                              "offers only: {}. Name one of those (transport.fabric.nic; "
                              "docs/topology.md) or set it to auto",
                              who, nic.why, prov, offered));
    }
    STRATA_LOG(Info, kLog,
               "{}: the topology's NIC {} is not among provider {}'s domains ({}); "
               "using {}",
               who, nic.why, prov, offered,
               head->domain_attr->name ? head->domain_attr->name : "?");
    return;
  }
  STRATA_LOG(Info, kLog, "{}: domain {} for NIC {}", who,
             match->domain_attr->name ? match->domain_attr->name : "?", nic.why);
  if (match == head) return;
  InfoPtr one(fi_dupinfo(match));
  if (!one) throw Error(ErrorCode::SystemError, fmt::format("{}: fi_dupinfo failed", who));
  choice.info = std::move(one);
}

ProviderChoice chooseProvider(const std::string& requested, bool wantHmem, int rank,
                              const std::string& who, double timeout, const NicWish& nic) {
  std::optional<ProviderChoice> choice;
  if (requested == "auto") {
    for (int pass = wantHmem ? 0 : 1; pass < 2 && !choice; ++pass) {
      for (const char* p : kAutoProviders) {
        if ((choice = choose(p, pass == 0))) break;
      }
    }
    if (!choice) {
      throw Error(ErrorCode::NotSupported,
                  fmt::format("fabric transport (rank {}): transport.fabric.provider=auto found "
                              "none of verbs;ofi_rxm, efa, tcp;ofi_rxm with RDM endpoints and "
                              "RMA; fi_getinfo offers: {}. Name one of those in "
                              "transport.fabric.provider or leave fabric out of transport.*",
                              rank, offeredProviders()));
    }
  } else {
    if (wantHmem) choice = choose(requested.c_str(), true);
    if (!choice) choice = choose(requested.c_str(), false);
    if (!choice) {
      throw Error(ErrorCode::NotSupported,
                  fmt::format("fabric transport (rank {}): libfabric provider \"{}\" "
                              "(transport.fabric.provider) is not available with RDM endpoints "
                              "and RMA writes; fi_getinfo offers: {}",
                              rank, requested, offeredProviders()));
    }
  }
  if (std::string wanted = tcpInterfaceMissing(choice->info.get()); !wanted.empty()) {
    // A link that is down for a moment while the job starts must not leave this rank on
    // loopback for its lifetime (peers then fail with an unexplained EINVAL or a refused
    // connection): wait for the interface up to transport.timeout, then say what is wrong.
    const std::string got = choice->info->domain_attr->name ? choice->info->domain_attr->name : "?";
    STRATA_LOG(Warn, kLog,
               "{}: FI_TCP_IFACE={} is not usable (down, no carrier or no address; libfabric "
               "offers {} instead); waiting up to {} s (transport.timeout) for it",
               who, wanted, got, timeout);
    const auto start = std::chrono::steady_clock::now();
    const std::string chosen = choice->info->fabric_attr->prov_name;
    const bool hmem = (choice->info->caps & FI_HMEM) != 0;
    while (!tcpInterfaceMissing(choice->info.get()).empty()) {
      double waited =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (waited >= timeout) {
        throw Error(ErrorCode::BackendError,
                    fmt::format("{}: the interface FI_TCP_IFACE={} stayed unusable for {} s "
                                "(transport.timeout): it is down, has no carrier (link down) or "
                                "no address, and libfabric's tcp provider offers only {}, which "
                                "other hosts cannot reach. Check the link (ip link show {}) or "
                                "set FI_TCP_IFACE to an interface that is up",
                                who, wanted, timeout, got, wanted));
      }
      ::usleep(100'000);
      if (auto again = choose(chosen.c_str(), hmem)) *choice = std::move(*again);
    }
    STRATA_LOG(Info, kLog, "{}: FI_TCP_IFACE={} is usable after {:.1f} s", who, wanted,
               std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  selectNic(*choice, nic, who);
  return std::move(*choice);
}

std::vector<backend::CheckLine> hmemLines(const std::string& provider, const fi_info* plain,
                                          const fi_info* withHmem, bool gpuDriver) {
  using State = backend::CheckLine::State;
  std::vector<backend::CheckLine> out;
  std::set<std::string> seen;
  for (const fi_info* i = plain; i; i = i->next) {
    const std::string domain = i->domain_attr && i->domain_attr->name ? i->domain_attr->name : "?";
    const std::string prov =
        i->fabric_attr && i->fabric_attr->prov_name ? i->fabric_attr->prov_name : provider;
    if (!seen.insert(prov + " " + domain).second) continue;  // one line per domain
    bool hmem = false;
    for (const fi_info* h = withHmem; h && !hmem; h = h->next) {
      hmem = (h->caps & FI_HMEM) != 0 && h->domain_attr && h->domain_attr->name &&
             domain == h->domain_attr->name && h->fabric_attr && h->fabric_attr->prov_name &&
             prov == h->fabric_attr->prov_name;
    }
    const std::string pci = pciAddress(i);
    const std::string where = pci.empty() ? "no PCI address" : "PCI " + pci;
    backend::CheckLine l;
    l.what = fmt::format("fabric {} domain {}", prov, domain);
    if (hmem) {
      l.found = where + ", FI_HMEM: the fabric transport registers CUDA buffers here";
      if (gpuDriver) {
        l.fallback =
            "the CUDA collectives' cross-host step still copies through pinned host bounce "
            "buffers (their FI_HMEM path is not written yet)";
      }
    } else if (gpuDriver) {
      l.state = State::Warn;
      l.found = where + ", no FI_HMEM: CUDA buffers cannot be registered here";
      l.fallback =
          "CUDA buffers cross hosts through pinned host bounce buffers (the CUDA collectives' "
          "network step); registering one with the fabric transport is refused";
    } else {
      l.found = where + ", no FI_HMEM (not needed: no CUDA driver here)";
    }
    out.push_back(std::move(l));
  }
  return out;
}

std::vector<backend::CheckLine> preflight(const std::string& requested, bool gpuDriver) {
  using State = backend::CheckLine::State;
  std::vector<backend::CheckLine> out;
  std::vector<std::string> candidates;
  if (requested.empty() || requested == "auto") {
    candidates.assign(std::begin(kAutoProviders), std::end(kAutoProviders));
  } else {
    candidates.push_back(requested);
  }
  for (const std::string& p : candidates) {
    InfoPtr plain = query(p.c_str(), false, false, false);
    if (!plain) continue;
    InfoPtr withHmem = query(p.c_str(), true, false, false);
    out.push_back({"fabric provider", State::Ok,
                   requested == p ? p + " (transport.fabric.provider)"
                                  : fmt::format("{} (auto: the first of verbs;ofi_rxm, efa, "
                                                "tcp;ofi_rxm that fi_getinfo offers)",
                                                p),
                   ""});
    for (auto& l : hmemLines(p, plain.get(), withHmem.get(), gpuDriver)) {
      out.push_back(std::move(l));
    }
    return out;
  }
  out.push_back({"fabric provider", State::Warn,
                 fmt::format("{} offers no RDM endpoint with RMA writes (fi_getinfo offers: {})",
                             candidates.size() == 1 ? "\"" + requested + "\""
                                                    : "none of verbs;ofi_rxm, efa, tcp;ofi_rxm",
                             offeredProviders()),
                 "no fabric transport: ranks on different hosts have no transport between them"});
  return out;
}

}  // namespace strata::fabric
