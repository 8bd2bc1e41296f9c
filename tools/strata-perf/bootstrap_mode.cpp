// strata-perf bootstrap: rendezvous time, allGather, barrier and send/recv ping-pong latency of
// the configured bootstrap backend, measured in every rank and reported by rank 0.

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <strata/bootstrap.hpp>
#include <strata/config.hpp>
#include <strata/error.hpp>

#include "base/process.hpp"
#include "mode.hpp"
#include "report.hpp"
#include "stats.hpp"

namespace strata::perf {

namespace {

using Clock = std::chrono::steady_clock;

constexpr int kPingTag = 7001;  // any tag >= 0; a fixed one keeps ping-pong in one ordered stream
constexpr size_t kHostBytes = 64;

struct BootstrapOptions {
  SweepOptions sweep;
  std::vector<std::string> ops = {"allgather", "barrier", "sendrecv"};
  std::vector<std::string> argv;  // echoed in the header
};

// What each rank contributes once, right after rendezvous. Ranks run the same binary on the
// same architecture, so a byte copy of doubles is fine here (unlike the library's wire format).
struct StartRecord {
  double createUs;
  double firstBarrierUs;
  char host[kHostBytes];
};

// Per-iteration time as the slowest rank saw it. One allGather after the timed loop, so the
// gathering never runs between timed iterations.
std::vector<double> maxOverRanks(Bootstrap& boot, const std::vector<double>& mine) {
  const size_t n = mine.size();
  const auto ranks = static_cast<size_t>(boot.size());
  std::vector<double> all(n * ranks);
  std::memcpy(all.data() + static_cast<size_t>(boot.rank()) * n, mine.data(), n * sizeof(double));
  boot.allGather(all.data(), n * sizeof(double));
  std::vector<double> out(mine);
  for (size_t r = 0; r < ranks; ++r) {
    for (size_t i = 0; i < n; ++i) out[i] = std::max(out[i], all[r * n + i]);
  }
  return out;
}

unsigned char pattern(int rank, size_t i, size_t bytes) {
  return static_cast<unsigned char>((static_cast<size_t>(rank) * 131 + i * 7 + bytes) & 0xff);
}

class Runner {
 public:
  Runner(Bootstrap& boot, const BootstrapOptions& opt, Reporter* out)
      : boot_(boot), opt_(opt), out_(out) {}

  int wrong() const { return wrong_; }

  void allGather(size_t bytes) {
    const size_t ranks = static_cast<size_t>(boot_.size());
    const size_t iters = opt_.sweep.itersFor(bytes);
    std::vector<unsigned char> buf(bytes * ranks, 0);
    unsigned char* mine = buf.data() + static_cast<size_t>(boot_.rank()) * bytes;
    for (size_t i = 0; i < bytes; ++i) mine[i] = pattern(boot_.rank(), i, bytes);

    boot_.barrier();
    for (size_t i = 0, w = opt_.sweep.warmupFor(bytes); i < w; ++i)
      boot_.allGather(buf.data(), bytes);
    boot_.barrier();
    std::vector<double> times(iters);
    for (size_t it = 0; it < iters; ++it) {
      auto t0 = Clock::now();
      boot_.allGather(buf.data(), bytes);
      times[it] = usSince(t0);
    }
    for (size_t r = 0; r < ranks; ++r) {
      for (size_t i = 0; i < bytes; ++i) {
        if (buf[r * bytes + i] != pattern(static_cast<int>(r), i, bytes)) {
          fmt::print(stderr, "strata-perf: rank {}: allgather of {} B: slot {} byte {} is wrong\n",
                     boot_.rank(), bytes, r, i);
          ++wrong_;
          break;
        }
      }
    }
    report("allgather", bytes, iters, maxOverRanks(boot_, times));
  }

  void barrier() {
    const size_t iters = opt_.sweep.itersFor(0);
    boot_.barrier();
    for (size_t i = 0, w = opt_.sweep.warmupFor(0); i < w; ++i) boot_.barrier();
    std::vector<double> times(iters);
    for (size_t it = 0; it < iters; ++it) {
      auto t0 = Clock::now();
      boot_.barrier();
      times[it] = usSince(t0);
    }
    report("barrier", 0, iters, maxOverRanks(boot_, times));
  }

  // Ranks 0 and 1 only; the others wait in the barriers around it. Rank 0 times the round trip
  // and reports half of it, as one-way latency.
  void sendRecv(size_t bytes) {
    const size_t iters = opt_.sweep.itersFor(bytes);
    const size_t total = opt_.sweep.warmupFor(bytes) + iters;
    const int rank = boot_.rank();
    std::vector<unsigned char> out(bytes), in(bytes);
    for (size_t i = 0; i < bytes; ++i) out[i] = pattern(0, i, bytes);
    std::vector<double> times;
    times.reserve(iters);

    boot_.barrier();
    if (rank == 0) {
      for (size_t it = 0; it < total; ++it) {
        auto t0 = Clock::now();
        boot_.send(1, kPingTag, out.data(), bytes);
        boot_.recv(1, kPingTag, in.data(), bytes);
        double us = usSince(t0) / 2;
        if (it >= total - iters) times.push_back(us);
      }
      if (in != out) {
        fmt::print(stderr, "strata-perf: rank 0: sendrecv of {} B: the echo differs\n", bytes);
        ++wrong_;
      }
    } else if (rank == 1) {
      for (size_t it = 0; it < total; ++it) {
        boot_.recv(0, kPingTag, in.data(), bytes);
        boot_.send(0, kPingTag, in.data(), bytes);
      }
    }
    boot_.barrier();
    if (rank == 0) out_->row({"sendrecv", bytes, iters, summarize(times)});
  }

 private:
  void report(const char* op, size_t bytes, size_t iters, const std::vector<double>& times) {
    if (out_) out_->row({op, bytes, iters, summarize(times)});
  }

  Bootstrap& boot_;
  const BootstrapOptions& opt_;
  Reporter* out_;
  int wrong_ = 0;
};

int runBootstrap(const BootstrapOptions& opt) {
  const std::vector<size_t> sizes = opt.sweep.checkedSizes();
  auto has = [&](const char* op) {
    return std::find(opt.ops.begin(), opt.ops.end(), op) != opt.ops.end();
  };

  Config config = Config::load();
  auto t0 = Clock::now();
  std::unique_ptr<Bootstrap> boot = Bootstrap::create(config);
  const double createUs = usSince(t0);

  try {
    t0 = Clock::now();
    boot->barrier();
    const double firstBarrierUs = usSince(t0);
    const int rank = boot->rank();
    const int size = boot->size();

    StartRecord me{};
    me.createUs = createUs;
    me.firstBarrierUs = firstBarrierUs;
    std::string host = process::hostName();
    std::strncpy(me.host, host.c_str(), kHostBytes - 1);
    std::vector<StartRecord> starts(static_cast<size_t>(size));
    starts[static_cast<size_t>(rank)] = me;
    boot->allGather(starts.data(), sizeof(StartRecord));

    std::unique_ptr<Reporter> out;
    if (rank == 0) {
      out = std::make_unique<Reporter>("bootstrap", std::string(boot->backend()), size,
                                       opt.sweep.json);
      std::set<std::string> hosts;
      for (const auto& s : starts) hosts.insert(std::string(s.host, strnlen(s.host, kHostBytes)));
      std::string cmd;
      for (const auto& a : opt.argv) cmd += (cmd.empty() ? "" : " ") + a;
      out->comment(fmt::format("strata-perf bootstrap: {}", cmd));
      out->comment(fmt::format("backend: {}  nranks: {}  hosts: {} ({}{})  local size: {}",
                               boot->backend(), size, hosts.size(), host,
                               hosts.size() > 1 ? ", ..." : "", boot->localSize()));
      out->comment(
          "per row: each iteration's time is the max over ranks; median/p99/max over iterations");
      out->comment(
          "rendezvous, first_barrier: one time per rank (Bootstrap::create, the barrier after "
          "it); median/p99/max over ranks");
      out->comment("sendrecv: rank 0 <-> rank 1 ping-pong, one-way time = round trip / 2");
      out->columns();

      std::vector<double> create, first;
      for (const auto& s : starts) {
        create.push_back(s.createUs);
        first.push_back(s.firstBarrierUs);
      }
      Summary c = summarize(create);
      out->row({"rendezvous", 0, 1, c});
      out->row({"first_barrier", 0, 1, summarize(first)});
      out->comment(
          fmt::format("rendezvous over ranks: min {:.1f} us, median {:.1f} us, max {:.1f} us",
                      c.min, c.median, c.max));
    }

    Runner runner(*boot, opt, out.get());
    if (has("allgather")) {
      for (size_t bytes : sizes) runner.allGather(bytes);
    }
    if (has("barrier")) runner.barrier();
    if (has("sendrecv")) {
      if (size < 2) {
        if (out) out->comment("sendrecv skipped: it needs at least 2 ranks");
      } else {
        for (size_t bytes : sizes) runner.sendRecv(bytes);
      }
    }

    // Each rank checked its own data; sum the failures so that rank 0 reports the outcome.
    std::vector<int32_t> wrong(static_cast<size_t>(size));
    wrong[static_cast<size_t>(rank)] = runner.wrong();
    boot->allGather(wrong.data(), sizeof(int32_t));
    int64_t total = 0;
    for (int32_t w : wrong) total += w;
    if (out) out->comment(fmt::format("wrong results: {}", total));
    boot->barrier();
    return total ? 1 : 0;
  } catch (...) {
    abortJobAndRethrow(*boot);
  }
}

}  // namespace

Mode addBootstrapMode(CLI::App& app) {
  auto opt = std::make_shared<BootstrapOptions>();
  CLI::App* cmd = app.add_subcommand(
      "bootstrap",
      "rendezvous time and allGather / barrier / send-recv latency of the configured bootstrap "
      "backend (run it in every rank: strata-run -n N, srun or mpirun)");
  opt->sweep.addTo(*cmd);
  cmd->add_option("--ops", opt->ops, "operations to measure (rendezvous is always measured)")
      ->check(CLI::IsMember({"allgather", "barrier", "sendrecv"}))
      ->delimiter(',')
      ->capture_default_str();
  return Mode{cmd, [opt](const std::vector<std::string>& argv) {
                opt->argv = argv;
                return runBootstrap(*opt);
              }};
}

}  // namespace strata::perf
