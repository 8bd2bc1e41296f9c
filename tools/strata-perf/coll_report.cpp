#include "coll_report.hpp"

#include <fmt/format.h>
#include <strata/bootstrap.hpp>

#include "coll_measure.hpp"
#include "stats.hpp"

namespace strata::perf {

void printHeader(Reporter& out, CollKind kind, const CollOptions& opt, Communicator& comm,
                 const std::vector<RankRecord>& ranks) {
  const bool linear = opt.stepBytesOption->count() > 0;
  out.line(fmt::format(
      "# nThread 1 nGpus 1 minBytes {} maxBytes {} step: {}({}) warmup iters: {} iters: {} agg "
      "iters: 1 validation: {} graph: {}",
      parseBytes(opt.sweep.minBytes), parseBytes(opt.sweep.maxBytes),
      linear ? parseBytes(opt.stepBytes) : opt.sweep.factor, linear ? "bytes" : "factor",
      opt.sweep.warmup, opt.sweep.iters, opt.check, opt.graph));
  const bool cuda = opt.memory == "cuda";
  if (opt.blocking && cuda) {
    out.comment(opt.graph > 0 ? "Blocking Enabled: cudaStreamSynchronize after each graph launch"
                              : "Blocking Enabled: cudaStreamSynchronize after each collective");
  } else if (opt.blocking) {
    out.comment(
        "Blocking Enabled: host memory collectives always complete before they return (-z has "
        "no further effect)");
  }
  out.line("#");
  std::string cmd;
  for (const auto& a : opt.argv) cmd += (cmd.empty() ? "" : " ") + a;
  out.comment(fmt::format("strata-perf {}: {}", collName(kind), cmd));
  const std::string memory =
      cuda ? fmt::format("cuda (device {}, {})", ranks[0].device, ranks[0].deviceName)
           : fmt::format("host ({})", opt.alloc == "strata"      ? "strata's allocator"
                                      : opt.alloc == "allochost" ? "allocHost"
                                                                 : "malloc");
  out.comment(fmt::format("backend: {}  nranks: {}  memory: {}  label: {}",
                          comm.bootstrap().backend(), comm.size(), memory, opt.label));
  if (!opt.sweep.itersOption->count() || !opt.sweep.warmupOption->count()) {
    out.comment(fmt::format(
        "iters/warmup {}/{} up to {}, scaled down in proportion above (at least 20/2); -n and -w "
        "fix them for every size",
        opt.sweep.iters, opt.sweep.warmup, formatBytes(SweepOptions::kLargeBytes)));
  }
  out.comment(
      "time: per iteration, average over ranks; algbw = size / time; busbw = algbw * "
      "factor (GB = 1e9 B)");
  if (cuda && opt.graph > 0) {
    out.comment(fmt::format(
        "cuda: each row's timed calls captured once in a CUDA graph, launched {} times; time = "
        "launches to the last cudaStreamSynchronize / (iters * {})",
        opt.graph, opt.graph));
  } else if (cuda) {
    out.comment(
        "cuda: calls enqueued back to back on one stream per rank; time = the calls to the last "
        "cudaStreamSynchronize / iters");
  }
  if (!hasInPlace(kind)) {
    out.comment(fmt::format("{} has no in-place form here: those columns are N/A", collName(kind)));
  }
  out.comment(opt.algorithm.empty()
                  ? std::string("algorithm: auto (chosen per call; an \"algorithm:\" line names "
                                "the one the rows below it ran)")
                  : fmt::format("algorithm: {} (forced with -a: collectives.{}.algorithm)",
                                opt.algorithm, collName(kind)));
  out.line("#");
  out.line("# Using devices");
  for (size_t r = 0; r < ranks.size(); ++r) {
    if (cuda) {
      out.line(fmt::format("#  Rank {:2} Group  0 Pid {:6} on {:>10} device {:2} [0x{:02x}] {}", r,
                           ranks[r].pid, ranks[r].host, ranks[r].device, ranks[r].pciBus,
                           ranks[r].deviceName));
    } else {
      out.line(fmt::format("#  Rank {:2} Group  0 Pid {:6} on {:>10} host memory", r, ranks[r].pid,
                           ranks[r].host));
    }
  }
}

CollRow collRow(const CollCase& c, Communicator& comm, const std::vector<RankResult>& all,
                bool check, CollTotals& totals) {
  CollRow row;
  row.op = collName(c.kind);
  row.bytes = wholeBytes(c);
  row.count = c.count;
  row.type = std::string(toString(c.type));
  row.redop = isReducing(c.kind) ? std::string(toString(c.op)) : std::string("none");
  row.root = c.root;
  row.algorithm = comm.lastAlgorithm();
  row.launch = comm.lastLaunch();
  const double factor = busBwFactor(c.kind, c.nranks);
  auto fill = [&](CollResult& res, bool inPlace) {
    double us = 0;
    int64_t wrong = 0;
    for (const RankResult& r : all) {
      us += inPlace ? r.inUs : r.outUs;
      wrong += inPlace ? r.inWrong : r.outWrong;
    }
    res.measured = true;
    res.timeUs = us / c.nranks;
    res.algbw = res.timeUs > 0 ? static_cast<double>(row.bytes) / (res.timeUs * 1e3) : 0;
    res.busbw = res.algbw * factor;
    res.wrong = check ? wrong : -1;
    totals.wrong += wrong;
    totals.busbwSum += res.busbw;
    ++totals.busbwCount;
  };
  fill(row.outOfPlace, false);
  if (hasInPlace(c.kind)) fill(row.inPlace, true);
  return row;
}

std::string algorithmText(const CollRow& row) {
  return row.launch.empty() ? row.algorithm : fmt::format("{} ({})", row.algorithm, row.launch);
}

void printTrailer(Reporter& out, const CollTotals& totals) {
  out.line(
      fmt::format("# Out of bounds values : {} {}", totals.wrong, totals.wrong ? "FAILED" : "OK"));
  out.line(fmt::format(
      "# Avg bus bandwidth    : {:g} ",
      totals.busbwCount ? totals.busbwSum / static_cast<double>(totals.busbwCount) : 0.0));
  out.line("#");
}

}  // namespace strata::perf
