#include "tests/gpu/cuda_collectives/world.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "tests/gpu/cuda_collectives/cases.hpp"
#include "tests/gpu/cuda_collectives/harness.hpp"
#include "tests/gpu/cuda_collectives/thread_bootstrap.hpp"

namespace cuda_coll_test {
namespace {

/// Results of one phase, over all ranks.
struct PhaseResult {
  explicit PhaseResult(std::string phase = {}) : name(std::move(phase)) {}
  std::string name;
  long checks = 0;
  long failed = 0;
  bool aborted = false;
  double seconds = 0;
  std::map<std::string, long> algorithms;  ///< rank 0's calls by algorithm
};

struct World {
  int n;
  std::shared_ptr<Hub> hub;
  /// [slot][rank]: every rank's input of a call. Single calls alternate slots 0 and 1 by
  /// parity; the calls of a burst or a graph take slots 2, 3, ...
  std::vector<std::vector<std::vector<char>>> in;
  std::mutex mu;
  std::vector<PhaseResult> phases;  ///< in order of first report
  std::atomic<bool> stop{false};    ///< a rank failed hard: the others leave

  explicit World(int ranks)
      : n(ranks),
        hub(std::make_shared<Hub>(ranks, 60.0)),
        in(2 + kMaxGroup, std::vector<std::vector<char>>(static_cast<size_t>(ranks))) {}

  void merge(const PhaseResult& r, int rank) {
    std::lock_guard<std::mutex> lock(mu);
    auto it = std::find_if(phases.begin(), phases.end(),
                           [&](const PhaseResult& p) { return p.name == r.name; });
    if (it == phases.end()) {
      phases.push_back(PhaseResult{r.name});
      it = phases.end() - 1;
    }
    it->checks += r.checks;
    it->failed += r.failed;
    it->aborted |= r.aborted;
    it->seconds = std::max(it->seconds, r.seconds);
    if (rank == 0) it->algorithms = r.algorithms;
  }
};

std::atomic<int> gPrinted{0};
constexpr int kMaxPrinted = 40;
std::mutex gPrintMu;

void report(const std::string& line) {
  const int k = gPrinted.fetch_add(1);
  if (k >= kMaxPrinted) return;
  std::lock_guard<std::mutex> lock(gPrintMu);
  std::printf("%s\n", line.c_str());
  if (k == kMaxPrinted - 1) std::printf("(further failures are not printed)\n");
  std::fflush(stdout);
}

uint64_t splitmix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

std::string hexElem(const char* p, size_t es) {
  std::string s = "0x";
  for (size_t i = es; i-- > 0;) s += fmt::format("{:02x}", static_cast<uint8_t>(p[i]));
  return s;
}

/// One rank of a world: its communicator, buffers and the running phase's counts.
class Rank {
 public:
  Rank(World& w, int rank, std::shared_ptr<ThreadBootstrap> boot)
      : w_(w), rank_(rank), n_(w.n), boot_(std::move(boot)) {}
  ~Rank() {
    mem_.release(a_);
    mem_.release(b_);
    for (char* p : {bounceIn_, bounceGarbage_, bounceOut_}) mem_.releaseBounce(p);
    if (mem_.stream != nullptr) cudaStreamDestroy(mem_.stream);
  }

  void run() {
    mem_.device = !gOpt.host;
    if (mem_.device) {
      CUDA_CHECK(cudaSetDevice(0));
      CUDA_CHECK(cudaStreamCreateWithFlags(&mem_.stream, cudaStreamNonBlocking));
    }
    std::vector<std::pair<std::string, std::vector<Case>>> phases;
    phases.emplace_back("auto", autoCases(n_));
    if (!gOpt.host) {
      for (const AlgoSpec& a : kAlgos) {
        phases.emplace_back(std::string("forced ") + a.name, forcedCases(n_, a));
      }
    }
    // Buffers for the largest call or group of calls, allocated once: cudaFree synchronizes
    // the device, which would wait for other ranks' kernels.
    size_t cap = layout(graphCases(), n_, nullptr);
    for (int b = 0; b < kBursts; ++b) cap = std::max(cap, layout(burstCases(n_, b), n_, nullptr));
    for (const auto& [name, cases] : phases) {
      for (const Case& c : cases) cap = std::max(cap, layout({c}, n_, nullptr));
    }
    cap_ = cap;
    a_ = mem_.allocate(cap_);
    b_ = mem_.allocate(cap_);
    bounceIn_ = mem_.allocateBounce(cap_);
    bounceGarbage_ = mem_.allocateBounce(cap_);
    bounceOut_ = mem_.allocateBounce(cap_);

    for (size_t p = 0; p < phases.size() && !w_.stop; ++p) {
      const bool isAuto = p == 0;
      const AlgoSpec* forced = isAuto ? nullptr : &kAlgos[p - 1];
      std::unique_ptr<Communicator> comm;
      try {
        comm = Communicator::create(boot_, config(forced));
        checkListing(*comm, forced);
        runPhase(*comm, phases[p].first, phases[p].second);
        if (isAuto && !w_.stop) burstPhase(*comm);
        if (isAuto && !gOpt.host && !w_.stop) graphPhase(*comm);
        // Every rank's kernels are done before any rank destroys its scratch.
        mem_.sync();
        boot_->barrier();
      } catch (const std::exception& e) {
        // The others leave before this rank's communicator goes (its destructor may wait for
        // their kernels, which wait for this rank until it stops them or wait_limit).
        w_.stop = true;
        boot_->abort(e.what());
        throw;
      }
      comm.reset();
      boot_->barrier();
    }
  }

  /// Counts the running phase as cut short (an error here or in another rank).
  void leavePhase() {
    phase_.aborted = true;
    if (!phase_.name.empty()) w_.merge(phase_, rank_);
  }
  /// The rank's part of a failure that ended it early.
  void failPhase(const std::string& why) {
    report(fmt::format("FAIL N={} rank {} [{}]: {}", n_, rank_,
                       phase_.name.empty() ? "set-up" : phase_.name, why));
    leavePhase();
  }

 private:
  Config config(const AlgoSpec* forced) const {
    Config c = Config::load();
    if (gOpt.host) {
      c.set("collectives.modules", "none");
      return c;
    }
    c.set("collectives.modules", "cuda");  // an error at create if it does not load
    c.set("collectives.cuda.max_blocks", std::to_string(gMaxBlocks));
    c.set("collectives.cuda.oneshot_max_bytes", "16K");  // kOneShotMax
    c.set("collectives.cuda.twoshot_max_bytes", "2M");   // kTwoShotMax
    c.set("collectives.cuda.packets_max_bytes", "64K");  // kPacketsMax
    c.set("collectives.cuda.staging_bytes", "8M");
    // A kernel that waits for a rank that never comes gives up within a lease's budget (the
    // default, 600 s, lets a late rank be late; this check has no late ranks).
    c.set("collectives.cuda.wait_limit", "60");
    if (forced != nullptr) {
      for (Op op : forced->ops) c.set(forceKey(op), forced->name);
      if (!forced->packets) c.set("collectives.cuda.staging_bytes", "256K");  // many chunks
    }
    return c;
  }

  /// The module lists the algorithms and ops this test knows, and forcing took (rank 0 checks).
  void checkListing(const Communicator& comm, const AlgoSpec* forced) {
    if (rank_ != 0 || gOpt.host) return;
    std::set<std::string> seen;
    for (const auto& info : comm.algorithms()) {
      if (info.backend != "cuda") continue;
      // The cross-host family serves ranks on several hosts only (this test runs on one), with
      // direct-staged's ops; no phase forces it.
      if (info.name == "cross-host") {
        if (!info.forcedFor.empty()) {
          listingFailure("cuda/cross-host is forced, although no phase forces it");
        }
        continue;
      }
      seen.insert(info.name);
      const AlgoSpec* spec = nullptr;
      for (const AlgoSpec& a : kAlgos) {
        if (info.name == a.name) spec = &a;
      }
      if (spec == nullptr) {
        listingFailure(fmt::format("cuda/{} is not known to this test", info.name));
        continue;
      }
      std::set<std::string> want, have(info.ops.begin(), info.ops.end());
      for (Op op : spec->ops) {
        for (auto& s : apiOps(op)) want.insert(s);
      }
      if (want != have) {
        listingFailure(fmt::format("cuda/{} lists ops [{}], the test expects [{}]", info.name,
                                   fmt::join(have, ", "), fmt::join(want, ", ")));
      }
      std::set<std::string> forcedFor(info.forcedFor.begin(), info.forcedFor.end());
      const std::set<std::string> wantForced =
          forced != nullptr && forced == spec ? want : std::set<std::string>{};
      if (forcedFor != wantForced) {
        listingFailure(fmt::format("cuda/{} is forced for [{}], the test expects [{}]", info.name,
                                   fmt::join(forcedFor, ", "), fmt::join(wantForced, ", ")));
      }
    }
    for (const AlgoSpec& a : kAlgos) {
      if (!seen.count(a.name)) listingFailure(fmt::format("cuda/{} is not listed", a.name));
    }
  }
  void listingFailure(const std::string& why) {
    ++listingFailures_;
    report(fmt::format("FAIL N={} rank {}: Communicator::algorithms(): {}", n_, rank_, why));
  }

  void runPhase(Communicator& comm, const std::string& name, const std::vector<Case>& cases) {
    const auto start = Clock::now();
    phase_ = PhaseResult{name};
    phase_.failed += listingFailures_;
    listingFailures_ = 0;
    for (size_t i = 0; i < cases.size() && !w_.stop; ++i) runCase(comm, cases[i], i);
    finishPhase(start);
  }

  /// Checks the algorithm of the call just made; false (and reported) when wrong.
  bool checkAlgorithm(const Communicator& comm, const Case& c, const std::string& what) {
    const std::string got = comm.lastAlgorithm();
    ++phase_.algorithms[got];
    const std::string prefix = gOpt.host ? "host/" : "cuda/";
    if (got.rfind(prefix, 0) != 0 || (!c.expect.empty() && got != c.expect)) {
      report(fmt::format("FAIL N={} rank {} [{}] {}: ran by '{}', expected {}", n_, rank_,
                         phase_.name, what, got, c.expect.empty() ? prefix + "*" : c.expect));
      return false;
    }
    if (gOpt.host) return true;
    // "<kernel> grid G block B": G within max_blocks keeps every rank's blocks co-resident.
    const std::string shape = comm.lastLaunch();
    unsigned grid = 0, block = 0;
    const size_t at = shape.find(" grid ");
    if (at == std::string::npos ||
        std::sscanf(shape.c_str() + at, " grid %u block %u", &grid, &block) != 2 || grid < 1 ||
        grid > static_cast<unsigned>(gMaxBlocks) || block < 32 || block > 512) {
      report(
          fmt::format("FAIL N={} rank {} [{}] {}: launch '{}' is not within grid 1..{}, "
                      "block 32..512",
                      n_, rank_, phase_.name, what, shape, gMaxBlocks));
      return false;
    }
    return true;
  }

  /// The expected output of rank r for c, from every rank's input.
  void expected(const Case& c, const std::vector<std::vector<char>>& in, std::vector<char>& out) {
    const size_t bytes = c.bytes();
    out.resize(c.recvElems(n_) * elemSize(c.type));
    std::vector<const char*> ins(static_cast<size_t>(n_));
    switch (c.op) {
      case Op::AllReduce:
        for (int q = 0; q < n_; ++q) ins[q] = in[q].data();
        strata::testing::reference(c.type, c.redop, ins, c.count, out.data());
        break;
      case Op::ReduceScatter:
        for (int q = 0; q < n_; ++q) ins[q] = in[q].data() + rank_ * bytes;
        strata::testing::reference(c.type, c.redop, ins, c.count, out.data());
        break;
      case Op::AllGather:
        for (int q = 0; q < n_; ++q) std::memcpy(out.data() + q * bytes, in[q].data(), bytes);
        break;
      case Op::Broadcast:
        std::memcpy(out.data(), in[c.root].data(), bytes);
        break;
      case Op::AllToAll:
        for (int q = 0; q < n_; ++q) {
          std::memcpy(out.data() + q * bytes, in[q].data() + rank_ * bytes, bytes);
        }
        break;
      case Op::SendRecv:
        std::memcpy(out.data(), in[(rank_ - c.root + n_) % n_].data(), bytes);
        break;
    }
  }

  /// Compares bit for bit; reports the first difference.
  bool compare(const std::string& what, DataType t, const char* got,
               const std::vector<char>& want) {
    if (want.empty() || std::memcmp(got, want.data(), want.size()) == 0) return true;
    const size_t es = elemSize(t);
    size_t wrong = 0, first = want.size();
    for (size_t i = 0; i < want.size(); ++i) {
      if (got[i] != want[i]) {
        ++wrong;
        first = std::min(first, i);
      }
    }
    const size_t e = first / es;
    report(fmt::format(
        "FAIL N={} rank {} [{}] {}: {} of {} bytes differ, first in element {}: got {}, "
        "expected {}",
        n_, rank_, phase_.name, what, wrong, want.size(), e, hexElem(got + e * es, es),
        hexElem(want.data() + e * es, es)));
    return false;
  }

  /// A case placed in the buffers: its byte offsets in a_ and b_ (and in the bounce buffers),
  /// the pointers passed to the call, and after the call what to compare.
  struct Placed {
    Case c;
    size_t aAt = 0, bAt = 0;
    char* send = nullptr;
    char* recv = nullptr;
    const char* got = nullptr;
    std::vector<char> want;
  };

  /// Places cases one after another in a_ and b_ (layout()).
  std::vector<Placed> place(const std::vector<Case>& cases) const {
    std::vector<std::pair<size_t, size_t>> at;
    const size_t need = layout(cases, n_, &at);
    if (need > cap_) {
      throw std::logic_error(
          fmt::format("the calls need {} bytes, the buffers have {}", need, cap_));
    }
    std::vector<Placed> out(cases.size());
    for (size_t i = 0; i < cases.size(); ++i) {
      out[i].c = cases[i];
      std::tie(out[i].aAt, out[i].bAt) = at[i];
    }
    return out;
  }

  /// This rank's input for call slot i of a group (call parity alternates single calls).
  std::vector<char>& input(size_t slot) { return w_.in[slot][rank_]; }

  /// Draws this rank's input and the garbage its output buffer starts with.
  std::vector<char> draw(const Case& c, size_t slot) {
    std::mt19937_64 rng(splitmix(splitmix(calls_++ * 1000 + n_) ^ static_cast<uint64_t>(rank_)));
    input(slot) = strata::testing::randomData(rng, c.type, c.sendElems(n_));
    return strata::testing::randomData(rng, c.type, c.recvElems(n_));
  }

  /// Enqueues the copies of input and garbage into the case's buffers; sets its pointers. The
  /// bounce buffers are used at the call's own offsets (inputs at its send offset, which is
  /// reserved in place too), so the calls of a group never share bounce bytes.
  void upload(Placed& p, const std::vector<char>& mine, const std::vector<char>& garbage) {
    const Case& c = p.c;
    p.send = a_ + p.aAt;
    p.recv = b_ + p.bAt;
    if (c.op == Op::ReduceScatter && c.inPlace) {
      mem_.toDevice(p.recv, mine.data(), mine.size(), bounceIn_ + p.aAt);  // output: a window
      p.send = p.recv;
      p.recv = p.send + rank_ * c.bytes();
      return;
    }
    mem_.toDevice(p.recv, garbage.data(), garbage.size(), bounceGarbage_ + p.bAt);
    if (c.inPlace) {
      p.send = c.op == Op::AllGather ? p.recv + rank_ * c.bytes() : p.recv;
      if (c.op != Op::Broadcast || rank_ == c.root) {
        mem_.toDevice(p.send, mine.data(), mine.size(), bounceIn_ + p.aAt);
      }
    } else {
      mem_.toDevice(p.send, mine.data(), mine.size(), bounceIn_ + p.aAt);
    }
  }

  /// Makes the call (send/recv: both, in a deadlock-free order); checks who ran it.
  bool call(Communicator& comm, const Placed& p, const std::string& what) {
    const Case& c = p.c;
    const strata::Stream s = mem_.handle();
    switch (c.op) {
      case Op::AllReduce:
        comm.allReduce(p.send, p.recv, c.count, c.type, c.redop, s);
        break;
      case Op::ReduceScatter:
        comm.reduceScatter(p.send, p.recv, c.count, c.type, c.redop, s);
        break;
      case Op::AllGather:
        comm.allGather(p.send, p.recv, c.count, c.type, s);
        break;
      case Op::Broadcast:
        comm.broadcast(c.nullSend && rank_ != c.root ? nullptr : p.send, p.recv, c.count, c.type,
                       c.root, s);
        break;
      case Op::AllToAll:
        comm.allToAll(p.send, p.recv, c.count, c.type, s);
        break;
      case Op::SendRecv: {
        // A send kernel waits for the matching recv: even ranks send first, odd ranks receive
        // first (the shifts are odd, so every pair is one even and one odd rank).
        const int to = (rank_ + c.root) % n_, from = (rank_ - c.root + n_) % n_;
        bool ok = true;
        for (int step = 0; step < 2; ++step) {
          if ((step == 0) == (rank_ % 2 == 0)) {
            comm.send(p.send, c.count, c.type, to, s);
          } else {
            comm.recv(p.recv, c.count, c.type, from, s);
          }
          ok = checkAlgorithm(comm, c, what) && ok;
        }
        return ok;
      }
    }
    return checkAlgorithm(comm, c, what);
  }

  /// Computes the expected output (overlapping the kernels) and enqueues the copy back.
  void collect(Placed& p, size_t slot) {
    expected(p.c, w_.in[slot], p.want);
    p.got = mem_.fetch(p.recv, p.want.size(), bounceOut_ + p.bAt);
  }

  /// After sync(): one check.
  void verdict(const Placed& p, const std::string& what, bool algoOk) {
    const bool ok = compare(what, p.c.type, p.got, p.want) && algoOk;
    ++phase_.checks;
    if (!ok) ++phase_.failed;
  }

  /// One call, alone: input slots alternate by parity, so one barrier per call suffices (a
  /// rank writes a slot again only after the next call's barrier, when every rank has folded
  /// this call).
  void runCase(Communicator& comm, const Case& c, size_t index) {
    const std::string what = c.describe();
    gProgress.set(rank_, fmt::format("[{}] case {}: {}", phase_.name, index, what));
    const size_t slot = calls_ & 1;
    const std::vector<char> garbage = draw(c, slot);
    boot_->barrier();  // every input is written
    Placed p = place({c}).front();
    upload(p, input(slot), garbage);
    const bool algoOk = call(comm, p, what);
    collect(p, slot);
    mem_.sync();
    verdict(p, what, algoOk);
  }

  /// Several calls enqueued back to back and synchronized once, so that ranks run calls ahead
  /// of each other and algorithms switch from call to call (the epochs and the parity double
  /// buffering on a real GPU). kBursts bursts of twelve calls, each in an order of its own.
  void burstPhase(Communicator& comm) {
    const auto start = Clock::now();
    phase_ = PhaseResult{"burst"};
    for (int b = 0; b < kBursts && !w_.stop; ++b) {
      std::vector<Case> cases = burstCases(n_, b);
      std::vector<Placed> placed = place(cases);
      std::vector<std::vector<char>> garbage;
      for (size_t i = 0; i < placed.size(); ++i) garbage.push_back(draw(placed[i].c, 2 + i));
      boot_->barrier();  // every input is written
      std::vector<bool> algoOk;
      for (size_t i = 0; i < placed.size(); ++i) {
        upload(placed[i], input(2 + i), garbage[i]);
        const std::string what = fmt::format("burst {} call {}: {}", b, i, placed[i].c.describe());
        gProgress.set(rank_, "[burst] " + what);
        algoOk.push_back(call(comm, placed[i], what));
      }
      for (size_t i = 0; i < placed.size(); ++i) collect(placed[i], 2 + i);
      mem_.sync();
      for (size_t i = 0; i < placed.size(); ++i) {
        verdict(placed[i], fmt::format("burst {} call {}: {}", b, i, placed[i].c.describe()),
                algoOk[i]);
      }
      boot_->barrier();  // every rank has folded the inputs before they are replaced
    }
    finishPhase(start);
  }

  /// Three allReduces (one per algorithm) captured into a graph on every rank, replayed five
  /// times with new inputs; every replay's results are checked.
  void graphPhase(Communicator& comm) {
    const auto start = Clock::now();
    phase_ = PhaseResult{"graph"};
    std::vector<Placed> placed = place(graphCases());
    for (Placed& p : placed) {  // the pointers the graph keeps; inputs come before each replay
      p.send = a_ + p.aAt;
      p.recv = b_ + p.bAt;
      if (p.c.inPlace) p.send = p.recv;
    }

    boot_->barrier();  // nobody makes a call that global-mode capture forbids while others capture
    gProgress.set(rank_, "[graph] capturing");
    CUDA_CHECK(cudaStreamBeginCapture(mem_.stream, cudaStreamCaptureModeGlobal));
    bool algoOk = true;
    for (const Placed& p : placed) algoOk = call(comm, p, "captured " + p.c.describe()) && algoOk;
    cudaGraph_t graph = nullptr;
    CUDA_CHECK(cudaStreamEndCapture(mem_.stream, &graph));
    boot_->barrier();
    cudaGraphExec_t exec = nullptr;
    CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));

    for (int rep = 0; rep < 5 && !w_.stop; ++rep) {
      gProgress.set(rank_, fmt::format("[graph] replay {}", rep));
      std::vector<std::vector<char>> garbage;
      for (size_t i = 0; i < placed.size(); ++i) garbage.push_back(draw(placed[i].c, 2 + i));
      boot_->barrier();  // every input is written
      for (size_t i = 0; i < placed.size(); ++i) upload(placed[i], input(2 + i), garbage[i]);
      CUDA_CHECK(cudaGraphLaunch(exec, mem_.stream));
      for (size_t i = 0; i < placed.size(); ++i) collect(placed[i], 2 + i);
      mem_.sync();
      for (const Placed& p : placed) {
        verdict(p, fmt::format("replay {} of {}", rep, p.c.describe()), algoOk);
      }
      boot_->barrier();  // every rank has folded the inputs before they are replaced
    }
    CUDA_CHECK(cudaGraphExecDestroy(exec));
    CUDA_CHECK(cudaGraphDestroy(graph));
    finishPhase(start);
  }

  void finishPhase(Clock::time_point start) {
    phase_.seconds = std::chrono::duration<double>(Clock::now() - start).count();
    w_.merge(phase_, rank_);
    phase_.name.clear();
  }

 private:
  World& w_;
  const int rank_;
  const int n_;
  std::shared_ptr<ThreadBootstrap> boot_;
  Memory mem_;
  char* a_ = nullptr;  ///< send buffers (device memory)
  char* b_ = nullptr;  ///< recv buffers (device memory)
  char* bounceIn_ = nullptr;
  char* bounceGarbage_ = nullptr;
  char* bounceOut_ = nullptr;
  size_t cap_ = 0;
  uint64_t calls_ = 0;
  long listingFailures_ = 0;
  PhaseResult phase_;
};

}  // namespace

WorldResult runWorld(int n) {
  World w(n);
  gProgress.start(n);
  std::vector<std::thread> threads;
  std::atomic<int> hardFailures{0};
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&w, r, &hardFailures] {
      auto boot = std::make_shared<ThreadBootstrap>(w.hub, r);
      Rank rank(w, r, boot);
      try {
        rank.run();
        gProgress.set(r, "done");
      } catch (const std::exception& e) {
        // A rank that only saw another's abort says so once, without counting a failure.
        const auto* se = dynamic_cast<const Error*>(&e);
        if (se != nullptr && se->code() == ErrorCode::Aborted && w.stop) {
          gProgress.set(r, "left after another rank's failure");
          rank.leavePhase();
          return;
        }
        ++hardFailures;
        w.stop = true;
        rank.failPhase(e.what());
        gProgress.set(r, std::string("failed: ") + e.what());
        boot->abort(e.what());
      }
    });
  }
  for (auto& t : threads) t.join();

  bool ok = hardFailures == 0;
  for (const PhaseResult& p : w.phases) {
    std::string algos;
    for (const auto& [name, count] : p.algorithms) {
      algos += fmt::format("{}{} {}", algos.empty() ? "" : ", ", name, count);
    }
    const bool pass = p.failed == 0 && !p.aborted;
    ok = ok && pass;
    std::printf("N=%d %-20s %s %ld of %ld checks passed%s in %.1f s (rank 0: %s)\n", n,
                p.name.c_str(), pass ? "PASS" : "FAIL", p.checks - p.failed, p.checks,
                p.aborted ? ", ABORTED" : "", p.seconds, algos.c_str());
  }
  if (w.phases.empty()) std::printf("N=%d FAIL before any phase ran\n", n);
  std::fflush(stdout);
  return {ok && !w.phases.empty(), hardFailures > 0};
}

}  // namespace cuda_coll_test
