#include "net/netif.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <functional>
#include <optional>

#include <fmt/format.h>

#include <strata/error.hpp>

#include "base/strings.hpp"

namespace strata::netif {

namespace {

constexpr std::string_view kInterfaceKey = "bootstrap.tcp.interface";
constexpr std::string_view kInterfaceEnv = "STRATA_BOOTSTRAP_TCP_INTERFACE";

unsigned prefixFromMask(const sockaddr* mask, int family) {
  if (mask == nullptr) return 0;
  const uint8_t* bytes = nullptr;
  size_t n = 0;
  if (family == AF_INET) {
    bytes = reinterpret_cast<const uint8_t*>(&reinterpret_cast<const sockaddr_in*>(mask)->sin_addr);
    n = 4;
  } else {
    bytes =
        reinterpret_cast<const uint8_t*>(&reinterpret_cast<const sockaddr_in6*>(mask)->sin6_addr);
    n = 16;
  }
  unsigned bits = 0;
  for (size_t i = 0; i < n; ++i) bits += static_cast<unsigned>(std::popcount(bytes[i]));
  return bits;
}

// The address bytes of an IPv4 or IPv6 socket address; IPv4-mapped IPv6 counts as IPv4 so
// that a root given as ::ffff:10.0.0.1 still finds the IPv4 subnet.
struct RawAddr {
  int family = AF_UNSPEC;
  uint8_t bytes[16]{};
};

std::optional<RawAddr> rawAddress(const sockaddr* sa) {
  if (sa == nullptr) return std::nullopt;
  RawAddr out;
  if (sa->sa_family == AF_INET) {
    out.family = AF_INET;
    std::memcpy(out.bytes, &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, 4);
    return out;
  }
  if (sa->sa_family == AF_INET6) {
    const auto& a6 = reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr;
    if (IN6_IS_ADDR_V4MAPPED(&a6)) {
      out.family = AF_INET;
      std::memcpy(out.bytes, a6.s6_addr + 12, 4);
    } else {
      out.family = AF_INET6;
      std::memcpy(out.bytes, a6.s6_addr, 16);
    }
    return out;
  }
  return std::nullopt;
}

bool inSubnet(const Interface& itf, const RawAddr& hint) {
  // A missing netmask says nothing about the subnet, so it must not claim every address.
  if (itf.family != hint.family || itf.prefixLen == 0) return false;
  auto own = rawAddress(reinterpret_cast<const sockaddr*>(&itf.addr));
  if (!own || own->family != hint.family) return false;
  unsigned bits = std::min(itf.prefixLen, hint.family == AF_INET ? 32u : 128u);
  for (unsigned i = 0; i < bits; ++i) {
    uint8_t m = static_cast<uint8_t>(0x80u >> (i % 8));
    if ((own->bytes[i / 8] & m) != (hint.bytes[i / 8] & m)) return false;
  }
  return true;
}

bool startsWith(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

// NCCL's default preference: ib*, then ordinary interfaces, then docker*, lo, virbr*.
int defaultTier(const Interface& itf) {
  if (startsWith(itf.name, "ib")) return 0;
  if (startsWith(itf.name, "docker")) return 2;
  if (startsWith(itf.name, "lo") || itf.loopback) return 3;
  if (startsWith(itf.name, "virbr")) return 4;
  return 1;
}

std::string_view familyName(int family) {
  return family == AF_INET ? "IPv4" : family == AF_INET6 ? "IPv6" : "";
}

// "lo (127.0.0.1, ::1), eth0 (10.0.0.5)": one entry per name, addresses in list order.
std::string describe(const std::vector<Interface>& candidates) {
  if (candidates.empty()) return "none";
  std::vector<std::pair<std::string, std::string>> byName;
  for (const auto& c : candidates) {
    auto it = std::find_if(byName.begin(), byName.end(),
                           [&](const auto& e) { return e.first == c.name; });
    if (it == byName.end()) {
      byName.emplace_back(c.name, c.address());
    } else {
      it->second += ", " + c.address();
    }
  }
  std::string out;
  for (const auto& [name, addrs] : byName) {
    if (!out.empty()) out += ", ";
    out += fmt::format("{} ({})", name, addrs);
  }
  return out;
}

}  // namespace

std::string Interface::address() const {
  char text[INET6_ADDRSTRLEN] = {};
  const void* src = nullptr;
  if (family == AF_INET) {
    src = &reinterpret_cast<const sockaddr_in*>(&addr)->sin_addr;
  } else if (family == AF_INET6) {
    src = &reinterpret_cast<const sockaddr_in6*>(&addr)->sin6_addr;
  } else {
    return "?";
  }
  if (inet_ntop(family, src, text, sizeof text) == nullptr) return "?";
  return text;
}

std::vector<Interface> list() {
  ifaddrs* head = nullptr;
  if (getifaddrs(&head) != 0) {
    int err = errno;
    throw Error(
        ErrorCode::SystemError,
        fmt::format("cannot list network interfaces: getifaddrs failed: {}", std::strerror(err)));
  }
  std::vector<Interface> out;
  for (ifaddrs* ifa = head; ifa != nullptr; ifa = ifa->ifa_next) {
    if (ifa->ifa_addr == nullptr || (ifa->ifa_flags & IFF_UP) == 0) continue;
    int family = ifa->ifa_addr->sa_family;
    if (family != AF_INET && family != AF_INET6) continue;
    if (family == AF_INET6 &&
        IN6_IS_ADDR_LINKLOCAL(&reinterpret_cast<const sockaddr_in6*>(ifa->ifa_addr)->sin6_addr)) {
      // Link-local addresses need a scope id on every use; no bootstrap peer could reach them.
      continue;
    }
    Interface itf;
    itf.name = ifa->ifa_name;
    itf.family = family;
    itf.addrLen = family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    std::memcpy(&itf.addr, ifa->ifa_addr, itf.addrLen);
    itf.prefixLen = prefixFromMask(ifa->ifa_netmask, family);
    itf.loopback = (ifa->ifa_flags & IFF_LOOPBACK) != 0;
    out.push_back(std::move(itf));
  }
  freeifaddrs(head);
  return out;
}

Spec parseSpec(std::string_view text) {
  Spec spec;
  std::string_view rest = strings::trim(text);
  // An empty spec means "no preference"; select() then uses the default order.
  if (rest.empty()) return spec;
  if (rest.front() == '^') {
    spec.negate = true;
    rest.remove_prefix(1);
  }
  if (!rest.empty() && rest.front() == '=') {
    spec.exact = true;
    rest.remove_prefix(1);
  }
  auto bad = [&](const std::string& why) {
    throw Error(ErrorCode::InvalidConfig,
                fmt::format("interface spec '{}': {}; expected a comma list of name prefixes, "
                            "optionally after '^' (all but these) and/or '=' (exact names), "
                            "e.g. 'eth,ib', '^docker', '=eth0', '^=docker0'",
                            text, why));
  };
  for (auto item : strings::split(rest)) {
    std::string_view name = strings::trim(item);
    if (name.empty()) bad("empty interface name in the list");
    if (name.find_first_of("^=") != std::string_view::npos) {
      bad(
          fmt::format("'{}' is not an interface name ('^' and '=' belong at the start, "
                      "'^' before '=')",
                      name));
    }
    spec.names.emplace_back(name);
  }
  return spec;
}

bool matches(const Spec& spec, std::string_view name) {
  bool hit = std::any_of(spec.names.begin(), spec.names.end(), [&](const std::string& n) {
    return spec.exact ? name == n : startsWith(name, n);
  });
  return hit != spec.negate;
}

Interface select(std::string_view spec, int family, const sockaddr* hint,
                 const std::vector<Interface>& candidates) {
  if (family != AF_UNSPEC && family != AF_INET && family != AF_INET6) {
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("interface selection: address family {} is neither AF_INET, "
                            "AF_INET6 nor AF_UNSPEC",
                            family));
  }
  // IPv4 first when the caller takes either family, as the header promises.
  auto pickFirst =
      [&](const std::function<bool(const Interface&)>& pred) -> std::optional<Interface> {
    for (int pass : {AF_INET, AF_INET6}) {
      if (family != AF_UNSPEC && family != pass) continue;
      for (const auto& c : candidates) {
        if (c.family == pass && pred(c)) return c;
      }
    }
    return std::nullopt;
  };

  std::string_view trimmed = strings::trim(spec);
  if (!trimmed.empty()) {
    Spec parsed = parseSpec(trimmed);
    if (auto r = pickFirst([&](const Interface& c) { return matches(parsed, c.name); })) {
      return *r;
    }
    std::string_view fam = familyName(family);
    throw Error(ErrorCode::InvalidConfig,
                fmt::format("{} '{}' matches no {}{}interface; present: {}. Set {} (environment "
                            "{}) to one of these names (a prefix, '=name' for an exact name, "
                            "'^name' to exclude), or leave it empty for the default choice",
                            kInterfaceKey, spec, fam, fam.empty() ? "" : " ", describe(candidates),
                            kInterfaceKey, kInterfaceEnv));
  }

  if (auto h = rawAddress(hint)) {
    if (auto r = pickFirst([&](const Interface& c) { return inSubnet(c, *h); })) return *r;
  }
  for (int tier = 0; tier <= 4; ++tier) {
    if (auto r = pickFirst([&](const Interface& c) { return defaultTier(c) == tier; })) {
      return *r;
    }
  }
  std::string_view fam = familyName(family);
  throw Error(ErrorCode::SystemError,
              fmt::format("no network interface that is up has an {}address (present: {}); "
                          "bring one up or set {} (environment {})",
                          fam.empty() ? "IPv4 or IPv6 " : std::string(fam) + " ",
                          describe(candidates), kInterfaceKey, kInterfaceEnv));
}

Interface select(std::string_view spec, int family, const sockaddr* hint) {
  return select(spec, family, hint, list());
}

int familyOf(std::string_view name) {
  if (name == "ipv4") return AF_INET;
  if (name == "ipv6") return AF_INET6;
  return AF_UNSPEC;
}

}  // namespace strata::netif
