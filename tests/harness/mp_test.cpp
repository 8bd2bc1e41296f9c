#include "mp_test.hpp"

#include <arpa/inet.h>
#include <dirent.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <regex>
#include <sstream>

#include <boost/test/unit_test.hpp>
#include <boost/test/unit_test_monitor.hpp>

namespace strata::testing {
namespace {

std::optional<int> envInt(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  char* end = nullptr;
  long parsed = std::strtol(value, &end, 10);
  if (*end != '\0') return std::nullopt;
  return static_cast<int>(parsed);
}

LaunchEnv readLaunchEnv() {
  LaunchEnv env;
  if (auto rank = envInt("STRATA_RANK")) {
    env.launcher = "strata-run";
    env.rank = *rank;
    env.size = envInt("STRATA_SIZE").value_or(-1);
    env.localRank = envInt("STRATA_LOCAL_RANK").value_or(-1);
    env.localSize = envInt("STRATA_LOCAL_SIZE").value_or(-1);
  } else if (auto procid = envInt("SLURM_PROCID")) {
    env.launcher = "slurm";
    env.rank = *procid;
    env.size = envInt("SLURM_NTASKS").value_or(envInt("SLURM_NPROCS").value_or(-1));
    env.localRank = envInt("SLURM_LOCALID").value_or(-1);
    // SLURM_TASKS_PER_NODE is "4" or "2(x2)"; on one node the local size is the task count.
    if (envInt("SLURM_NNODES").value_or(envInt("SLURM_JOB_NUM_NODES").value_or(0)) == 1) {
      env.localSize = env.size;
    }
  } else if (auto rank = envInt("OMPI_COMM_WORLD_RANK")) {
    env.launcher = "mpirun";
    env.rank = *rank;
    env.size = envInt("OMPI_COMM_WORLD_SIZE").value_or(-1);
    env.localRank = envInt("OMPI_COMM_WORLD_LOCAL_RANK").value_or(-1);
    env.localSize = envInt("OMPI_COMM_WORLD_LOCAL_SIZE").value_or(-1);
  }
  if (const char* root = std::getenv("STRATA_ROOT")) env.root = root;
  return env;
}

}  // namespace

const LaunchEnv& launchEnv() {
  static const LaunchEnv env = readLaunchEnv();
  return env;
}

int multiProcessMain(int argc, char** argv, std::string_view skipReason, bool (*init)()) {
  if (std::getenv("STRATA_RANK") == nullptr && std::getenv("SLURM_PROCID") == nullptr &&
      std::getenv("OMPI_COMM_WORLD_RANK") == nullptr) {
    std::cout << skipReason << std::endl;
    return 77;
  }
  // strata::Error carries a code and a peer that what() alone does not show.
  boost::unit_test::unit_test_monitor.register_exception_translator<Error>([](const Error& error) {
    BOOST_ERROR("rank " << launchEnv().rank << ": uncaught strata::Error " << describe(error));
  });
  return boost::unit_test::unit_test_main(init, argc, argv);
}

std::optional<Error> catchError(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& error) {
    return error;
  }
  return std::nullopt;
}

std::string describe(const Error& error) {
  std::ostringstream out;
  out << toString(error.code()) << " (peer " << error.peer() << "): " << error.what();
  return out.str();
}

bool namesRank(std::string_view message, int rank) {
  // "rank 1", "rank=1", "rank #1", "ranks 0 and 1", "ranks 0, 1": the word rank, then within the
  // same clause the number standing alone.
  const std::regex pattern("rank[^.;:]*?[^0-9]" + std::to_string(rank) + "([^0-9]|$)",
                           std::regex::icase);
  return std::regex_search(std::string(message), pattern);
}

double secondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

size_t countOpenFds() {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return 0;
  size_t count = 0;
  while (dirent* entry = readdir(dir)) {
    if (entry->d_name[0] != '.') ++count;
  }
  closedir(dir);
  return count - 1;  // the directory stream's own fd
}

std::set<unsigned long> listeningSocketInodes() {
  std::set<unsigned long> ours;
  if (DIR* dir = opendir("/proc/self/fd")) {
    while (dirent* entry = readdir(dir)) {
      if (entry->d_name[0] == '.') continue;
      char target[128] = {};
      std::string link = std::string("/proc/self/fd/") + entry->d_name;
      ssize_t n = readlink(link.c_str(), target, sizeof(target) - 1);
      unsigned long inode = 0;
      if (n > 0 && std::sscanf(target, "socket:[%lu]", &inode) == 1) ours.insert(inode);
    }
    closedir(dir);
  }
  std::set<unsigned long> listening;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state, queues, timer, retransmits, uid, timeout;
      unsigned long inode = 0;
      fields >> slot >> local >> remote >> state >> queues >> timer >> retransmits >> uid >>
          timeout >> inode;
      if (state == "0A" && ours.count(inode) != 0) listening.insert(inode);
    }
  }
  return listening;
}

bool splitHostPort(std::string_view address, std::string& host, int& port) {
  size_t colon = address.rfind(':');
  if (colon == std::string_view::npos || colon + 1 >= address.size()) return false;
  std::string_view h = address.substr(0, colon);
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  host = std::string(h);
  char* end = nullptr;
  std::string p(address.substr(colon + 1));
  long value = std::strtol(p.c_str(), &end, 10);
  if (*end != '\0' || value <= 0 || value > 65535) return false;
  port = static_cast<int>(value);
  return !host.empty();
}

bool isLoopbackHost(std::string_view host) {
  if (host == "localhost" || host == "::1") return true;
  in_addr v4{};
  std::string h(host);
  if (inet_pton(AF_INET, h.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  return false;
}

int connectLoopback(std::string_view address) {
  std::string host;
  int port = 0;
  if (!splitHostPort(address, host, port) || !isLoopbackHost(host)) {
    errno = EPERM;
    return -1;
  }
  if (host == "localhost") host = "127.0.0.1";
  sockaddr_storage storage{};
  socklen_t length = 0;
  int family = AF_INET;
  if (host.find(':') != std::string::npos) {
    auto* v6 = reinterpret_cast<sockaddr_in6*>(&storage);
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(static_cast<uint16_t>(port));
    inet_pton(AF_INET6, host.c_str(), &v6->sin6_addr);
    length = sizeof(*v6);
    family = AF_INET6;
  } else {
    auto* v4 = reinterpret_cast<sockaddr_in*>(&storage);
    v4->sin_family = AF_INET;
    v4->sin_port = htons(static_cast<uint16_t>(port));
    inet_pton(AF_INET, host.c_str(), &v4->sin_addr);
    length = sizeof(*v4);
  }
  int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (connect(fd, reinterpret_cast<sockaddr*>(&storage), length) != 0) {
    int saved = errno;
    close(fd);
    errno = saved;
    return -1;
  }
  return fd;
}

void writeAllIgnoringErrors(int fd, const void* data, size_t bytes) {
  const auto* p = static_cast<const char*>(data);
  while (bytes > 0) {
    ssize_t n = send(fd, p, bytes, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    p += n;
    bytes -= static_cast<size_t>(n);
  }
}

}  // namespace strata::testing
