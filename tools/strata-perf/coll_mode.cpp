// strata-perf allreduce|allgather|reducescatter|broadcast|alltoall|sendrecv: the collectives of
// a Communicator measured and printed as nccl-tests does (same flags, columns, bus bandwidth
// factors and trailer), so that numbers can be put next to nccl-tests' and peers' numbers.
// With --memory cuda the buffers are device memory (device.hpp): every call is enqueued on a
// CUDA stream and the time runs to a cudaStreamSynchronize, as in nccl-tests; -G captures the
// timed calls in a CUDA graph and times its launches.

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <strata/bootstrap.hpp>
#include <strata/communicator.hpp>
#include <strata/config.hpp>
#include <strata/error.hpp>

#include "base/process.hpp"
#include "coll_buffers.hpp"
#include "coll_data.hpp"
#include "coll_measure.hpp"
#include "coll_options.hpp"
#include "coll_report.hpp"
#include "device.hpp"
#include "mode.hpp"
#include "report.hpp"
#include "stats.hpp"

namespace strata::perf {

namespace {

// meson's (and the design's) status of a check that cannot run here.
constexpr int kExitSkip = 77;

// nccl-tests' order for -d all / -o all (bfloat16 last, as nccl-tests appends it).
const std::vector<DataType> kAllTypes = {
    DataType::Int8,   DataType::Uint8,   DataType::Int32,   DataType::Uint32,  DataType::Int64,
    DataType::Uint64, DataType::Float16, DataType::Float32, DataType::Float64, DataType::BFloat16};
const std::vector<ReduceOp> kAllOps = {ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min,
                                       ReduceOp::Avg};

std::vector<size_t> collSizes(const CollOptions& opt) {
  size_t lo = 0, hi = 0, step = 0;
  try {
    lo = parseBytes(opt.sweep.minBytes);
    hi = parseBytes(opt.sweep.maxBytes);
    if (!opt.stepBytes.empty()) step = parseBytes(opt.stepBytes);
  } catch (const std::invalid_argument& e) {
    throw CLI::ValidationError(e.what());
  }
  if (lo > hi) {
    throw CLI::ValidationError(fmt::format("--minbytes {} is larger than --maxbytes {}",
                                           opt.sweep.minBytes, opt.sweep.maxBytes));
  }
  if (opt.stepBytesOption->count() == 0) return sizeList(lo, hi, opt.sweep.factor);
  if (opt.factorOption->count()) {
    throw CLI::ValidationError("give either -f (a step factor) or -i (a step in bytes), not both");
  }
  if (step == 0) throw CLI::ValidationError("--stepbytes must be at least 1");
  std::vector<size_t> sizes;
  for (size_t s = lo; s <= hi; s += step) {
    sizes.push_back(s);
    if (s + step < s) break;
  }
  if (sizes.back() != hi) sizes.push_back(hi);  // as every strata-perf mode: -e is measured
  return sizes;
}

std::vector<DataType> typesOf(const CollOptions& opt) {
  if (opt.datatype == "all") return kAllTypes;
  return {*parseDataType(opt.datatype)};
}

std::vector<ReduceOp> opsOf(CollKind kind, const CollOptions& opt) {
  if (!isReducing(kind)) return {ReduceOp::Sum};  // unused; printed as "none"
  if (opt.redop == "all") return kAllOps;
  return {*parseReduceOp(opt.redop)};
}

/// --api compare: the row's call through strata::Communicator and through the NCCL API in
/// alternating pairs (out of place, unchecked), so that both see the same phase of the machine;
/// rank 0 prints each side's median (the slowest rank per measurement) and the median of the
/// pairs' ratios.
void compareRow(Communicator& comm, NcclApi& nccl, const CollCase& c, const Buffers& buf,
                size_t iters, const Issue& base, int& rep, Reporter* out) {
  constexpr int kPairs = 7;
  Issue how = base;
  how.check = false;
  std::vector<double> strataUs, ncclUs, ratios;
  const int n = c.nranks;
  for (int i = 0; i < kPairs; ++i) {
    double t[2];
    for (int side = 0; side < 2; ++side) {
      how.nccl = side == 0 ? nullptr : &nccl;
      double mine = measure(comm, c, buf, false, iters, 1, how, rep).us;
      std::vector<double> all(static_cast<size_t>(n));
      all[static_cast<size_t>(c.rank)] = mine;
      comm.bootstrap().allGather(all.data(), sizeof(double));
      t[side] = *std::max_element(all.begin(), all.end());
    }
    strataUs.push_back(t[0]);
    ncclUs.push_back(t[1]);
    ratios.push_back(t[1] / t[0]);
  }
  if (out == nullptr) return;
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  out->comment(fmt::format(
      "compare {} B: Communicator {:.2f} us, NCCL API {:.2f} us (medians of {} alternating "
      "pairs); NCCL API / Communicator per pair: median {:.3f}, min {:.3f}, max {:.3f}",
      wholeBytes(c), median(strataUs), median(ncclUs), kPairs, median(ratios),
      *std::min_element(ratios.begin(), ratios.end()),
      *std::max_element(ratios.begin(), ratios.end())));
}

int runColl(CollKind kind, const CollOptions& opt) {
  const std::vector<size_t> sizes = collSizes(opt);
  const bool cuda = opt.memory == "cuda";
  if (opt.graph > 0 && !cuda) {
    throw CLI::ValidationError(
        "-G/--cudagraph needs --memory cuda: a CUDA graph captures work enqueued on a stream, and "
        "host memory collectives run on the CPU before they return");
  }
  if (cuda && opt.alloc != "malloc") {
    throw CLI::ValidationError(
        fmt::format("--alloc {} allocates host memory; with --memory cuda the buffers come from "
                    "cudaMalloc (leave --alloc out)",
                    opt.alloc));
  }
  // Decided by every rank alone before the bootstrap, so that all of them skip alike and none
  // waits for a peer that has already gone.
  device::Probe probe;
  if (cuda) {
    if (!device::built()) {
      fmt::print(stderr,
                 "strata-perf: --memory cuda: this strata-perf was built without CUDA (meson "
                 "found no CUDA toolkit) (skipped)\n");
      return kExitSkip;
    }
    probe = device::probe();
    if (probe.count == 0) {
      fmt::print(stderr, "strata-perf: --memory cuda needs a CUDA device: {} (skipped)\n",
                 probe.error);
      return kExitSkip;
    }
  }
  const size_t maxBytes = *std::max_element(sizes.begin(), sizes.end());
  const std::vector<DataType> types = typesOf(opt);
  const std::vector<ReduceOp> ops = opsOf(kind, opt);

  Config config = Config::load();
  if (!opt.algorithm.empty()) {
    config.set(fmt::format("collectives.{}.algorithm", collName(kind)), opt.algorithm);
  }
  std::shared_ptr<Bootstrap> boot = Bootstrap::create(config);
  const int nranks = boot->size();
  const int rank = boot->rank();
  if (kind == CollKind::Broadcast && (opt.root < 0 || opt.root >= nranks)) {
    // Every rank sees the same flags and size, so every rank stops here alike.
    throw CLI::ValidationError(
        fmt::format("--root {} is not a rank of this job (ranks 0..{}); pick a root below {}",
                    opt.root, nranks - 1, nranks));
  }
  try {
    // The device is chosen before the communicator, which sets up on the current device.
    device::Info dev;
    StreamHandle stream;
    if (cuda) {
      dev = device::select(boot->localRank() % probe.count);
      stream.reset(device::createStream());
    }
    const Target at{cuda, stream.get()};
    std::unique_ptr<Communicator> comm = Communicator::create(boot, config);
    Buffers buf(*comm, opt.alloc, maxBytes, at, opt.check != 0);

    RankRecord me;
    me.pid = static_cast<int32_t>(getpid());
    std::string host = process::hostName();
    std::memcpy(me.host, host.data(), std::min(host.size(), sizeof(me.host) - 1));
    if (cuda) {
      me.device = dev.index;
      me.pciBus = dev.pciBus;
      std::memcpy(me.deviceName, dev.name.data(),
                  std::min(dev.name.size(), sizeof(me.deviceName) - 1));
    }
    std::vector<RankRecord> ranks(static_cast<size_t>(nranks));
    ranks[static_cast<size_t>(rank)] = me;
    boot->allGather(ranks.data(), sizeof(RankRecord));

    std::unique_ptr<Reporter> out;
    if (rank == 0) {
      out = std::make_unique<Reporter>(collName(kind), std::string(boot->backend()), nranks,
                                       opt.sweep.json);
      out->setLabel(opt.label);
      out->setMemory(cuda ? "cuda" : "host");
      out->setGraph(opt.graph);
      printHeader(*out, kind, opt, *comm, ranks);
      out->collColumns();
    }

    // --api nccl: the same rows through the NCCL C API (its own communicator on these ranks).
    std::unique_ptr<NcclApi> nccl;
    const bool compare = opt.api == "compare";
    if (opt.api != "strata") {
      nccl = std::make_unique<NcclApi>(opt.ncclLib, *boot);
      if (out) {
        out->comment(fmt::format("api: {} through {}", opt.api, nccl->describe()));
      }
    }
    const bool check = opt.check != 0;
    Issue how;
    how.nccl = compare ? nullptr : nccl.get();
    how.grouped = opt.api == "nccl-group" || compare;  // compare: alltoall as a group
    how.check = check;
    how.at = at;
    how.blocking = opt.blocking != 0;
    how.graph = opt.graph;
    CollTotals totals;
    int rep = 0;
    std::string lastAlgorithm;  // with the launch shape: a new line when either changes
    for (DataType type : types) {
      for (ReduceOp op : ops) {
        for (size_t bytes : sizes) {
          CollCase c;
          c.kind = kind;
          c.type = type;
          c.op = op;
          c.root = kind == CollKind::Broadcast ? opt.root : -1;
          c.rank = rank;
          c.nranks = nranks;
          c.count = countFor(kind, bytes, type, nranks);
          const size_t iters = opt.sweep.itersFor(bytes);
          const size_t warmup = opt.sweep.warmupFor(bytes);

          RankResult mine;
          Measured m = measure(*comm, c, buf, false, iters, warmup, how, rep);
          mine.outUs = m.us;
          mine.outWrong = m.wrong;
          if (hasInPlace(kind)) {
            m = measure(*comm, c, buf, true, iters, warmup, how, rep);
            mine.inUs = m.us;
            mine.inWrong = m.wrong;
          }
          std::vector<RankResult> all(static_cast<size_t>(nranks));
          all[static_cast<size_t>(rank)] = mine;
          boot->allGather(all.data(), sizeof(RankResult));

          CollRow row = collRow(c, *comm, all, check, totals);
          if (nccl && !compare) {  // what the library chose is not visible through the NCCL API
            row.algorithm = opt.api == "nccl-group" ? "nccl api (grouped)" : "nccl api";
            row.launch.clear();
          }
          const std::string algorithm = algorithmText(row);
          if (out && algorithm != lastAlgorithm) {
            out->comment(fmt::format("algorithm: {}", algorithm));
            lastAlgorithm = algorithm;
          }
          if (out) out->row(row);
          if (compare) compareRow(*comm, *nccl, c, buf, iters, how, rep, out.get());
        }
      }
    }
    if (out) printTrailer(*out, totals);
    boot->barrier();
    return totals.wrong ? 1 : 0;
  } catch (...) {
    abortJobAndRethrow(*boot);
  }
}

const CLI::Validator kTypeName(
    [](std::string& text) {
      if (text == "all" || parseDataType(text)) return std::string();
      return fmt::format(
          "unknown data type '{}': use int8, uint8, int32, uint32, int64, uint64, half, "
          "bfloat16, float, double or all",
          text);
    },
    "TYPE", "data type");

const CLI::Validator kOpName(
    [](std::string& text) {
      if (text == "all" || parseReduceOp(text)) return std::string();
      return fmt::format("unknown reduction '{}': use sum, prod, min, max, avg or all", text);
    },
    "OP", "reduction");

Mode addCollMode(CLI::App& app, CollKind kind, const std::string& help) {
  auto opt = std::make_shared<CollOptions>();
  CLI::App* cmd = app.add_subcommand(collName(kind), help);
  opt->sweep.maxBytes = "64M";
  opt->sweep.addTo(*cmd);
  opt->factorOption = cmd->get_option("-f");
  opt->stepBytesOption =
      cmd->add_option("-i,--stepbytes", opt->stepBytes,
                      "add this many bytes between rows instead of multiplying by -f")
          ->type_name("BYTES");
  cmd->add_option("-c,--check", opt->check,
                  "check every result against a reference, on an extra iteration (0 or 1)")
      ->check(CLI::Range(0, 1))
      ->capture_default_str();
  cmd->add_option("-d,--datatype", opt->datatype,
                  "int8 uint8 int32 uint32 int64 uint64 half bfloat16 float double, or all")
      ->check(kTypeName)
      ->capture_default_str();
  if (isReducing(kind)) {
    cmd->add_option("-o,--op", opt->redop, "sum prod min max avg, or all")
        ->check(kOpName)
        ->capture_default_str();
  } else {
    // Accepted like nccl-tests does for every op; a non-reducing op prints "none".
    cmd->add_option("-o,--op", opt->redop, "ignored: this collective does not reduce")
        ->check(kOpName);
  }
  cmd->add_option("-r,--root", opt->root,
                  kind == CollKind::Broadcast ? "root rank" : "ignored: only broadcast has a root")
      ->capture_default_str();
  cmd->add_option("-z,--blocking", opt->blocking,
                  "--memory cuda: cudaStreamSynchronize after each call (each graph launch with "
                  "-G); host memory collectives always block")
      ->check(CLI::Range(0, 1))
      ->capture_default_str();
  cmd->add_option("--memory", opt->memory,
                  "buffer memory: host, or cuda (cudaMalloc on device localRank % devices, calls "
                  "enqueued on a CUDA stream; exits 77 without a CUDA device)")
      ->check(CLI::IsMember({"host", "cuda"}))
      ->capture_default_str();
  cmd->add_option("-G,--cudagraph", opt->graph,
                  "--memory cuda: capture each row's timed calls in a CUDA graph and time N "
                  "launches of it (nccl-tests' -G); 0: no graph")
      ->check(CLI::Range(0, 1000000))
      ->capture_default_str();
  cmd->add_option("--alloc", opt->alloc,
                  "host buffers from malloc, from strata's allocator (Context::allocate), or "
                  "from Communicator::allocHost (allochost: shared with the host's peers, "
                  "read in place by the zerocopy algorithm)")
      ->check(CLI::IsMember({"malloc", "strata", "allochost"}))
      ->capture_default_str();
  cmd->add_option("--label", opt->label, "\"label\" of the JSON rows (names the run in plots)")
      ->capture_default_str();
  cmd->add_option(
         "--api", opt->api,
         "strata: strata::Communicator; nccl: the same calls through the NCCL C API "
         "of --nccl-lib (dlopen); nccl-group: as nccl, alltoall as a group of "
         "ncclSend/ncclRecv (as PyTorch issues it); compare: the rows through "
         "strata::Communicator, each followed by a comment line comparing it with the NCCL "
         "API in 7 alternating pairs")
      ->check(CLI::IsMember({"strata", "nccl", "nccl-group", "compare"}))
      ->capture_default_str();
  cmd->add_option("--nccl-lib", opt->ncclLib,
                  "--api nccl: the library to load (dlopen's search path; build/bindings/nccl "
                  "holds libstrata-nccl.so.2; a real libnccl.so.2 works too)")
      ->capture_default_str();
  cmd->add_option("-a,--algorithm", opt->algorithm,
                  "force a collectives algorithm by name (collectives.<op>.algorithm; "
                  "strata-info --algorithms lists them); default: auto");
  return Mode{cmd, [opt, kind](const std::vector<std::string>& argv) {
                opt->argv = argv;
                return runColl(kind, *opt);
              }};
}

}  // namespace

std::vector<Mode> addCollModes(CLI::App& app) {
  const char* runIt = " (run it in every rank: strata-run -n N, srun or mpirun)";
  std::vector<Mode> modes;
  modes.push_back(addCollMode(app, CollKind::AllReduce,
                              std::string("Communicator::allReduce, nccl-tests style") + runIt));
  modes.push_back(addCollMode(app, CollKind::AllGather,
                              std::string("Communicator::allGather, nccl-tests style") + runIt));
  modes.push_back(
      addCollMode(app, CollKind::ReduceScatter,
                  std::string("Communicator::reduceScatter, nccl-tests style") + runIt));
  modes.push_back(addCollMode(app, CollKind::Broadcast,
                              std::string("Communicator::broadcast, nccl-tests style") + runIt));
  modes.push_back(addCollMode(app, CollKind::AllToAll,
                              std::string("Communicator::allToAll, nccl-tests style") + runIt));
  modes.push_back(addCollMode(
      app, CollKind::SendRecv,
      std::string("Communicator::send/recv in a ring (rank r sends to r+1), nccl-tests style") +
          runIt));
  return modes;
}

}  // namespace strata::perf
