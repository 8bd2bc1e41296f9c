#include "base/process.hpp"

#include <dirent.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

#include <fmt/format.h>

#include <strata/error.hpp>

#include "base/log.hpp"
#include "base/strings.hpp"

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

std::vector<int> parseCpuList(std::string_view text, std::string_view what) {
  constexpr int kMaxCpu = 65535;
  auto bad = [&](const std::string& why) {
    return Error(ErrorCode::InvalidConfig,
                 fmt::format("{} = \"{}\": {} (a CPU list: 0-3,8,10-11)", what, text, why));
  };
  auto number = [&](std::string_view n) {
    if (n.empty() || n.size() > 5 || n.find_first_not_of("0123456789") != std::string_view::npos) {
      throw bad(fmt::format("\"{}\" is not a CPU number", n));
    }
    const int v = std::stoi(std::string(n));
    if (v > kMaxCpu) throw bad(fmt::format("CPU {} is above {}", v, kMaxCpu));
    return v;
  };
  std::vector<int> out;
  for (std::string_view item : strings::split(text)) {
    item = strings::trim(item);
    const size_t dash = item.find('-');
    const int first = number(item.substr(0, dash));
    const int last = dash == std::string_view::npos ? first : number(item.substr(dash + 1));
    if (last < first) throw bad(fmt::format("the range {} runs backwards", item));
    for (int c = first; c <= last; ++c) out.push_back(c);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::string cpuListText(const std::vector<int>& cpus) {
  std::string out;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    out += (out.empty() ? "" : ",") +
           (j == i ? std::to_string(cpus[i]) : fmt::format("{}-{}", cpus[i], cpus[j]));
    i = j + 1;
  }
  return out;
}

std::vector<int> allowedCpus(std::string* why) {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) {
    if (why) *why = fmt::format("sched_getaffinity: {}", std::strerror(errno));
    return {};
  }
  std::vector<int> mask;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &allowed)) mask.push_back(c);
  }
  return mask;
}

std::string pinCurrentThread(const std::vector<int>& cpus, std::string* why) {
  if (cpus.empty()) return {};
  const std::vector<int> mask = allowedCpus(why);
  if (mask.empty()) return {};
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> taken;
  for (int c : cpus) {
    if (c < CPU_SETSIZE && std::binary_search(mask.begin(), mask.end(), c)) {
      CPU_SET(c, &set);
      taken.push_back(c);
    }
  }
  if (taken.empty()) {
    if (why) {
      *why = fmt::format("none of CPUs {} is in this process's mask {}", cpuListText(cpus),
                         cpuListText(mask));
    }
    return {};
  }
  if (int rc = pthread_setaffinity_np(pthread_self(), sizeof set, &set); rc != 0) {
    if (why) *why = fmt::format("pthread_setaffinity_np: {}", std::strerror(rc));
    return {};
  }
  return cpuListText(taken);
}

void nameCurrentThread(const char* name) {
  char cut[16];
  std::snprintf(cut, sizeof cut, "%s", name);
  pthread_setname_np(pthread_self(), cut);
}

void startThread(const char* name, const std::vector<int>& cpus, std::string_view subsystem,
                 std::string_view who) {
  nameCurrentThread(name);
  if (cpus.empty()) return;
  std::string why;
  const std::string bound = pinCurrentThread(cpus, &why);
  if (bound.empty()) {
    STRATA_LOG(Warn, subsystem, "{} stays unbound (transport.proxy_cpus {}): {}", who,
               cpuListText(cpus), why);
  } else {
    STRATA_LOG(Debug, subsystem, "{} runs on CPUs {}", who, bound);
  }
}

}  // namespace strata::process
