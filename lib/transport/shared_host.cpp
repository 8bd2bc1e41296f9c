// The process-wide registry of shared host memory (<strata/backend/host_memory.hpp>): memfd
// allocations mapped MAP_SHARED, looked up by address on every host collective call.

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <shared_mutex>

#include <fmt/format.h>

#include <strata/backend/host_memory.hpp>
#include <strata/error.hpp>

namespace strata::backend {

namespace {

struct Allocation {
  size_t bytes = 0;
  uint64_t id = 0;
  int fd = -1;
  uint64_t inode = 0;
};

struct Registry {
  std::shared_mutex mu;
  std::map<uintptr_t, Allocation> byAddress;  // by start address
  std::atomic<size_t> live{0};                // lets a lookup skip the lock when there is none
  std::atomic<uint64_t> frees{0};
  uint64_t nextId = 1;
};

Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: lookups may run during static teardown
  return *r;
}

std::string errnoText(int err) {
  return std::strerror(err);
}

}  // namespace

void* allocSharedHost(size_t bytes) {
  if (bytes == 0) {
    throw Error(ErrorCode::InvalidArgument, "allocHost: 0 bytes requested (ask for at least 1)");
  }
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  if (bytes > SIZE_MAX - page) {
    throw Error(ErrorCode::InvalidArgument, fmt::format("allocHost: {} bytes is too large", bytes));
  }
  const size_t length = (bytes + page - 1) / page * page;
  int fd = memfd_create("strata-host", MFD_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    throw Error(ErrorCode::SystemError,
                fmt::format("allocHost({} B): memfd_create failed: {}", bytes, errnoText(err)));
  }
  auto fail = [&](const char* what) {
    const int err = errno;
    ::close(fd);
    throw Error(ErrorCode::SystemError,
                fmt::format("allocHost({} B): {} failed: {}{}", bytes, what, errnoText(err),
                            err == ENOMEM || err == ENOSPC ? " (out of memory, or /dev/shm's or "
                                                             "the memory cgroup's limit reached)"
                                                           : ""));
  };
  if (ftruncate(fd, static_cast<off_t>(length)) != 0) fail("ftruncate");
  struct stat st {};
  if (fstat(fd, &st) != 0) fail("fstat");
  void* p = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) fail("mmap");
  Registry& r = registry();
  std::unique_lock lock(r.mu);
  r.byAddress[reinterpret_cast<uintptr_t>(p)] =
      Allocation{length, r.nextId++, fd, static_cast<uint64_t>(st.st_ino)};
  r.live.fetch_add(1, std::memory_order_release);
  return p;
}

void freeSharedHost(void* ptr) {
  if (!ptr) return;
  Registry& r = registry();
  Allocation a;
  {
    std::unique_lock lock(r.mu);
    auto it = r.byAddress.find(reinterpret_cast<uintptr_t>(ptr));
    if (it == r.byAddress.end()) {
      throw Error(ErrorCode::InvalidArgument,
                  fmt::format("freeHost({}): not the start of memory from allocHost that is "
                              "still allocated (freed twice, or from another allocator?)",
                              ptr));
    }
    a = it->second;
    r.byAddress.erase(it);
    r.live.fetch_sub(1, std::memory_order_release);
    // Counted before the pages go: a peer that sees the new count drops its mappings.
    r.frees.fetch_add(1, std::memory_order_acq_rel);
  }
  munmap(ptr, a.bytes);
  ::close(a.fd);
}

std::optional<SharedHostRegion> findSharedHost(const void* ptr, size_t bytes) noexcept {
  Registry& r = registry();
  if (r.live.load(std::memory_order_acquire) == 0 || !ptr) return std::nullopt;
  const auto at = reinterpret_cast<uintptr_t>(ptr);
  std::shared_lock lock(r.mu);
  auto it = r.byAddress.upper_bound(at);
  if (it == r.byAddress.begin()) return std::nullopt;
  --it;
  const uintptr_t base = it->first;
  const Allocation& a = it->second;
  const uintptr_t offset = at - base;
  if (offset >= a.bytes || bytes > a.bytes - offset) return std::nullopt;
  return SharedHostRegion{a.id, a.fd, a.inode, a.bytes, offset};
}

uint64_t sharedHostFrees() noexcept {
  return registry().frees.load(std::memory_order_acquire);
}

}  // namespace strata::backend
