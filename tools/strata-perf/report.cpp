#include "report.hpp"

#include <cerrno>
#include <cstring>
#include <stdexcept>

#include <fmt/format.h>

namespace strata::perf {

std::string jsonString(std::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += fmt::format("\\u{:04x}", static_cast<unsigned>(c));
        } else {
          out += c;
        }
    }
  }
  out += '"';
  return out;
}

Reporter::Reporter(std::string mode, std::string backend, int nranks, const std::string& jsonPath)
    : mode_(std::move(mode)), backend_(std::move(backend)), nranks_(nranks), table_(stdout) {
  if (jsonPath == "-") {
    json_ = stdout;
    table_ = stderr;
  } else if (!jsonPath.empty()) {
    json_ = std::fopen(jsonPath.c_str(), "w");
    if (!json_) {
      throw std::runtime_error(fmt::format("cannot open --json file '{}': {}; check the path",
                                           jsonPath, std::strerror(errno)));
    }
    ownJson_ = true;
  }
}

Reporter::~Reporter() {
  if (ownJson_) std::fclose(json_);
}

void Reporter::comment(std::string_view text) {
  fmt::print(table_, "# {}\n", text);
  std::fflush(table_);
}

void Reporter::columns() {
  fmt::print(table_, "#\n# {:>14} {:>10} {:>7} {:>12} {:>12} {:>12}\n", "op", "size(B)", "iters",
             "median(us)", "p99(us)", "max(us)");
  std::fflush(table_);
}

void Reporter::row(const Row& r) {
  fmt::print(table_, "  {:>14} {:>10} {:>7} {:>12.2f} {:>12.2f} {:>12.2f}\n", r.op, r.bytes,
             r.iters, r.us.median, r.us.p99, r.us.max);
  std::fflush(table_);
  if (json_) {
    fmt::print(json_,
               "{{\"tool\":\"strata-perf\",\"mode\":{},\"backend\":{},\"nranks\":{},\"op\":{},"
               "\"bytes\":{},\"iters\":{},\"median_us\":{:.3f},\"p99_us\":{:.3f},"
               "\"max_us\":{:.3f},\"min_us\":{:.3f}}}\n",
               jsonString(mode_), jsonString(backend_), nranks_, jsonString(r.op), r.bytes, r.iters,
               r.us.median, r.us.p99, r.us.max, r.us.min);
    std::fflush(json_);
  }
}

void Reporter::bandwidthColumns() {
  fmt::print(table_, "#\n# {:>10} {:>10} {:>7} {:>10} {:>9} {:>10} {:>10} {:>7}\n", "size", "count",
             "iters", "time", "bw", "lat", "lat p99", "#wrong");
  fmt::print(table_, "# {:>10} {:>10} {:>7} {:>10} {:>9} {:>10} {:>10} {:>7}\n", "(B)",
             "(elements)", "", "(us)", "(GB/s)", "(us)", "(us)", "");
  std::fflush(table_);
}

void Reporter::row(const BandwidthRow& r) {
  std::string wrong = r.wrong < 0 ? std::string("N/A") : fmt::format("{}", r.wrong);
  fmt::print(table_, "  {:>10} {:>10} {:>7} {:>10.2f} {:>9.2f} {:>10.2f} {:>10.2f} {:>7}\n",
             r.bytes, r.count, r.iters, r.timeUs, r.gbps, r.latUs.median, r.latUs.p99, wrong);
  std::fflush(table_);
  if (json_) {
    fmt::print(
        json_,
        "{{\"tool\":\"strata-perf\",\"mode\":{},\"transport\":{},{}\"nranks\":{},"
        "\"bytes\":{},\"count\":{},\"iters\":{},\"time_us\":{:.3f},\"bw_gbps\":{:.3f},"
        "\"lat_median_us\":{:.3f},\"lat_p99_us\":{:.3f},\"lat_min_us\":{:.3f},"
        "\"wrong\":{}}}\n",
        jsonString(mode_), jsonString(backend_),
        provider_.empty() ? std::string() : fmt::format("\"provider\":{},", jsonString(provider_)),
        nranks_, r.bytes, r.count, r.iters, r.timeUs, r.gbps, r.latUs.median, r.latUs.p99,
        r.latUs.min, r.wrong < 0 ? std::string("null") : wrong);
    std::fflush(json_);
  }
}

}  // namespace strata::perf
