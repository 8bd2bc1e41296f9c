// strata-perf allreduce|allgather|reducescatter|broadcast|alltoall|sendrecv: the collectives of
// a Communicator measured and printed as nccl-tests does (same flags, columns, bus bandwidth
// factors and trailer), so that numbers can be put next to nccl-tests' and peers' numbers.
// With --memory cuda the buffers are device memory (device.hpp): every call is enqueued on a
// CUDA stream and the time runs to a cudaStreamSynchronize, as in nccl-tests; -G captures the
// timed calls in a CUDA graph and times its launches.

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <strata/bootstrap.hpp>
#include <strata/communicator.hpp>
#include <strata/config.hpp>
#include <strata/error.hpp>
#include <strata/memory.hpp>
#include <strata/transport.hpp>

#include "base/process.hpp"
#include "coll_data.hpp"
#include "device.hpp"
#include "mode.hpp"
#include "report.hpp"
#include "stats.hpp"

namespace strata::perf {

namespace {

using Clock = std::chrono::steady_clock;

// meson's (and the design's) status of a check that cannot run here.
constexpr int kExitSkip = 77;

struct CollOptions {
  SweepOptions sweep;
  std::string stepBytes;  // -i: a linear step instead of -f
  CLI::Option* stepBytesOption = nullptr;
  CLI::Option* factorOption = nullptr;
  int check = 1;
  std::string datatype = "float";
  std::string redop = "sum";
  int root = 0;
  int blocking = 0;
  std::string memory = "host";
  std::string alloc = "malloc";
  int graph = 0;  ///< -G: launches of a CUDA graph of the timed calls (0: no graph)
  std::string label = "strata";
  std::string algorithm;          ///< -a: forced through collectives.<op>.algorithm
  std::vector<std::string> argv;  // echoed in the header
};

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

// Where the calls of a run go: host memory (the calls complete before they return), or device
// memory and the stream (device.hpp's) they are enqueued on.
struct Target {
  bool device = false;
  void* stream = nullptr;
};

// The buffers of one run. Host memory: from the heap (any user buffer) or from strata's
// allocator, and the inputs are written and the results read in place. Device memory:
// cudaMalloc'ed and zeroed, with host staging buffers of the same size (only with -c 1: a sweep
// to 8 GiB on 8 GPUs would otherwise hold 128 GiB of host memory) in which the inputs are written
// (upload() copies them over) and into which a result is copied to be checked.
class Buffers {
 public:
  Buffers(Communicator& comm, const std::string& alloc, size_t bytes, Target target, bool check)
      : target_(target) {
    bytes = std::max<size_t>(bytes, 64);
    bytes_ = bytes;
    if (target_.device) {
      devSend_ = device::allocate(bytes);
      devRecv_ = device::allocate(bytes);
      device::zero(devSend_, bytes, target_.stream);
      device::zero(devRecv_, bytes, target_.stream);
      if (!check) return;
    }
    if (alloc == "strata" && !target_.device) {
      sendMem_ = comm.context().allocate(bytes);
      recvMem_ = comm.context().allocate(bytes);
      send_ = sendMem_.data();
      recv_ = recvMem_.data();
    } else {
      const size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
      heapSend_.reset(std::aligned_alloc(kAlign, rounded));
      heapRecv_.reset(std::aligned_alloc(kAlign, rounded));
      if (!heapSend_ || !heapRecv_) {
        throw Error(
            ErrorCode::SystemError,
            fmt::format("cannot allocate 2 x {} of host memory; lower -e", formatBytes(bytes)));
      }
      send_ = heapSend_.get();
      recv_ = heapRecv_.get();
    }
    std::memset(send_, 0, bytes);
    std::memset(recv_, 0, bytes);
  }
  ~Buffers() {
    device::release(devSend_);
    device::release(devRecv_);
  }
  Buffers(const Buffers&) = delete;
  Buffers& operator=(const Buffers&) = delete;

  /// Where the collectives read and write.
  std::byte* send() const { return static_cast<std::byte*>(target_.device ? devSend_ : send_); }
  std::byte* recv() const { return static_cast<std::byte*>(target_.device ? devRecv_ : recv_); }
  /// Where the inputs are prepared: send() and recv() themselves for host memory; device
  /// memory has them only with -c 1.
  std::byte* hostSend() const { return static_cast<std::byte*>(send_); }
  std::byte* hostRecv() const { return static_cast<std::byte*>(recv_); }

  /// Device memory: copies the first `bytes` of both staging buffers to the device buffers.
  void upload(size_t bytes) const {
    if (!target_.device) return;
    device::toDevice(devSend_, send_, std::min(bytes, bytes_), target_.stream);
    device::toDevice(devRecv_, recv_, std::min(bytes, bytes_), target_.stream);
  }
  /// A result in send() or recv() readable on the host: itself for host memory, else a copy in
  /// the receive staging buffer (overwritten by the next prepare).
  const void* result(const void* where, size_t bytes) const {
    if (!target_.device) return where;
    device::toHost(recv_, where, bytes, target_.stream);
    return recv_;
  }

 private:
  static constexpr size_t kAlign = 4096;
  struct Free {
    void operator()(void* p) const { std::free(p); }
  };
  std::unique_ptr<void, Free> heapSend_, heapRecv_;
  RegisteredMemory sendMem_, recvMem_;
  void* send_ = nullptr;
  void* recv_ = nullptr;
  Target target_;
  void* devSend_ = nullptr;
  void* devRecv_ = nullptr;
  size_t bytes_ = 0;
};

// A CUDA stream for the run (none for host memory), destroyed after the communicator.
struct StreamDestroy {
  void operator()(void* stream) const noexcept { device::destroyStream(stream); }
};
using StreamHandle = std::unique_ptr<void, StreamDestroy>;

void callColl(Communicator& comm, const CollCase& c, const void* send, void* recv, Target at) {
  const Stream s{at.stream};
  switch (c.kind) {
    case CollKind::AllReduce:
      comm.allReduce(send, recv, c.count, c.type, c.op, s);
      return;
    case CollKind::AllGather:
      comm.allGather(send, recv, c.count, c.type, s);
      return;
    case CollKind::ReduceScatter:
      comm.reduceScatter(send, recv, c.count, c.type, c.op, s);
      return;
    case CollKind::Broadcast:
      comm.broadcast(send, recv, c.count, c.type, c.root, s);
      return;
    case CollKind::AllToAll:
      comm.allToAll(send, recv, c.count, c.type, s);
      return;
    case CollKind::SendRecv: {
      if (c.nranks == 1) {
        // nccl-tests sends to itself; here that is a copy, so that one rank runs too.
        if (at.device) {
          device::copyAsync(recv, send, c.count * sizeOf(c.type), at.stream);
        } else {
          std::memcpy(recv, send, c.count * sizeOf(c.type));
        }
        return;
      }
      // Host send/recv return when done, so a ring of sends first could wait forever; even ranks
      // send first and odd ranks receive first, which completes for any nranks (and in the same
      // order on a stream, where each call waits for its peer's).
      const int next = (c.rank + 1) % c.nranks;
      const int prev = (c.rank - 1 + c.nranks) % c.nranks;
      if (c.rank % 2 == 0) {
        comm.send(send, c.count, c.type, next, s);
        comm.recv(recv, c.count, c.type, prev, s);
      } else {
        comm.recv(recv, c.count, c.type, prev, s);
        comm.send(send, c.count, c.type, next, s);
      }
      return;
    }
  }
}

// In place as NCCL defines it; alltoall has no in-place form in strata's API (send and recv must
// not overlap), and a blocking in-place sendrecv would overwrite the data before sending it.
bool hasInPlace(CollKind kind) {
  return kind != CollKind::AllToAll && kind != CollKind::SendRecv;
}

struct Placement {
  const void* send;
  void* recv;
  const void* result;
};

Placement placementFor(const CollCase& c, const Buffers& buf, bool inPlace) {
  if (!inPlace) return {buf.send(), buf.recv(), buf.recv()};
  const size_t own = static_cast<size_t>(c.rank) * c.count * sizeOf(c.type);
  switch (c.kind) {
    case CollKind::AllGather:
      return {buf.recv() + own, buf.recv(), buf.recv()};
    case CollKind::ReduceScatter:
      return {buf.send(), buf.send() + own, buf.send() + own};
    default:
      return {buf.recv(), buf.recv(), buf.recv()};
  }
}

size_t wholeBytes(const CollCase& c) {
  return std::max(sendElements(c), recvElements(c)) * sizeOf(c.type);
}

void prepare(const CollCase& c, const Buffers& buf, bool inPlace) {
  if (!inPlace) {
    fillSend(c, buf.hostSend());
    poison(c.type, buf.hostRecv(), recvElements(c));
  } else {
    fillInPlace(c, c.kind == CollKind::ReduceScatter ? buf.hostSend() : buf.hostRecv());
  }
  buf.upload(wholeBytes(c));
}

// How the calls of a row are issued.
struct Issue {
  bool check = false;
  Target at;
  bool blocking = false;  ///< device memory, -z 1: synchronize after each call (graph launch)
  int graph = 0;          ///< -G: launches of a graph that holds the timed calls
};

struct Measured {
  double us = 0;  // per iteration on this rank
  int64_t wrong = 0;
};

Measured measure(Communicator& comm, CollCase c, const Buffers& buf, bool inPlace, size_t iters,
                 size_t warmup, const Issue& how, int& rep) {
  Measured m;
  const Placement p = placementFor(c, buf, inPlace);
  const Target at = how.at;
  void* stream = at.stream;
  if (how.check) prepare(c, buf, inPlace);
  for (size_t i = 0; i < warmup; ++i) callColl(comm, c, p.send, p.recv, at);
  if (at.device) device::synchronize(stream);
  // As nccl-tests: the timed calls are captured once, untimed; the time is that of the launches.
  std::unique_ptr<device::Graph> graph;
  if (how.graph > 0) {
    graph = std::make_unique<device::Graph>();
    graph->begin(stream);
    for (size_t i = 0; i < iters; ++i) callColl(comm, c, p.send, p.recv, at);
    graph->end();
  }
  comm.bootstrap().barrier();
  const auto t0 = Clock::now();
  if (graph) {
    for (int l = 0; l < how.graph; ++l) {
      graph->launch(stream);
      if (how.blocking) device::synchronize(stream);
    }
  } else {
    for (size_t i = 0; i < iters; ++i) {
      callColl(comm, c, p.send, p.recv, at);
      if (at.device && how.blocking) device::synchronize(stream);
    }
  }
  if (at.device) device::synchronize(stream);
  m.us = usSince(t0) / static_cast<double>(iters * static_cast<size_t>(graph ? how.graph : 1));
  if (how.check) {
    // A separate iteration with fresh inputs (as nccl-tests), so that the check neither
    // disturbs the timing nor passes on data left by an earlier size; with -G it is a graph of
    // one call too, so that what runs from a graph is checked.
    c.seed = ++rep;
    prepare(c, buf, inPlace);
    if (how.graph > 0) {
      device::Graph once;
      once.begin(stream);
      callColl(comm, c, p.send, p.recv, at);
      once.end();
      once.launch(stream);
    } else {
      callColl(comm, c, p.send, p.recv, at);
    }
    if (at.device) device::synchronize(stream);
    m.wrong = countWrong(c, buf.result(p.result, recvElements(c) * sizeOf(c.type)));
  }
  return m;
}

// The count argument of the call for `bytes` of the whole buffer, nccl-tests' convention:
// allgather, reducescatter and alltoall split the buffer between the ranks.
size_t countFor(CollKind kind, size_t bytes, DataType type, int nranks) {
  const size_t elements = bytes / sizeOf(type);
  switch (kind) {
    case CollKind::AllGather:
    case CollKind::ReduceScatter:
    case CollKind::AllToAll:
      return elements / static_cast<size_t>(nranks);
    default:
      return elements;
  }
}

struct RankRecord {
  int32_t pid = 0;
  char host[60] = {};
  int32_t device = -1;  // --memory cuda: the rank's CUDA device
  int32_t pciBus = 0;
  char deviceName[64] = {};
};

struct RankResult {
  double outUs = 0;
  double inUs = 0;
  int64_t outWrong = 0;
  int64_t inWrong = 0;
};

std::vector<DataType> typesOf(const CollOptions& opt) {
  if (opt.datatype == "all") return kAllTypes;
  return {*parseDataType(opt.datatype)};
}

std::vector<ReduceOp> opsOf(CollKind kind, const CollOptions& opt) {
  if (!isReducing(kind)) return {ReduceOp::Sum};  // unused; printed as "none"
  if (opt.redop == "all") return kAllOps;
  return {*parseReduceOp(opt.redop)};
}

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
           : fmt::format("host ({})", opt.alloc == "strata" ? "strata's allocator" : "malloc");
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

// "cuda/oneshot (grid 8 block 512)"; the name alone when the algorithm launched no kernel.
std::string algorithmText(const std::string& algorithm, const std::string& launch) {
  return launch.empty() ? algorithm : fmt::format("{} ({})", algorithm, launch);
}

int runColl(CollKind kind, const CollOptions& opt) {
  const std::vector<size_t> sizes = collSizes(opt);
  const bool cuda = opt.memory == "cuda";
  if (opt.graph > 0 && !cuda) {
    throw CLI::ValidationError(
        "-G/--cudagraph needs --memory cuda: a CUDA graph captures work enqueued on a stream, and "
        "host memory collectives run on the CPU before they return");
  }
  if (cuda && opt.alloc == "strata") {
    throw CLI::ValidationError(
        "--alloc strata allocates host memory; with --memory cuda the buffers come from "
        "cudaMalloc (leave --alloc out)");
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

    const bool check = opt.check != 0;
    Issue how;
    how.check = check;
    how.at = at;
    how.blocking = opt.blocking != 0;
    how.graph = opt.graph;
    const double factor = busBwFactor(kind, nranks);
    int64_t totalWrong = 0;
    double busbwSum = 0;
    size_t busbwCount = 0;
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

          CollRow row;
          row.op = collName(kind);
          row.bytes = wholeBytes(c);
          row.count = c.count;
          row.type = std::string(toString(type));
          row.redop = isReducing(kind) ? std::string(toString(op)) : std::string("none");
          row.root = c.root;
          row.algorithm = comm->lastAlgorithm();
          row.launch = comm->lastLaunch();
          const std::string algorithm = algorithmText(row.algorithm, row.launch);
          if (out && algorithm != lastAlgorithm) {
            out->comment(fmt::format("algorithm: {}", algorithm));
            lastAlgorithm = algorithm;
          }
          auto fill = [&](CollResult& res, bool inPlace) {
            double us = 0;
            int64_t wrong = 0;
            for (const RankResult& r : all) {
              us += inPlace ? r.inUs : r.outUs;
              wrong += inPlace ? r.inWrong : r.outWrong;
            }
            res.measured = true;
            res.timeUs = us / nranks;
            res.algbw = res.timeUs > 0 ? static_cast<double>(row.bytes) / (res.timeUs * 1e3) : 0;
            res.busbw = res.algbw * factor;
            res.wrong = check ? wrong : -1;
            totalWrong += wrong;
            busbwSum += res.busbw;
            ++busbwCount;
          };
          fill(row.outOfPlace, false);
          if (hasInPlace(kind)) fill(row.inPlace, true);
          if (out) out->row(row);
        }
      }
    }

    if (out) {
      out->line(
          fmt::format("# Out of bounds values : {} {}", totalWrong, totalWrong ? "FAILED" : "OK"));
      out->line(fmt::format("# Avg bus bandwidth    : {:g} ",
                            busbwCount ? busbwSum / static_cast<double>(busbwCount) : 0.0));
      out->line("#");
    }
    boot->barrier();
    return totalWrong ? 1 : 0;
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
                  "host buffers from malloc or from strata's allocator (Context::allocate)")
      ->check(CLI::IsMember({"malloc", "strata"}))
      ->capture_default_str();
  cmd->add_option("--label", opt->label, "\"label\" of the JSON rows (names the run in plots)")
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
