// Gloo allreduce / allgather bus bandwidth, measured like tools/bench/mpi_coll.c (and so like
// nccl-tests and `strata-perf allreduce|allgather`), for tools/bench/coll_vs_peers.sh.
//
//   gloo_coll allreduce|allgather MINBYTES MAXBYTES FACTOR [ITERS [WARMUP]]
//
// Rank and size come from STRATA_RANK/STRATA_SIZE (strata-run) or OMPI_COMM_WORLD_RANK/SIZE
// (mpirun). The ranks meet through a gloo FileStore in $GLOO_STORE_DIR (a fresh, empty directory
// per run) and connect with gloo's TCP transport on 127.0.0.1 only. GLOO_ALGO picks the
// allreduce algorithm: "ring" (the default, and what gloo::allreduce does when none is set) or
// "bcube"; a non-default one is reported with label "gloo-<algo>".
//
// Sizes, iteration counts, timing (max over ranks of each rank's average per iteration, taken
// with a gloo allreduce of max), the check and the JSON line per size are those of mpi_coll.c.
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
using AllreduceAlgorithm = gloo::AllreduceOptions::Algorithm;

enum class Op { Allreduce, Allgather };

constexpr long long kFullIterBytes = 64 << 10;  // full iteration count up to here

void usage() {
  std::fprintf(stderr,
               "usage: gloo_coll allreduce|allgather MINBYTES MAXBYTES FACTOR [ITERS [WARMUP]]\n"
               "env: STRATA_RANK/STRATA_SIZE or OMPI_COMM_WORLD_RANK/SIZE, GLOO_STORE_DIR,\n"
               "     GLOO_ALGO=ring|bcube (allreduce)\n");
}

// A byte count with an optional K/M/G suffix (powers of 1024); -1 when malformed. (Plain values
// rather than std::optional: g++ 12 warns maybe-uninitialized on optionals of long long at -O2.)
long long parseBytes(const char* s) {
  char* end = nullptr;
  long long v = std::strtoll(s, &end, 10);
  if (end == s || v < 0) return -1;
  long long mult = 1;
  if (*end == 'K' || *end == 'k') {
    mult = 1LL << 10;
    ++end;
  } else if (*end == 'M' || *end == 'm') {
    mult = 1LL << 20;
    ++end;
  } else if (*end == 'G' || *end == 'g') {
    mult = 1LL << 30;
    ++end;
  }
  if (*end != '\0') return -1;
  return v * mult;
}

std::optional<int> envInt(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::atoi(v);
}

// Rank r's element i: small positive integers, so the float sum over ranks is exact.
float valueOf(int r, size_t i) {
  return static_cast<float>((r + 1) * static_cast<int>(i % 7 + 1));
}

long defaultIters(long long bytes) {
  if (bytes <= kFullIterBytes) return 200;
  long long n = 200 * kFullIterBytes / bytes;
  return n < 5 ? 5 : static_cast<long>(n);
}

double maxOverRanks(const std::shared_ptr<gloo::Context>& context, double v) {
  gloo::AllreduceOptions opts(context);
  opts.setOutput(&v, 1);
  opts.setReduceFunction(
      static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::max<double>));
  gloo::allreduce(opts);
  return v;
}

long sumOverRanks(const std::shared_ptr<gloo::Context>& context, long v) {
  gloo::AllreduceOptions opts(context);
  opts.setOutput(&v, 1);
  opts.setReduceFunction(
      static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<long>));
  gloo::allreduce(opts);
  return v;
}

void barrier(const std::shared_ptr<gloo::Context>& context) {
  gloo::BarrierOptions opts(context);
  gloo::barrier(opts);
}

int run(int argc, char** argv) {
  std::optional<Op> op;
  if (argc >= 2 && std::strcmp(argv[1], "allreduce") == 0) op = Op::Allreduce;
  if (argc >= 2 && std::strcmp(argv[1], "allgather") == 0) op = Op::Allgather;
  const long long minBytes = argc >= 3 ? parseBytes(argv[2]) : -1;
  const long long maxBytes = argc >= 4 ? parseBytes(argv[3]) : -1;
  const long long factor = argc >= 5 ? parseBytes(argv[4]) : -1;
  const long long itersArg = argc >= 6 ? parseBytes(argv[5]) : 0;
  const long long warmupArg = argc >= 7 ? parseBytes(argv[6]) : -2;  // -2: default
  if (!op || argc > 7 || minBytes < 1 || maxBytes < minBytes || factor < 2 || itersArg < 0 ||
      warmupArg == -1) {
    usage();
    return 2;
  }

  auto rank = envInt("STRATA_RANK");
  auto nranks = envInt("STRATA_SIZE");
  if (!rank || !nranks) {
    rank = envInt("OMPI_COMM_WORLD_RANK");
    nranks = envInt("OMPI_COMM_WORLD_SIZE");
  }
  const char* storeDir = std::getenv("GLOO_STORE_DIR");
  if (!rank || !nranks || *nranks < 1 || *rank < 0 || *rank >= *nranks || storeDir == nullptr ||
      *storeDir == '\0') {
    std::fprintf(stderr,
                 "gloo_coll: needs STRATA_RANK/STRATA_SIZE (strata-run) or "
                 "OMPI_COMM_WORLD_RANK/SIZE (mpirun), and GLOO_STORE_DIR (an empty directory "
                 "shared by the ranks)\n");
    return 2;
  }

  std::string algoName = "ring";
  AllreduceAlgorithm algo = AllreduceAlgorithm::RING;
  if (const char* a = std::getenv("GLOO_ALGO"); a != nullptr && *a != '\0') {
    algoName = a;
    if (algoName == "bcube") {
      algo = AllreduceAlgorithm::BCUBE;
    } else if (algoName != "ring") {
      std::fprintf(stderr, "gloo_coll: GLOO_ALGO must be ring or bcube, not '%s'\n", a);
      return 2;
    }
  }
  const std::string label = algoName == "ring" ? "gloo" : "gloo-" + algoName;

  // Loopback only: the device binds to 127.0.0.1 and publishes that address in the store.
  gloo::transport::tcp::attr attr;
  attr.hostname = "127.0.0.1";
  auto device = gloo::transport::tcp::CreateDevice(attr);
  gloo::rendezvous::FileStore store(storeDir);
  auto context = std::make_shared<gloo::rendezvous::Context>(*rank, *nranks);
  context->connectFullMesh(store, device);

  const size_t n = static_cast<size_t>(*nranks);
  const size_t maxCount = static_cast<size_t>(maxBytes) / sizeof(float);
  const size_t maxSend = *op == Op::Allreduce ? maxCount : maxCount / n;
  std::vector<float> send(maxSend ? maxSend : 1);
  std::vector<float> recv(maxCount ? maxCount : 1);
  // Allgather: rank r's element i lands at r * sendCount + i, so one formula serves both.
  for (size_t i = 0; i < maxSend; ++i) send[i] = valueOf(*rank, i);

  bool anyWrong = false;
  for (long long bytes = minBytes; bytes <= maxBytes; bytes *= factor) {
    size_t count = static_cast<size_t>(bytes) / sizeof(float);
    size_t sendCount = count;
    if (*op == Op::Allgather) {
      sendCount = count / n;
      count = sendCount * n;
    }
    if (sendCount == 0) continue;  // as mpi_coll: nothing to move at this size
    const long iters = itersArg > 0 ? static_cast<long>(itersArg) : defaultIters(bytes);
    const long warmup =
        warmupArg >= 0 ? static_cast<long>(warmupArg) : (iters / 10 < 2 ? 2 : iters / 10);

    // The options (and the buffer registrations they hold) are built once per size and reused
    // for every iteration, as an application that runs one collective repeatedly would.
    std::function<void()> once;
    std::unique_ptr<gloo::AllreduceOptions> arOpts;
    std::unique_ptr<gloo::AllgatherOptions> agOpts;
    if (*op == Op::Allreduce) {
      arOpts = std::make_unique<gloo::AllreduceOptions>(context);
      arOpts->setAlgorithm(algo);
      arOpts->setInput(send.data(), count);
      arOpts->setOutput(recv.data(), count);
      arOpts->setReduceFunction(
          static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
      once = [&] { gloo::allreduce(*arOpts); };
    } else {
      agOpts = std::make_unique<gloo::AllgatherOptions>(context);
      agOpts->setInput(send.data(), sendCount);
      agOpts->setOutput(recv.data(), count);
      once = [&] { gloo::allgather(*agOpts); };
    }

    std::memset(recv.data(), 0, count * sizeof(float));  // stale results must not pass the check
    barrier(context);
    for (long it = 0; it < warmup; ++it) once();
    barrier(context);
    const auto t0 = Clock::now();
    for (long it = 0; it < iters; ++it) once();
    const double avgUs =
        std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / iters;
    const double maxUs = maxOverRanks(context, avgUs);

    long wrong = 0;
    const float sumScale = static_cast<float>(*nranks * (*nranks + 1) / 2);
    for (size_t i = 0; i < count; ++i) {
      float want = *op == Op::Allreduce ? sumScale * static_cast<float>(static_cast<int>(i % 7 + 1))
                                        : valueOf(static_cast<int>(i / sendCount), i % sendCount);
      if (recv[i] != want) ++wrong;
    }
    const long wrongTotal = sumOverRanks(context, wrong);
    anyWrong = anyWrong || wrongTotal != 0;

    if (*rank == 0) {
      const double size = static_cast<double>(count * sizeof(float));
      const double algbw = size / maxUs / 1e3;
      const double busFactor = *op == Op::Allreduce ? 2.0 * (*nranks - 1) / *nranks
                                                    : static_cast<double>(*nranks - 1) / *nranks;
      std::printf(
          "{\"tool\":\"gloo\",\"label\":\"%s\",\"op\":\"%s\",\"nranks\":%d,"
          "\"backend\":\"gloo\",\"memory\":\"host\",\"size\":%zu,\"count\":%zu,"
          "\"type\":\"float\",\"redop\":\"%s\",\"root\":-1,\"inplace\":false,"
          "\"time_us\":%.3f,\"algbw\":%.6g,\"busbw\":%.6g,\"wrong\":%ld}\n",
          label.c_str(), *op == Op::Allreduce ? "allreduce" : "allgather", *nranks,
          count * sizeof(float), count, *op == Op::Allreduce ? "sum" : "none", maxUs, algbw,
          algbw * busFactor, wrongTotal);
      std::fflush(stdout);
    }
    if (bytes > maxBytes / factor) break;  // the next step would overflow or pass the end
  }
  barrier(context);  // no rank tears down its pairs while another still reads from them
  return anyWrong ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gloo_coll: %s\n", e.what());
    return 1;
  }
}
