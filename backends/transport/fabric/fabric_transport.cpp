#include "fabric_transport.hpp"

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include <fmt/format.h>

#include <strata/backend/module.hpp>
#include <strata/version.hpp>

#include "base/config_keys.hpp"
#include "fabric_records.hpp"

namespace strata::fabric {
namespace {

// checkPeer() posts at most one probe write per interval.
constexpr auto kProbeInterval = std::chrono::milliseconds(100);
// A connection being destroyed waits this long for its own operations before it lets go.
constexpr double kCloseGraceSeconds = 1.0;

// cuPointerGetAttribute through the driver library, loaded only when CUDA memory is registered
// (the module links no CUDA).
int cudaDeviceOf(void* ptr) {
  using Fn = int (*)(void*, int, unsigned long long);
  static Fn fn = [] {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    return lib ? reinterpret_cast<Fn>(dlsym(lib, "cuPointerGetAttribute")) : nullptr;
  }();
  if (!fn) return -1;
  int device = -1;
  constexpr int kDeviceOrdinal = 9;  // CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
  if (fn(&device, kDeviceOrdinal, reinterpret_cast<unsigned long long>(ptr)) != 0) return -1;
  return device;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Memory

namespace {

class FabricLocal final : public backend::LocalMemory {
 public:
  FabricLocal(std::shared_ptr<Endpoint> endpoint, fid_mr* mr, MemoryRecord record)
      : endpoint_(std::move(endpoint)), mr_(mr), record_(record) {
    endpoint_->registrations_.fetch_add(1);
  }
  ~FabricLocal() override {
    endpoint_->closeRegion(mr_);
    endpoint_->registrations_.fetch_sub(1);
  }
  std::vector<uint8_t> descriptor() const override { return encode(record_); }
  void* desc() const noexcept { return fi_mr_desc(mr_); }

 private:
  std::shared_ptr<Endpoint> endpoint_;
  fid_mr* mr_;
  MemoryRecord record_;
};

class FabricRemote final : public backend::RemoteMemory {
 public:
  FabricRemote(std::shared_ptr<Endpoint> endpoint, MemoryRecord record)
      : endpoint_(std::move(endpoint)), record_(record) {
    endpoint_->imports_.fetch_add(1);
  }
  ~FabricRemote() override { endpoint_->imports_.fetch_sub(1); }
  /// The target address of dst + offset: the remote VA under FI_MR_VIRT_ADDR, else the offset.
  uint64_t target(uint64_t offset) const noexcept {
    return (record_.mrMode & FI_MR_VIRT_ADDR) ? record_.baseVa + offset : offset;
  }
  uint64_t key() const noexcept { return record_.key; }

 private:
  std::shared_ptr<Endpoint> endpoint_;
  MemoryRecord record_;
};

// ---------------------------------------------------------------------------------------------
// Connection

class FabricConnection final : public backend::TransportConnection {
 public:
  FabricConnection(std::shared_ptr<Endpoint> endpoint, std::shared_ptr<ConnState> state)
      : endpoint_(std::move(endpoint)), state_(std::move(state)) {
    endpoint_->connections_.fetch_add(1);
  }

  ~FabricConnection() override {
    // Give our own writes a moment to land so that the address can be removed cleanly; a peer
    // that is gone never completes them, and the endpoint then reaps them when it closes.
    auto deadline = Deadline::after(kCloseGraceSeconds);
    while (state_->outstanding.load() > 0 && !deadline.expired() && !state_->failed()) {
      endpoint_->progressOnce();
      endpoint_->waitForCompletion(deadline.remaining());
    }
    if (state_->outstanding.load() == 0) {
      std::lock_guard<std::mutex> lock(endpoint_->mutex_);
      fi_av_remove(endpoint_->av_, &state_->addr, 1, 0);
    }
    endpoint_->connections_.fetch_sub(1);
  }

  void write(const backend::RemoteRef& dst, uint64_t dstOffset, const backend::LocalRef& src,
             uint64_t srcOffset, size_t bytes) override {
    state_->rethrow();
    auto deadline = Deadline::fromTimeout(endpoint_->timeout_);
    auto* remote = static_cast<FabricRemote*>(dst.memory);
    auto* local = static_cast<FabricLocal*>(src.memory);
    void* desc = local ? local->desc() : nullptr;
    if (!local && (endpoint_->mrMode_ & FI_MR_LOCAL)) {
      throw Error(ErrorCode::InvalidArgument,
                  fmt::format("{}: write to rank {} from an unregistered buffer, but the "
                              "provider needs local registration (FI_MR_LOCAL)",
                              endpoint_->describe(), state_->rank),
                  state_->rank);
    }
    const char* from = static_cast<const char*>(src.data) + srcOffset;
    while (bytes > 0) {
      size_t n = std::min(bytes, endpoint_->maxChunk_);
      auto op = std::make_unique<OpContext>();
      op->conn = state_;
      endpoint_->postWrite(std::move(op), from, n, desc, remote->target(dstOffset), remote->key(),
                           deadline);
      from += n;
      dstOffset += n;
      bytes -= n;
    }
  }

  void updateAndSync(const backend::RemoteRef& dst, uint64_t dstOffset, uint64_t value) override {
    state_->rethrow();
    auto deadline = Deadline::fromTimeout(endpoint_->timeout_);
    // Without write-after-write ordering, the signal may overtake the data: complete the data
    // first (delivery complete), then write the signal.
    if (!endpoint_->orderedWaw_) waitIdle(deadline, "a signal's earlier writes");
    auto* remote = static_cast<FabricRemote*>(dst.memory);
    int slot = endpoint_->acquireSlot(deadline, state_->rank);
    uint64_t* word = endpoint_->slotWord(slot);
    __atomic_store_n(word, value, __ATOMIC_RELEASE);
    auto op = std::make_unique<OpContext>();
    op->conn = state_;
    op->slot = slot;
    endpoint_->postWrite(std::move(op), word, sizeof(uint64_t), endpoint_->internalDesc(),
                         remote->target(dstOffset), remote->key(), deadline);
  }

  void flush(double deadlineSeconds) override {
    waitIdle(Deadline::after(deadlineSeconds), "flush");
  }

  void progress() override { endpoint_->progressFromCaller(); }

  void checkPeer() override {
    state_->rethrow();
    // A peer process on this host that has exited is gone whatever the provider says: shm never
    // completes a write to a dead process, and ofi_rxm keeps retrying a refused connection
    // instead of failing the write.
    if (state_->processExited()) {
      state_->fail(Error(ErrorCode::PeerLost,
                         fmt::format("{}: rank {} (pid {}) has exited", endpoint_->describe(),
                                     state_->rank, state_->pid),
                         state_->rank));
      state_->rethrow();
    }
    auto now = std::chrono::steady_clock::now();
    if (now - lastProbe_ < kProbeInterval) return;
    lastProbe_ = now;
    endpoint_->progressOnce();
    state_->rethrow();
    // Any write to the peer that completed since the last look (the probe or data) shows it
    // alive and restarts the clock. Only the probe's own completion did before: under load (an
    // allToAll's megabytes on tcp;ofi_rxm between 2-CPU namespace nodes) the probe waited behind
    // the data, or was refused with -FI_EAGAIN by a full queue, for more than 5 s while the data
    // kept completing, and a live peer was reported lost.
    uint64_t done = state_->completions.load();
    if (done != completionsSeen_) {
      completionsSeen_ = done;
      probeWaiting_ = false;
    }
    // No write completing or failing within transport.fabric.probe_timeout while a probe is
    // queued (or refused with -FI_EAGAIN on every attempt) means the peer is unreachable:
    // ofi_rxm keeps retrying a refused connection instead of failing the write. A live peer's
    // progress thread completes the probe in microseconds when the link is idle.
    if (probeWaiting_ && endpoint_->probeTimeout_ > 0) {
      double waited = std::chrono::duration<double>(now - probeSince_).count();
      if (waited > endpoint_->probeTimeout_) {
        state_->fail(Error(ErrorCode::PeerLost,
                           fmt::format("{}: rank {} completed no write, not even an 8-byte "
                                       "liveness write, in {:.1f} s "
                                       "(transport.fabric.probe_timeout); the peer is gone or "
                                       "unreachable",
                                       endpoint_->describe(), state_->rank, waited),
                           state_->rank));
        state_->rethrow();
      }
    }
    if (!probeWaiting_) {
      probeWaiting_ = true;
      probeSince_ = now;
    }
    if (state_->probeInFlight.exchange(true)) return;
    auto op = std::make_unique<OpContext>();
    op->conn = state_;
    op->probe = true;
    try {
      endpoint_->postWrite(std::move(op), endpoint_->probeSource(), sizeof(uint64_t),
                           endpoint_->internalDesc(), state_->probeTarget, state_->probeKey,
                           Deadline::after(0));
    } catch (const Error& e) {
      state_->probeInFlight = false;
      if (e.code() != ErrorCode::Timeout) throw;  // a full queue only postpones the probe
    }
  }

 private:
  void waitIdle(const Deadline& deadline, std::string_view what) {
    for (;;) {
      endpoint_->progressOnce();
      state_->rethrow();
      int64_t left = state_->outstanding.load();
      if (left == 0) return;
      if (deadline.expired()) {
        throw Error(ErrorCode::Timeout,
                    fmt::format("{}: {} to rank {} timed out with {} write(s) not completed; "
                                "the peer is not making progress or the link is down",
                                endpoint_->describe(), what, state_->rank, left),
                    state_->rank);
      }
      endpoint_->waitForCompletion(deadline.remaining());
    }
  }

  std::shared_ptr<Endpoint> endpoint_;
  std::shared_ptr<ConnState> state_;
  std::chrono::steady_clock::time_point lastProbe_{};
  std::chrono::steady_clock::time_point probeSince_{};
  uint64_t completionsSeen_ = 0;
  bool probeWaiting_ = false;
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// FabricTransport

namespace {

/// Whether a CUDA driver is present, so that CUDA memory may be registered at all.
bool cudaDriverPresent() {
  return ::access("/dev/nvidiactl", F_OK) == 0;
}

}  // namespace

FabricTransport::FabricTransport(const backend::TransportInit& init) {
  std::string provider =
      init.config ? config::getString(*init.config, "transport.fabric.provider") : "";
  if (provider.empty()) provider = "auto";
  // FI_HMEM is requested only where CUDA memory may be registered at all (a CUDA driver is
  // present); asking for it elsewhere would narrow the providers for nothing.
  endpoint_ = std::make_shared<Endpoint>(init, provider, cudaDriverPresent());
  progress_ = std::make_unique<ProgressThread>(endpoint_, init.proxyCpus);
}

FabricTransport::~FabricTransport() {
  endpoint_->stopWatchers();
  progress_.reset();
}

bool FabricTransport::blockingWaitSupported() const noexcept {
  // Only with a wait fd does the progress thread wake when data arrives; without one it sleeps
  // in back-off steps, and a waiter that polls itself is faster.
  return endpoint_->waitFd_ >= 0;
}

bool FabricTransport::waitSignal(const backend::LocalRef& mem, uint64_t offset, uint64_t above,
                                 double maxSeconds) {
  auto* word = reinterpret_cast<const uint64_t*>(static_cast<const char*>(mem.data) + offset);
  return endpoint_->waitWord(word, above, maxSeconds);
}

bool FabricTransport::canReach(const backend::PeerInfo& peer) const noexcept {
  return endpoint_->provider_ == "shm" ? peer.sameHost : true;
}

bool FabricTransport::supportsMemory(MemoryKind kind) const noexcept {
  return kind == MemoryKind::Host || (kind == MemoryKind::Cuda && endpoint_->hmem_);
}

std::unique_ptr<backend::LocalMemory> FabricTransport::registerMemory(
    void* data, size_t bytes, MemoryKind kind, const backend::HostAllocation* /*host*/) {
  bool cuda = kind == MemoryKind::Cuda;
  int device = 0;
  if (cuda) {
    if (!endpoint_->hmem_) {
      throw Error(ErrorCode::NotSupported,
                  fmt::format("{}: cannot register CUDA memory: the provider does not offer "
                              "FI_HMEM (GPU memory registration); use the nvlink transport "
                              "within a node or a provider with FI_HMEM (verbs with DMA-BUF or "
                              "peer memory, efa, shm)",
                              endpoint_->describe()));
    }
    device = cudaDeviceOf(data);
    if (device < 0) {
      throw Error(ErrorCode::NotSupported,
                  fmt::format("{}: cannot tell which CUDA device owns {} (libcuda.so.1 missing "
                              "or not a device pointer)",
                              endpoint_->describe(), data));
    }
  }
  fid_mr* mr = endpoint_->registerRegion(data, bytes, FI_REMOTE_WRITE | FI_WRITE, cuda, device);
  MemoryRecord rec;
  rec.key = fi_mr_key(mr);
  rec.baseVa = reinterpret_cast<uint64_t>(data);
  rec.length = bytes;
  rec.mrMode = endpoint_->mrMode_;
  rec.kind = static_cast<uint8_t>(kind);
  if (rec.key == FI_KEY_NOTAVAIL) {
    endpoint_->closeRegion(mr);
    throw Error(ErrorCode::NotSupported,
                fmt::format("{}: the provider gives no 64-bit key for this region (raw keys "
                            "are not implemented)",
                            endpoint_->describe()));
  }
  return std::make_unique<FabricLocal>(endpoint_, mr, rec);
}

std::unique_ptr<backend::RemoteMemory> FabricTransport::importMemory(
    const backend::PeerInfo& owner, std::span<const uint8_t> descriptor, size_t bytes,
    MemoryKind kind) {
  MemoryRecord rec = decodeMemory(descriptor, owner.rank);
  if (rec.length != bytes) {
    throw Error(ErrorCode::ProtocolError,
                fmt::format("{}: the memory descriptor of rank {} describes {} bytes, but the "
                            "buffer is {} bytes; the records do not belong together",
                            endpoint_->describe(), owner.rank, rec.length, bytes),
                owner.rank);
  }
  if (rec.kind != static_cast<uint8_t>(kind)) {
    throw Error(ErrorCode::ProtocolError,
                fmt::format("{}: the memory descriptor of rank {} is for {} memory, the "
                            "buffer record says {}",
                            endpoint_->describe(), owner.rank,
                            rec.kind == static_cast<uint8_t>(MemoryKind::Cuda) ? "cuda" : "host",
                            kind == MemoryKind::Cuda ? "cuda" : "host"),
                owner.rank);
  }
  return std::make_unique<FabricRemote>(endpoint_, rec);
}

std::vector<uint8_t> FabricTransport::endpoint() {
  EndpointRecord r;
  r.provider = endpoint_->provider_;
  r.fabric = endpoint_->info_->fabric_attr->name ? endpoint_->info_->fabric_attr->name : "";
  r.domain = endpoint_->info_->domain_attr->name ? endpoint_->info_->domain_attr->name : "";
  r.address = endpoint_->address_;
  r.mrMode = endpoint_->mrMode_;
  r.cqDataSize = endpoint_->info_->domain_attr->cq_data_size;
  r.probeKey = fi_mr_key(endpoint_->internalMr_);
  r.probeVa = reinterpret_cast<uint64_t>(endpoint_->internal_);
  return encode(r);
}

std::unique_ptr<backend::TransportConnection> FabricTransport::connect(
    const backend::PeerInfo& peer, std::span<const uint8_t> peerEndpoint) {
  EndpointRecord r = decodeEndpoint(peerEndpoint, peer.rank);
  std::string fabricName =
      endpoint_->info_->fabric_attr->name ? endpoint_->info_->fabric_attr->name : "";
  // IP providers (tcp, udp, sockets) name the fabric after the subnet of the local interface
  // ("10.232.7.0/24"): hosts on different subnets reach each other through IP routers, so for
  // them only the provider has to match (a peer that cannot be reached fails when it is used).
  const uint32_t format = endpoint_->info_->addr_format;
  const bool routed =
      format == FI_SOCKADDR || format == FI_SOCKADDR_IN || format == FI_SOCKADDR_IN6;
  if (r.provider != endpoint_->provider_ || (!routed && r.fabric != fabricName)) {
    throw Error(ErrorCode::BackendError,
                fmt::format("{}: rank {} uses provider \"{}\" on fabric \"{}\", this rank "
                            "provider \"{}\" on fabric \"{}\"; both ends must use the same "
                            "provider and fabric (set transport.fabric.provider explicitly)",
                            endpoint_->describe(), peer.rank, r.provider, r.fabric,
                            endpoint_->provider_, fabricName),
                peer.rank);
  }
  if ((r.mrMode & FI_MR_RAW) != 0) {
    throw Error(ErrorCode::ProtocolError,
                fmt::format("{}: rank {} announces FI_MR_RAW keys, which are not implemented",
                            endpoint_->describe(), peer.rank),
                peer.rank);
  }
  auto state = std::make_shared<ConnState>();
  state->rank = peer.rank;
  state->sameHost = peer.sameHost;
  state->pid = peer.pid;
  state->probeKey = r.probeKey;
  state->probeTarget = (r.mrMode & FI_MR_VIRT_ADDR) ? r.probeVa : 0;
  {
    std::lock_guard<std::mutex> lock(endpoint_->mutex_);
    int n = fi_av_insert(endpoint_->av_, r.address.data(), 1, &state->addr, 0, nullptr);
    if (n != 1) {
      throw Error(ErrorCode::BackendError,
                  fmt::format("{}: fi_av_insert of rank {}'s address ({} bytes) failed: {}",
                              endpoint_->describe(), peer.rank, r.address.size(),
                              n < 0 ? fiError(n) : std::string("address not inserted")),
                  peer.rank);
    }
  }
  return std::make_unique<FabricConnection>(endpoint_, std::move(state));
}

backend::TransportStats FabricTransport::stats() const noexcept {
  backend::TransportStats s;
  s.registrations = endpoint_->registrations_.load();
  s.imports = endpoint_->imports_.load();
  s.connections = endpoint_->connections_.load();
  return s;
}

namespace {

std::unique_ptr<backend::Transport> create(const backend::TransportInit& init) {
  return std::make_unique<FabricTransport>(init);
}

std::vector<backend::CheckLine> checkNode(const Config& config) {
  std::string provider = config::getString(config, "transport.fabric.provider");
  return preflight(provider.empty() ? "auto" : provider, cudaDriverPresent());
}

const backend::ModuleInfo kInfo = {
    STRATA_MODULE_ABI_VERSION,
    backend::ModuleKind::Transport,
    "fabric",
    STRATA_VERSION_STRING,
    "libfabric RDM endpoints: one-sided RMA writes (verbs, efa, tcp, shm providers)",
    nullptr,
    nullptr,
    &create,
    nullptr,
    &checkNode,
};

}  // namespace
}  // namespace strata::fabric

extern "C" __attribute__((visibility("default"))) const strata::backend::ModuleInfo*
strata_module_info() {
  return &strata::fabric::kInfo;
}
