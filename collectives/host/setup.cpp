// The engine's set-up, collective over the context's ranks: the slot geometry and its check,
// the pairing of every two ranks (connections, receive areas, semaphore words), the proxy for
// peers whose memory is not mapped here, and the single-copy probe.

#include <sched.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "base/config_keys.hpp"
#include "base/log.hpp"
#include "engine.hpp"

namespace strata::collectives {

namespace {

/// Entries of the proxy FIFO of proxied links (triggers in flight before a push waits).
constexpr uint32_t kProxyFifoEntries = 1024;
/// Spin before yielding in the progress loop (0 when the host's ranks outnumber its cores).
constexpr int kSpinMicros = 10;

/// Spinning only helps while every rank of this host has a core to spin on.
int spinMicros(const std::vector<std::vector<int>>& hosts, int rank) {
  cpu_set_t cpus;
  int cores = sched_getaffinity(0, sizeof cpus, &cpus) == 0 ? CPU_COUNT(&cpus) : 1;
  size_t local = 1;
  for (const auto& g : hosts) {
    if (std::find(g.begin(), g.end(), rank) != g.end()) local = g.size();
  }
  return static_cast<int>(local) > cores ? 0 : kSpinMicros;
}

}  // namespace

Engine::Engine(std::shared_ptr<Context> context, const Config& config)
    : context_(std::move(context)) {
  rank_ = context_->rank();
  size_ = context_->size();
  timeout_ = config::getDouble(config, "transport.timeout");
  singleCopyMin_ = static_cast<size_t>(config::getInt(config, "collectives.single_copy_min_bytes"));
  allRanks_.resize(static_cast<size_t>(size_));
  for (int r = 0; r < size_; ++r) allRanks_[r] = r;
  links_.resize(static_cast<size_t>(size_));
  out_.resize(static_cast<size_t>(size_));
  hosts_ = context_->hostGroups();
  spinUs_ = spinMicros(hosts_, rank_);
  slots_ = slotGeometry(static_cast<size_t>(config::getInt(config, "collectives.buffer_bytes")),
                        static_cast<size_t>(config::getInt(config, "collectives.chunk_bytes")),
                        size_, rank_);
  if (size_ == 1) return;
  // Before anything is connected: a rank of another geometry would write past its peers' slots.
  requireSameGeometry(context_->bootstrap(), slots_);

  area_ = context_->allocate(slots_.areaBytes);
  flags_ = context_->allocate(Link::flagBytes(size_));
  connectLinks();
  if (proxy_) proxy_->start();
  probeSingleCopy(config);
  STRATA_LOG(Debug, "coll",
             "host collectives: {} ranks, chunk {} B, {} slots per peer, {} peers "
             "through the proxy",
             size_, slots_.chunkBytes, slots_.depth,
             std::count_if(links_.begin(), links_.end(),
                           [](const Link& l) { return l.peer() >= 0 && !l.isMapped(); }));
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
    if (Link::mappable(ends)) {
      links_[peers[i]] = Link::mapped(ends);
      continue;
    }
    if (!proxy_) {
      proxy_ = std::make_unique<ProxyService>(kProxyFifoEntries, timeout_);
      staging_ = context_->allocate(slots_.areaBytes);
    }
    links_[peers[i]] = Link::proxied(ends, *proxy_, staging_, timeout_);
  }
}

void Engine::probeSingleCopy(const Config& config) {
  std::string mode = config::getString(config, "collectives.single_copy");
  pids_.assign(size_, 0);
  for (int p = 0; p < size_; ++p) pids_[p] = context_->pid(p);
  // Every rank tries to read every same-host peer's probe word; single copy is used only when
  // all pairs of the job can, so that every rank picks the same algorithms.
  uint8_t ok = mode != "off";
  uint64_t myAddress = reinterpret_cast<uint64_t>(&probeWord_);
  std::vector<uint64_t> addresses(size_);
  addresses[rank_] = myAddress;
  context_->bootstrap().allGather(addresses.data(), sizeof(uint64_t));
  for (int p = 0; p < size_ && ok; ++p) {
    if (p == rank_) continue;
    if (!links_[p].isMapped()) {
      ok = 0;
      break;
    }
    uint64_t value = 0;
    iovec local{&value, sizeof value};
    iovec remote{reinterpret_cast<void*>(addresses[p]), sizeof value};
    ssize_t n = process_vm_readv(pids_[p], &local, 1, &remote, 1, 0);
    const int err = errno;  // read before anything else can change it
    if (n != static_cast<ssize_t>(sizeof value) || value != probeWord_) {
      // errno means something only when the call failed; a short read or another value leaves
      // it stale.
      std::string why = n < 0 ? std::strerror(err)
                        : n != static_cast<ssize_t>(sizeof value)
                            ? fmt::format("short read ({} of {} bytes)", n, sizeof value)
                            : std::string("read a different value (not the probe word)");
      STRATA_LOG(Info, "coll", "single copy off: cannot read rank {}'s memory (pid {}): {}", p,
                 pids_[p], why);
      ok = 0;
    }
  }
  std::vector<uint8_t> all(size_);
  all[rank_] = ok;
  context_->bootstrap().allGather(all.data(), 1);
  singleCopy_ = std::all_of(all.begin(), all.end(), [](uint8_t v) { return v != 0; });
}

}  // namespace strata::collectives
