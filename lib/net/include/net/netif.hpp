#pragma once
#ifndef STRATA_INTERNAL_HEADERS
#error "net/netif.hpp is internal to strata: applications include <strata/...> only"
#endif

// Network interface selection with NCCL_SOCKET_IFNAME's grammar:
//   "eth,ib"     names starting with eth or ib
//   "^docker"    every name not starting with docker
//   "=eth0"      exactly eth0 ("^=docker0": all but exactly docker0)
// An explicit (non-negated) list that matches no interface is InvalidConfig at once.

#include <sys/socket.h>

#include <string>
#include <string_view>
#include <vector>

#include <strata/export.hpp>

namespace strata::netif {

struct Interface {
  std::string name;
  sockaddr_storage addr{};
  socklen_t addrLen = 0;
  int family = 0;  ///< AF_INET or AF_INET6
  unsigned prefixLen = 0;
  bool loopback = false;
  std::string address() const;  ///< numeric address without port
};

/// Up interfaces with an IPv4 or IPv6 address (IPv6 link-local excluded), one entry per address.
STRATA_API std::vector<Interface> list();

struct Spec {
  bool negate = false;
  bool exact = false;
  std::vector<std::string> names;
};
/// Parses the grammar above; throws InvalidConfig for an empty name in a list.
STRATA_API Spec parseSpec(std::string_view text);
STRATA_API bool matches(const Spec& spec, std::string_view name);

/// Chooses one interface address. family: AF_UNSPEC, AF_INET or AF_INET6.
/// With a spec: the first matching interface (IPv4 first when family is AF_UNSPEC); throws
/// InvalidConfig naming the spec and the interfaces present when nothing matches.
/// Without a spec: the interface whose subnet holds `hint` (e.g. the root address) if any, then
/// NCCL's default order: ib*, then anything but docker*/lo/virbr*, then docker*, lo, virbr*.
STRATA_API Interface select(std::string_view spec, int family, const sockaddr* hint,
                            const std::vector<Interface>& candidates);
STRATA_API Interface select(std::string_view spec, int family = 0, const sockaddr* hint = nullptr);

/// The address family bootstrap.tcp.family names: "ipv4" AF_INET, "ipv6" AF_INET6, else
/// AF_UNSPEC ("auto").
STRATA_API int familyOf(std::string_view name);

}  // namespace strata::netif
