#include "fabric_shm_regions.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>

#include <fmt/format.h>

#include "base/log.hpp"

namespace strata::fabric {
namespace {

// The largest pid the kernel can hand out (FUTEX_TID_MASK); anything above is not a pid.
constexpr uint64_t kPidLimit = 0x3fffffff;

// Reads one decimal number from the front of text and drops it; false if there is none.
bool takeNumber(std::string_view& text, uint64_t& value) {
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end == text.data()) return false;
  text.remove_prefix(static_cast<size_t>(end - text.data()));
  return true;
}

bool takeDash(std::string_view& text) {
  if (text.empty() || text.front() != '-') return false;
  text.remove_prefix(1);
  return true;
}

}  // namespace

uint64_t pidNamespace() noexcept {
  struct stat st {};
  if (::stat("/proc/self/ns/pid", &st) != 0) return 0;
  return static_cast<uint64_t>(st.st_ino);
}

std::string shmRegionName(uint64_t pidns, pid_t pid, uint64_t index) {
  return fmt::format("{}{}-{}-{}", kShmRegionPrefix, pidns, pid, index);
}

std::optional<ShmRegionName> parseShmRegionName(std::string_view name) noexcept {
  if (!name.starts_with(kShmRegionPrefix)) return std::nullopt;
  name.remove_prefix(kShmRegionPrefix.size());
  uint64_t pidns = 0, pid = 0, index = 0;
  if (!takeNumber(name, pidns) || !takeDash(name) || !takeNumber(name, pid) || !takeDash(name) ||
      !takeNumber(name, index) || !name.empty()) {
    return std::nullopt;
  }
  if (pidns == 0 || pid == 0 || pid > kPidLimit) return std::nullopt;
  return ShmRegionName{pidns, static_cast<pid_t>(pid), index};
}

size_t sweepStaleShmRegions(const std::string& dir, uint64_t pidns) noexcept {
  if (pidns == 0) return 0;
  DIR* d = opendir(dir.c_str());
  if (!d) return 0;
  size_t removed = 0;
  while (dirent* e = readdir(d)) {
    const char* name = e->d_name;
    auto parsed = parseShmRegionName(name);
    if (!parsed || parsed->pidns != pidns) continue;  // not ours to judge
    struct stat st {};
    if (fstatat(dirfd(d), name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode) ||
        st.st_uid != geteuid()) {
      continue;
    }
    if (::kill(parsed->pid, 0) == 0 || errno != ESRCH) continue;  // still alive
    if (unlinkat(dirfd(d), name, 0) == 0) {
      ++removed;
      STRATA_LOG(Info, "fabric", "removed {}/{} left by exited process {} (libfabric shm)", dir,
                 name, parsed->pid);
    }
  }
  closedir(d);
  return removed;
}

}  // namespace strata::fabric
