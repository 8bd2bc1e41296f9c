#include "launch/hostlist.hpp"

#include <charconv>
#include <cstdint>
#include <limits>
#include <optional>
#include <variant>

#include <fmt/format.h>

#include <strata/error.hpp>

#include "base/strings.hpp"

namespace strata::hostlist {

namespace {

[[noreturn]] void invalid(std::string_view list, const std::string& why) {
  throw Error(ErrorCode::InvalidArgument,
              fmt::format("invalid host list '{}': {}; expected Slurm's syntax such as "
                          "'n[01-03,07],login'",
                          list, why));
}

struct Range {
  uint64_t lo = 0;
  uint64_t hi = 0;
  size_t width = 0;  // digits of the lower bound, so "009" keeps its zero padding
};

using Group = std::vector<Range>;
// A host pattern alternates literal text and bracket groups: "rack[1-2]-n[1-2]".
using Part = std::variant<std::string, Group>;
using Pattern = std::vector<Part>;

bool isDigits(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

// Parses an unsigned decimal; nullopt for anything else (signs, spaces, overflow).
std::optional<uint64_t> parseNumber(std::string_view s) {
  if (!isDigits(s)) return std::nullopt;
  uint64_t v = 0;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || ptr != s.data() + s.size()) return std::nullopt;
  return v;
}

Group parseGroup(std::string_view list, std::string_view body) {
  if (body.empty()) invalid(list, "empty brackets '[]'");
  Group group;
  for (std::string_view item : strings::split(body)) {
    if (item.empty()) invalid(list, fmt::format("empty range in '[{}]'", body));
    size_t dash = item.find('-');
    std::string_view loText = item.substr(0, dash);
    std::string_view hiText = dash == std::string_view::npos ? loText : item.substr(dash + 1);
    auto lo = parseNumber(loText);
    auto hi = parseNumber(hiText);
    if (!lo || !hi) {
      invalid(list,
              fmt::format("range '{}' is not a number or a range of numbers like 01-03", item));
    }
    if (*hi < *lo) invalid(list, fmt::format("reversed range '{}'", item));
    group.push_back({*lo, *hi, loText.size()});
  }
  return group;
}

// Splits at top-level commas (commas inside brackets separate ranges) and parses each host
// pattern. Everything is checked here, so first() and expand() reject the same inputs.
std::vector<Pattern> parse(std::string_view list) {
  if (list.empty()) invalid(list, "it is empty");
  std::vector<Pattern> patterns;
  Pattern current;
  std::string literal;
  bool partEmpty = true;  // nothing seen since the last top-level comma
  size_t i = 0;
  auto finishPattern = [&] {
    if (partEmpty) invalid(list, fmt::format("empty host name at offset {}", i));
    if (!literal.empty()) current.emplace_back(std::move(literal));
    literal.clear();
    patterns.push_back(std::move(current));
    current.clear();
    partEmpty = true;
  };
  for (; i < list.size(); ++i) {
    char c = list[i];
    if (c == ',') {
      finishPattern();
    } else if (c == '[') {
      size_t close = list.find_first_of("[]", i + 1);
      if (close == std::string_view::npos || list[close] != ']') {
        invalid(list, fmt::format("'[' at offset {} has no matching ']'", i));
      }
      if (!literal.empty()) current.emplace_back(std::move(literal));
      literal.clear();
      current.emplace_back(parseGroup(list, list.substr(i + 1, close - i - 1)));
      partEmpty = false;
      i = close;
    } else if (c == ']') {
      invalid(list, fmt::format("']' at offset {} has no matching '['", i));
    } else if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
      invalid(list, fmt::format("whitespace at offset {}", i));
    } else {
      literal += c;
      partEmpty = false;
    }
  }
  finishPattern();
  return patterns;
}

std::string formatNumber(uint64_t v, size_t width) {
  return fmt::format("{:0{}}", v, width);
}

// Host count of a pattern, or nullopt when it exceeds `limit` (also guards the overflow).
std::optional<uint64_t> countHosts(const Pattern& p, uint64_t limit) {
  uint64_t total = 1;
  for (const auto& part : p) {
    if (const auto* g = std::get_if<Group>(&part)) {
      uint64_t n = 0;
      for (const auto& r : *g) {
        uint64_t span = r.hi - r.lo;
        if (span >= limit || n + span + 1 > limit) return std::nullopt;
        n += span + 1;
      }
      if (total > limit / n) return std::nullopt;
      total *= n;
    }
  }
  return total;
}

void appendHosts(const Pattern& p, size_t index, std::string& prefix,
                 std::vector<std::string>& out) {
  if (index == p.size()) {
    out.push_back(prefix);
    return;
  }
  size_t mark = prefix.size();
  if (const auto* lit = std::get_if<std::string>(&p[index])) {
    prefix += *lit;
    appendHosts(p, index + 1, prefix, out);
  } else {
    for (const auto& r : std::get<Group>(p[index])) {
      for (uint64_t v = r.lo;; ++v) {
        prefix.resize(mark);
        prefix += formatNumber(v, r.width);
        appendHosts(p, index + 1, prefix, out);
        if (v == r.hi) break;
      }
    }
  }
  prefix.resize(mark);
}

std::optional<uint64_t> parseCount(std::string_view s) {
  auto v = parseNumber(s);
  if (!v || *v > static_cast<uint64_t>(std::numeric_limits<int>::max())) return std::nullopt;
  return v;
}

}  // namespace

std::vector<std::string> expand(std::string_view list, size_t maxHosts) {
  auto patterns = parse(list);
  uint64_t total = 0;
  for (const auto& p : patterns) {
    auto n = countHosts(p, maxHosts);
    if (!n || total + *n > maxHosts) {
      invalid(list, fmt::format("it names more than {} hosts", maxHosts));
    }
    total += *n;
  }
  std::vector<std::string> hosts;
  hosts.reserve(total);
  std::string prefix;
  for (const auto& p : patterns) appendHosts(p, 0, prefix, hosts);
  return hosts;
}

std::string first(std::string_view list) {
  auto patterns = parse(list);
  std::string host;
  for (const auto& part : patterns.front()) {
    if (const auto* lit = std::get_if<std::string>(&part)) {
      host += *lit;
    } else {
      const auto& r = std::get<Group>(part).front();
      host += formatNumber(r.lo, r.width);
    }
  }
  return host;
}

std::vector<int> tasksPerNode(std::string_view text) {
  // One entry per node; a cap keeps "1(x4000000000)" from exhausting memory.
  constexpr uint64_t kMaxNodes = 1u << 20;
  auto bad = [&](const std::string& why) {
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("invalid tasks-per-node list '{}' (SLURM_STEP_TASKS_PER_NODE): {}; "
                            "expected a form such as '2(x3),1'",
                            text, why));
  };
  if (text.empty()) bad("it is empty");
  std::vector<int> out;
  for (std::string_view item : strings::split(text)) {
    if (item.empty()) bad(fmt::format("empty entry at offset {}", item.data() - text.data()));
    std::string_view tasksText = item;
    uint64_t repeat = 1;
    size_t paren = item.find('(');
    if (paren != std::string_view::npos) {
      tasksText = item.substr(0, paren);
      std::string_view rest = item.substr(paren);
      if (rest.size() < 4 || rest.substr(0, 2) != "(x" || rest.back() != ')') {
        bad(fmt::format("entry '{}' is not of the form N or N(xM)", item));
      }
      auto r = parseCount(rest.substr(2, rest.size() - 3));
      if (!r || *r == 0) bad(fmt::format("bad repeat count in '{}'", item));
      repeat = *r;
    }
    auto tasks = parseCount(tasksText);
    if (!tasks) bad(fmt::format("entry '{}' is not of the form N or N(xM)", item));
    if (out.size() + repeat > kMaxNodes) bad(fmt::format("more than {} nodes", kMaxNodes));
    out.insert(out.end(), repeat, static_cast<int>(*tasks));
  }
  return out;
}

std::vector<int> ports(std::string_view text) {
  constexpr uint64_t kMaxPort = 65535;
  auto bad = [&](const std::string& why) {
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("invalid port list '{}' (SLURM_STEP_RESV_PORTS): {}; expected ports "
                            "in 1..65535 such as '12000-12003,12010'",
                            text, why));
  };
  if (text.empty()) bad("it is empty");
  std::vector<int> out;
  for (std::string_view item : strings::split(text)) {
    if (item.empty()) bad(fmt::format("empty entry at offset {}", item.data() - text.data()));
    size_t dash = item.find('-');
    auto lo = parseNumber(item.substr(0, dash));
    auto hi = dash == std::string_view::npos ? lo : parseNumber(item.substr(dash + 1));
    if (!lo || !hi) bad(fmt::format("entry '{}' is not a port or a range of ports", item));
    if (*lo < 1 || *lo > kMaxPort || *hi < 1 || *hi > kMaxPort) {
      bad(fmt::format("entry '{}' is outside 1..65535", item));
    }
    if (*hi < *lo) bad(fmt::format("reversed range '{}'", item));
    // Bounded so that a long list of full ranges cannot grow without limit.
    if (out.size() + (*hi - *lo + 1) > kMaxPort) bad("more than 65535 ports");
    for (uint64_t p = *lo; p <= *hi; ++p) out.push_back(static_cast<int>(p));
  }
  return out;
}

}  // namespace strata::hostlist
