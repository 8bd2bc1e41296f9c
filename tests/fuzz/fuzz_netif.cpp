// libFuzzer target for the interface-spec parser and the interface choice (lib/net/netif.cpp),
// which read bootstrap.tcp.interface / STRATA_BOOTSTRAP_TCP_INTERFACE. Byte 0 picks the address
// family (or an invalid one), byte 1 a subnet hint (none, IPv4, IPv6, IPv4-mapped IPv6; its
// address bytes follow), byte 2 the prefix lengths of the fixed candidate interfaces; the rest
// is the spec. Checked:
//   * parseSpec refuses only with Error(InvalidConfig); an accepted spec has non-empty, trimmed
//     names without '^' or '=', each name selects itself unless negated, and writing the spec
//     back in its own grammar parses to the same spec;
//   * select() refuses only with InvalidConfig, InvalidArgument (bad family) or SystemError;
//     what it picks is one of the candidates, of the family asked for, and matches the spec.
#include <netinet/in.h>

#include <cstring>
#include <string>
#include <vector>

#include "fuzz_common.hpp"
#include "net/netif.hpp"

namespace ni = strata::netif;
using strata::Error;
using strata::ErrorCode;

namespace {

ni::Interface make(const char* name, int family, const uint8_t* addr, unsigned prefix) {
  ni::Interface itf;
  itf.name = name;
  itf.family = family;
  itf.prefixLen = prefix;
  itf.loopback = std::strcmp(name, "lo") == 0;
  if (family == AF_INET) {
    auto* sa = reinterpret_cast<sockaddr_in*>(&itf.addr);
    sa->sin_family = AF_INET;
    std::memcpy(&sa->sin_addr, addr, 4);
    itf.addrLen = sizeof(sockaddr_in);
  } else {
    auto* sa = reinterpret_cast<sockaddr_in6*>(&itf.addr);
    sa->sin6_family = AF_INET6;
    std::memcpy(&sa->sin6_addr, addr, 16);
    itf.addrLen = sizeof(sockaddr_in6);
  }
  return itf;
}

std::vector<ni::Interface> candidates(uint8_t prefixes) {
  static const uint8_t lo4[4] = {127, 0, 0, 1}, eth4[4] = {10, 1, 2, 3}, ib4[4] = {192, 168, 7, 9},
                       dock4[4] = {172, 17, 0, 1};
  static const uint8_t lo6[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
  static const uint8_t eth6[16] = {0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x12, 0x34};
  return {
      make("lo", AF_INET, lo4, 8 * (prefixes & 1)),
      make("eth0", AF_INET, eth4, (prefixes >> 1) & 31),
      make("ib0", AF_INET, ib4, 24 * ((prefixes >> 6) & 1)),
      make("docker0", AF_INET, dock4, 16),
      make("lo", AF_INET6, lo6, 128),
      make("eth0", AF_INET6, eth6, 64 * (prefixes >> 7)),
  };
}

std::string format(const ni::Spec& spec) {
  std::string text = std::string(spec.negate ? "^" : "") + (spec.exact ? "=" : "");
  for (size_t i = 0; i < spec.names.size(); ++i) text += (i ? "," : "") + spec.names[i];
  return text;
}

void parse(std::string_view text) {
  ni::Spec spec;
  try {
    spec = ni::parseSpec(text);
  } catch (const Error& e) {
    fuzz::expectCode(e, ErrorCode::InvalidConfig);
    return;
  }
  for (const auto& n : spec.names) {
    FUZZ_CHECK(!n.empty() && n.find_first_of("^=,") == std::string::npos);
    FUZZ_CHECK(n.front() != ' ' && n.back() != ' ');
    FUZZ_CHECK(ni::matches(spec, n) != spec.negate);
  }
  if (spec.names.empty()) return;  // blank: no preference
  ni::Spec again = ni::parseSpec(format(spec));
  FUZZ_CHECK(again.negate == spec.negate && again.exact == spec.exact && again.names == spec.names);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Input input(data, size);
  static const int kFamilies[] = {AF_UNSPEC, AF_INET, AF_INET6, 99};
  int family = kFamilies[input.byte() % 4];
  uint8_t hintKind = input.byte() % 4;
  sockaddr_storage hint{};
  const sockaddr* hintPtr = nullptr;
  if (hintKind == 1) {
    auto* sa = reinterpret_cast<sockaddr_in*>(&hint);
    sa->sin_family = AF_INET;
    for (int i = 0; i < 4; ++i) reinterpret_cast<uint8_t*>(&sa->sin_addr)[i] = input.byte();
    hintPtr = reinterpret_cast<const sockaddr*>(&hint);
  } else if (hintKind >= 2) {
    auto* sa = reinterpret_cast<sockaddr_in6*>(&hint);
    sa->sin6_family = AF_INET6;
    uint8_t* b = sa->sin6_addr.s6_addr;
    for (int i = 0; i < 16; ++i) b[i] = input.byte();
    if (hintKind == 3) {  // IPv4-mapped
      std::memset(b, 0, 10);
      b[10] = b[11] = 0xff;
    }
    hintPtr = reinterpret_cast<const sockaddr*>(&hint);
  }
  auto cands = candidates(input.byte());
  auto rest = input.rest();
  std::string_view text(reinterpret_cast<const char*>(rest.data()), rest.size());

  parse(text);
  try {
    ni::Interface got = ni::select(text, family, hintPtr, cands);
    bool found = false;
    for (const auto& c : cands) {
      found = found || (c.name == got.name && c.family == got.family &&
                        std::memcmp(&c.addr, &got.addr, sizeof c.addr) == 0);
    }
    FUZZ_CHECK(found);
    FUZZ_CHECK(family == AF_UNSPEC || got.family == family);
    FUZZ_CHECK(!got.address().empty());
    auto trimmed = text.find_first_not_of(" \t");
    if (trimmed != std::string_view::npos) FUZZ_CHECK(ni::matches(ni::parseSpec(text), got.name));
  } catch (const Error& e) {
    FUZZ_CHECK(e.code() == ErrorCode::InvalidConfig || e.code() == ErrorCode::InvalidArgument ||
               e.code() == ErrorCode::SystemError);
    FUZZ_CHECK(family != 99 || e.code() == ErrorCode::InvalidArgument);
  }
  return 0;
}
