#pragma once

// Choosing the libfabric provider (docs/transport-fabric.md, "Providers"): the one
// transport.fabric.provider names, or the first of the usual ones under "auto", with the
// strongest completion and ordering guarantees it accepts, and the wait for the interface that
// FI_TCP_IFACE names. fabric_endpoint.cpp opens the objects on what it chose.

#include <rdma/fabric.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <strata/backend/check.hpp>

namespace strata::fabric {

struct InfoDeleter {
  void operator()(fi_info* info) const noexcept { fi_freeinfo(info); }
};
using InfoPtr = std::unique_ptr<fi_info, InfoDeleter>;

// The mr_mode bits strata handles (FI_MR_RAW is left out on purpose: keys wider than 64 bits
// would need fi_mr_raw_attr/fi_mr_map_raw, which this transport does not implement).
inline constexpr uint64_t kMrModeHandled =
    FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_PROV_KEY | FI_MR_ALLOCATED | FI_MR_ENDPOINT;

/// A provider's fi_info and the guarantees it accepted.
struct ProviderChoice {
  InfoPtr info;
  bool deliveryComplete = false;  ///< FI_DELIVERY_COMPLETE
  bool waw = false;               ///< write-after-write ordering on both sides
};

/// The NIC lib/topology chose for this rank (backend::TransportInit's nic fields).
struct NicWish {
  std::vector<std::string> names;  ///< mlx5_0, ib0, ...; empty: no wish
  std::string busId;               ///< "0000:1b:00.0"
  std::string why;
  bool required = false;  ///< transport.fabric.nic named NICs: no other will do
};

/// Of the entries of choice.info with the head's provider, makes the one `nic` names (by PCI
/// address, domain name, device name, or a domain name that starts with the name and a dash:
/// efa's rdmap16s27-rdm) the choice, as a copy of that one entry. None: the head stays (logged),
/// or, when nic.required, InvalidConfig listing the provider's domains. No wish: nothing.
void selectNic(ProviderChoice& choice, const NicWish& nic, const std::string& who);

/// The provider `requested` names ("auto": the first of verbs;ofi_rxm, efa, tcp;ofi_rxm), with
/// FI_HMEM where `wantHmem` and the provider has it. When the tcp provider is not on the
/// interface FI_TCP_IFACE names, waits up to `timeout` seconds for that interface. `rank` and
/// `who` (the transport as messages name it) are for errors and logs. Of the provider's domains
/// (one per NIC), the one `nic` names (by PCI address, domain or device name), else the first
/// (logged). Throws NotSupported when no provider fits, BackendError when the interface stays
/// unusable, InvalidConfig when a required NIC is not among the provider's domains.
ProviderChoice chooseProvider(const std::string& requested, bool wantHmem, int rank,
                              const std::string& who, double timeout, const NicWish& nic = {});

/// The pre-flight lines (strata-info --check) for one provider from fi_getinfo's answers
/// without (`plain`) and with FI_HMEM (`withHmem`, may be null): each of its domains (one per
/// NIC; named by each entry's own provider, `provider` where an entry has none), its PCI address
/// and whether it registers CUDA memory. gpuDriver: a CUDA driver is present, so FI_HMEM matters.
std::vector<backend::CheckLine> hmemLines(const std::string& provider, const fi_info* plain,
                                          const fi_info* withHmem, bool gpuDriver);

/// The pre-flight for transport.fabric.provider `requested` ("auto": the provider auto would
/// take): which provider, and hmemLines for it; a warning line when none is offered.
std::vector<backend::CheckLine> preflight(const std::string& requested, bool gpuDriver);

}  // namespace strata::fabric
