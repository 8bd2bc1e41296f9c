// strata-perf p2p: one-sided write bandwidth and ping-pong latency between rank 0 and rank 1
// over one transport (shm, fabric), through the public API (Context, Connection,
// HostSemaphore). Other ranks only take part in the collectives and wait in barriers.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <strata/bootstrap.hpp>
#include <strata/config.hpp>
#include <strata/error.hpp>
#include <strata/memory.hpp>
#include <strata/transport.hpp>

#include "mode.hpp"
#include "report.hpp"
#include "stats.hpp"

namespace strata::perf {

namespace {

using Clock = std::chrono::steady_clock;

constexpr int kWrongTag = 7101;  // rank 1 -> rank 0: the bytes rank 1 found wrong per size

struct P2pOptions {
  SweepOptions sweep;
  std::string transport = "auto";
  size_t window = 0;  // writes per signal in the bandwidth loop; 0: the whole batch
  int check = 1;
  std::vector<std::string> argv;  // echoed in the header
};

// Two patterns per size: seed 0 for every message but the last, seed 1 for the last one, so a
// last message that did not land (or landed before an earlier one) shows as wrong bytes.
unsigned char pattern(int seed, size_t i, size_t bytes) {
  return static_cast<unsigned char>((i * 7 + bytes + static_cast<size_t>(seed) * 101 + (i >> 8)) &
                                    0xff);
}

void fill(unsigned char* data, size_t bytes, int seed) {
  for (size_t i = 0; i < bytes; ++i) data[i] = pattern(seed, i, bytes);
}

int64_t countWrong(const unsigned char* data, size_t bytes, int seed) {
  int64_t wrong = 0;
  for (size_t i = 0; i < bytes; ++i) wrong += data[i] != pattern(seed, i, bytes);
  return wrong;
}

// Rank 0 and rank 1 of the measurement. Each owns a source buffer of 2 x maxBytes (the first
// half holds the seed-0 pattern, the second the seed-1 pattern of the current size) and a
// receive buffer of maxBytes that the peer writes into.
class Pair {
 public:
  Pair(Context& ctx, const P2pOptions& opt, size_t maxBytes)
      : ctx_(ctx), opt_(opt), rank_(ctx.rank()), maxBytes_(std::max<size_t>(maxBytes, 8)) {
    const int peer = 1 - rank_;
    std::vector<int> peers = {peer};
    conn_ = ctx.connect(peers).at(0);
    std::vector<std::shared_ptr<Connection>> conns = {conn_};
    sem_ = ctx.createSemaphores(conns).at(0);
    src_ = ctx.allocate(2 * maxBytes_);
    recv_ = ctx.allocate(maxBytes_);
    remote_ = ctx.exchange(recv_, peers).at(0);
  }

  std::string_view transport() const { return conn_->transport(); }

  struct Result {
    double totalUs = 0;  // bandwidth loop, rank 0's clock
    std::vector<double> latUs;
    int64_t wrong = 0;  // rank 0's count; rank 1's comes over the bootstrap
  };

  /// Before the barrier that starts a size: after it the peer may write at once.
  void prepare(size_t bytes) {
    if (rank_ == 0) {
      auto* src = static_cast<unsigned char*>(src_.data());
      fill(src, bytes, 0);
      fill(src + maxBytes_, bytes, 1);
    }
    std::memset(recv_.data(), 0, bytes);
  }

  Result run(size_t bytes, size_t iters, size_t warmup) {
    Result r;
    const bool check = opt_.check != 0;

    // Bandwidth: an untimed batch, then the timed one. Rank 1 checks the timed batch's last
    // message and then signals once more, so that rank 0's next writes cannot overwrite the
    // data under the check.
    if (rank_ == 0) {
      if (warmup) sendBatch(bytes, warmup);
      auto t0 = Clock::now();
      sendBatch(bytes, iters);
      r.totalUs = usSince(t0);
      sem_->wait();
    } else {
      if (warmup) receiveBatch(warmup);
      receiveBatch(iters);
      if (check) r.wrong += countWrong(static_cast<unsigned char*>(recv_.data()), bytes, 1);
      std::memset(recv_.data(), 0, bytes);
      sem_->signal();
    }

    // Latency: write + signal, the peer waits and echoes its receive buffer + signal.
    const size_t total = warmup + iters;
    r.latUs.reserve(iters);
    if (rank_ == 0) {
      for (size_t it = 0; it < total; ++it) {
        const uint64_t from = it + 1 == total ? maxBytes_ : 0;
        auto t0 = Clock::now();
        conn_->write(remote_, 0, src_, from, bytes);
        sem_->signal();
        sem_->wait();
        const double us = usSince(t0) / 2;
        if (it >= warmup) r.latUs.push_back(us);
      }
      if (check) r.wrong += countWrong(static_cast<unsigned char*>(recv_.data()), bytes, 1);
    } else {
      for (size_t it = 0; it < total; ++it) {
        sem_->wait();
        conn_->write(remote_, 0, recv_, 0, bytes);
        sem_->signal();
      }
      if (check) r.wrong += countWrong(static_cast<unsigned char*>(recv_.data()), bytes, 1);
    }
    return r;
  }

 private:
  // Signals in a batch of n messages: one per full window of the first n - 1 messages, one for
  // a partial window, and one for the last message, which travels alone so that every earlier
  // write is ordered before it (fabric providers without write-after-write ordering complete
  // the earlier writes before a signal).
  size_t signalsFor(size_t n) const {
    const size_t w = opt_.window ? opt_.window : std::max<size_t>(n - 1, 1);
    return (n - 1 + w - 1) / w + 1;
  }

  void sendBatch(size_t bytes, size_t n) {
    const size_t w = opt_.window ? opt_.window : std::max<size_t>(n - 1, 1);
    size_t inWindow = 0;
    for (size_t i = 0; i + 1 < n; ++i) {
      conn_->write(remote_, 0, src_, 0, bytes);
      if (++inWindow == w) {
        sem_->signal();
        inWindow = 0;
      }
    }
    if (inWindow) sem_->signal();
    conn_->write(remote_, 0, src_, maxBytes_, bytes);
    sem_->signal();
    sem_->wait();  // rank 1 has seen every signal: all n messages have landed
  }

  void receiveBatch(size_t n) {
    for (size_t k = signalsFor(n); k > 0; --k) sem_->wait();
    sem_->signal();
  }

  Context& ctx_;
  const P2pOptions& opt_;
  int rank_;
  size_t maxBytes_;
  std::shared_ptr<Connection> conn_;
  std::shared_ptr<HostSemaphore> sem_;
  RegisteredMemory src_;
  RegisteredMemory recv_;
  RegisteredMemory remote_;
};

int runP2p(const P2pOptions& opt) {
  // sizes() always adds 64 B; p2p keeps it only inside the requested range.
  const std::vector<size_t> sizes = opt.sweep.checkedSizes(/*onlyRequested=*/true);
  const size_t maxBytes = parseBytes(opt.sweep.maxBytes);

  Config config = Config::load();
  if (opt.transport != "auto") {
    config.set("transport.intra_node", opt.transport);
    config.set("transport.inter_node", opt.transport);
  }
  std::shared_ptr<Bootstrap> boot = Bootstrap::create(config);
  try {
    const int rank = boot->rank();
    const int size = boot->size();
    if (size < 2) {
      throw Error(ErrorCode::InvalidArgument,
                  "strata-perf p2p needs at least 2 ranks (rank 0 writes to rank 1); run it "
                  "with strata-run -n 2, srun -n 2 or mpirun -np 2");
    }
    auto ctx = Context::create(boot, config);
    std::unique_ptr<Pair> pair;
    if (rank < 2) pair = std::make_unique<Pair>(*ctx, opt, maxBytes);

    std::unique_ptr<Reporter> out;
    if (rank == 0) {
      std::string transport(pair->transport());
      std::string provider;
      if (transport == "fabric") {
        // The public API does not say which provider "auto" chose; the fabric transport logs it
        // at debug level.
        provider = config.get("transport.fabric.provider").value_or("auto");
      }
      out = std::make_unique<Reporter>("p2p", transport, size, opt.sweep.json);
      out->setProvider(provider);
      std::string cmd;
      for (const auto& a : opt.argv) cmd += (cmd.empty() ? "" : " ") + a;
      out->comment(fmt::format("strata-perf p2p: {}", cmd));
      out->comment(fmt::format(
          "transport: {}{}  nranks: {}  hosts: rank 0 on {}, rank 1 on {} ({})", transport,
          provider.empty() ? "" : fmt::format("  provider: {}", provider), size, ctx->hostName(0),
          ctx->hostName(1), ctx->sameHost(1) ? "same host" : "two hosts"));
      out->comment(fmt::format(
          "bandwidth: rank 0 writes iters messages into rank 1's buffer, {}, and waits for "
          "rank 1's reply; time = rank 0's time / iters; bw = size / time (GB = 1e9 B)",
          opt.window ? fmt::format("signals after every {} writes and after the last", opt.window)
                     : std::string("signals before and after the last message")));
      out->comment(
          "latency: ping-pong of write + signal, rank 1 echoes; one-way = round trip / 2 on "
          "rank 0");
      out->bandwidthColumns();
    }

    int64_t totalWrong = 0;
    for (size_t bytes : sizes) {
      const size_t iters = opt.sweep.itersFor(bytes);
      const size_t warmup = opt.sweep.warmupFor(bytes);
      if (pair) pair->prepare(bytes);
      boot->barrier();
      if (pair) {
        Pair::Result r = pair->run(bytes, iters, warmup);
        int64_t peerWrong = 0;
        if (rank == 1) {
          boot->send(0, kWrongTag, &r.wrong, sizeof(r.wrong));
        } else {
          boot->recv(1, kWrongTag, &peerWrong, sizeof(peerWrong));
          const int64_t wrong = r.wrong + peerWrong;
          totalWrong += wrong;
          if (wrong) {
            fmt::print(stderr, "strata-perf: p2p of {} B: {} byte(s) arrived wrong\n", bytes,
                       wrong);
          }
          BandwidthRow row;
          row.bytes = bytes;
          row.count = bytes;
          row.iters = iters;
          row.timeUs = r.totalUs / static_cast<double>(iters);
          row.gbps = r.totalUs > 0 ? static_cast<double>(bytes) * static_cast<double>(iters) /
                                         (r.totalUs * 1e3)
                                   : 0;
          row.latUs = summarize(r.latUs);
          row.wrong = opt.check ? wrong : -1;
          out->row(row);
        }
      }
      boot->barrier();
    }

    if (out) {
      out->comment(opt.check ? fmt::format("wrong results: {}", totalWrong)
                             : std::string("wrong results: N/A (-c 0)"));
    }
    // Rank 0 alone knows the outcome; the others learn it so that every rank exits alike.
    boot->broadcast(&totalWrong, sizeof(totalWrong), 0);
    pair.reset();
    boot->barrier();
    return totalWrong ? 1 : 0;
  } catch (...) {
    abortJobAndRethrow(*boot);
  }
}

}  // namespace

Mode addP2pMode(CLI::App& app) {
  auto opt = std::make_shared<P2pOptions>();
  CLI::App* cmd = app.add_subcommand(
      "p2p",
      "one-sided write bandwidth and ping-pong latency between rank 0 and rank 1 over one "
      "transport (run it in every rank: strata-run -n 2, srun or mpirun)");
  opt->sweep.maxBytes = "64M";
  opt->sweep.addTo(*cmd);
  cmd->add_option("--transport", opt->transport,
                  "transport to measure: sets transport.intra_node and transport.inter_node "
                  "(auto: leave the configuration alone)")
      ->check(CLI::IsMember({"auto", "shm", "fabric"}))
      ->capture_default_str();
  cmd->add_option("--window", opt->window,
                  "writes per signal in the bandwidth loop (0: one signal per batch)")
      ->check(CLI::Range(size_t{0}, size_t{100000000}))
      ->capture_default_str();
  cmd->add_option("-c,--check", opt->check, "check the last message of each loop (0 or 1)")
      ->check(CLI::Range(0, 1))
      ->capture_default_str();
  return Mode{cmd, [opt](const std::vector<std::string>& argv) {
                opt->argv = argv;
                return runP2p(*opt);
              }};
}

}  // namespace strata::perf
