// The engine's set-up, collective over the context's ranks: the slot geometry and its check,
// the pairing of every two ranks (connections, receive areas, semaphore words), the proxy for
// peers whose memory is not mapped here, and the probes of reading peers' memory directly.

#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cstring>

#include <fmt/format.h>

#include <strata/error.hpp>

#include "base/config_keys.hpp"
#include "base/log.hpp"
#include "base/wire.hpp"
#include "engine.hpp"
#include "stream_copy.hpp"

namespace strata::collectives {

namespace {

/// Entries of the proxy FIFO of proxied links (triggers in flight before a push waits).
constexpr uint32_t kProxyFifoEntries = 1024;
/// The default chunk when the ranks span several hosts.
constexpr size_t kNetChunkBytes = 256 * 1024;
/// Spin before yielding in the progress loop (0 when the host's ranks outnumber its CPUs).
constexpr int kSpinMicros = 10;

/// The ranks of rank's host (its group of the context's host groups).
const std::vector<int>& hostOf(const std::vector<std::vector<int>>& hosts, int rank) {
  for (const auto& g : hosts) {
    if (std::find(g.begin(), g.end(), rank) != g.end()) return g;
  }
  throw Error(ErrorCode::Internal, fmt::format("rank {} is in no host group", rank));
}

/// Maps every page of [p, p + bytes) writable in this process now (MADV_POPULATE_WRITE, Linux
/// 5.14), so that the first calls do not take a page fault per 4 KiB of slot they touch: the
/// first 4 allGathers of 512 KiB per rank at 2 ranks (each in a new slot) averaged 490-533 us
/// without and 100-195 with (steady state 36-44; the rest is the user's fresh buffers), and the
/// measured choice (measured_choice.hpp) would otherwise time those faults against the slots.
/// The cost moves to create: about 7 ms for an 8 MiB area and 2.6 ms per 8 MiB of peer regions
/// on one AMD EPYC VM. The contents stay as they are. Where the kernel does not have it, the
/// pages fault in on first use, as before.
void prefault(void* p, size_t bytes) {
#ifndef MADV_POPULATE_WRITE
  constexpr int MADV_POPULATE_WRITE = 23;
#endif
  if (!p || bytes == 0) return;
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const auto start = reinterpret_cast<uintptr_t>(p) & ~(page - 1);
  const auto end = reinterpret_cast<uintptr_t>(p) + bytes;
  if (madvise(reinterpret_cast<void*>(start), end - start, MADV_POPULATE_WRITE) != 0) {
    STRATA_LOG(Debug, "coll",
               "madvise(MADV_POPULATE_WRITE) of {} bytes: {} (pages fault in on "
               "first use)",
               end - start, std::strerror(errno));
  }
}

}  // namespace

Engine::Engine(std::shared_ptr<Context> context, const Config& config)
    : context_(std::move(context)) {
  rank_ = context_->rank();
  size_ = context_->size();
  timeout_ = config::getDouble(config, "transport.timeout");
  singleCopyMin_ = static_cast<size_t>(config::getInt(config, "collectives.single_copy_min_bytes"));
  netDirect_ = config::getString(config, "collectives.net_path") != "proxy";
  allRanks_.resize(static_cast<size_t>(size_));
  for (int r = 0; r < size_; ++r) allRanks_[r] = r;
  links_.resize(static_cast<size_t>(size_));
  out_.resize(static_cast<size_t>(size_));
  hosts_ = context_->hostGroups();
  // Across hosts the network is slower than a copy, and smaller pieces overlap the transfer
  // with the copy and reduction on each side: allReduce at 2 ranks on two namespace nodes ran
  // 5-25 % faster at 1-16 MiB with 256 KiB chunks than with 1 MiB (docs/benchmarks.md). Every
  // rank sees the same host groups, so every rank cuts its slots the same way.
  auto chunk = static_cast<size_t>(config::getInt(config, "collectives.chunk_bytes"));
  if (hosts_.size() > 1 && config::source(config, "collectives.chunk_bytes") == "default") {
    chunk = std::min(chunk, kNetChunkBytes);
  }
  slots_ = slotGeometry(static_cast<size_t>(config::getInt(config, "collectives.buffer_bytes")),
                        chunk, size_, rank_);
  chooseStreaming(config);
  if (size_ == 1) {
    tuning_.source = "not needed: one rank, no peer to read from";
    return;
  }
  // Before anything is connected: a rank of another geometry would write past its peers' slots.
  requireSameGeometry(context_->bootstrap(), slots_);

  area_ = context_->allocate(slots_.areaBytes);
  flags_ = context_->allocate(Link::flagBytes(size_));
  prefault(area_.data(), slots_.areaBytes);
  connectLinks();
  if (proxy_) proxy_->start();
  probePeerAccess(config);
  tune(config);
  STRATA_LOG(Debug, "coll",
             "host collectives: {} ranks, chunk {} B, {} slots per peer, {} peers "
             "not mapped ({})",
             size_, slots_.chunkBytes, slots_.depth,
             std::count_if(links_.begin(), links_.end(),
                           [](const Link& l) { return l.peer() >= 0 && !l.isMapped(); }),
             netDirect_ ? "written by the calling thread" : "through the proxy");
}

void Engine::connectLinks() {
  std::vector<int> peers;
  for (int p = 0; p < size_; ++p) {
    if (p != rank_) peers.push_back(p);
  }
  auto conns = context_->connect(peers);
  auto areas = context_->exchange(area_, peers);
  auto flags = context_->exchange(flags_, peers);
  for (size_t i = 0; i < peers.size(); ++i) {
    LinkEnds ends{rank_,
                  peers[i],
                  conns[i],
                  slots_,
                  static_cast<char*>(area_.data()),
                  static_cast<char*>(flags_.data()),
                  areas[i],
                  flags[i]};
    if (rank_ == 0 && peers[i] == 1)
      probePeerView_ = static_cast<const char*>(areas[i].hostPointer());
    if (Link::mappable(ends)) {
      links_[peers[i]] = Link::mapped(ends);
      // This rank's region of the peer's area, which it writes.
      prefault(static_cast<char*>(areas[i].hostPointer()) + slots_.regionOffset(rank_),
               slots_.regionBytes());
      continue;
    }
    if (!staging_) staging_ = context_->allocate(slots_.areaBytes);
    if (netDirect_) {
      links_[peers[i]] = Link::direct(ends, staging_);
      bool seen = false;
      for (int p : progressPeers_) seen = seen || links_[p].transport() == conns[i]->transport();
      if (!seen) progressPeers_.push_back(peers[i]);
      continue;
    }
    if (!proxy_) {
      proxy_ = std::make_unique<ProxyService>(kProxyFifoEntries, timeout_);
      proxy_->pinTo(context_->proxyCpus());  // near this rank's NIC (transport.proxy_cpus)
    }
    links_[peers[i]] = Link::proxied(ends, *proxy_, staging_, timeout_);
  }
}

namespace {

/// A page of memfd memory holding a probe word, for the zero-copy probe (not from the allocHost
/// registry: probing must not count as an allocation or a free).
struct ProbeFile {
  int fd = -1;
  uint64_t inode = 0;
  void* page = MAP_FAILED;
  size_t bytes = 0;
  explicit ProbeFile(uint64_t word) {
    bytes = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    fd = memfd_create("strata-probe", MFD_CLOEXEC);
    struct stat st {};
    if (fd < 0 || ftruncate(fd, static_cast<off_t>(bytes)) != 0 || fstat(fd, &st) != 0) return;
    inode = static_cast<uint64_t>(st.st_ino);
    page = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (page != MAP_FAILED) std::memcpy(page, &word, sizeof word);
  }
  ~ProbeFile() {
    if (page != MAP_FAILED) munmap(page, bytes);
    if (fd >= 0) ::close(fd);
  }
  ProbeFile(const ProbeFile&) = delete;
  ProbeFile& operator=(const ProbeFile&) = delete;
  bool ok() const { return page != MAP_FAILED; }
};

}  // namespace

void Engine::probePeerAccess(const Config& config) {
  const bool singleWanted = config::getString(config, "collectives.single_copy") != "off";
  const bool zeroWanted = config::getString(config, "collectives.zero_copy") != "off";
  pids_.assign(size_, 0);
  for (int p = 0; p < size_; ++p) pids_[p] = context_->pid(p);
  maps_ = std::make_unique<PeerMaps>(size_);
  mapFailureSaid_.assign(static_cast<size_t>(size_), 0);
  bool allMapped = true;
  for (int p = 0; p < size_; ++p) allMapped &= p == rank_ || links_[p].isMapped();
  ProbeFile file(probeWord_);
  // Every rank tries to read every peer's probe word both ways (process_vm_readv; mapping the
  // peer's memfd); each way is used only when all pairs of the job can, so that every rank
  // picks the same algorithms. Record per rank: probe word address, memfd fd, its inode, and the
  // receive area's address (for the tuning probe).
  constexpr size_t kMaskBytes = 128;  // CPUs 0..1023 this rank may run on
  constexpr size_t kRecord = 32 + kMaskBytes;
  std::vector<uint8_t> records(kRecord * static_cast<size_t>(size_));
  uint8_t* mine = records.data() + kRecord * static_cast<size_t>(rank_);
  wire::storeLe(mine, reinterpret_cast<uint64_t>(&probeWord_));
  wire::storeLe(mine + 8, static_cast<int64_t>(file.ok() ? file.fd : -1));
  wire::storeLe(mine + 16, file.inode);
  wire::storeLe(mine + 24, reinterpret_cast<uint64_t>(area_.data()));
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  if (sched_getaffinity(0, sizeof cpus, &cpus) != 0) CPU_ZERO(&cpus);
  for (size_t cpu = 0; cpu < 8 * kMaskBytes; ++cpu) {
    if (CPU_ISSET(cpu, &cpus)) mine[32 + cpu / 8] |= static_cast<uint8_t>(1u << (cpu % 8));
  }
  context_->bootstrap().allGather(records.data(), kRecord);
  // The CPUs the ranks of this host may use together: ranks bound one per core each have
  // their own, although each one's affinity shows a single CPU.
  const std::vector<int>& local = hostOf(hosts_, rank_);
  std::vector<uint8_t> hostMask(kMaskBytes);
  for (int p : local) {
    for (size_t b = 0; b < kMaskBytes; ++b) {
      hostMask[b] |= records[kRecord * static_cast<size_t>(p) + 32 + b];
    }
  }
  hostCores_ = 0;
  for (uint8_t byte : hostMask) hostCores_ += std::popcount(byte);
  // Spinning only helps while every rank of this host has a CPU of its own.
  const int localRanks = static_cast<int>(local.size());
  spinUs_ = localRanks > std::max(hostCores_, 1) ? 0 : kSpinMicros;
  // Decisions every rank must take alike use it only when all ranks share this host.
  if (localRanks != size_) hostCores_ = 0;
  if (size_ > 1) probePeerArea_ = wire::loadLe<uint64_t>(records.data() + kRecord + 24);
  uint8_t single = singleWanted && allMapped;
  uint8_t zero = zeroWanted && allMapped && file.ok();
  for (int p = 0; p < size_ && (single || zero); ++p) {
    if (p == rank_) continue;
    const uint8_t* rec = records.data() + kRecord * static_cast<size_t>(p);
    if (single) {
      uint64_t value = 0;
      iovec local{&value, sizeof value};
      iovec remote{reinterpret_cast<void*>(wire::loadLe<uint64_t>(rec)), sizeof value};
      ssize_t n = process_vm_readv(pids_[p], &local, 1, &remote, 1, 0);
      const int err = errno;  // read before anything else can change it
      if (n != static_cast<ssize_t>(sizeof value) || value != probeWord_) {
        // errno means something only when the call failed; a short read or another value
        // leaves it stale.
        std::string why = n < 0 ? std::strerror(err)
                          : n != static_cast<ssize_t>(sizeof value)
                              ? fmt::format("short read ({} of {} bytes)", n, sizeof value)
                              : std::string("read a different value (not the probe word)");
        STRATA_LOG(Info, "coll", "single copy off: cannot read rank {}'s memory (pid {}): {}", p,
                   pids_[p], why);
        single = 0;
      }
    }
    if (zero) {
      const int64_t fd = wire::loadLe<int64_t>(rec + 8);
      std::string why = fd < 0 || fd > INT32_MAX
                            ? std::string("it could not create its probe memfd")
                            : PeerMaps::probe(pids_[p], static_cast<int>(fd),
                                              wire::loadLe<uint64_t>(rec + 16), probeWord_);
      if (!why.empty()) {
        STRATA_LOG(Info, "coll", "zero copy off: cannot map rank {}'s memory (pid {}): {}", p,
                   pids_[p], why);
        zero = 0;
      }
    }
  }
  std::vector<uint8_t> all(2 * static_cast<size_t>(size_));
  all[2 * rank_] = single;
  all[2 * rank_ + 1] = zero;
  context_->bootstrap().allGather(all.data(), 2);
  singleCopy_ = zeroCopy_ = true;
  for (int p = 0; p < size_; ++p) {
    singleCopy_ &= all[2 * p] != 0;
    zeroCopy_ &= all[2 * p + 1] != 0;
  }
}

void Engine::chooseStreaming(const Config& config) {
  const std::string mode = config::getString(config, "collectives.stream_copy");
  if (mode == "always") {
    streamMin_ = 0;
    streamWhy_ = "streaming copies: always (collectives.stream_copy = always)";
  } else if (mode == "off") {
    streamMin_ = UINT64_MAX;
    streamWhy_ = "streaming copies: never (collectives.stream_copy = off)";
  } else {
    const int ranksOnHost = static_cast<int>(hostOf(hosts_, rank_).size());
    streamMin_ = streamMinBytes(lastLevelCache(), ranksOnHost, &streamWhy_);
  }
}

void Engine::tune(const Config& config) {
  const std::string mode = config::getString(config, "collectives.tuning");
  // Whether the key was set is rank 0's answer on every rank (below): ranks may have the same
  // value from different sources, and must still take the same crossovers.
  singleCopyMinSet_ = config::source(config, "collectives.single_copy_min_bytes") != "default";
  auto finish = [&] {
    if (singleCopyMinSet_) {
      tuning_.choices.gatherSingleCopyMin = singleCopyMin_;
      tuning_.choices.why.push_back(
          fmt::format("allGather, reduceScatter, broadcast, allToAll: single copy from {} B, as "
                      "collectives.single_copy_min_bytes is set (on rank 0; here: {})",
                      singleCopyMin_, config::source(config, "collectives.single_copy_min_bytes")));
    }
  };
  auto defaults = [&](std::string source) {
    tuning_.choices = Choices{};
    tuning_.choices.gatherSingleCopyMin = singleCopyMin_;
    tuning_.choices.why = {
        fmt::format("allGather, reduceScatter, broadcast, allToAll: single copy from {} B "
                    "(collectives.single_copy_min_bytes)",
                    singleCopyMin_),
        "allReduce: never single copy (the slots' two-shot)"};
    tuning_.source = std::move(source);
  };
  if (!singleCopy_) {
    defaults("not needed: single copy is not available to this job");
    return;
  }
  if (mode == "off") {
    defaults("collectives.tuning = off: the configured crossovers");
    finish();
    return;
  }
  // Rank 0 finds the figures (cache or probe) and tells every rank, so that every rank takes
  // the same decisions. Message: u32 length of the encoded samples, the samples, u32 cores,
  // u16 length of the source text, the text, u16 length of the machine text, the text, u8 1 if
  // collectives.single_copy_min_bytes is set on rank 0.
  constexpr size_t kMessage = 1024;
  std::vector<uint8_t> msg(kMessage);
  const int local = static_cast<int>(hosts_.empty() ? size_ : hosts_[0].size());
  if (rank_ == 0) {
    MachineKey key = MachineKey::current(local);
    if (hostCores_ > 0) key.cores = hostCores_;
    std::vector<ProbeSample> samples;
    std::string source;
    auto file = tuningCacheFile();
    if (file) {
      std::string problem;
      if (auto cached = loadCachedSamples(*file, key, &problem)) {
        samples = std::move(*cached);
        source = fmt::format("cache {}", file->string());
      } else if (!problem.empty()) {
        STRATA_LOG(Warn, "coll", "host tuning cache ignored: {}", problem);
      }
    }
    if (samples.empty() && mode == "auto" && probePeerView_ && probePeerArea_) {
      const auto t0 = std::chrono::steady_clock::now();
      try {
        samples = probeReads(pids_[1], probePeerArea_, probePeerView_, slots_.areaBytes);
        const double ms =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                .count();
        source = fmt::format("measured at create in {:.1f} ms (rank 0 reading rank 1)", ms);
        if (file) {
          std::string failed = storeCachedSamples(*file, key, samples);
          if (!failed.empty()) {
            STRATA_LOG(Info, "coll", "host tuning cache not written: {}", failed);
          } else {
            source += fmt::format(", stored in {}", file->string());
          }
        }
      } catch (const Error& err) {
        STRATA_LOG(Warn, "coll", "host tuning probe failed, using the defaults: {}", err.what());
        samples.clear();
        source = fmt::format("probe failed ({})", err.what());
      }
    }
    if (samples.empty() && source.empty()) {
      source = mode == "cached" ? "collectives.tuning = cached, but the cache has no entry for "
                                  "this machine"
                                : "no same-host peer to measure";
    }
    wire::Writer w;
    const std::vector<uint8_t> enc = encodeSamples(samples);
    w.u32(static_cast<uint32_t>(enc.size())).raw(enc);
    w.u32(static_cast<uint32_t>(key.cores));
    const std::string text = key.text();
    w.u16(static_cast<uint16_t>(std::min<size_t>(source.size(), 400)))
        .raw({reinterpret_cast<const uint8_t*>(source.data()),
              std::min<size_t>(source.size(), 400)});
    w.u16(static_cast<uint16_t>(std::min<size_t>(text.size(), 300)))
        .raw({reinterpret_cast<const uint8_t*>(text.data()), std::min<size_t>(text.size(), 300)});
    w.u8(singleCopyMinSet_ ? 1 : 0);
    const auto& bytes = w.data();
    std::copy(bytes.begin(), bytes.end(), msg.begin());
  }
  context_->bootstrap().broadcast(msg.data(), msg.size(), 0);
  wire::Reader r(msg, "host tuning from rank 0");
  const uint32_t encBytes = r.u32("samples length");
  auto enc = r.raw(encBytes, "samples");
  std::vector<ProbeSample> samples = decodeSamples(enc.data(), enc.size());
  const int cores = static_cast<int>(r.u32("cores"));
  auto sourceText = r.raw(r.u16("source length"), "source");
  auto machineText = r.raw(r.u16("machine length"), "machine");
  singleCopyMinSet_ = r.u8("single_copy_min_bytes set") != 0;
  const std::string source(sourceText.begin(), sourceText.end());
  if (samples.empty()) {
    defaults(source);
  } else {
    tuning_.choices = deriveChoices(samples, local, cores, slots_.chunkBytes);
    tuning_.samples = samples;
    tuning_.source = source;
  }
  tuning_.machine.assign(machineText.begin(), machineText.end());
  finish();
}

}  // namespace strata::collectives
