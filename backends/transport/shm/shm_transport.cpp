#include "shm_transport.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <mutex>
#include <string>
#include <system_error>
#include <unordered_map>

#include <fmt/format.h>

#include <strata/backend/module.hpp>
#include <strata/error.hpp>
#include <strata/version.hpp>

#include "base/log.hpp"
#include "base/process.hpp"
#include "base/wire.hpp"

namespace strata::shm {

namespace {

using backend::HostAllocation;
using backend::LocalMemory;
using backend::LocalRef;
using backend::PeerInfo;
using backend::RemoteMemory;
using backend::RemoteRef;
using backend::Transport;
using backend::TransportConnection;
using backend::TransportInit;
using backend::TransportStats;

constexpr const char* kLog = "shm";
// process_vm_writev() moves at most MAX_RW_COUNT (about 2 GiB) per call; 1 GiB chunks stay
// below it on every page size.
constexpr size_t kMaxChunk = size_t{1} << 30;

std::string errnoText(int err) {
  return std::generic_category().message(err);
}

// Local rather than strata::toString(MemoryKind), so this file does not depend on the core.
std::string_view kindName(MemoryKind kind) {
  return kind == MemoryKind::Host ? "host" : kind == MemoryKind::Cuda ? "cuda" : "unknown";
}

std::string describePeer(int rank, int32_t pid) {
  return fmt::format("rank {} (pid {})", rank, pid);
}

uint64_t randomNonce() {
  uint64_t value = 0;
  for (int attempt = 0; attempt < 4 && value == 0; ++attempt) {
    if (getrandom(&value, sizeof(value), GRND_NONBLOCK) != sizeof(value)) value = 0;
  }
  if (value == 0) {
    // No entropy yet (early boot): uniqueness within this process is all the nonce needs, so
    // mix a counter with the clock and the pid (splitmix64).
    static std::atomic<uint64_t> counter{0};
    uint64_t z =
        counter.fetch_add(1) +
        static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) +
        (static_cast<uint64_t>(getpid()) << 32) + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    value = (z ^ (z >> 31)) | 1;
  }
  return value;
}

// Registrations alive in this process, by nonce. Process-wide (not per transport) because two
// Contexts of one process may exchange records; an import by the owner process itself is
// checked here instead of through /proc (a stale descriptor has no live entry).
struct LiveEntry {
  DescriptorMode mode;
  uint64_t address;
  uint64_t size;
  int32_t fd;
  uint64_t inode;
  uint64_t offset;
};
std::mutex& liveMutex() {
  static std::mutex mutex;
  return mutex;
}
std::unordered_map<uint64_t, LiveEntry>& liveTable() {
  static std::unordered_map<uint64_t, LiveEntry> table;
  return table;
}

struct Counters {
  std::atomic<size_t> registrations{0};
  std::atomic<size_t> imports{0};
  std::atomic<size_t> connections{0};
};

// Maps errno of process_vm_readv/writev to the error a user can act on.
[[noreturn]] void throwVmError(int err, const char* call, int rank, int32_t pid, uint64_t address,
                               size_t bytes) {
  const std::string who = describePeer(rank, pid);
  switch (err) {
    case ESRCH:
      throw Error(
          ErrorCode::PeerLost,
          fmt::format("shm transport: {} exited ({} failed: {})", who, call, errnoText(err)), rank);
    case EPERM:
    case EACCES:
    case ENOSYS:
      throw Error(
          ErrorCode::NotSupported,
          fmt::format("shm transport: the kernel forbids this process to access user memory "
                      "of {} ({}: {}). Cross-process access to memory that strata did not "
                      "allocate needs ptrace permission (same user, dumpable process, "
                      "kernel.yama.ptrace_scope 0 or prctl(PR_SET_PTRACER) in the owner, "
                      "no seccomp filter against {}). Allocate the buffer with "
                      "Context::allocate(), which shm maps without that permission",
                      who, call, errnoText(err), call),
          rank);
    case EFAULT:
      throw Error(ErrorCode::ProtocolError,
                  fmt::format("shm transport: {} bytes at {:#x} are not mapped in {} or here ({}: "
                              "{}); was the buffer freed before its registration was released?",
                              bytes, address, who, call, errnoText(err)),
                  rank);
    default:
      throw Error(ErrorCode::SystemError,
                  fmt::format("shm transport: {} to {} failed: {}", call, who, errnoText(err)),
                  rank);
  }
}

class ShmLocalMemory final : public LocalMemory {
 public:
  ShmLocalMemory(std::shared_ptr<Counters> counters, const MemoryDescriptor& descriptor)
      : counters_(std::move(counters)),
        nonce_(descriptor.nonce),
        record_(encodeDescriptor(descriptor)) {
    {
      std::lock_guard lock(liveMutex());
      liveTable()[nonce_] = LiveEntry{descriptor.mode, descriptor.address, descriptor.size,
                                      descriptor.fd,   descriptor.inode,   descriptor.offset};
    }
    counters_->registrations.fetch_add(1, std::memory_order_relaxed);
  }
  ~ShmLocalMemory() override {
    {
      std::lock_guard lock(liveMutex());
      liveTable().erase(nonce_);
    }
    counters_->registrations.fetch_sub(1, std::memory_order_relaxed);
  }
  std::vector<uint8_t> descriptor() const override { return record_; }

 private:
  std::shared_ptr<Counters> counters_;
  uint64_t nonce_;
  std::vector<uint8_t> record_;
};

class ShmRemoteMemory final : public RemoteMemory {
 public:
  ShmRemoteMemory(std::shared_ptr<Counters> counters, int rank, int32_t pid, uint64_t address,
                  uint64_t size, char* data, void* mapBase, size_t mapLength)
      : counters_(std::move(counters)),
        rank_(rank),
        pid_(pid),
        address_(address),
        size_(size),
        data_(data),
        mapBase_(mapBase),
        mapLength_(mapLength) {
    counters_->imports.fetch_add(1, std::memory_order_relaxed);
  }
  ~ShmRemoteMemory() override {
    if (mapBase_ != nullptr) munmap(mapBase_, mapLength_);
    counters_->imports.fetch_sub(1, std::memory_order_relaxed);
  }
  void* hostPointer() const noexcept override { return data_; }

  char* data() const noexcept { return data_; }
  int rank() const noexcept { return rank_; }
  int32_t pid() const noexcept { return pid_; }
  uint64_t address() const noexcept { return address_; }

  // For user memory of another process (data_ == nullptr).
  void writeUser(uint64_t dstOffset, const char* from, size_t bytes) const {
    size_t done = 0;
    while (done < bytes) {
      const size_t chunk = std::min(bytes - done, kMaxChunk);
      iovec local{const_cast<char*>(from + done), chunk};
      iovec remote{reinterpret_cast<void*>(address_ + dstOffset + done), chunk};
      ssize_t n = process_vm_writev(pid_, &local, 1, &remote, 1, 0);
      if (n < 0) {
        if (errno == EINTR) continue;
        throwVmError(errno, "process_vm_writev", rank_, pid_, address_ + dstOffset + done, chunk);
      }
      if (n == 0) {
        // Only possible if the kernel copied nothing without an error; never loop on it.
        throwVmError(EFAULT, "process_vm_writev", rank_, pid_, address_ + dstOffset + done, chunk);
      }
      done += static_cast<size_t>(n);
    }
  }

 private:
  std::shared_ptr<Counters> counters_;
  int rank_;
  int32_t pid_;
  uint64_t address_;
  uint64_t size_;
  char* data_;  ///< where this process may load and store, or nullptr (remote user memory)
  void* mapBase_;
  size_t mapLength_;
};

class ShmConnection final : public TransportConnection {
 public:
  ShmConnection(std::shared_ptr<Counters> counters, const PeerInfo& peer)
      : counters_(std::move(counters)), rank_(peer.rank), pid_(peer.pid) {
    self_ = pid_ == getpid();
    if (!self_) {
      long fd = syscall(SYS_pidfd_open, static_cast<pid_t>(pid_), 0);
      if (fd >= 0) {
        pidfd_ = static_cast<int>(fd);  // close-on-exec by definition
      } else if (errno == ESRCH) {
        lost_ = true;
      } else {
        // Kernels before 5.3, or a seccomp filter: fall back to kill(pid, 0), which cannot
        // tell an exited but unreaped process from a live one (documented).
        STRATA_LOG(Debug, kLog, "pidfd_open({}) failed ({}); watching rank {} with kill(pid, 0)",
                   pid_, errnoText(errno), rank_);
      }
    }
    counters_->connections.fetch_add(1, std::memory_order_relaxed);
    if (lost_) {
      counters_->connections.fetch_sub(1, std::memory_order_relaxed);
      throw lostError("it had exited before connect()");
    }
  }
  ~ShmConnection() override {
    if (pidfd_ >= 0) close(pidfd_);
    counters_->connections.fetch_sub(1, std::memory_order_relaxed);
  }

  void write(const RemoteRef& dst, uint64_t dstOffset, const LocalRef& src, uint64_t srcOffset,
             size_t bytes) override {
    if (dst.kind != MemoryKind::Host || src.kind != MemoryKind::Host) {
      throw Error(ErrorCode::NotSupported,
                  fmt::format("shm transport: write to {} from {} memory to {} memory: shm moves "
                              "host memory only; use the nvlink transport for device memory",
                              describePeer(rank_, pid_), kindName(src.kind), kindName(dst.kind)),
                  rank_);
    }
    if (bytes == 0) return;
    auto* remote = static_cast<ShmRemoteMemory*>(dst.memory);
    const char* from = static_cast<const char*>(src.data) + srcOffset;
    if (char* to = remote->data()) {
      // memmove: a self-connection may copy between overlapping parts of one buffer.
      std::memmove(to + dstOffset, from, bytes);
    } else {
      remote->writeUser(dstOffset, from, bytes);
    }
  }

  void updateAndSync(const RemoteRef& dst, uint64_t dstOffset, uint64_t value) override {
    if (dst.kind != MemoryKind::Host) {
      throw Error(ErrorCode::NotSupported,
                  fmt::format("shm transport: updateAndSync to {} in {} memory: shm signals host "
                              "memory only",
                              describePeer(rank_, pid_), kindName(dst.kind)),
                  rank_);
    }
    auto* remote = static_cast<ShmRemoteMemory*>(dst.memory);
    if (char* to = remote->data()) {
#if defined(__x86_64__) || defined(__i386__)
      // memcpy may use non-temporal stores for large copies, which x86 does not order with
      // later stores; sfence orders them (a release fence alone compiles to nothing on x86).
      __builtin_ia32_sfence();
#endif
      __atomic_thread_fence(__ATOMIC_RELEASE);
      __atomic_store_n(reinterpret_cast<uint64_t*>(to + dstOffset), value, __ATOMIC_RELEASE);
    } else {
      // process_vm_writev() has returned for every earlier write, so the data is in place;
      // the kernel's copy of these 8 bytes is not guaranteed to be one store (documented).
      remote->writeUser(dstOffset, reinterpret_cast<const char*>(&value), sizeof(value));
    }
  }

  void flush(double /*deadlineSeconds*/) override {
    // write() copies synchronously: every earlier write has landed when it returned.
  }

  void checkPeer() override {
    if (lost_) throw lostError("it exited");
    if (self_) return;
    if (pidfd_ >= 0) {
      pollfd p{pidfd_, POLLIN, 0};
      int r = poll(&p, 1, 0);
      if (r > 0 && (p.revents & (POLLIN | POLLHUP | POLLERR)) != 0) lost_ = true;
    } else if (kill(pid_, 0) != 0 && errno == ESRCH) {
      lost_ = true;
    }
    if (lost_) throw lostError("it exited");
  }

 private:
  Error lostError(std::string_view what) const {
    return Error(ErrorCode::PeerLost,
                 fmt::format("shm transport: lost {}: {}; data it had not yet read is gone and "
                             "the job cannot continue with it",
                             describePeer(rank_, pid_), what),
                 rank_);
  }

  std::shared_ptr<Counters> counters_;
  int rank_;
  int32_t pid_;
  bool self_ = false;
  bool lost_ = false;
  int pidfd_ = -1;
};

class ShmTransport final : public Transport {
 public:
  explicit ShmTransport(const TransportInit& init)
      : counters_(std::make_shared<Counters>()),
        rank_(init.rank),
        jobSize_(init.size),
        hostId_(init.hostId) {}

  std::string_view name() const noexcept override { return kTransportName; }
  bool canReach(const PeerInfo& peer) const noexcept override { return peer.sameHost; }
  bool supportsMemory(MemoryKind kind) const noexcept override { return kind == MemoryKind::Host; }

  std::unique_ptr<LocalMemory> registerMemory(void* data, size_t bytes, MemoryKind kind,
                                              const HostAllocation* host) override {
    if (kind != MemoryKind::Host) {
      throw Error(ErrorCode::NotSupported,
                  fmt::format("shm transport: cannot register {} memory ({} bytes at {}): shm "
                              "shares host memory only; use the nvlink transport for device memory",
                              kindName(kind), bytes, data));
    }
    if (data == nullptr || bytes == 0) {
      throw Error(ErrorCode::InvalidArgument,
                  fmt::format("shm transport: cannot register an empty buffer ({} bytes at {})",
                              bytes, data));
    }
    MemoryDescriptor d;
    d.pid = getpid();
    d.hostId = hostId_;
    d.nonce = randomNonce();
    d.address = reinterpret_cast<uint64_t>(data);
    d.size = bytes;
    if (host != nullptr && host->memfd >= 0) {
      struct stat st {};
      if (fstat(host->memfd, &st) != 0) {
        throw Error(ErrorCode::InvalidArgument,
                    fmt::format("shm transport: fstat of the buffer's memfd {} failed: {}",
                                host->memfd, errnoText(errno)));
      }
      if (static_cast<uint64_t>(st.st_ino) != host->inode) {
        throw Error(ErrorCode::InvalidArgument,
                    fmt::format("shm transport: memfd {} has inode {}, not the {} the allocation "
                                "names",
                                host->memfd, static_cast<uint64_t>(st.st_ino), host->inode));
      }
      if (host->offset > static_cast<uint64_t>(st.st_size) ||
          bytes > static_cast<uint64_t>(st.st_size) - host->offset) {
        throw Error(
            ErrorCode::InvalidArgument,
            fmt::format("shm transport: {} bytes at offset {} do not fit in memfd {} of "
                        "{} bytes",
                        bytes, host->offset, host->memfd, static_cast<int64_t>(st.st_size)));
      }
      d.mode = DescriptorMode::Memfd;
      d.fd = host->memfd;
      d.inode = host->inode;
      d.offset = host->offset;
    } else {
      d.mode = DescriptorMode::User;
    }
    STRATA_LOG(Debug, kLog, "registered {} bytes at {} ({}, nonce {:016x})", bytes, data,
               d.mode == DescriptorMode::Memfd ? fmt::format("memfd {} offset {}", d.fd, d.offset)
                                               : std::string("user memory"),
               d.nonce);
    return std::make_unique<ShmLocalMemory>(counters_, d);
  }

  std::unique_ptr<RemoteMemory> importMemory(const PeerInfo& owner,
                                             std::span<const uint8_t> descriptor, size_t bytes,
                                             MemoryKind kind) override {
    const std::string who = describePeer(owner.rank, owner.pid);
    if (kind != MemoryKind::Host) {
      throw Error(ErrorCode::NotSupported,
                  fmt::format("shm transport: cannot import {} memory of {}: shm shares host "
                              "memory only",
                              kindName(kind), who),
                  owner.rank);
    }
    if (!owner.sameHost) {
      throw Error(ErrorCode::NotSupported,
                  fmt::format("shm transport: cannot import memory of {} on host {}: shm reaches "
                              "ranks on this host only",
                              who, owner.hostName),
                  owner.rank);
    }
    MemoryDescriptor d;
    try {
      d = decodeDescriptor(descriptor, fmt::format("shm memory descriptor of rank {}", owner.rank));
    } catch (const Error& e) {
      throw Error(e.code(), e.what(), owner.rank);
    }
    auto bad = [&](const std::string& what) {
      return Error(ErrorCode::ProtocolError,
                   fmt::format("shm transport: memory descriptor of {}: {}", who, what),
                   owner.rank);
    };
    if (d.pid <= 0 || (owner.pid != 0 && d.pid != owner.pid)) {
      throw bad(fmt::format("it names pid {}, but the bootstrap says rank {} is pid {}", d.pid,
                            owner.rank, owner.pid));
    }
    if (d.hostId != 0 && owner.hostId != 0 && d.hostId != owner.hostId) {
      throw bad(fmt::format("it names host id {:#x}, but the bootstrap says {:#x}", d.hostId,
                            owner.hostId));
    }
    if (d.size != bytes) {
      throw bad(fmt::format("it describes {} bytes, but the record says {}", d.size, bytes));
    }
    if (d.size == 0 || d.address == 0 || d.address + d.size < d.address) {
      throw bad(fmt::format("invalid range of {} bytes at {:#x}", d.size, d.address));
    }

    if (d.pid == getpid()) return importOwn(owner, d, bad);
    if (d.mode == DescriptorMode::User) return importUser(owner, d);
    return importMemfd(owner, d, bad);
  }

  std::vector<uint8_t> endpoint() override { return encodeEndpoint(Endpoint{getpid(), hostId_}); }

  std::unique_ptr<TransportConnection> connect(const PeerInfo& peer,
                                               std::span<const uint8_t> peerEndpoint) override {
    const std::string who = describePeer(peer.rank, peer.pid);
    if (!peer.sameHost) {
      throw Error(ErrorCode::NotSupported,
                  fmt::format("shm transport: cannot connect to {} on host {}: shm reaches ranks "
                              "on this host only",
                              who, peer.hostName),
                  peer.rank);
    }
    int32_t pid = 0;
    uint64_t hostId = 0;
    try {
      Endpoint e = decodeEndpoint(peerEndpoint, fmt::format("shm endpoint of rank {}", peer.rank));
      pid = e.pid;
      hostId = e.hostId;
    } catch (const Error& e) {
      throw Error(e.code(), e.what(), peer.rank);
    }
    if (pid <= 0 || (peer.pid != 0 && pid != peer.pid)) {
      throw Error(ErrorCode::ProtocolError,
                  fmt::format("shm transport: endpoint of {} names pid {}, but the bootstrap "
                              "says pid {}",
                              who, pid, peer.pid),
                  peer.rank);
    }
    if (hostId != 0 && peer.hostId != 0 && hostId != peer.hostId) {
      throw Error(ErrorCode::ProtocolError,
                  fmt::format("shm transport: endpoint of {} names host id {:#x}, but the "
                              "bootstrap says {:#x}",
                              who, hostId, peer.hostId),
                  peer.rank);
    }
    PeerInfo checked = peer;
    checked.pid = pid;
    auto connection = std::make_unique<ShmConnection>(counters_, checked);
    STRATA_LOG(Debug, kLog, "connected to {}", who);
    return connection;
  }

  TransportStats stats() const noexcept override {
    TransportStats s;
    s.registrations = counters_->registrations.load(std::memory_order_relaxed);
    s.imports = counters_->imports.load(std::memory_order_relaxed);
    s.connections = counters_->connections.load(std::memory_order_relaxed);
    return s;
  }

 private:
  template <class Bad>
  std::unique_ptr<RemoteMemory> importOwn(const PeerInfo& owner, const MemoryDescriptor& d,
                                          Bad& bad) {
    // The owner is this process: the address is valid here if the registration is alive.
    bool alive = false;
    {
      std::lock_guard lock(liveMutex());
      auto it = liveTable().find(d.nonce);
      if (it != liveTable().end()) {
        const LiveEntry& e = it->second;
        alive = e.mode == d.mode && e.address == d.address && e.size == d.size &&
                (d.mode == DescriptorMode::User ||
                 (e.fd == d.fd && e.inode == d.inode && e.offset == d.offset));
      }
    }
    if (!alive) {
      throw bad(
          fmt::format("stale descriptor: this process (the owner) has no live registration "
                      "with nonce {:016x} at {:#x}; was the buffer released?",
                      d.nonce, d.address));
    }
    char* data = reinterpret_cast<char*>(d.address);
    return std::make_unique<ShmRemoteMemory>(counters_, owner.rank, d.pid, d.address, d.size, data,
                                             nullptr, 0);
  }

  std::unique_ptr<RemoteMemory> importUser(const PeerInfo& owner, const MemoryDescriptor& d) {
    // Probe one byte now, so that a kernel that forbids the access (or a dead owner) is
    // reported at import rather than at the first write.
    char probe = 0;
    iovec local{&probe, 1};
    iovec remote{reinterpret_cast<void*>(d.address), 1};
    ssize_t n;
    do {
      n = process_vm_readv(d.pid, &local, 1, &remote, 1, 0);
    } while (n < 0 && errno == EINTR);
    if (n < 0) throwVmError(errno, "process_vm_readv", owner.rank, d.pid, d.address, 1);
    STRATA_LOG(Debug, kLog, "imported {} bytes of user memory of rank {} (pid {}) at {:#x}", d.size,
               owner.rank, d.pid, d.address);
    return std::make_unique<ShmRemoteMemory>(counters_, owner.rank, d.pid, d.address, d.size,
                                             nullptr, nullptr, 0);
  }

  template <class Bad>
  std::unique_ptr<RemoteMemory> importMemfd(const PeerInfo& owner, const MemoryDescriptor& d,
                                            Bad& bad) {
    const std::string who = describePeer(owner.rank, d.pid);
    const std::string path = fmt::format("/proc/{}/fd/{}", d.pid, d.fd);
    int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) {
      const int err = errno;
      if (kill(d.pid, 0) != 0 && errno == ESRCH) {
        throw Error(
            ErrorCode::PeerLost,
            fmt::format("shm transport: cannot import memory of {}: the process exited", who),
            owner.rank);
      }
      if (err == ENOENT) {
        throw bad(
            fmt::format("stale descriptor: {} does not exist (the owner closed the memfd; "
                        "was the buffer released?)",
                        path));
      }
      if (err == EACCES || err == EPERM) {
        throw Error(ErrorCode::NotSupported,
                    fmt::format("shm transport: cannot open {} to map memory of {}: {}. Opening "
                                "another process's fd needs the same user and a dumpable process "
                                "(ptrace read access); run the ranks as one user",
                                path, who, errnoText(err)),
                    owner.rank);
      }
      throw Error(
          ErrorCode::SystemError,
          fmt::format("shm transport: cannot open {} to map memory of {}: {}{}", path, who,
                      errnoText(err),
                      err == EMFILE || err == ENFILE ? "; " + process::descriptorAdvice(jobSize_)
                                                     : std::string()),
          owner.rank);
    }
    struct stat st {};
    if (fstat(fd, &st) != 0) {
      const int err = errno;
      close(fd);
      throw Error(ErrorCode::SystemError,
                  fmt::format("shm transport: fstat of {} (memory of {}) failed: {}", path, who,
                              errnoText(err)),
                  owner.rank);
    }
    if (static_cast<uint64_t>(st.st_ino) != d.inode) {
      close(fd);
      throw bad(
          fmt::format("stale or reused descriptor: {} has inode {}, the descriptor names "
                      "inode {}",
                      path, static_cast<uint64_t>(st.st_ino), d.inode));
    }
    const uint64_t fileSize = static_cast<uint64_t>(st.st_size);
    if (d.offset > fileSize || d.size > fileSize - d.offset) {
      close(fd);
      throw bad(fmt::format("{} bytes at offset {} lie beyond the end of its memfd ({} bytes)",
                            d.size, d.offset, fileSize));
    }
    const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
    const uint64_t mapOffset = d.offset & ~(page - 1);
    const uint64_t delta = d.offset - mapOffset;
    const size_t mapLength = static_cast<size_t>(d.size + delta);
    void* base = mmap(nullptr, mapLength, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
                      static_cast<off_t>(mapOffset));
    const int mmapErr = errno;
    close(fd);  // the mapping keeps the memory alive; no fd is held per import
    if (base == MAP_FAILED) {
      throw Error(ErrorCode::SystemError,
                  fmt::format("shm transport: mmap of {} bytes of {} (memory of {}) failed: {}",
                              mapLength, path, who, errnoText(mmapErr)),
                  owner.rank);
    }
    STRATA_LOG(Debug, kLog, "mapped {} bytes of rank {} (pid {}, memfd {} offset {}) at {}", d.size,
               owner.rank, d.pid, d.fd, d.offset, base);
    return std::make_unique<ShmRemoteMemory>(counters_, owner.rank, d.pid, d.address, d.size,
                                             static_cast<char*>(base) + delta, base, mapLength);
  }

  std::shared_ptr<Counters> counters_;
  int rank_;
  int jobSize_;
  uint64_t hostId_;
};

}  // namespace

std::unique_ptr<backend::Transport> createShmTransport(const backend::TransportInit& init) {
  return std::make_unique<ShmTransport>(init);
}

}  // namespace strata::shm

namespace strata::shm {

const backend::ModuleInfo* builtinModuleInfo() {
  static const backend::ModuleInfo info{
      STRATA_MODULE_ABI_VERSION,
      backend::ModuleKind::Transport,
      "shm",
      STRATA_VERSION_STRING,
      "host memory between processes of one host (memfd mappings, process_vm_writev)",
      nullptr,
      nullptr,
      &createShmTransport,
      nullptr,
      nullptr,
  };
  return &info;
}

}  // namespace strata::shm
