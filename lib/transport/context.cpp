#include <linux/mempolicy.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>
#include <set>

#include <fmt/format.h>

#include <strata/backend/module.hpp>
#include <strata/error.hpp>

#include "base/config_keys.hpp"
#include "base/log.hpp"
#include "base/process.hpp"
#include "base/strings.hpp"
#include "bootstrap/registry.hpp"
#include "bootstrap/watched.hpp"
#include "context_impl.hpp"
#include "nic_choice.hpp"
#include "records.hpp"

namespace strata {
namespace transport {
namespace {

uint64_t fnv1a(std::string_view text) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h ? h : 1;
}

std::string bootId() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(in, id);
  return id;
}

std::vector<std::string> parseList(const Config& config, std::string_view key) {
  std::string text = config::getString(config, key);
  std::vector<std::string> out;
  for (auto part : strings::split(text)) {
    std::string item(strings::trim(part));
    if (item.empty()) continue;
    if (!validTransportName(item)) {
      throw Error(ErrorCode::InvalidConfig,
                  fmt::format("{}={}: '{}' is not a transport name (known: shm, fabric, nvlink)",
                              key, text, item));
    }
    if (std::find(out.begin(), out.end(), item) == out.end()) out.push_back(item);
  }
  if (out.empty()) {
    throw Error(ErrorCode::InvalidConfig,
                fmt::format("{} is empty: name at least one transport (shm, fabric, nvlink)", key));
  }
  return out;
}

uint64_t randomId() {
  static std::mutex mu;
  static std::mt19937_64 gen{std::random_device{}()};
  std::lock_guard lk(mu);
  return gen();
}

}  // namespace

void sendBlob(Bootstrap& b, int peer, int tag, const std::vector<uint8_t>& blob) {
  uint64_t n = blob.size();
  b.send(peer, tag, &n, sizeof n);
  b.send(peer, tag, blob.data(), blob.size());
}

std::vector<uint8_t> recvBlob(Bootstrap& b, int peer, int tag, const char* what) {
  uint64_t n = 0;
  b.recv(peer, tag, &n, sizeof n);
  if (n > kMaxRecord) {
    throw Error(
        ErrorCode::ProtocolError,
        fmt::format("rank {} announced a {} of {} bytes (limit {})", peer, what, n, kMaxRecord),
        peer);
  }
  std::vector<uint8_t> blob(n);
  b.recv(peer, tag, blob.data(), blob.size());
  return blob;
}

HostBlock::~HostBlock() {
  if (data) munmap(data, bytes);
  if (alloc.memfd >= 0) close(alloc.memfd);
}

DeviceBlock::~DeviceBlock() {
  if (owner && data) owner->deallocate(data, kind);
}

uint32_t SlotPool::acquire(int rank) {
  std::lock_guard lk(mu);
  for (size_t i = 0; i < kSlots; ++i) {
    if (!used[i]) {
      used[i] = true;
      return static_cast<uint32_t>(i);
    }
  }
  throw Error(ErrorCode::NotSupported,
              fmt::format("rank {}: more than {} live semaphores on one transport; destroy "
                          "semaphores that are no longer used",
                          rank, kSlots));
}

void SlotPool::release(uint32_t slot) noexcept {
  std::lock_guard lk(mu);
  if (slot < kSlots) used[slot] = false;
}

}  // namespace transport

// --- Context ------------------------------------------------------------------------------

Context::Context(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Context::~Context() = default;

void Context::revoke(const Error& reason) noexcept {
  auto& r = *impl_->revocation;
  std::lock_guard lk(r.mu);
  if (r.raised.load(std::memory_order_relaxed)) return;
  try {
    r.error = reason;
  } catch (...) {
    return;  // out of memory for the message: the connections keep going as before
  }
  r.raised.store(true, std::memory_order_release);
}

std::optional<Error> Context::revoked() const {
  auto& r = *impl_->revocation;
  if (!r.raised.load(std::memory_order_acquire)) return std::nullopt;
  std::lock_guard lk(r.mu);
  return r.error;
}

std::shared_ptr<backend::Transport> Context::Impl::find(std::string_view name) const {
  for (const auto& t : transports) {
    if (t.name == name) return t.transport;
  }
  return nullptr;
}

backend::PeerInfo Context::Impl::peerInfo(int peer) const {
  backend::PeerInfo p;
  p.rank = peer;
  p.hostId = hosts[peer].hostId;
  p.hostName = hosts[peer].hostName;
  p.pid = hosts[peer].pid;
  p.sameHost = hosts[peer].hostId == hosts[rank].hostId;
  return p;
}

std::string Context::Impl::chooseTransport(int peer, MemoryKind kind) const {
  const auto& list = hosts[peer].hostId == hosts[rank].hostId ? intraList : interList;
  auto info = peerInfo(peer);
  for (const auto& name : list) {
    auto t = find(name);
    if (!t || !t->supportsMemory(kind) || !t->canReach(info)) continue;
    const auto& theirs = hosts[peer].transports;
    if (std::find(theirs.begin(), theirs.end(), name) != theirs.end()) return name;
  }
  return {};
}

void Context::Impl::checkPeer(int peer, const char* what) const {
  if (peer < 0 || peer >= size) {
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("{}: rank {} is out of range (the job has {} ranks)", what, peer, size),
                peer);
  }
}

std::shared_ptr<Context> Context::create(std::shared_ptr<Bootstrap> bootstrap,
                                         const Config& config) {
  if (!bootstrap) {
    throw Error(ErrorCode::InvalidArgument, "Context::create: the bootstrap is null");
  }
  auto I = std::make_unique<Impl>();
  I->bootstrap = bootstrap;
  I->config = config;
  I->rank = bootstrap->rank();
  I->size = bootstrap->size();
  I->timeout = config::getDouble(config, "transport.timeout");
  I->intraList = transport::parseList(config, "transport.intra_node");
  I->interList = transport::parseList(config, "transport.inter_node");

  // Round 1: who is on which host.
  transport::HostRecord me;
  me.rank = I->rank;
  me.pid = static_cast<int32_t>(getpid());
  me.hostName = process::hostName();
  std::string hostKey = config::getString(config, "transport.host_id");
  me.hostId = transport::fnv1a(hostKey.empty() ? me.hostName + "/" + transport::bootId() : hostKey);
  std::vector<uint8_t> slots(transport::kHostSlot * I->size);
  auto mine = transport::encodeHost(me);
  std::memcpy(slots.data() + transport::kHostSlot * I->rank, mine.data(), mine.size());
  bootstrap->allGather(slots.data(), transport::kHostSlot);
  auto decodeAll = [&] {
    std::vector<transport::HostRecord> hosts;
    for (int r = 0; r < I->size; ++r) {
      hosts.push_back(transport::decodeHost(
          std::span<const uint8_t>(slots.data() + transport::kHostSlot * r, transport::kHostSlot),
          r, I->size));
    }
    return hosts;
  };
  I->hosts = decodeAll();

  bool needIntra = false, needInter = false;
  for (int r = 0; r < I->size; ++r) {
    if (r == I->rank) continue;
    (I->hosts[r].hostId == me.hostId ? needIntra : needInter) = true;
  }

  // Load transports lazily: walk each needed list and stop at the first transport that handles
  // host memory, so a single-host job never opens a fabric endpoint it does not use.
  backend::TransportInit init;
  init.config = &I->config;
  init.bootstrap = bootstrap.get();
  init.rank = I->rank;
  init.size = I->size;
  init.localRank = bootstrap->localRank();
  init.localSize = bootstrap->localSize();
  init.hostId = me.hostId;
  // Ranks on other hosts: the NIC this rank should use (lib/topology, transport.fabric.nic),
  // and the cores near it for the proxy and progress threads (transport.proxy_cpus).
  const transport::NearNic near =
      needInter ? transport::chooseNic(I->config, init) : transport::NearNic{};
  init.proxyCpus = transport::proxyCpus(I->config, near.cpus);
  I->proxyCpus = init.proxyCpus;
  I->numaNode = near.numaNode;
  auto load = [&](const std::vector<std::string>& list) {
    for (const auto& name : list) {
      if (auto t = I->find(name)) {
        if (t->supportsMemory(MemoryKind::Host)) return;
        continue;
      }
      if (I->failures.count(name)) continue;
      try {
        // shm is built in; the registry returns it like a module.
        auto m = bootstrap::findModule(backend::ModuleKind::Transport, name, I->config);
        if (!m.info) throw Error(ErrorCode::NotSupported, m.error);
        std::unique_ptr<backend::Transport> t = m.info->createTransport(init);
        bool host = t->supportsMemory(MemoryKind::Host);
        I->transports.push_back({name, std::shared_ptr<backend::Transport>(std::move(t))});
        STRATA_LOG(Debug, "transport", "loaded transport {}", name);
        if (host) return;
      } catch (const Error& e) {
        I->failures[name] = e.what();
        STRATA_LOG(Info, "transport", "transport {} is not usable here: {}", name, e.what());
      }
    }
  };
  if (needIntra) load(I->intraList);
  if (needInter) load(I->interList);

  // Round 2: which transports each rank loaded.
  for (const auto& t : I->transports) me.transports.push_back(t.name);
  mine = transport::encodeHost(me);
  std::memset(slots.data(), 0, slots.size());
  std::memcpy(slots.data() + transport::kHostSlot * I->rank, mine.data(), mine.size());
  bootstrap->allGather(slots.data(), transport::kHostSlot);
  auto second = decodeAll();
  for (int r = 0; r < I->size; ++r) {
    if (second[r].hostId != I->hosts[r].hostId || second[r].pid != I->hosts[r].pid) {
      throw Error(ErrorCode::ProtocolError,
                  fmt::format("rank {} changed its host identity between the two rounds of "
                              "Context::create",
                              r),
                  r);
    }
  }
  I->hosts = std::move(second);
  return std::make_shared<Context>(std::move(I));
}

Bootstrap& Context::bootstrap() noexcept {
  return *impl_->bootstrap;
}
const std::shared_ptr<Bootstrap>& Context::bootstrapPtr() const noexcept {
  return impl_->bootstrap;
}
int Context::rank() const noexcept {
  return impl_->rank;
}
int Context::size() const noexcept {
  return impl_->size;
}

bool Context::sameHost(int peer) const {
  impl_->checkPeer(peer, "Context::sameHost");
  return impl_->hosts[peer].hostId == impl_->hosts[impl_->rank].hostId;
}

const std::string& Context::hostName(int rank) const {
  impl_->checkPeer(rank, "Context::hostName");
  return impl_->hosts[rank].hostName;
}

uint64_t Context::hostId(int rank) const {
  impl_->checkPeer(rank, "Context::hostId");
  return impl_->hosts[rank].hostId;
}

int32_t Context::pid(int rank) const {
  impl_->checkPeer(rank, "Context::pid");
  return impl_->hosts[rank].pid;
}

const std::vector<int>& Context::proxyCpus() const noexcept {
  return impl_->proxyCpus;
}

std::vector<std::vector<int>> Context::hostGroups() const {
  std::vector<std::vector<int>> groups;
  for (int r = 0; r < impl_->size; ++r) {
    uint64_t id = impl_->hosts[r].hostId;
    auto g = std::find_if(groups.begin(), groups.end(), [&](const std::vector<int>& g) {
      return impl_->hosts[g.front()].hostId == id;
    });
    if (g == groups.end()) {
      groups.push_back({r});
    } else {
      g->push_back(r);
    }
  }
  return groups;
}

int Context::localRank(int rank) const {
  impl_->checkPeer(rank, "Context::localRank");
  int local = 0;
  for (int r = 0; r < rank; ++r) {
    if (impl_->hosts[r].hostId == impl_->hosts[rank].hostId) ++local;
  }
  return local;
}

std::vector<std::string> Context::transports() const {
  std::vector<std::string> out;
  for (const auto& t : impl_->transports) out.push_back(t.name);
  return out;
}

std::vector<Context::TransportUsage> Context::usage() const {
  std::vector<TransportUsage> out;
  for (const auto& t : impl_->transports) {
    auto s = t.transport->stats();
    out.push_back({t.name, s.registrations, s.imports, s.connections});
  }
  return out;
}

std::string Context::transportFor(int peer, MemoryKind kind) const {
  const auto& I = *impl_;
  I.checkPeer(peer, "Context::transportFor");
  if (peer == I.rank) {
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("Context::transportFor: rank {} is this rank", peer), peer);
  }
  auto name = I.chooseTransport(peer, kind);
  if (!name.empty()) return name;
  bool same = sameHost(peer);
  const auto& list = same ? I.intraList : I.interList;
  std::string mine, theirs, why;
  for (const auto& t : I.transports) mine += (mine.empty() ? "" : ",") + t.name;
  for (const auto& t : I.hosts[peer].transports) theirs += (theirs.empty() ? "" : ",") + t;
  for (const auto& [n, reason] : I.failures) why += fmt::format("; {} here: {}", n, reason);
  throw Error(ErrorCode::NotSupported,
              fmt::format("no transport connects rank {} and rank {} ({} host, {} memory): "
                          "transport.{}={}, rank {} has [{}], rank {} has [{}]{}. Add a transport "
                          "both can use to the list, or install the missing module",
                          I.rank, peer, same ? "same" : "other", toString(kind),
                          same ? "intra_node" : "inter_node", fmt::join(list, ","), I.rank, mine,
                          peer, theirs, why),
              peer);
}

RegisteredMemory Context::Impl::registerImpl(void* data, size_t bytes, MemoryKind kind,
                                             std::shared_ptr<transport::HostBlock> host,
                                             std::shared_ptr<transport::DeviceBlock> device) {
  auto m = std::make_shared<RegisteredMemory::Impl>();
  m->local = true;
  m->rank = rank;
  m->data = data;
  m->size = bytes;
  m->kind = kind;
  m->id = transport::randomId();
  m->hostId = hosts[rank].hostId;
  m->pid = hosts[rank].pid;
  m->hostBlock = std::move(host);
  m->deviceBlock = std::move(device);
  for (const auto& t : transports) {
    if (!t.transport->supportsMemory(kind)) continue;
    RegisteredMemory::Impl::LocalReg reg;
    reg.name = t.name;
    reg.transport = t.transport;
    reg.memory = t.transport->registerMemory(data, bytes, kind,
                                             m->hostBlock ? &m->hostBlock->alloc : nullptr);
    m->locals.push_back(std::move(reg));
  }
  return RegisteredMemory(std::move(m));
}

namespace {

/// Asks the kernel to place the pages of [p, p + bytes) on I.numaNode (MPOL_PREFERRED: another
/// node when that one is full). A failure (a node this machine does not have: a topology.file
/// of another machine) is said once and changes nothing else.
void preferNode(Context::Impl& I, void* p, size_t bytes) {
  constexpr int kBits = 1024;
  unsigned long mask[kBits / (8 * sizeof(unsigned long))] = {};
  const int node = I.numaNode;
  if (node >= kBits) return;
  mask[size_t(node) / (8 * sizeof(unsigned long))] |=
      1ul << (size_t(node) % (8 * sizeof(unsigned long)));
  if (syscall(SYS_mbind, p, bytes, MPOL_PREFERRED, mask, kBits + 1, 0) != 0 &&
      !I.numaFailureSaid.exchange(true)) {
    STRATA_LOG(Info, "transport",
               "rank {}: host buffers stay where the kernel puts them: mbind to NUMA node {} "
               "failed: {}",
               I.rank, node, std::strerror(errno));
  }
}

}  // namespace

RegisteredMemory Context::allocate(size_t bytes, MemoryKind kind) {
  auto& I = *impl_;
  if (bytes == 0) throw Error(ErrorCode::InvalidArgument, "Context::allocate: 0 bytes");
  if (kind == MemoryKind::Host) {
    auto block = std::make_shared<transport::HostBlock>();
    long page = sysconf(_SC_PAGESIZE);
    block->bytes = (bytes + page - 1) / page * page;
    block->alloc.memfd = memfd_create("strata", MFD_CLOEXEC);
    if (block->alloc.memfd < 0) {
      throw Error(ErrorCode::SystemError,
                  fmt::format("memfd_create for {} bytes failed: {}", bytes, strerror(errno)));
    }
    if (ftruncate(block->alloc.memfd, static_cast<off_t>(block->bytes)) != 0) {
      throw Error(ErrorCode::SystemError, fmt::format("ftruncate of a {}-byte memfd failed: {}",
                                                      block->bytes, strerror(errno)));
    }
    void* p =
        mmap(nullptr, block->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, block->alloc.memfd, 0);
    if (p == MAP_FAILED) {
      throw Error(ErrorCode::SystemError,
                  fmt::format("mmap of a {}-byte memfd failed: {}", block->bytes, strerror(errno)));
    }
    block->data = p;
    if (I.numaNode >= 0) preferNode(I, p, block->bytes);
    struct stat st {};
    if (fstat(block->alloc.memfd, &st) != 0) {
      // The shm transport checks the memfd by this inode; a zeroed one would surface later as
      // a misleading import error.
      throw Error(ErrorCode::SystemError, fmt::format("fstat of a {}-byte memfd failed: {}",
                                                      block->bytes, strerror(errno)));
    }
    block->alloc.inode = st.st_ino;
    block->alloc.offset = 0;
    return I.registerImpl(p, bytes, kind, std::move(block), nullptr);
  }
  for (const auto& t : I.transports) {
    if (!t.transport->supportsMemory(kind)) continue;
    if (void* p = t.transport->allocate(bytes, kind)) {
      auto block = std::make_shared<transport::DeviceBlock>();
      block->owner = t.transport;
      block->data = p;
      block->kind = kind;
      return I.registerImpl(p, bytes, kind, nullptr, std::move(block));
    }
  }
  throw Error(ErrorCode::NotSupported,
              fmt::format("Context::allocate: no loaded transport allocates {} memory (loaded: {})",
                          toString(kind), fmt::join(transports(), ",")));
}

RegisteredMemory Context::registerMemory(void* data, size_t bytes, MemoryKind kind) {
  if (!data || bytes == 0) {
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("Context::registerMemory: {} ({} bytes at {})",
                            data ? "0 bytes" : "null buffer", bytes, data));
  }
  if (kind != MemoryKind::Host && kind != MemoryKind::Cuda) {
    throw Error(ErrorCode::InvalidArgument, "Context::registerMemory: unknown memory kind");
  }
  return impl_->registerImpl(data, bytes, kind, nullptr, nullptr);
}

std::shared_ptr<transport::SlotPool> Context::Impl::pool(const std::string& name,
                                                         Context& context) {
  std::lock_guard lk(mu);
  auto& p = pools[name];
  if (!p) {
    auto t = find(name);
    auto pool = std::make_shared<transport::SlotPool>();
    pool->arena = context.allocate(transport::SlotPool::kSlots * transport::SlotPool::kStride,
                                   t->signalMemoryKind());
    p = pool;
  }
  return p;
}

std::vector<std::shared_ptr<Connection>> Context::connect(std::span<const int> peers,
                                                          MemoryKind kind) {
  auto& I = *impl_;
  std::set<int> seen;
  for (int p : peers) {
    I.checkPeer(p, "Context::connect");
    if (p == I.rank) {
      throw Error(ErrorCode::InvalidArgument,
                  fmt::format("Context::connect: rank {} cannot connect to itself", p), p);
    }
    if (!seen.insert(p).second) {
      throw Error(ErrorCode::InvalidArgument,
                  fmt::format("Context::connect: rank {} is listed twice", p), p);
    }
  }
  std::vector<std::string> names;
  for (int p : peers) names.push_back(transportFor(p, kind));

  // One record per peer: our endpoint and semaphore arena for the chosen transport.
  for (size_t i = 0; i < peers.size(); ++i) {
    transport::ConnectRecord c;
    c.from = I.rank;
    c.to = peers[i];
    c.transport = names[i];
    c.endpoint = I.find(names[i])->endpoint();
    c.arena = I.pool(names[i], *this)->arena.serialize();
    transport::sendBlob(*I.bootstrap, peers[i], transport::kTagConnect,
                        transport::encodeConnect(c));
  }
  std::vector<std::shared_ptr<Connection>> out;
  for (size_t i = 0; i < peers.size(); ++i) {
    int p = peers[i];
    auto c = transport::decodeConnect(
        transport::recvBlob(*I.bootstrap, p, transport::kTagConnect, "connect record"), p);
    if (c.to != I.rank) {
      throw Error(ErrorCode::ProtocolError,
                  fmt::format("rank {} sent a connect record meant for rank {} to rank {}", p, c.to,
                              I.rank),
                  p);
    }
    if (c.transport != names[i]) {
      throw Error(ErrorCode::ProtocolError,
                  fmt::format("rank {} connects to rank {} with transport {}, but rank {} chose {} "
                              "(did they pass different memory kinds to connect()?)",
                              p, I.rank, c.transport, I.rank, names[i]),
                  p);
    }
    auto impl = std::make_unique<Connection::Impl>();
    impl->peer = p;
    impl->transportName = names[i];
    impl->transport = I.find(names[i]);
    impl->timeout = I.timeout;
    impl->scope = bootstrap::scopeOf(I.bootstrap.get());
    impl->revocation = I.revocation;
    impl->conn = impl->transport->connect(I.peerInfo(p), c.endpoint);
    impl->localArena = I.pool(names[i], *this)->arena;
    impl->peerArena = transport::deserializeWith(*this, c.arena, p, names[i]);
    out.push_back(std::make_shared<Connection>(std::move(impl)));
  }
  // Ready handshake: nobody writes before the peer has imported everything.
  for (size_t i = 0; i < peers.size(); ++i) {
    transport::sendBlob(*I.bootstrap, peers[i], transport::kTagReady,
                        transport::encodeReady({I.rank, peers[i], names[i]}));
  }
  for (size_t i = 0; i < peers.size(); ++i) {
    auto r = transport::decodeReady(
        transport::recvBlob(*I.bootstrap, peers[i], transport::kTagReady, "ready record"),
        peers[i]);
    if (r.to != I.rank || r.transport != names[i]) {
      throw Error(ErrorCode::ProtocolError,
                  fmt::format("rank {} sent a ready record for rank {} over {}, expected rank {} "
                              "over {}",
                              peers[i], r.to, r.transport, I.rank, names[i]),
                  peers[i]);
    }
  }
  return out;
}

std::vector<RegisteredMemory> Context::exchange(const RegisteredMemory& local,
                                                std::span<const int> peers) {
  auto& I = *impl_;
  if (!local || !local.isLocal()) {
    throw Error(ErrorCode::InvalidArgument,
                "Context::exchange: the memory to send must be local registered memory");
  }
  for (int p : peers) {
    I.checkPeer(p, "Context::exchange");
    if (p == I.rank) {
      throw Error(ErrorCode::InvalidArgument,
                  fmt::format("Context::exchange: rank {} is this rank", p), p);
    }
  }
  auto record = local.serialize();
  for (int p : peers) transport::sendBlob(*I.bootstrap, p, transport::kTagExchange, record);
  std::vector<RegisteredMemory> out;
  for (int p : peers) {
    out.push_back(RegisteredMemory::deserialize(
        *this, transport::recvBlob(*I.bootstrap, p, transport::kTagExchange, "memory record"), p));
  }
  return out;
}

}  // namespace strata
