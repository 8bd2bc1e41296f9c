// libFuzzer target for the Slurm list parsers (lib/launch/hostlist.cpp): the input is parsed as a
// compressed host list (SLURM_JOB_NODELIST, SLURM_STEP_NODELIST), a tasks-per-node list
// (SLURM_STEP_TASKS_PER_NODE) and a port list (SLURM_STEP_RESV_PORTS). Checked:
//   * a list is refused only with Error(InvalidArgument);
//   * first() and expand() agree on which lists are well formed, and first() is the first host;
//   * a well-formed host list expands to exactly the count its ranges claim (computed here
//     independently from the brackets), or is refused when that is past the limit;
//   * expanded hosts are non-empty plain names, and expanding them written out as a plain
//     comma list gives the same hosts;
//   * a tasks-per-node list gives one entry per node its "(xN)" repeats claim, a port list one
//     port in 1..65535 per port its ranges claim.
#include <charconv>
#include <optional>
#include <string>
#include <vector>

#include "fuzz_common.hpp"
#include "launch/hostlist.hpp"

namespace hl = strata::hostlist;
using strata::Error;
using strata::ErrorCode;

namespace {

constexpr size_t kMaxHosts = 4096;
constexpr uint64_t kBig = uint64_t{1} << 40;  // "more than any limit" for the count below

std::optional<uint64_t> number(std::string_view s) {
  uint64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size()) return std::nullopt;
  return v;
}

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  size_t start = 0;
  for (size_t i = 0; i <= s.size(); ++i) {
    if (i == s.size() || s[i] == sep) {
      out.push_back(s.substr(start, i - start));
      start = i + 1;
    }
  }
  return out;
}

// Hosts a well-formed list names, saturating at kBig: per top-level name, the product of the
// sizes of its bracket groups.
uint64_t claimedHosts(std::string_view list) {
  uint64_t total = 0, product = 1;
  for (size_t i = 0; i <= list.size(); ++i) {
    if (i == list.size() || list[i] == ',') {
      total = std::min(kBig, total + product);
      product = 1;
    } else if (list[i] == '[') {
      size_t close = list.find(']', i);
      uint64_t n = 0;
      for (std::string_view r : split(list.substr(i + 1, close - i - 1), ',')) {
        auto parts = split(r, '-');
        uint64_t lo = number(parts[0]).value_or(0);
        uint64_t hi = parts.size() > 1 ? number(parts[1]).value_or(kBig) : lo;
        n = std::min(kBig, n + std::min(kBig, hi - lo + 1));
        if (hi - lo >= kBig) n = kBig;
      }
      product = std::min<unsigned __int128>(kBig, static_cast<unsigned __int128>(product) * n);
      i = close;
    }
  }
  return total;
}

void hosts(std::string_view list) {
  std::string firstHost;
  try {
    firstHost = hl::first(list);
  } catch (const Error& e) {
    fuzz::expectCode(e, ErrorCode::InvalidArgument);
    try {
      hl::expand(list, kMaxHosts);
      FUZZ_CHECK(false);  // first() refused a list that expand() takes
    } catch (const Error& e2) {
      fuzz::expectCode(e2, ErrorCode::InvalidArgument);
    }
    return;
  }
  uint64_t claimed = claimedHosts(list);
  std::vector<std::string> all;
  try {
    all = hl::expand(list, kMaxHosts);
  } catch (const Error& e) {
    fuzz::expectCode(e, ErrorCode::InvalidArgument);
    FUZZ_CHECK(claimed > kMaxHosts);
    return;
  }
  FUZZ_CHECK(all.size() == claimed);
  FUZZ_CHECK(!all.empty() && all.front() == firstHost);
  std::string plain;
  for (const auto& h : all) {
    FUZZ_CHECK(!h.empty() && h.find_first_of(",[] \t\r\n") == std::string::npos);
    if (!plain.empty()) plain += ',';
    plain += h;
  }
  FUZZ_CHECK(hl::expand(plain, kMaxHosts) == all);
}

void tasks(std::string_view text) {
  std::vector<int> out;
  try {
    out = hl::tasksPerNode(text);
  } catch (const Error& e) {
    fuzz::expectCode(e, ErrorCode::InvalidArgument);
    return;
  }
  uint64_t claimed = 0;
  for (std::string_view item : split(text, ',')) {
    size_t paren = item.find("(x");
    claimed += paren == std::string_view::npos
                   ? 1
                   : number(item.substr(paren + 2, item.size() - paren - 3)).value_or(0);
  }
  FUZZ_CHECK(out.size() == claimed);
  for (int t : out) FUZZ_CHECK(t >= 0);
}

void ports(std::string_view text) {
  std::vector<int> out;
  try {
    out = hl::ports(text);
  } catch (const Error& e) {
    fuzz::expectCode(e, ErrorCode::InvalidArgument);
    return;
  }
  uint64_t claimed = 0;
  for (std::string_view item : split(text, ',')) {
    auto parts = split(item, '-');
    uint64_t lo = number(parts[0]).value_or(0);
    uint64_t hi = parts.size() > 1 ? number(parts[1]).value_or(0) : lo;
    claimed += hi - lo + 1;
  }
  FUZZ_CHECK(out.size() == claimed && out.size() <= 65535);
  for (int p : out) FUZZ_CHECK(p >= 1 && p <= 65535);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  hosts(text);
  tasks(text);
  ports(text);
  return 0;
}
