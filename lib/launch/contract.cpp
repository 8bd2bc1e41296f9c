#include "launch/contract.hpp"

#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <csignal>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>

#include <fmt/format.h>

#include <strata/error.hpp>

#include "base/config_keys.hpp"
#include "base/log.hpp"
#include "launch/hostlist.hpp"

namespace strata {
namespace {

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return (v && *v) ? v : nullptr;
}

int parseInt(const char* name, const char* text, int min, int max) {
  int value = 0;
  std::string_view s(text);
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec != std::errc() || p != s.data() + s.size() || value < min || value > max) {
    throw Error(ErrorCode::InvalidConfig,
                fmt::format("environment variable {}='{}' is not an integer in {}..{}", name, text,
                            min, max));
  }
  return value;
}

int requireInt(const char* name, int min, int max, const char* launcher) {
  const char* v = env(name);
  if (!v) {
    throw Error(ErrorCode::InvalidConfig,
                fmt::format("{} is not set although the job looks launched by {}; the launcher "
                            "contract needs it",
                            name, launcher));
  }
  return parseInt(name, v, min, max);
}

// A secret that other users can read is no secret: they can join or disturb the job. Warned once
// per file and process (create/destroy cycles read it again).
void checkSecretFileMode(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return;  // the read below reports it
  const mode_t loose = st.st_mode & (S_IRGRP | S_IWGRP | S_IROTH | S_IWOTH);
  if (loose == 0) return;
  static std::mutex mu;
  static std::set<std::string> warned;
  std::lock_guard lk(mu);
  if (!warned.insert(path).second) return;
  const bool readable = loose & (S_IRGRP | S_IROTH), writable = loose & (S_IWGRP | S_IWOTH);
  STRATA_LOG(Warn, "launch",
             "bootstrap.secret_file '{}' is {} by {} (mode {:04o}): anyone who can read it can "
             "join or disturb this job. Make it private: chmod 600 '{}'",
             path,
             readable && writable ? "readable and writable"
             : readable           ? "readable"
                                  : "writable",
             (loose & (S_IROTH | S_IWOTH)) ? "other users" : "its group", st.st_mode & 07777, path);
}

std::string readSecretFile(const std::string& path) {
  checkSecretFileMode(path);
  std::ifstream in(path);
  if (!in) {
    throw Error(ErrorCode::InvalidConfig,
                fmt::format("bootstrap.secret_file '{}' cannot be read", path));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  std::string s = ss.str();
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  if (s.empty()) {
    throw Error(ErrorCode::InvalidConfig, fmt::format("bootstrap.secret_file '{}' is empty", path));
  }
  return s;
}

}  // namespace

LaunchInfo detectLaunch(const Config& config) {
  LaunchInfo info;
  constexpr int kMaxRanks = 1 << 24;
  if (env("STRATA_RANK") || env("STRATA_SIZE")) {
    info.launcher = "strata-run";
    info.size = requireInt("STRATA_SIZE", 1, kMaxRanks, "strata-run (STRATA_RANK/STRATA_SIZE)");
    info.rank = requireInt("STRATA_RANK", 0, info.size - 1, "strata-run (STRATA_RANK/STRATA_SIZE)");
    if (env("STRATA_LOCAL_SIZE")) {
      info.localSize = parseInt("STRATA_LOCAL_SIZE", env("STRATA_LOCAL_SIZE"), 1, info.size);
      info.localRank = requireInt("STRATA_LOCAL_RANK", 0, info.localSize - 1, "strata-run");
    } else {
      info.localSize = info.size;
      info.localRank = info.rank;
    }
    if (const char* root = env("STRATA_ROOT")) info.root = root;
    if (info.rank == 0 && env("STRATA_ROOT_FD")) {
      int fd = parseInt("STRATA_ROOT_FD", env("STRATA_ROOT_FD"), 0, 1 << 20);
      int listening = 0;
      socklen_t len = sizeof listening;
      if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) == 0 && listening) {
        info.rootFd = fd;
      } else {
        // A stale variable (e.g. a nested launch) is not fatal: rank 0 binds the port itself.
        STRATA_LOG(Debug, "launch", "STRATA_ROOT_FD={} is not a listening socket; ignoring it", fd);
      }
    }
  } else if (env("SLURM_PROCID") && env("SLURM_STEP_ID")) {
    info.launcher = "slurm";
    const char* sizeVar = env("SLURM_STEP_NUM_TASKS") ? "SLURM_STEP_NUM_TASKS" : "SLURM_NTASKS";
    info.size = requireInt(sizeVar, 1, kMaxRanks, "srun");
    info.rank = requireInt("SLURM_PROCID", 0, info.size - 1, "srun");
    info.localRank =
        env("SLURM_LOCALID") ? parseInt("SLURM_LOCALID", env("SLURM_LOCALID"), 0, kMaxRanks) : 0;
    info.localSize = 1;
    if (const char* tpn = env("SLURM_STEP_TASKS_PER_NODE")) {
      int node =
          env("SLURM_NODEID") ? parseInt("SLURM_NODEID", env("SLURM_NODEID"), 0, kMaxRanks) : 0;
      auto counts = hostlist::tasksPerNode(tpn);
      if (node >= static_cast<int>(counts.size())) {
        throw Error(ErrorCode::InvalidConfig,
                    fmt::format("SLURM_NODEID={} but SLURM_STEP_TASKS_PER_NODE='{}' lists only {} "
                                "nodes",
                                node, tpn, counts.size()));
      }
      info.localSize = counts[static_cast<size_t>(node)];
    }
    if (info.localRank >= info.localSize) {
      throw Error(ErrorCode::InvalidConfig,
                  fmt::format("SLURM_LOCALID={} is not below the local task count {}",
                              info.localRank, info.localSize));
    }
    if (const char* nodes = env("SLURM_STEP_NODELIST")) {
      std::string host = hostlist::first(nodes);
      int port = static_cast<int>(config::getInt(config, "bootstrap.tcp.port"));
      if (const char* resv = env("SLURM_STEP_RESV_PORTS")) {
        auto ports = hostlist::ports(resv);
        if (!ports.empty()) port = ports.front();
      }
      if (port > 0) info.root = fmt::format("{}:{}", host, port);
    }
  } else if (env("OMPI_COMM_WORLD_RANK")) {
    info.launcher = "mpirun";
    info.size = requireInt("OMPI_COMM_WORLD_SIZE", 1, kMaxRanks, "mpirun");
    info.rank = requireInt("OMPI_COMM_WORLD_RANK", 0, info.size - 1, "mpirun");
    info.localSize = env("OMPI_COMM_WORLD_LOCAL_SIZE")
                         ? parseInt("OMPI_COMM_WORLD_LOCAL_SIZE", env("OMPI_COMM_WORLD_LOCAL_SIZE"),
                                    1, info.size)
                         : 1;
    info.localRank = env("OMPI_COMM_WORLD_LOCAL_RANK")
                         ? parseInt("OMPI_COMM_WORLD_LOCAL_RANK", env("OMPI_COMM_WORLD_LOCAL_RANK"),
                                    0, info.localSize - 1)
                         : 0;
    if (const char* root = env("STRATA_ROOT")) info.root = root;
  } else {
    info.launcher = "none";
    if (const char* root = env("STRATA_ROOT")) info.root = root;
  }
  // An explicit bootstrap.tcp.root is for launchers that give no root; strata-run's own wins.
  std::string cfgRoot = config::getString(config, "bootstrap.tcp.root");
  if (!cfgRoot.empty() && info.launcher != "strata-run") info.root = cfgRoot;

  if (const char* secret = env("STRATA_SECRET")) {
    info.secret = secret;
  } else {
    std::string file = config::getString(config, "bootstrap.secret_file");
    if (!file.empty()) info.secret = readSecretFile(file);
  }
  return info;
}

}  // namespace strata
