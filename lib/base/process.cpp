#include "base/process.hpp"

#include <dirent.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

#include <fmt/format.h>

#include "base/log.hpp"

namespace strata::process {

std::string hostName() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "unknown";
  return buf;
}

bool gone(pid_t pid) {
  if (::kill(pid, 0) != 0) return errno == ESRCH;
  std::ifstream stat(fmt::format("/proc/{}/stat", pid));
  std::string line;
  if (!std::getline(stat, line)) return true;
  const size_t paren = line.rfind(')');  // the command name may hold spaces and parentheses
  if (paren == std::string::npos || paren + 2 >= line.size()) return false;
  const char state = line[paren + 2];
  return state == 'Z' || state == 'X';
}

uint64_t descriptorsNeeded(int ranks) {
  return 3 * static_cast<uint64_t>(std::max(ranks - 1, 0)) + 64;
}

namespace {

int openDescriptors() {
  int n = 0;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
    ::closedir(d);
    --n;  // opendir's own
  }
  return n;
}

std::string limitText(rlim_t v) {
  return v == RLIM_INFINITY ? std::string("unlimited") : std::to_string(v);
}

}  // namespace

std::string descriptorAdvice(int ranks) {
  rlimit lim{};
  ::getrlimit(RLIMIT_NOFILE, &lim);
  const uint64_t need = descriptorsNeeded(ranks);
  return fmt::format(
      "this process ran out of file descriptors ({} open, limit {}, hard limit {}); a job of {} "
      "ranks needs about {} per process (2 bootstrap sockets and 1 transport handle per peer): "
      "raise the limit with `ulimit -n {}` before launching (above the hard limit: "
      "/etc/security/limits.conf, systemd's LimitNOFILE, or the cluster's launcher settings)",
      openDescriptors(), limitText(lim.rlim_cur), limitText(lim.rlim_max), ranks, need, need);
}

bool outOfDescriptors(std::string_view text) {
  // ENFILE's text contains EMFILE's: "Too many open files (in system)".
  return text.find(std::strerror(EMFILE)) != std::string_view::npos;
}

void ensureDescriptors(int ranks, int rank, const char* logName) {
  const uint64_t need = descriptorsNeeded(ranks);
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_cur == RLIM_INFINITY ||
      lim.rlim_cur >= need) {
    return;
  }
  const rlim_t old = lim.rlim_cur;
  lim.rlim_cur = lim.rlim_max == RLIM_INFINITY ? need : std::min<rlim_t>(lim.rlim_max, need);
  if (lim.rlim_cur > old && ::setrlimit(RLIMIT_NOFILE, &lim) == 0) {
    STRATA_LOG(Debug, logName, "raised the soft limit of open files from {} to {} for {} ranks",
               old, lim.rlim_cur, ranks);
  } else {
    lim.rlim_cur = old;
  }
  if (lim.rlim_cur < need && rank == 0) {
    STRATA_LOG(Warn, logName,
               "a job of {} ranks needs about {} file descriptors per process (2 bootstrap "
               "sockets and 1 transport handle per peer), but the limit is {} (hard limit {}); "
               "set-up will fail with \"Too many open files\" once a rank runs out: raise the "
               "hard limit (ulimit -Hn, /etc/security/limits.conf, systemd's LimitNOFILE)",
               ranks, need, limitText(lim.rlim_cur), limitText(lim.rlim_max));
  }
}

}  // namespace strata::process
