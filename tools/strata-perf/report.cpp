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

void Reporter::line(std::string_view text) {
  fmt::print(table_, "{}\n", text);
  std::fflush(table_);
}

// nccl-tests' layout (common.cu): "%12li  %12li  %8s  %6s  %6s" for the row head, then per
// placement "  %7s  %6.2f  %6.2f  %5g" (time with 2, 1 or 0 decimals as it grows).
void Reporter::collColumns() {
  fmt::print(table_, "#\n");
  fmt::print(table_,
             "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}           out-of-place                       "
             "in-place          \n",
             "", "", "", "", "");
  fmt::print(table_,
             "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6} {:>6}  {:>7}  {:>6}  "
             "{:>6} {:>6}\n",
             "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time",
             "algbw", "busbw", "#wrong");
  fmt::print(table_,
             "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>5}  {:>7}  {:>6}  "
             "{:>6}  {:>5}\n",
             "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)",
             "(GB/s)", "");
  std::fflush(table_);
}

namespace {

std::string timeText(double us) {
  if (us >= 10000.0) return fmt::format("{:7.0f}", us);
  if (us >= 100.0) return fmt::format("{:7.1f}", us);
  return fmt::format("{:7.2f}", us);
}

std::string placementText(const CollResult& r) {
  if (!r.measured) return fmt::format("  {:>7}  {:>6}  {:>6}  {:>5}", "N/A", "N/A", "N/A", "N/A");
  std::string wrong = r.wrong < 0 ? std::string("N/A") : fmt::format("{}", r.wrong);
  return fmt::format("  {:>7}  {:6.2f}  {:6.2f}  {:>5}", timeText(r.timeUs), r.algbw, r.busbw,
                     wrong);
}

}  // namespace

void Reporter::row(const CollRow& r) {
  fmt::print(table_, "{:12}  {:12}  {:>8}  {:>6}  {:6}{}{}\n", r.bytes, r.count, r.type, r.redop,
             r.root, placementText(r.outOfPlace), placementText(r.inPlace));
  std::fflush(table_);
  if (!json_) return;
  for (const CollResult* p : {&r.outOfPlace, &r.inPlace}) {
    if (!p->measured) continue;
    fmt::print(
        json_,
        "{{\"tool\":\"strata-perf\",\"label\":{},\"op\":{},\"nranks\":{},"
        "\"backend\":{},\"memory\":{},\"size\":{},\"count\":{},\"type\":{},"
        "\"redop\":{},\"root\":{},\"algorithm\":{},{}{}\"inplace\":{},\"time_us\":{:.3f},"
        "\"algbw\":{:.6f},\"busbw\":{:.6f},\"wrong\":{}}}\n",
        jsonString(label_), jsonString(r.op), nranks_, jsonString(backend_), jsonString(memory_),
        r.bytes, r.count, jsonString(r.type), jsonString(r.redop), r.root, jsonString(r.algorithm),
        r.launch.empty() ? std::string() : fmt::format("\"launch\":{},", jsonString(r.launch)),
        graph_ > 0 ? fmt::format("\"graph\":{},", graph_) : std::string(),
        p == &r.inPlace ? "true" : "false", p->timeUs, p->algbw, p->busbw,
        p->wrong < 0 ? std::string("null") : fmt::format("{}", p->wrong));
  }
  std::fflush(json_);
}

}  // namespace strata::perf
